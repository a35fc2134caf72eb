"""The one fault model: every kind of fault and admin action, its text forms, and schedules.

Kinds, each acting on one host's end of one rail unless said otherwise:
  down, up             the rail's link goes down / comes back (a dead NIC or cable)
  blackhole            every packet on the rail is dropped, the link stays up (a dead switch port)
  degrade RATE         the rail is shaped down to RATE, e.g. 100mbit
  lossy PCT            PCT% of the rail's packets, each way, are dropped at random (a gray failure:
                       a dirty optic, a bad cable), e.g. lossy 1 or lossy 0.5
  gray [DIR] [BYTES]   every IP packet longer than BYTES (default 1000) is dropped, small ones
                       pass (a gray failure: an MTU mismatch after maintenance, a policer), e.g.
                       gray, gray out, gray in 600
  marginal PCT [DIR]   PCT% of the IP packets longer than 1000 bytes are dropped at random (a
                       marginal optic, whose errors grow with frame length), e.g. marginal 90 out
  flap [PERIOD_MS COUNT]  link down/up COUNT times, PERIOD_MS per cycle (default 400 and 8)
  clear                undo every lab fault on the rail
  all-down             every data rail of the host down: only the mgmt fallback is left
  drain, undrain, failover, restore   operator actions through r2cc's control plane

DIR says which way across the host's end of the rail: both (the default), out (what the host
sends to its peer on that rail) or in (what arrives at the host on it).

Text forms, all read by one parser:
  words     `r2cc lab fault h0 1 degrade 100mbit`   ->  ["degrade", "100mbit"] + host, rail
  notation  h<HOST>:<RAIL>:<KIND>[:ARGS], e.g. h0:1:down, h0:3:flap:200:3, h0:1:lossy:1,
            h0:1:gray:in:600, h0:1:marginal:90:out, h1:2:drain, h0:all-down
A FaultSchedule is a list of {at: SECONDS, do: NOTATION} entries (as read from YAML).

This module is pure (no lab, no processes): bad input fails before anything is built. The lab
(lab/lab.py) injects lab kinds, serving/fault_experiment.py holds one fault during a load, the bench
(bench/spec.py) places one at a fraction of an op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Iterator

from r2cc_serve.admin.actions import ACTIONS, HOST_INDEX, RAIL_INDEX
from r2cc_serve.errors import UserError
from r2cc_serve.util.rates import check_rate
from r2cc_testbed.faults.timing import split_timing

# what `r2cc lab fault` and Lab.fault take
LAB_KINDS = ("down", "up", "blackhole", "clear", "degrade", "flap", "lossy", "gray", "marginal")
REPAIRS = ("up", "clear")
RAIL_FAULTS = tuple(k for k in LAB_KINDS if k not in REPAIRS)  # break one rail: what `r2cc bench` injects
HOST_FAULTS = ("all-down",)
ADMIN_ACTIONS = tuple(ACTIONS)  # the admin API's, as `r2cc rails ACTION` gives them
KINDS = LAB_KINDS + HOST_FAULTS + ADMIN_ACTIONS

# What ends a fault or action on its rail; the keys are the kinds a run can hold for a while.
_UNDO = {**{k: "clear" for k in RAIL_FAULTS + HOST_FAULTS}, "drain": "undrain", "failover": "restore"}
HELD_KINDS = tuple(_UNDO)
# Rail faults a run can keep in place for as long as it likes (a flap ends by itself): a host
# made a straggler for a whole benchmark (`r2cc bench --hold-fault`, `r2cc serve-prefill --fault`).
STEADY_RAIL_FAULTS = ("down", "blackhole", "degrade", "lossy", "gray", "marginal")

FLAP_DEFAULTS = (400, 8)  # period_ms, count: a bad cable, long enough to be seen under load
_ARG_COUNTS = {"degrade": (1,), "flap": (0, 2), "lossy": (1,), "gray": (0, 1, 2), "marginal": (1, 2)}
LOSS_STEP_PCT = 0.1  # nftables draws a number in 0..999 per packet: losses come in tenths of a percent
SIZE_FAULTS = ("gray", "marginal")  # drop IP packets by their length, in a direction
DIRECTIONS = ("both", "out", "in")  # which way across the host's end of the rail
LARGE_PACKET_BYTES = 1000  # gray's default BYTES, and what marginal counts as a large packet
PACKET_BYTES_RANGE = (68, 65535)  # gray's BYTES: IPv4's smallest MTU to its largest packet
_FORMS = {"gray": "gray [both|out|in] [BYTES], e.g. gray out 600",
          "marginal": "marginal PCT [both|out|in], e.g. marginal 90 out"}
_USAGE = {"degrade": "one argument, RATE (e.g. 100mbit)",
          "lossy": "one argument, PCT: the share of packets dropped, e.g. 1 or 0.5 (percent)",
          "flap": "PERIOD_MS and COUNT (e.g. 200 and 3), or none for {} and {}".format(*FLAP_DEFAULTS),
          "gray": "at most DIR and BYTES: " + _FORMS["gray"],
          "marginal": "PCT and at most DIR: " + _FORMS["marginal"]}
# h<HOST>:<RAIL> read as the admin actions of `r2cc rails` read it, then the kind and its arguments.
_NOTATION = re.compile(rf"^{HOST_INDEX}:(?:{RAIL_INDEX}:)?([a-z][a-z-]*)((?::[^:]+)*)$")
NOTATION_HELP = ("use h<HOST>:<RAIL>:<KIND>[:ARGS], e.g. h0:1:down, h0:1:degrade:100mbit, "
                 "h0:1:flap:200:3, h0:1:lossy:1, h0:1:gray:out:600, h0:1:marginal:90, h1:2:drain, "
                 "or h<HOST>:all-down")


@dataclass(frozen=True)
class FaultSpec:
    """One fault or admin action: what, on which host's rail, and (when a run times it) when.

    Validated on construction, so every FaultSpec is one the lab or the control plane can act on.
    """
    kind: str
    host: int = 0
    rail: int | None = None         # None for host faults (all-down), which ignore a rail given
    rate: str | None = None         # degrade: the rail's new rate
    loss_pct: float | None = None   # lossy, marginal: percent of packets dropped
    direction: str | None = None    # gray, marginal: both (default), out or in
    max_bytes: int | None = None    # gray: the longest IP packet that passes (default 1000); marginal: 1000
    period_ms: int | None = None    # flap: one down+up cycle (default 400)
    count: int | None = None        # flap: cycles (default 8)
    after_s: float | None = None    # seconds into a run: a schedule's `at`, a serving run's injection
    hold_s: float | None = None     # a serving run undoes the fault this many seconds later

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"unknown fault kind {self.kind!r}: use one of {', '.join(KINDS)}")
        _check_index("host", self.host)
        if self.kind in HOST_FAULTS:
            object.__setattr__(self, "rail", None)
        elif self.rail is None:
            raise UserError(f"{self.kind} needs a rail")
        else:
            _check_index("rail", self.rail)
        self._check_arguments()
        for name in ("after_s", "hold_s"):
            if getattr(self, name) is not None:
                _check_seconds(name, getattr(self, name))

    def _check_arguments(self) -> None:
        if self.kind == "degrade":
            if self.rate is None:
                raise UserError("degrade needs a rate, e.g. degrade 100mbit")
            object.__setattr__(self, "rate", check_rate(self.rate))
        elif self.rate is not None:
            raise UserError(f"{self.kind} takes no rate, got {self.rate!r}")
        if self.kind in ("lossy", "marginal"):
            object.__setattr__(self, "loss_pct", _check_loss(self.loss_pct, self.kind))
        elif self.loss_pct is not None:
            raise UserError(f"{self.kind} takes no loss percentage, got {self.loss_pct!r}")
        self._check_size_arguments()
        if self.kind != "flap":
            if (self.period_ms, self.count) != (None, None):
                raise UserError(f"{self.kind} takes no flap period or count")
            return
        period_ms = FLAP_DEFAULTS[0] if self.period_ms is None else self.period_ms
        count = FLAP_DEFAULTS[1] if self.count is None else self.count
        if not (_is_int(period_ms) and _is_int(count) and period_ms >= 2 and count >= 1):
            raise UserError(f"flap needs whole numbers PERIOD_MS >= 2 and COUNT >= 1, got {period_ms!r} and {count!r}")
        object.__setattr__(self, "period_ms", period_ms)
        object.__setattr__(self, "count", count)

    def _check_size_arguments(self) -> None:
        """gray and marginal: a direction, and the size above which packets are dropped."""
        if self.kind not in SIZE_FAULTS:
            if (self.direction, self.max_bytes) != (None, None):
                raise UserError(f"{self.kind} takes no direction or packet size")
            return
        direction = "both" if self.direction is None else self.direction
        if direction not in DIRECTIONS:
            raise UserError(f"{self.kind} direction {direction!r} is not valid: use both, out or in "
                            f"({_FORMS[self.kind]})")
        object.__setattr__(self, "direction", direction)
        size = LARGE_PACKET_BYTES if self.max_bytes is None else self.max_bytes
        if self.kind == "marginal" and size != LARGE_PACKET_BYTES:
            raise UserError(f"marginal drops among packets longer than {LARGE_PACKET_BYTES} bytes, "
                            f"got {size!r}: use gray for another size")
        low, high = PACKET_BYTES_RANGE
        if not (_is_int(size) and low <= size <= high):
            raise UserError(f"gray BYTES {size!r} is not valid: use a whole number of bytes from {low} to {high}, "
                            f"the longest IP packet that passes ({_FORMS['gray']})")
        object.__setattr__(self, "max_bytes", size)

    # --- what it does -------------------------------------------------------------------------

    @property
    def is_admin(self) -> bool:
        """An operator action through r2cc's control plane rather than a change to the lab."""
        return self.kind in ADMIN_ACTIONS

    @property
    def duration_s(self) -> float:
        """How long carrying it out takes: a flap's cycles, 0 for everything else."""
        return self.period_ms * self.count / 1000 if self.kind == "flap" else 0.0

    def target_rails(self, lab_rails: int) -> list[int]:
        return list(range(lab_rails)) if self.rail is None else [self.rail]

    def per_rail(self, lab_rails: int) -> list["FaultSpec"]:
        """The one-rail specs this one is made of: all-down is down on every data rail."""
        if self.kind == "all-down":
            return [FaultSpec("down", self.host, k) for k in range(lab_rails)]
        return [self]

    def undo(self, lab_rails: int) -> list["FaultSpec"]:
        """The one-rail specs that end this fault or action ([] for those that end nothing: up, clear...)."""
        if self.kind not in _UNDO:
            return []
        return [FaultSpec(_UNDO[self.kind], s.host, s.rail) for s in self.per_rail(lab_rails)]

    def check_hold(self) -> "FaultSpec":
        """UserError if +FOR is given to a fault nothing undoes later (a flap ends by itself; up, clear...)."""
        if self.hold_s is not None and (self.kind == "flap" or not self.undo(1)):
            raise UserError(f"{self.kind} is not undone later: leave out +{self.hold_s:g}s")
        return self

    def check_target(self, hosts: int, rails: int) -> "FaultSpec":
        """UserError unless host and rail exist in a lab of hosts x rails."""
        if self.host >= hosts:
            raise UserError(f"host {self.host} is outside the lab's hosts 0..{hosts - 1}")
        if self.rail is not None and self.rail >= rails:
            raise UserError(f"rail {self.rail} is outside the lab's rails 0..{rails - 1}")
        return self

    # --- how it reads ---------------------------------------------------------------------------

    @property
    def action(self) -> str:
        """'down', 'degrade 100mbit', 'flap 400ms x8'."""
        if self.kind == "degrade":
            return f"degrade {self.rate}"
        if self.kind == "lossy":
            return f"lossy {self.loss_pct:g}%"
        if self.kind in SIZE_FAULTS:  # 'gray out >600 B', 'marginal 90% both ways >1000 B'
            way = "both ways" if self.direction == "both" else self.direction
            share = f" {self.loss_pct:g}%" if self.kind == "marginal" else ""
            return f"{self.kind}{share} {way} >{self.max_bytes} B"
        if self.kind == "flap":
            return f"flap {self.period_ms}ms x{self.count}"
        return self.kind

    def _size_args(self) -> list:
        """gray's DIR and BYTES, marginal's DIR, defaults left off the end (h0:1:gray, h0:1:gray:out)."""
        args = [self.direction, self.max_bytes] if self.kind == "gray" else [self.direction]
        defaults = ["both", LARGE_PACKET_BYTES]
        while args and args[-1] == defaults[len(args) - 1]:
            args.pop()
        return args

    @property
    def target(self) -> str:
        return f"h{self.host} " + ("all rails" if self.rail is None else f"rail{self.rail}")

    @property
    def text(self) -> str:
        """For people: 'flap 400ms x8 on h0 rail3 after 2 s for 4 s'."""
        when = "" if self.after_s is None else f" after {self.after_s:g} s"
        held = "" if self.hold_s is None else f" for {self.hold_s:g} s"
        return f"{self.action} on {self.target}{when}{held}"

    @property
    def notation(self) -> str:
        """The text form parse_fault_text reads back: 'h0:3:flap:400:8', 'h0:all-down'."""
        pct = f"{self.loss_pct:g}" if self.loss_pct is not None else None
        args = {"degrade": [self.rate], "flap": [self.period_ms, self.count], "lossy": [pct],
                "gray": self._size_args(), "marginal": [pct, *self._size_args()]}.get(self.kind, [])
        rail = [] if self.rail is None else [self.rail]
        return ":".join(str(x) for x in [f"h{self.host}", *rail, self.kind, *args])


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # YAML's true is no index


def _check_index(name: str, value) -> None:
    if not _is_int(value) or value < 0:
        raise UserError(f"{name} must be a whole number >= 0, got {value!r}")


def _check_loss(pct, kind: str) -> float:
    """A loss percentage in (0, 100], in steps of LOSS_STEP_PCT."""
    try:
        value = float(str(pct).rstrip("%")) if not isinstance(pct, bool) else math.nan
    except ValueError:
        value = math.nan
    if not 0 < value <= 100:
        raise UserError(f"{kind} needs a percentage above 0 and at most 100 ({_FORMS.get(kind, 'e.g. 1 or 0.5')}), "
                        f"got {pct!r}")
    steps = round(value / LOSS_STEP_PCT)
    if steps < 1 or abs(steps * LOSS_STEP_PCT - value) > 1e-9:
        raise UserError(f"{kind} {value:g}%: use steps of {LOSS_STEP_PCT:g}% (the lab drops by a draw in 0..999)")
    return steps * LOSS_STEP_PCT


def _check_seconds(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise UserError(f"{name} must be a number of seconds >= 0, got {value!r}")


# --- parsing -------------------------------------------------------------------------------------

@contextlib.contextmanager
def labelled(label: str) -> Iterator[None]:
    """Say where a UserError raised inside came from: '<label>: <message>'."""
    try:
        yield
    except UserError as exc:
        raise UserError(f"{label}: {exc}") from None


def parse_fault_words(words: list[str], host: int, rail: int | None, kinds: tuple[str, ...] = KINDS) -> FaultSpec:
    """[KIND, *ARGS] on host's rail, e.g. ['degrade', '100mbit'] or ['flap', '200', '3']."""
    if not words or not words[0]:
        raise UserError(f"no fault kind given: use one of {', '.join(kinds)}")
    kind, args = words[0], list(words[1:])
    if kind not in kinds:
        problem = f"unknown fault kind {kind!r}" if kind not in KINDS else f"{kind!r} cannot be used here"
        raise UserError(f"{problem}: use one of {', '.join(kinds)}")
    if len(args) not in _ARG_COUNTS.get(kind, (0,)):
        raise UserError(f"{kind} takes {_USAGE.get(kind, 'no arguments')}, got {len(args)}")
    if kind == "degrade":
        return FaultSpec(kind, host, rail, rate=args[0])
    if kind == "lossy":
        return FaultSpec(kind, host, rail, loss_pct=args[0])
    if kind == "marginal":
        return FaultSpec(kind, host, rail, loss_pct=args[0], direction=(args[1:] or [None])[0])
    if kind == "gray":
        return _gray_from_words(args, host, rail)
    if kind == "flap" and args:
        try:
            period_ms, count = (int(a) for a in args)
        except ValueError:
            raise UserError(f"flap needs whole numbers PERIOD_MS and COUNT, got {' '.join(args)!r}") from None
        return FaultSpec(kind, host, rail, period_ms=period_ms, count=count)
    return FaultSpec(kind, host, rail)


def _gray_from_words(args: list[str], host: int, rail: int | None) -> FaultSpec:
    """gray [DIR] [BYTES]: one argument is BYTES when it is a number, else DIR."""
    if len(args) == 1 and re.fullmatch(r"[-+]?\d+", args[0]):
        args = ["both", *args]
    direction, size = (args + [None, None])[:2]
    if size is not None:
        size = int(size) if re.fullmatch(r"[-+]?\d+", size) else size
    return FaultSpec("gray", host, rail, direction=direction, max_bytes=size)


@dataclass(frozen=True)
class TimedFault:
    """A fault as one piece of text gave it. spec.after_s and spec.hold_s are @seconds and +FOR
    (None when left out); share is @N% as a fraction (None unless given)."""
    text: str
    spec: FaultSpec
    share: float | None = None

    def with_defaults(self, after_s: float | None, hold_s: float | None) -> FaultSpec:
        """The spec with the command's own @ and + filled in where the text left them out."""
        s = self.spec
        return dataclasses.replace(s, after_s=after_s if s.after_s is None else s.after_s,
                                   hold_s=hold_s if s.hold_s is None else s.hold_s)


def parse_timed(text: str, kinds: tuple[str, ...] = KINDS, *, at: str = "seconds", hold: bool = True,
                label: str | None = None) -> TimedFault:
    """One fault in the notation with its time, h<HOST>:<RAIL>:<KIND>[:ARGS][@WHEN][+FOR] (timing.py
    says what at and hold allow)."""
    text = str(text).strip()
    with labelled(label or f"fault {text!r}"):
        t = split_timing(text, at, hold)
        spec = dataclasses.replace(parse_fault_text(t.fault, kinds), after_s=t.after_s, hold_s=t.hold_s)
        return TimedFault(text, spec, t.share)


def parse_fault_text(text: str, kinds: tuple[str, ...] = KINDS) -> FaultSpec:
    """The notation: 'h0:1:down', 'h1:rail2:blackhole', 'h0:1:degrade:100mbit', 'h0:all-down'."""
    m = _NOTATION.match(str(text).strip())
    if not m:
        raise UserError(f"not valid: {NOTATION_HELP}")
    host, rail, kind = int(m.group(1)), m.group(2), m.group(3)
    if rail is None and kind not in HOST_FAULTS:
        raise UserError(f"{kind} needs a rail: h{host}:<RAIL>:{kind}")
    return parse_fault_words([kind, *m.group(4).split(":")[1:]], host, None if rail is None else int(rail), kinds)


# --- schedules -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class FaultSchedule:
    """Timed faults and admin actions of one run, in time order (each entry's after_s is its `at`)."""
    entries: tuple[FaultSpec, ...] = ()

    @classmethod
    def parse(cls, entries, source: str = "fault schedule") -> "FaultSchedule":
        """From a list whose entries are {at: SECONDS, do: NOTATION}, e.g. {"at": 10, "do": "h0:1:down"},
        or the notation with its time, e.g. "h0:1:down@10s" or "h0:1:lossy:5%@10s+20s" (check()
        adds the undo a +FOR asks for)."""
        if not isinstance(entries, list):
            raise UserError(f"{source}: expected a list of entries like h0:1:down@10s or "
                            f"{{at: SECONDS, do: FAULT}}, got {type(entries).__name__}")
        parsed: list[FaultSpec] = []
        for n, entry in enumerate(entries, 1):
            with labelled(f"{source} entry {n}"):
                spec = _parse_entry(entry)
                if parsed and spec.after_s < parsed[-1].after_s:
                    raise UserError(f"at {spec.after_s:g} s comes before entry {n - 1}'s "
                                    f"{parsed[-1].after_s:g} s: list the entries in time order")
            parsed.append(spec)
        return cls(tuple(parsed))

    def check(self, hosts: int, rails: int, source: str = "fault schedule") -> "FaultSchedule":
        """UserError naming the first entry whose host or rail is outside a lab of hosts x rails.
        Returns the schedule to run: an entry held for +FOR seconds is followed by its undo then."""
        for n, spec in enumerate(self.entries, 1):
            with labelled(f"{source} entry {n} ({spec.notation})"):
                spec.check_target(hosts, rails)
        if all(s.hold_s is None for s in self.entries):
            return self
        timed = []
        for n, spec in enumerate(self.entries):
            timed.append((spec.after_s, n, dataclasses.replace(spec, hold_s=None)))
            if spec.hold_s is not None:
                end = spec.after_s + spec.hold_s
                timed += [(end, n, dataclasses.replace(u, after_s=end)) for u in spec.undo(rails)]
        return FaultSchedule(tuple(s for _, _, s in sorted(timed, key=lambda t: t[:2])))

    def describe(self) -> list[str]:
        return [f"at {s.after_s:g} s: {s.action} on {s.target}" for s in self.entries]

    def to_list(self) -> list[dict]:
        """The form parse reads back (e.g. to write into a report)."""
        return [{"at": s.after_s, "do": s.notation} for s in self.entries]


def _parse_entry(entry) -> FaultSpec:
    if isinstance(entry, str):
        spec = parse_timed(entry, label=f"{entry.strip()!r}").spec
        with labelled(f"{entry.strip()!r}"):
            if spec.after_s is None:
                raise UserError("a schedule needs the time of each fault: add @SECONDS, e.g. h0:1:down@10s")
            spec.check_hold()
        return spec
    if not isinstance(entry, dict):
        raise UserError(f"expected NOTATION@SECONDS[+SECONDS] or {{at: SECONDS, do: FAULT}}, got {entry!r}")
    missing = [k for k in ("at", "do") if k not in entry]
    unknown = sorted(str(k) for k in entry if k not in ("at", "do"))
    if missing or unknown:
        problems = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unknown key(s) {', '.join(unknown)}"] if unknown else [])
        raise UserError(f"{'; '.join(problems)}: an entry is {{at: SECONDS, do: FAULT}}")
    at, do = entry["at"], entry["do"]
    _check_seconds("at", at)
    with labelled(f"at {at:g} s, do {do!r}"):
        if not isinstance(do, str):
            raise UserError(f"expected a fault or admin action as text: {NOTATION_HELP}")
        if "@" in do or "+" in do:
            raise UserError(f"`at` already gives the time: write the entry as {{at: {at:g}, do: "
                            f"{do.split('@')[0].split('+')[0]}}} or as one string, {do.split('@')[0]}@{at:g}s[+SECONDS]")
        return dataclasses.replace(parse_fault_text(do), after_s=float(at))
