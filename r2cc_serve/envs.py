"""The one registry of R2CC_* knobs.

Every setting the project reads from the environment is declared here with its
default and a one-line reason. Read them with ``envs.get("R2CC_X")`` (typed) so
that a typo fails loudly instead of silently using a default.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable, NamedTuple

from r2cc_serve.errors import KnobError


@dataclass(frozen=True)
class Knob:
    name: str
    default: object  # the value, or a function of no arguments that works it out (R2CC_STATUS_DIR)
    parse: Callable[[str], object]
    help: str
    transport: str | None = None  # the TransportOptions field (csrc/transport.h) this knob sets

    def default_value(self):
        return self.default() if callable(self.default) else self.default


def _bool(s: str) -> bool:
    return s.strip().lower() in ("1", "true", "yes", "on")


class PortRange(NamedTuple):
    """Ports a listener may take, first to last; (0, 0): any port the kernel picks."""

    first: int
    last: int

    def __str__(self) -> str:  # as written in R2CC_PORT_RANGE
        return f"{self.first}-{self.last}" if self.first else "0"


def _port_range(s: str) -> PortRange:
    s = s.strip()
    if s == "0":
        return PortRange(0, 0)
    m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", s)
    if not m:
        raise ValueError("expected FIRST-LAST, e.g. 29650-29749, or 0 for any free port")
    first, last = int(m[1]), int(m[2])
    if not 1 <= first <= last <= 65535:
        raise ValueError("expected FIRST-LAST with 1 <= FIRST <= LAST <= 65535")
    return PortRange(first, last)


def _default_status_dir() -> str:
    """R2CC_STATUS_DIR when unset: runtime files of this deployment, outside /tmp (see its help)."""
    unit = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]  # systemd's RuntimeDirectory= of the unit
    if unit:
        return os.path.join(unit, "r2cc-status")
    if os.geteuid() == 0:
        return "/run/r2cc/status"
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "r2cc", "status")
    return os.path.join(os.path.expanduser("~"), ".cache", "r2cc", "status")


_KNOBS: dict[str, Knob] = {}


def _knob(name: str, default, parse, help: str, transport: str | None = None) -> None:
    _KNOBS[name] = Knob(name, default, parse, help, transport)


def transport_knobs() -> list[Knob]:
    """The knobs that set a TransportOptions field, in registry order."""
    return [k for k in _KNOBS.values() if k.transport]


# --- transport (passed to the C++ core at communicator creation) -------------
_knob("R2CC_CHUNK_BYTES", 1024 * 1024, int,
      "Largest chunk a message is cut into; one chunk is the unit of striping and re-send. "
      "A bulk message's chunk carries about 8 ms of the slowest rail to its peer (the rail's "
      "connections to all peers together), between R2CC_MIN_CHUNK_BYTES and this: big chunks "
      "cost less CPU per byte on fast rails, small ones keep a slow rail from finishing last.",
      transport="chunk_bytes")
_knob("R2CC_MIN_CHUNK_BYTES", 256 * 1024, int,
      "Smallest chunk of a bulk message: used while a rail to the peer is under a quarter of "
      "its fastest rail or not yet measured (see R2CC_CHUNK_BYTES).",
      transport="min_chunk_bytes")
_knob("R2CC_RAIL_WINDOW_BYTES", 1024 * 1024, int,
      "Most un-acknowledged bytes per rail connection (each holds about 10 ms of its measured "
      "bandwidth, at least one chunk; 4 small chunks while unmeasured); keeps kernel queues "
      "short so failover re-sends little and striping follows bandwidth.",
      transport="window_bytes")
_knob("R2CC_HEARTBEAT_MS", 10, int,
      "An idle rail sends a heartbeat this often so the peer can tell silence from death "
      "(and our kernel has bytes for the peer's to acknowledge). Keep it well under half of "
      "R2CC_RAIL_TIMEOUT_MS: idle-rail detection took 55-65 ms at 5 and 10, up to 88 ms at 15.",
      transport="heartbeat_ms")
_knob("R2CC_RAIL_TIMEOUT_MS", 60, int,
      "A rail whose peer sent nothing and whose peer's kernel acknowledged none of our bytes "
      "for this long is suspect: its chunks move to the other rails. Where the path's own "
      "round trips vary more (busy hosts, deep queues), the bar is twice the kernel's "
      "retransmission estimate (srtt + 4 rttvar) instead, up to R2CC_PEER_SILENCE_MS; "
      "rail_stats() shows each rail's current bar. A silent peer whose kernel still "
      "acknowledges is a stalled process, not a failed rail.",
      transport="rail_timeout_ms")
_knob("R2CC_PEER_SILENCE_MS", 400, int,
      "A suspect rail whose path stays dead this long is failed and reconnected; a peer "
      "process silent this long (its host acknowledging) is reported as stalled.",
      transport="peer_silence_ms")
_knob("R2CC_PROBE_INTERVAL_MS", 200, int,
      "How often a failed rail is probed (reconnect attempt) for re-admission.",
      transport="probe_interval_ms")
_knob("R2CC_FLAP_THRESHOLD", 2.0, float,
      "Flap dampening: each failure of a rail (to one peer) adds 1 to its penalty, which halves "
      "every R2CC_FLAP_HALF_LIFE_S; a failure that brings it to this value holds the rail out "
      "(state held: connected and probed, no new chunks; the peer is told). At 2 the third "
      "failure within about a minute holds and one or two never do, so a single fault is "
      "re-admitted as fast as without dampening (one 1 s down / 2 s up flap costs a failover, "
      "re-sent chunks and a slower step each time). 0: never hold.",
      transport="flap_threshold")
_knob("R2CC_FLAP_HALF_LIFE_S", 60.0, float,
      "Flap dampening: the penalty halves every this many seconds, so failures an hour apart "
      "never add up while a rail failing every few seconds reaches the threshold at once.",
      transport="flap_half_life_s")
_knob("R2CC_FLAP_HOLD_S", 10.0, float,
      "Flap dampening: a held rail returns once it has gone this long without failing (a held "
      "rail keeps its heartbeats, so it keeps being judged, and a failure starts the time "
      "again); each new hold while the penalty is still high doubles it, up to "
      "R2CC_FLAP_HOLD_MAX_S. The rail returns by itself with its path good; POST .../restore "
      "ends a hold at once.",
      transport="hold_s")
_knob("R2CC_FLAP_HOLD_MAX_S", 300.0, float,
      "Flap dampening: the longest quiet time a hold asks for (an optic that keeps flapping on "
      "and off for hours is tried again every 5 minutes).",
      transport="hold_max_s")
_knob("R2CC_ALL_RAILS_DOWN_GRACE_MS", 600, int,
      "A collective waiting on a peer with no healthy rail waits this long for one to come "
      "back, then the group aborts with RailsDownError on every rank. With no collective "
      "waiting, an outage fails nothing and the group heals when a rail returns.",
      transport="all_down_grace_ms")
_knob("R2CC_CONNECT_TIMEOUT_S", 30.0, float,
      "Group set-up: how long to wait for every rail connection.",
      transport="connect_timeout_s")
_knob("R2CC_OP_TIMEOUT_S", 300.0, float,
      "Upper bound for one collective; a wait longer than this aborts the group (with "
      "PeerStalledError naming the rank when a stalled process is why).",
      transport="op_timeout_s")
_knob("R2CC_LOSS_HOLD_PCT", 0.5, float,
      "Lossy rails: a rail whose connection to a peer retransmits this many percentage points "
      "more of its data segments than that peer's best other rail (TCP_INFO, over a window of "
      "at least R2CC_LOSS_MIN_SEGMENTS; retransmissions the peer reported as duplicates lost "
      "nothing and do not count) is held out like a flapping one (state held, reason "
      "'lossy: ...'): a chunk whose last packet is lost waits for a retransmission timeout of "
      "200 ms or more. Healthy rails here retransmit under 0.02%. It stays held while its "
      "heartbeats still show loss, for R2CC_FLAP_HOLD_S doubled per new hold. 0: never.",
      transport="loss_hold_pct")
_knob("R2CC_LOSS_MIN_SEGMENTS", 1000, int,
      "Data segments a loss window must span before a rail is judged lossy (or 10 "
      "retransmissions, whichever comes first; a window also spans at least a second and needs "
      "retransmissions in 3 of its 250 ms samples, so one burst, e.g. a rate cut overflowing the "
      "queue, is not loss): at 1% loss 1000 segments show ~10 retransmissions, a healthy rail's "
      "well under one.",
      transport="loss_min_segments")
_knob("R2CC_WATCHDOG_REALTIME", True, _bool,
      "Run the heartbeat/failure-detection thread with SCHED_FIFO priority (or a lower nice "
      "value without the privilege), so a saturated CPU is not mistaken for a dead rail.",
      transport="watchdog_realtime")
_knob("R2CC_HEDGE_BYTES", 16 * 1024, int,
      "Single-chunk sends up to this size get a second copy on another rail when they are late to be "
      "acknowledged (a spinning waiter's peer 4x later than it usually answers, 50 us to 1 ms; else "
      "1 ms after sending): a message "
      "lost on a silently dead rail then costs that, not the failure detection. 0: off.",
      transport="hedge_bytes")
_knob("R2CC_SPIN_US", 1000, int,
      "A rank waiting for a collective polls its sockets for up to this many microseconds before "
      "it sleeps, while the host has a core to spare (R2CC_SPIN_MAX_CPU_PRESSURE): small messages "
      "then arrive without a wake-up. Spinning also turns itself off while most spins end "
      "without data (a late peer) and one wait in 16 tries again; counters() shows spin_hits, "
      "spin_misses and spin_skips (waits that slept at once because the CPU was wanted). At 100 "
      "a tenth of the 4-64 KiB waits on an idle 2-host lab outlasted the spin and slept (p99 "
      "0.31-0.36 ms); at 1000 under 1% did (p99 0.16-0.23 ms, Open MPI's 0.21-0.22). "
      "0: never spin.",
      transport="spin_us")
_knob("R2CC_SPIN_MAX_CPU_PRESSURE", 0.10, float,
      "Spin for R2CC_SPIN_US only while the host's CPU pressure (/proc/pressure/cpu: the share of "
      "time some runnable thread waited for a core, over about a second; at start the kernel's "
      "last 10 s) is below this, so a spin never holds a core that a model worker or another rank "
      "wants. Above it a wait polls for at most 50 us, and only while such brief polls get their "
      "bytes (a sleep costs those a 50-80 us wake-up); else it sleeps at once. An idle host's "
      "pressure is near 0; the 2-core lab serving a model sits far above 0.1. 1: spin whatever "
      "the load; without PSI in the kernel a rank spins in full only at 1.",
      transport="spin_max_cpu_pressure")
_knob("R2CC_PORT_RANGE", PortRange(29650, 29749), _port_range,
      "Ports r2cc listens on, FIRST-LAST: each rail listener of a rank and its control agent take the "
      "first free port of the range, so a firewall can name them and several ranks (or deployments) on "
      "a host each get their own; a rank needs one per rail address and one on its agent's address. The "
      "default misses vLLM's ports (8000, 29500-29501, 29550, 29600) and Linux's ephemeral 32768-60999. "
      "Open it on the rail networks and, for the agents, from the admin API's host. 0: any free port "
      "the kernel picks (ephemeral: no firewall rule can name it).",
      transport="port_range")
_knob("R2CC_SMALL_MSG_BYTES", 64 * 1024, int,
      "Sends up to this size are copied and complete at once (kept until acknowledged).",
      transport="small_msg_bytes")
_knob("R2CC_PIPELINE_BYTES", 4 * 1024 * 1024, int,
      "all_reduce slice size: reduction of one slice overlaps the transfer of the next.")
_knob("R2CC_ALLREDUCE_ONE_SHOT_BYTES", 32 * 1024, int,
      "all_reduce of at most this many bytes in a group of 3 or more ranks: one exchange of whole "
      "inputs (half the message delays of reduce-scatter + all-gather). Must be equal on every rank.")
_knob("R2CC_PAIR_ONE_SHOT_BYTES", 512 * 1024, int,
      "The same cut-off for a group of two ranks, where one exchange sends no more bytes than "
      "reduce-scatter + all-gather: it saves a message delay and reduces the whole vector instead "
      "of half (2 hosts x 4 rails: 15-25% faster from 128 KiB to 512 KiB, even at 1 MiB, 15% "
      "slower at 2 MiB). Must be equal on every rank.")

# --- schedules (r2cc_serve/sched/: planner, plans, the C++ plan executor) ------------
_knob("R2CC_SCHEDULE", "auto", str,
      "all_reduce schedule: auto (the planner picks from size and every rank's bandwidth: "
      "OptCC when a host lost rails; with 2 ranks it keeps builtin, which nothing beats there), "
      "builtin (the fixed C++ path: one-shot up to R2CC_ALLREDUCE_ONE_SHOT_BYTES, else direct), "
      "or a forced plan: direct, one_shot, optcc (ring and r2ccl only beyond 16 ranks: partial "
      "sums change the bits). Every schedule gives the same bits. Must be equal on every rank.")
_knob("R2CC_BANDWIDTH_TABLE", "", str,
      "Fixed per-rank bandwidth for auto/optcc, comma-separated (fractions or bytes/s, e.g. "
      "1,1,1,0.5), equal on every rank; replaces the in-band exchange of healthy rails (tests, "
      "known topologies). Empty: the ranks exchange what they measure.")
_knob("R2CC_RAIL_BPS", 1.25e9, float,
      "Nominal bytes/s of one rail. A rank's capacity for the planner is this times its healthy "
      "rails; schedule shares depend only on the ratios, the size cut-offs on the absolute value.")
_knob("R2CC_PLAN_ALPHA_S", 80e-6, float,
      "Planner cost model: seconds of one message delay on the critical path (a 4 KiB "
      "all_reduce on loopback takes ~80-90 us here); sets where one_shot gives way to direct.")
_knob("R2CC_PLAN_MSG_OVERHEAD_S", 20e-6, float,
      "Planner cost model: seconds each message costs the busiest rank (posting, framing, "
      "acks, wake-ups); limits how many micro-chunks optcc cuts a vector into.")
_knob("R2CC_PLAN_TRIAL_CALLS", 6, int,
      "auto: where the cost model prefers a plan to the built-in path's choice, this many calls "
      "of that size alternate the two and the ranks keep the faster by their clocks (the model "
      "cannot see busy CPUs). Even; 0 trusts the model.")
_knob("R2CC_PLAN_REFRESH_CALLS", 256, int,
      "auto/optcc: the ranks re-exchange their bandwidth (one 8-byte all_gather) once this many "
      "all_reduces ran on the current table, so a rail failure re-plans within that many calls.")
_knob("R2CC_PLAN_REFRESH_BYTES", 16 * 1024 * 1024, int,
      "auto/optcc: ... or once this many all_reduce bytes ran on it (a call this large "
      "re-exchanges every time: the exchange is noise beside the transfer).")

# --- vLLM integration ------------------------------------------------------------
_knob("R2CC_DISTRIBUTED_BACKEND", "default", str,
      "Set by `vllm serve --distributed-backend r2cc` (inherited by engine and workers); "
      "'r2cc' routes tensor-parallel collectives through r2cc.")
_knob("R2CC_CONFIG", "", str, "YAML file with the rail map (see configs/rails-lab.yaml).")
_knob("R2CC_RAILS", "", str, "Comma-separated rails of every rank (interface names or IPv4); overrides the YAML.")
_knob("R2CC_NETNS", "", str,
      "Namespace holding a rank's rails; {rank} and {node} are filled in (e.g. r2cc-h{rank}).")
_knob("R2CC_FALLBACK_RAILS", "", str,
      "Comma-separated fallback rails (e.g. mgmt0) used only when every rail to a peer is down.")
_knob("R2CC_FT_AUTO_RETRY", True, _bool,
      "With `vllm serve --enable-fault-tolerance`: after an r2cc group gives up (every rail to a "
      "peer down past R2CC_ALL_RAILS_DOWN_GRACE_MS), r2cc itself sends vLLM's `retry` until a "
      "rail is back and the group re-forms. Off: only an operator's POST /fault_tolerance/apply "
      "{\"instruction\": \"retry\"} resumes the engine (before vLLM's engine_recovery_timeout_sec).")
_knob("R2CC_FT_RETRY_INTERVAL_S", 0.5, float,
      "Pause between two automatic retries while the rails are still down.")
_knob("R2CC_STEP_SHARE_DIR", "", str,
      "Measuring only (serve-bench sets it): each vLLM worker times its steps and the collectives "
      "inside them, for any backend, and writes the totals to <dir>/rank<R>.json (r2cc_serve/vllm/"
      "step_share.py; its clocks cost 3-11 us per collective call here, under 0.5% of a decode step). "
      "Empty (default): nothing is timed.")
_knob("R2CC_FT_REFORM_TIMEOUT_S", 3.0, float,
      "One retry's bound for re-forming a group: the ranks meeting in the store, then at least "
      "one rail to every peer connecting. A retry that runs out leaves the engine unhealthy.")

# --- health and control ----------------------------------------------------------
_knob("R2CC_CONTROL", True, _bool,
      "Each communicator runs a control agent (rail state, drain/failover) and writes a status file.")
_knob("R2CC_STATUS_DIR", _default_status_dir, str,
      "Where each rank writes <group>-rank<r>.json (state, counters, events, its agent's address and "
      "token), read by `r2cc admin` on the host. Default: $RUNTIME_DIRECTORY/r2cc-status in a systemd "
      "unit with RuntimeDirectory= (one per unit: per deployment, removed when it stops), else "
      "/run/r2cc/status for root, $XDG_RUNTIME_DIR/r2cc/status, or ~/.cache/r2cc/status. Not /tmp: "
      "systemd's PrivateTmp hides it from `r2cc admin` and every deployment on the host shares it. Two "
      "deployments on one host outside such units need one each (equal group names overwrite each "
      "other's files).")
_knob("R2CC_STATE_DIR", "", str,
      "Where each host keeps the drains and failovers operators made through the admin API "
      "(<group>@<host>.json, with reason, token fingerprint and time), so that a restarted group "
      "comes up with the same rails out of service. Empty (default): kept in memory only, since "
      "groups with the same name (tests, a second deployment) must not inherit each other's "
      "drains. To turn it on, set it on every host to a directory that outlives the process, "
      "e.g. /var/lib/r2cc, one per deployment.")
_knob("R2CC_CONTROL_HOST", "", str,
      "Address the control agent binds to; empty = VLLM_HOST_IP if set, else 127.0.0.1.")
_knob("R2CC_HOST_LABEL", "", str,
      "Name of this rank's host in the admin API; default: its rail namespace, else node<N>/rank<R>.")
_knob("R2CC_ADMIN_TOKEN", "", str, "Bearer token the admin API requires for mutations (drain, failover...).")
_knob("R2CC_ADMIN_TOKEN_FILE", "", str, "File holding the admin token (used when R2CC_ADMIN_TOKEN is empty).")
_knob("R2CC_ADMIN_READ_TOKEN", "", str, "Bearer token the admin API requires for reads (rails, health, events, "
      "plan; vLLM's --api-key and R2CC_ADMIN_TOKEN are taken too); empty, and no --api-key: reads are open.")
_knob("R2CC_ADMIN_REFRESH_MS", 200, int, "How often the admin API refreshes its view of every rank's rails.")
_knob("R2CC_API_SERVER_NICE", -10, int, "Nice value for vLLM's API server process with the r2cc backend, so admin "
      "reads and /health do not wait behind busy workers for a CPU (0: leave the priority alone).")
_knob("R2CC_CONTROL_NICE", -10, int, "Nice value of each rank's control agent and rail monitor threads, so an "
      "operator's drain or read does not wait behind the model for a CPU (0: leave them alone).")
_knob("R2CC_MONITOR_INTERVAL_MS", 100, int,
      "How often each rank's rails' states are checked for its monitor (a cheap check, made by the "
      "transport's watchdog passes; a full sample for events and the status file follows when a state changed).")
_knob("R2CC_STATUS_REFRESH_MS", 1000, int,
      "A status file is rewritten at once when a rail's or peer's state, an event, an error or a "
      "decision changes; otherwise (counters, byte totals) at most this often, and the monitor samples "
      "in full no more often than this unless something changed.")

# --- lab ----------------------------------------------------------------------
_knob("R2CC_LAB_PREFIX", "r2cc", str,
      "Prefix of lab namespaces and interfaces (hosts are <prefix>-h0, <prefix>-h1, ...).")
_knob("R2CC_LAB_STATE", "/run/r2cc-lab/state.json", str,
      "Where the lab records what it built, for status/fault/down (unset: "
      "/run/r2cc-lab/<prefix>-state.json for a prefix other than r2cc).")

# --- emulated RDMA guest (r2cc lab guest) --------------------------------------
_knob("R2CC_GUEST_CACHE", "/var/cache/r2cc-guest", str,
      "Where `r2cc lab guest build` keeps the guest's kernel, initramfs and portable C++ core.")
_knob("R2CC_MARCH", "native", str,
      "-march the C++ core is compiled for (setup.py reads it; the emulated guest's copy uses "
      "x86-64-v3, which qemu's TCG runs, where the host's native build may not).")

# --- logging ------------------------------------------------------------------
_knob("R2CC_LOG_LEVEL", "WARNING", str, "Python log level of r2cc_serve loggers.")


def get(name: str):
    """Typed value of knob ``name`` (environment if set, else its default)."""
    knob = _KNOBS.get(name)
    if knob is None:
        raise KeyError(f"unknown r2cc knob {name!r}; declare it in r2cc_serve/envs.py")
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return knob.default_value()
    try:
        return knob.parse(raw)
    except ValueError as exc:
        raise KnobError(
            f"{name}={raw!r} is not valid ({exc}); unset it or see `r2cc knobs` for the expected form"
        ) from None


def all_knobs() -> list[Knob]:
    return list(_KNOBS.values())
