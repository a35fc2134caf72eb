"""One bench rank: `python -m r2cc_testbed.bench.worker CONFIG.json [--rank R]`.

Runs inside its lab host's namespace (started by `ip netns exec`, or by mpirun through a
wrapper; then the rank comes from OMPI_COMM_WORLD_RANK). It works through the task list in the
config and rewrites its results file (<out_dir>/<launch>-rank<R>.json) after every task, so
the parent keeps whatever finished even if this process is later killed.

Tasks:
  measure   {size}                   fault-free timing + correctness of the op
  baseline  {size, exclude_rail}     r2cc only: the same on a group without that rail
  fault     {size, n, spec, delay_s} one op during which the parent injects the fault,
                                     then `followups` more ops with the fault still active
A faulted op is bit_exact when it equals this backend's own fault-free result (r2cc: and the
canonical rank-order sum). Fault hand-shake through the store: rank 0 sets fault/<n>/req (the delay), every rank waits
for fault/<n>/go and starts the op at once; the parent injects `delay` after go, and clears
the fault when every rank has added 1 to fault/<n>/done, then sets fault/<n>/cleared.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import resource
import statistics
import sys
import threading
import time

import torch

from r2cc_serve import envs
from r2cc_testbed.bench import data
from r2cc_testbed.bench.backends import RailTxCounters, make_backend
from r2cc_testbed.bench.spec import format_size

RECOVERY_WAIT_S = 15.0
SETTLE_S = 1.0  # held faults: rails unchanged this long count as settled


def call_switches(before, after) -> int:
    """How the calling thread left its core during one call: 0 it kept it, 1 it slept (waited in
    the kernel), 2 it was preempted (another thread took the core), 3 both. A tail call with the
    caller preempted was waiting for a CPU, not for the network."""
    return int(after.ru_nvcsw > before.ru_nvcsw) | 2 * int(after.ru_nivcsw > before.ru_nivcsw)


def warm_up(runner, calls: int, min_s: float, rank: int, store, key: str) -> int:
    """`calls` untimed runs, repeated while rank 0 has warmed up for less than min_s; the number
    of runs. Every rank must make the same calls, so after each batch rank 0 says under
    key/<batch> whether another follows (each warm-up needs a key of its own)."""
    start, batch, runs = time.monotonic(), 0, 0
    while True:
        for _ in range(calls):
            runner.reset()
            runner.run()
        runs += calls
        if calls == 0 or min_s <= 0:
            return runs
        if rank == 0:
            store.set(f"{key}/{batch}", "more" if time.monotonic() - start < min_s else "done")
        if bytes(store.get(f"{key}/{batch}")) == b"done":
            return runs
        batch += 1


class Watchdog:
    """Bounds one blocking call: on expiry, record `message` in the results and exit.

    Backends cannot always be interrupted (a hung MPI_Allreduce); the collective calls release
    the GIL, so this thread still runs and can end the process with a recorded reason.
    """

    def __init__(self, on_expire):
        self._on_expire = on_expire
        self._cv = threading.Condition()
        self._deadline, self._message = None, ""
        threading.Thread(target=self._loop, daemon=True).start()

    def arm(self, seconds: float, message: str) -> None:
        with self._cv:
            self._deadline, self._message = time.monotonic() + seconds, message
            self._cv.notify()

    def disarm(self) -> None:
        with self._cv:
            self._deadline = None

    def _loop(self) -> None:
        with self._cv:
            while True:
                if self._deadline is None:
                    self._cv.wait()
                elif time.monotonic() >= self._deadline:
                    self._on_expire(self._message)
                    os._exit(3)
                else:
                    self._cv.wait(self._deadline - time.monotonic())


class Worker:
    def __init__(self, cfg: dict, rank: int):
        self.cfg, self.rank, self.world = cfg, rank, cfg["world"]
        self.rails, self.op, self.backend_name = cfg["rails"], cfg["op"], cfg["backend"]
        self.rail_tx = RailTxCounters(self.rails)
        self.path = os.path.join(cfg["out_dir"], f"{cfg['launch']}-rank{rank}.json")
        self.results = {"rank": rank, "pid": os.getpid(), "tasks": [], "error": None}
        self.save()
        from torch.distributed import PrefixStore, TCPStore
        base = TCPStore(cfg["store_host"], cfg["store_port"], is_master=False, wait_for_workers=False,
                        timeout=datetime.timedelta(seconds=cfg["startup_s"]))
        self.store = PrefixStore(cfg["launch"] + "/", base)
        self.watchdog = Watchdog(self._expired)
        self.p50 = {}  # size -> this rank's fault-free median, for the fault delay
        self.extra = {}  # excluded rail -> r2cc group without it (baselines)
        self.warmups = 0  # measure tasks warmed up so far: names their warm-up's store keys

    # ---- results -----------------------------------------------------------------------
    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.results, f)
        os.replace(tmp, self.path)

    def _expired(self, message: str) -> None:
        tasks = self.results["tasks"]
        if tasks and tasks[-1].get("pending"):
            tasks[-1].update(pending=False, completed=False, error=message)
        else:
            self.results["error"] = message
        self.save()
        self.say(f"watchdog: {message}")

    def say(self, msg: str) -> None:
        if self.rank == 0:
            print(f"[bench] {self.backend_name} {msg}", file=sys.stderr, flush=True)

    # ---- main ----------------------------------------------------------------------------
    def run(self) -> None:
        cfg = self.cfg
        if cfg.get("rail_Bps"):  # read by the communicator's planner at creation
            os.environ["R2CC_RAIL_BPS"] = str(cfg["rail_Bps"])
        self.watchdog.arm(cfg["startup_s"], "group set-up did not finish")
        self.backend = make_backend(self.backend_name, self.rank, self.world, self.store, self.rails,
                                    cfg["timeout_s"])
        self.watchdog.disarm()
        if cfg.get("hold"):
            self.watchdog.arm(cfg["startup_s"], "held faults were not in place in time")
            self.hold_faults()
            self.watchdog.disarm()
        for task in cfg["tasks"]:
            entry = {"kind": task["kind"], "size": task["size"]}
            if task["kind"] == "fault":
                entry.update(n=task["n"], spec=task["spec"]["text"], pending=True, completed=False)
                self.results["tasks"].append(entry)
                self.save()
                if not self.fault(task, entry):
                    break  # the group is broken; nothing more can run
            else:
                entries = {k: dict(entry, exclude_rail=task.get("exclude_rail"), schedule=k)
                           for k in task.get("schedules") or [None]}
                self.results["tasks"] += entries.values()
                self.measure(task, entries)
            self.save()

    def hold_faults(self) -> None:
        """Ask the parent for the held faults, then wait until this rank's rails show them
        (no connection state change for SETTLE_S), so measurements start in the degraded state."""
        if self.rank == 0:
            self.store.set("hold/req", "1")
        self.store.wait(["hold/go"], datetime.timedelta(seconds=self.cfg["startup_s"]))
        self.results["held"] = json.loads(self.store.get("hold/go"))
        for host, rail in self.results["held"].get("drains", []):
            if host == self.rank:
                self.backend.drain(rail)
        if self.cfg.get("hold_traffic_s"):
            self.hold_traffic(self.cfg["hold_traffic_s"])
        time.sleep(SETTLE_S / 2)
        states, since, t0 = None, time.monotonic(), time.monotonic()
        while time.monotonic() - since < SETTLE_S and time.monotonic() - t0 < RECOVERY_WAIT_S:
            now = self.backend.rail_states()
            if now != states:
                states, since = now, time.monotonic()
            time.sleep(0.05)
        self.results["held_states"] = states
        self.say(f"held faults in place: {self.results['held']}")
        self.backend.barrier()

    def hold_traffic(self, seconds: float) -> None:
        """4 MiB all_reduces for `seconds`. Every rank stops after the same call: element 0 of each
        input is 1 on a rank whose time is up, so the sum says when any rank's is."""
        work = torch.zeros(1 << 20)
        t0, calls = time.monotonic(), 0
        while True:
            work.zero_()
            work[0] = float(time.monotonic() - t0 >= seconds)
            self.backend.comm.all_reduce(work)
            calls += 1
            if work[0] > 0:
                break
        self.say(f"held-fault traffic: {calls} all_reduces of 4M in {time.monotonic() - t0:.1f} s; "
                 f"rails now {self.backend.rail_states()}")

    def _group(self, task):
        k = task.get("exclude_rail")
        if k is None:
            return self.backend
        if k not in self.extra:
            for other in self.extra.values():
                other.close()
            self.extra.clear()
            rails = [r for i, r in enumerate(self.rails) if i != k]
            self.extra[k] = make_backend("r2cc", self.rank, self.world, self.store, rails,
                                         self.cfg["timeout_s"], group=f"bench-x{k}")
        return self.extra[k]

    def measure(self, task, entries: dict) -> None:
        """Times the op; with r2cc schedules (entries: schedule -> entry), each schedule once per
        round in rotating order, so they share the machine's drift and noise. Without: one entry
        under key None, on the group's configured path."""
        size, iters, warmup = task["size"], self.cfg["iters"], self.cfg["warmup"]
        label = f"{self.op} {format_size(size)}" + (
            f" without rail{task['exclude_rail']}" if task.get("exclude_rail") is not None else "")
        schedules = list(entries)
        if schedules != [None]:
            label += f" ({', '.join(schedules)} interleaved)"
        at_least = f" (repeated for at least {self.cfg['warmup_s']:g} s)" if self.cfg.get("warmup_s") else ""
        self.say(f"{label}: {warmup} warm-up{at_least} + {iters} timed")
        limit = self.cfg["timeout_s"] * len(schedules)
        self.watchdog.arm(limit, f"{label} did not finish within {limit} s")
        try:
            b = self._group(task)
            use = (lambda k: b.set_schedule(k)) if schedules != [None] else (lambda k: None)
            inp = data.make_input(self.op, self.rank, size, self.world)
            ref = data.reference(self.op, self.rank, size, self.world)
            runner = b.runner(self.op, inp)
            first, last = {}, {}
            # A fresh group's first calls, timed before anything else runs on it (first size only).
            cold = self._time_calls(b, runner, self.cfg.get("first_calls", 0)) if self.warmups == 0 else []
            for k in schedules:
                use(k)
                runner.reset()
                first[k] = data.compare(runner.run(), ref)
                # auto's first calls of a size are its trials (sched/trials.py): warm up past them,
                # so the timed calls run what it kept
                self._warm_up(runner, warmup + (envs.get("R2CC_PLAN_TRIAL_CALLS") if k == "auto" else 0))
            acc = {k: {"times": [], "starts": [], "switches": [], "cpu": 0.0, "tx": [0] * len(self.rails),
                       "resent": 0, "failovers": 0} for k in schedules}
            counts0, chunks0 = b.wait_counts(), b.chunks()
            for i in range(iters):
                for k in schedules[i % len(schedules):] + schedules[:i % len(schedules)]:
                    a = acc[k]
                    use(k)
                    runner.reset()
                    b.barrier()
                    # Read after the barrier, so the rails' shares and r2cc's re-sends are the timed
                    # call's alone; cheaply, and alike for every backend, as a rank slow here
                    # starts the timed call late and its peer's time counts the wait.
                    tx0, (resent0, fo0) = self.rail_tx.read(), b.repairs()
                    a["starts"].append(time.time())
                    ru0 = resource.getrusage(resource.RUSAGE_THREAD)
                    t0, c0 = time.perf_counter(), time.process_time()
                    out = runner.run()
                    a["times"].append(time.perf_counter() - t0)
                    a["switches"].append(call_switches(ru0, resource.getrusage(resource.RUSAGE_THREAD)))
                    # the OS's user + system time of every thread of this rank (library threads too)
                    a["cpu"] += time.process_time() - c0
                    resent1, fo1 = b.repairs()
                    a["tx"] = [x + y - z for x, y, z in zip(a["tx"], self.rail_tx.read(), tx0)]
                    a["resent"] += resent1 - resent0
                    a["failovers"] += fo1 - fo0
                    if i == iters - 1:
                        last[k] = data.compare(out, ref)
            counts = {k: v - counts0[k] for k, v in b.wait_counts().items()}
            chunks = [now - before for now, before in zip(b.chunks(), chunks0)]
            for k, entry in entries.items():
                a = acc[k]
                # r2cc: re-sends or failovers in a fault-free run mean a rail was wrongly declared dead.
                entry.update(resent_bytes=a["resent"], failovers=a["failovers"])
                # r2cc: how the timed iterations' waits and writes went (all schedules together)
                entry.update(counts)
                entry.update(chunk_bytes_sent=chunks[0], chunks_sent=chunks[1])  # r2cc's chunk size
                if a["failovers"]:
                    entry["rail_errors"] = b.rail_errors()
                if cold and k == schedules[0]:
                    entry["first_times"] = cold
                entry.update(times=a["times"], starts=a["starts"], switches=a["switches"], cpu_s=a["cpu"],
                             rail_tx_bytes=a["tx"],
                             bit_exact=first[k][0] and last[k][0], close=first[k][1] and last[k][1],
                             max_err=max(first[k][2], last[k][2]), error=None)
                if k:
                    use(k)
                    entry["plan"] = b.plan_info()
                    entry["plan_ran"] = b.plan_ran(inp)
                if task.get("exclude_rail") is None:  # the first schedule measured times the faults
                    self.p50.setdefault(size, statistics.median(a["times"]))
                self.say(f"{label}: {k or ''} median {statistics.median(a['times']) * 1e3:.2f} ms")
        except Exception as exc:  # recorded; the parent reports the size as failed
            for entry in entries.values():
                entry.update(error=f"{type(exc).__name__}: {exc}")
            # Every rank speaks here: the first rank to fail is the one that explains it.
            print(f"[bench] {self.backend_name} rank {self.rank} {label}: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
        finally:
            self.watchdog.disarm()

    @staticmethod
    def _time_calls(b, runner, calls: int) -> list[float]:
        """Seconds each of `calls` calls took, each started together after a barrier as the timed
        loop's are."""
        times = []
        for _ in range(calls):
            runner.reset()
            b.barrier()
            t0 = time.perf_counter()
            runner.run()
            times.append(time.perf_counter() - t0)
        return times

    def _warm_up(self, runner, calls: int) -> None:
        self.warmups += 1
        warm_up(runner, calls, self.cfg.get("warmup_s", 0.0), self.rank, self.store, f"warm/{self.warmups}")

    def fault(self, task, entry) -> bool:
        """The faulted op; False if the group cannot be used afterwards."""
        size, n, cfg = task["size"], task["n"], self.cfg
        limit = cfg["fault_timeout_s"]
        label = f"{self.op} {format_size(size)} fault {task['spec']['text']}"
        inp = data.make_input(self.op, self.rank, size, self.world)
        ref = data.reference(self.op, self.rank, size, self.world)
        if self.backend_name == "r2cc":
            self.backend.set_schedule(None)  # faulted ops run the configured path (R2CC_SCHEDULE)
        runner = self.backend.runner(self.op, inp)
        self.watchdog.arm(cfg["timeout_s"], f"{label}: warm-up did not finish")
        for _ in range(max(1, cfg["warmup"])):  # also opens lazy connections (MPI)
            runner.reset()
            expected = runner.run().clone()  # this backend's own fault-free result
        runner.reset()
        self.backend.barrier()
        self.watchdog.disarm()
        resent0 = self.backend.resent_bytes()
        states0 = self.backend.rail_states()  # recovered means: back to these (held faults stay)
        rail = task["spec"]["fault"]["rail"]
        detect0 = self.backend.detection(rail) if hasattr(self.backend, "detection") else None
        delay = task.get("delay_s")
        if delay is None:  # r2cc measured it in this run
            delay = task["spec"]["at"] * self.p50.get(size, 0.0)
        if self.rank == 0:
            self.store.set(f"fault/{n}/req", json.dumps({"delay_s": delay}))
        self.store.wait([f"fault/{n}/go"], datetime.timedelta(seconds=cfg["startup_s"]))
        self.say(f"{label}: faulted op (fault at +{delay * 1e3:.1f} ms)")
        ok, out, err = True, None, None
        entry.update(start=time.time())
        for i in range(1 + cfg["followups"]):
            what = "faulted op" if i == 0 else f"follow-up op {i}"
            # A little past the limit, so a backend's own timeout error (gloo) is what gets recorded.
            self.watchdog.arm(limit + 5, f"{what} did not finish within {limit + 5:g} s")
            t0 = time.perf_counter()
            try:
                if i:
                    runner.reset()
                out = runner.run()
            except Exception as exc:
                ok, err = False, f"{what}: {type(exc).__name__}: {exc}"
            finally:
                self.watchdog.disarm()
            if i == 0:
                entry.update(elapsed_s=time.perf_counter() - t0, end=time.time())
                if ok:
                    exact_ref, close, _ = data.compare(out, ref)
                    # r2cc must also equal the canonical rank-order sum; the others their own result.
                    entry.update(bit_exact=torch.equal(out, expected) and (exact_ref or self.backend_name != "r2cc"),
                                 correct=close)
            if not ok:
                break
        if ok:  # the last follow-up must be right too
            entry["bit_exact"] = entry["bit_exact"] and torch.equal(out, expected)
        entry.update(pending=False, completed=ok, error=err,
                     resent_bytes=self.backend.resent_bytes() - resent0)
        if detect0 is not None:
            det = self.backend.detection(rail)
            det["failovers"] -= detect0["failovers"]
            det["states_before"] = detect0["states"]  # a rail already down before the fault is not re-detected
            if not det["failovers"]:  # the rail never failed (e.g. degrade): nothing was detected
                det.update(detect_s=None, rail_error=None)
            entry.update(det)
        self.save()
        self.store.add(f"fault/{n}/done", 1)
        self.say(f"{label}: {'completed' if ok else 'FAILED: ' + str(err)}")
        if not ok or task.get("last", False):
            return ok
        # The parent clears the fault; wait until every rail is back before the next task.
        self.store.wait([f"fault/{n}/cleared"], datetime.timedelta(seconds=limit + 30))
        t0 = time.monotonic()
        while self.backend.rail_states() != states0 and time.monotonic() - t0 < RECOVERY_WAIT_S:
            time.sleep(0.02)
        entry.update(recovered=self.backend.rail_states() == states0, recover_s=time.monotonic() - t0)
        self.watchdog.arm(limit, "barrier after recovery did not finish")
        self.backend.barrier()
        self.watchdog.disarm()
        return True


def _watch_parent(pid: int) -> None:
    """Exit if the bench parent is gone (its clean-up may never come)."""
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(4)
        time.sleep(1.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="r2cc_testbed.bench.worker")
    ap.add_argument("config")
    ap.add_argument("--rank", type=int, default=None)
    args = ap.parse_args(argv)
    with open(args.config) as f:
        cfg = json.load(f)
    rank = args.rank if args.rank is not None else int(os.environ["OMPI_COMM_WORLD_RANK"])
    torch.set_num_threads(1)  # 2 cores shared by every rank: no intra-op thread pools
    # Hard bound on the whole process; dumps every thread's stack on expiry (no GIL needed).
    faulthandler.dump_traceback_later(cfg["deadline_s"], exit=True)
    threading.Thread(target=_watch_parent, args=(cfg["parent_pid"],), daemon=True).start()
    worker = Worker(cfg, rank)
    try:
        worker.run()
    except Exception as exc:
        worker.results["error"] = f"{type(exc).__name__}: {exc}"
        worker.save()
        print(f"[bench] {cfg['backend']} rank {rank}: {worker.results['error']}", file=sys.stderr, flush=True)
    finally:
        sys.stderr.flush()
        # Skip interpreter teardown: a broken gloo/MPI group can block in its destructors.
        if cfg["backend"] == "mpi" and worker.results["error"] is None and \
                all(t.get("completed", True) for t in worker.results["tasks"]):
            from mpi4py import MPI
            MPI.Finalize()  # mpirun reports a rank that exits without it as an error
        elif cfg["backend"] == "r2cc":
            for b in [getattr(worker, "backend", None), *worker.extra.values()]:
                if b is not None:
                    b.close()
    os._exit(0)


if __name__ == "__main__":
    main()
