"""Type stub of the C++ core (csrc/bindings.cc). Blocking calls release the GIL."""

from enum import Enum
from typing import ClassVar

PROTOCOL_VERSION: int  # of the wire (csrc/protocol.h): peers with another one are refused at the handshake

class AbortedError(RuntimeError):
    kind: str  # the name of an ErrorKind other than none

class ErrorKind(Enum):
    """Why a group failed (csrc/errors.h); r2cc_serve.comm.errors maps each name to an exception."""
    none: ErrorKind
    rails_down: ErrorKind
    peer_stalled: ErrorKind
    peer_gone: ErrorKind
    call_mismatch: ErrorKind
    timeout: ErrorKind
    closed: ErrorKind
    aborted: ErrorKind

class LastRailError(RuntimeError): ...

class PortRangeError(RuntimeError):
    """Every port of a rail listener's range (R2CC_PORT_RANGE) was in use."""
    address: str
    ports: tuple[int, int]  # first, last

class DType(Enum):
    f32: DType
    f16: DType
    bf16: DType
    i32: DType
    i64: DType

class RedOp(Enum):
    sum: RedOp
    max: RedOp
    min: RedOp

class TransportOptions:
    chunk_bytes: int
    min_chunk_bytes: int
    window_bytes: int
    heartbeat_ms: int
    rail_timeout_ms: int
    peer_silence_ms: int
    probe_interval_ms: int
    all_down_grace_ms: int
    connect_timeout_s: float
    op_timeout_s: float
    small_msg_bytes: int
    hedge_bytes: int
    watchdog_realtime: bool
    fallback_rails: int
    spin_us: int
    spin_max_cpu_pressure: float
    flap_threshold: float
    flap_half_life_s: float
    hold_s: float
    hold_max_s: float
    loss_hold_pct: float
    loss_min_segments: int
    port_range: tuple[int, int]  # first, last; (0, 0): any port the kernel picks
    FIELDS: ClassVar[list[str]]  # the fields above, in csrc/transport.h's order
    def __init__(self) -> None: ...

# The stats classes follow csrc/stats.h: the fields in its order (tests/unit/test_stats_fields.py).
class ConnStats:
    peer: int
    rail: int
    state: str
    held: bool
    bytes_sent: int
    bytes_recv: int
    chunks_sent: int
    chunks_resent: int
    bytes_resent: int
    failovers: int
    reconnects: int
    inflight_bytes: int
    bandwidth_Bps: float
    rtt_s: float
    suspect_after_s: float
    last_detect_s: float
    last_error: str
    last_error_time: float
    fallback: bool
    flap_failures: int
    flap_penalty: float
    holds: int
    hold_left_s: float
    hold_reason: str
    retrans_pct: float
    loss_holds: int
    stuck_suspects: int
    slow_suspects: int
    mute_suspects: int
    FIELDS: ClassVar[list[str]]  # the fields above, in order
    def as_dict(self) -> dict[str, int | float | bool | str]: ...

class PeerStats:
    peer: int
    stalled: bool
    stalled_for_s: float
    stalls: int
    last_stall_s: float
    silent_s: float
    has_path: bool
    closed: bool
    chunk_bytes: int
    chunk_cost_bytes: float
    one_rail_max_bytes: int
    all_rails_min_bytes: int
    FIELDS: ClassVar[list[str]]
    def as_dict(self) -> dict[str, int | float | bool]: ...

class Counters:
    rejected_handshakes: int
    failovers: int
    chunks_resent: int
    bytes_resent: int
    spin_hits: int
    spin_misses: int
    handoffs: int
    hedges: int
    waiter_hedges: int
    hedges_unneeded: int
    writer_chunks: int
    holds: int
    loss_holds: int
    spin_skips: int
    spin_briefs: int
    cpu_pressure: float
    watchdog_passes: int
    watchdog_locked_us: int
    watchdog_pass_max_us: int
    caller_watchdog_passes: int
    gray_suspects: int
    probes: int
    own_stalls: int
    FIELDS: ClassVar[list[str]]
    def as_dict(self) -> dict[str, int | float]: ...

class Transport:
    rank: int
    world: int
    num_rails: int
    def __init__(self, rank: int, world: int, rail_ips: list[str], netns: str, secret: bytes, group_hash: int,
                 options: TransportOptions) -> None: ...
    def listen_ports(self) -> list[int]: ...
    def connect_all(self, peer_addrs: list[list[tuple[str, int]]]) -> None: ...
    def drain_rail(self, rail: int, force: bool = True) -> None: ...
    def undrain_rail(self, rail: int) -> None: ...
    def failover_rail(self, rail: int, force: bool = True) -> None: ...
    def restore_rail(self, rail: int) -> None: ...
    def inject_failure(self, peer: int, rail: int, chunks: int) -> None: ...
    def inject_full_socket(self, peer: int, rail: int) -> None: ...
    def audit_books(self) -> list[str]: ...  # one line per breach of the transport's books; [] when sound
    def abort(self, reason: str) -> None: ...
    def error(self) -> str: ...
    def error_kind(self) -> str: ...  # an ErrorKind's name
    def stats(self) -> list[ConnStats]: ...
    def peer_stats(self) -> list[PeerStats]: ...
    def counters(self) -> Counters: ...
    def state_signature(self) -> str: ...
    def wait_state_change(self, seen: str, poll_ms: int, timeout_ms: int, watch_path: str,
                          watch_since_ns: int) -> str: ...
    def interrupt_state_wait(self) -> None: ...
    def close(self) -> None: ...
    def all_reduce(self, inp: int, out: int, count: int, dtype: DType, op: RedOp, slice_bytes: int,
                   one_shot_bytes: int) -> None: ...
    def all_gather(self, inp: int, out: int, count: int, dtype: DType) -> None: ...
    def reduce_scatter(self, inp: int, out: int, count: int, dtype: DType, op: RedOp) -> None: ...
    def gather(self, inp: int, out: int, count: int, dtype: DType, root: int) -> None: ...
    def broadcast(self, buf: int, nbytes: int, root: int) -> None: ...
    def send(self, buf: int, nbytes: int, peer: int) -> None: ...
    def recv(self, buf: int, nbytes: int, peer: int) -> None: ...
    def all_reduce_plan(self, program: PlanProgram, inp: int, out: int, count: int, dtype: DType,
                        op: RedOp) -> None:
        """Runs this rank's program of an all_reduce plan (csrc/sched/executor.h); inp may equal out."""

class PlanProgram:
    """One rank's program (r2cc_serve.sched.ir.Program.encode()), decoded and checked once."""
    steps: int
    scratch_elems: int
    in_place_safe: bool  # may run with inp == out without copying the input first
    def __init__(self, encoded: bytes) -> None: ...

def iface_ipv4(ifname: str, netns: str = "") -> str: ...
def reduce_in_order(dtype: DType, op: RedOp, out: int, inputs: list[int], count: int) -> None: ...
