"""Control agent: a tiny HTTP endpoint inside each rank's process.

The admin API (in vLLM's API server or `r2cc admin`) reads rail state from it and
asks it to drain, undrain, fail over or restore a rail of this rank. Every request
needs the agent's bearer token, which only reaches trusted readers (the 0600 status
file on the host, or vLLM's own worker RPC).

    GET  /state                          -> the monitor's last full sample, whose `time` (unix) and
                                            `seq` say when it was taken: a state change shows within
                                            R2CC_MONITOR_INTERVAL_MS, counters and byte totals can be
                                            R2CC_STATUS_REFRESH_MS old (the monitor samples them no
                                            more often, to spare the rank's CPU)
    GET  /state?fresh=1                  -> a sample taken now (the admin view asks after an action)
    POST /rails/<rail>/<action>[?force=1] -> action in drain, undrain, failover, restore; the reply
                                            carries the state sampled right after it. Without force,
                                            drain and failover of a peer's last healthy rail answer
                                            409 and change nothing (checked and done as one step).
                                            Optional JSON body {"reason": text, "by": fingerprint}:
                                            a drain or failover is recorded with them (the monitor's
                                            DecisionStore), an undrain or restore clears the record

At start the agent applies the decisions recorded for this group on this host (R2CC_STATE_DIR),
so a restarted rank keeps the rails the operator took out of service.

HTTP/1.1 with keep-alive: the admin view polls every rank a few times a second, and a new
TCP connection per poll costs both sides more than the answer itself.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from r2cc_serve import envs
from r2cc_serve.health.decisions import BY_MAX_CHARS, CLEARS, ENDED_BY, KINDS, REASON_MAX_CHARS, check_text, describe
from r2cc_serve.util.ports import listen_in_range
from r2cc_serve.util.priority import raise_thread_priority

log = logging.getLogger("r2cc_serve.health")

ACTIONS = ("drain", "undrain", "failover", "restore")
IDLE_TIMEOUT_S = 120.0
_RAIL_ACTION = re.compile(r"^/rails/(\d+)/(%s)(\?force=(?:0|1))?$" % "|".join(ACTIONS))


class ControlAgent:
    def __init__(self, comm, monitor, host: str, ports: tuple[int, int] = (0, 0)):
        """host: the address to listen on; ports: the range to take the first free port of
        (R2CC_PORT_RANGE; (0, 0): any)."""
        self.comm, self.monitor = comm, monitor
        self.token = secrets.token_hex(16)
        self.stopped = False
        agent = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive; every reply carries Content-Length
            timeout = IDLE_TIMEOUT_S       # an idle kept-alive connection frees its thread
            # Headers and body go out in two writes; with Nagle on, the body waited for the
            # client's delayed ACK: every answer took 44 ms, idle or not.
            disable_nagle_algorithm = True

            def log_message(self, *args):  # keep worker logs clean
                pass

            def _drain_body(self) -> bytes:
                """Read the request body (also one nobody needs, so the next request on the
                connection parses)."""
                try:
                    n = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    n = -1
                if 0 < n <= 1 << 16:
                    return self.rfile.read(n)
                if n:  # absurd or unreadable: answer, then drop the connection
                    self.close_connection = True
                return b""

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                got = self.headers.get("Authorization", "")
                if hmac.compare_digest(got.encode(), f"Bearer {agent.token}".encode()):
                    return True
                self._reply(401, {"detail": "missing or wrong bearer token for this r2cc control agent"})
                return False

            def _refused(self) -> bool:
                """After stop(), a kept-alive connection must not reach a closed communicator."""
                if not agent.stopped:
                    return False
                self.close_connection = True
                self._reply(503, {"detail": "this rank's r2cc group is closing"})
                return True

            def do_GET(self):
                self._drain_body()
                if self._refused() or not self._authorized():
                    return
                if self.path in ("/state", "/state?fresh=1"):
                    self._reply(200, agent.state(fresh=self.path.endswith("fresh=1")))
                else:
                    self._reply(404, {"detail": f"no route {self.path}"})

            def do_POST(self):
                body = self._drain_body()
                if self._refused() or not self._authorized():
                    return
                m = _RAIL_ACTION.match(self.path)
                if not m:
                    self._reply(404, {"detail": f"no route {self.path}"})
                    return
                try:
                    note = json.loads(body) if body else {}
                    if not isinstance(note, dict):
                        raise ValueError("the body must be a JSON object")
                    reason = check_text(note.get("reason"), REASON_MAX_CHARS, "reason")
                    by = check_text(note.get("by"), BY_MAX_CHARS, "by")
                except ValueError as exc:
                    self._reply(422, {"detail": str(exc)})
                    return
                code, reply = agent.act(int(m.group(1)), m.group(2), force=m.group(3) != "?force=0",
                                        reason=reason, by=by)
                self._reply(code, reply)

        self.server = listen_in_range(lambda port: ThreadingHTTPServer((host, port), Handler), ports,
                                      f"the control agent on {host}")
        self.server.daemon_threads = True
        self.address = f"{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self._serve, name="r2cc-agent", daemon=True)

    def _serve(self) -> None:
        # Request threads are started by this one and inherit its priority.
        done = raise_thread_priority(envs.get("R2CC_CONTROL_NICE"))
        if done.startswith("not changed"):
            log.warning("r2cc control agent priority: %s (R2CC_CONTROL_NICE)", done)
        self.server.serve_forever()

    def start(self) -> "ControlAgent":
        self.apply_recorded_decisions()
        self._thread.start()
        return self

    def apply_recorded_decisions(self) -> None:
        """Drain or fail over, with force, the rails the operator took out of service before this
        rank started (the monitor's DecisionStore), each with one log line saying who, when and why."""
        m, store = self.monitor, self.monitor.decisions
        held = {r["rail"] for r in self.comm.rail_stats() if r["held"]}
        where = f"recorded in {store.path}" if store.path else "recorded in memory"
        for rail, kinds in sorted(store.by_rail().items()):
            for kind in KINDS:
                d = kinds.get(kind)
                if d is None:
                    continue
                if not 0 <= rail < self.comm.num_rails:
                    log.error("r2cc: %s rank %d: recorded %s of rail%d ignored: this rank has rails 0..%d (%s)",
                              m.group, m.rank, kind, rail, self.comm.num_rails - 1, where)
                    continue
                if kind == "failover" and rail in held:
                    continue  # already out (control restarted in the same process)
                try:
                    getattr(self.comm, f"{kind}_rail")(rail, force=True)
                except Exception as exc:
                    log.error("r2cc: %s rank %d: could not re-apply %s: %s", m.group, m.rank,
                              describe(rail, kind, d), exc)
                    continue
                log.warning("r2cc: %s rank %d on %s: re-applied %s (%s; %s it through the admin API to end it)",
                            m.group, m.rank, m.host, describe(rail, kind, d), where, ENDED_BY[kind])

    def state(self, fresh: bool = False) -> dict:
        snap = dict(self.monitor.refresh_now() if fresh else self.monitor.snapshot())
        snap.pop("agent_token", None)
        return snap

    def act(self, rail: int, action: str, force: bool = True, reason: str | None = None,
            by: str | None = None) -> tuple[int, dict]:
        """Do `action` on `rail` of this rank; a drain or failover is recorded with reason and by
        (who: a token fingerprint), an undrain or restore clears the record."""
        from r2cc_serve.errors import LastRailError

        if not 0 <= rail < self.comm.num_rails:
            return 404, {"detail": f"no rail {rail}: this rank has rails 0..{self.comm.num_rails - 1}"}
        try:
            if action in KINDS:
                getattr(self.comm, f"{action}_rail")(rail, force=force)
            else:
                getattr(self.comm, f"{action}_rail")(rail)
        except LastRailError as exc:
            return 409, {"detail": str(exc)}
        except Exception as exc:  # e.g. the group was aborted: say so instead of dropping the connection
            return 500, {"detail": f"{action} of rail{rail} failed on rank {self.monitor.rank}: {exc}"}
        not_kept = self._remember(rail, action, reason, by)
        state = self.state(fresh=True)  # the outcome, so the admin view needs no second round trip
        log.warning("r2cc: operator %s of rail%d on %s rank %d%s%s", action, rail, self.monitor.group,
                    self.monitor.rank, f" by {by}" if by else "", f": {reason}" if reason else "")
        reply = {"rank": self.monitor.rank, "rail": rail, "action": action, "done": True, "state": state}
        if not_kept:
            reply["warning"] = not_kept
        return 200, reply

    def _remember(self, rail: int, action: str, reason: str | None, by: str | None) -> str:
        """Record (drain, failover) or clear (undrain, restore) the decision; why it could not be
        kept on disk, or ""."""
        store = self.monitor.decisions
        try:
            if action in KINDS:
                store.record(rail, action, reason, by)
            else:
                store.clear(rail, CLEARS[action])
        except OSError as exc:
            why = (f"{action} of rail{rail} done on rank {self.monitor.rank} but not recorded in {store.path} "
                   f"({exc.strerror or exc}): a restart will not {'keep' if action in KINDS else 'end'} it")
            log.error("r2cc: %s", why)
            return why
        return ""

    def stop(self) -> None:
        self.stopped = True
        self.server.shutdown()
        self.server.server_close()
