"""Exceptions a user may see. Each message says what failed and what to do.

The C++ core reports a failure's kind as a value (csrc/errors.h); `comm/errors.py` maps
each kind to one of these classes, so callers catch a type instead of parsing text.
"""


class R2CCError(RuntimeError):
    """Base class of every r2cc error. `kind` names the failure ("" when not from the core)."""

    kind = ""


class UserError(R2CCError):
    """Bad input or environment; the CLI prints it without a traceback."""


class KnobError(UserError, ValueError):
    """An R2CC_* knob holds a value its parser refuses (one line: the knob, the value, the form)."""


class PortRangeError(UserError):
    """A listener (a rail or the control agent) found every port of R2CC_PORT_RANGE in use."""

    @classmethod
    def exhausted(cls, listener: str, first: int, last: int) -> "PortRangeError":
        """The message says which knob and range, and what to do; `listener`, e.g. "rail 0 on 10.0.0.1"."""
        return cls(f"R2CC_PORT_RANGE={first}-{last}: no free port for {listener}: all {last - first + 1} are in use "
                   "(by other r2cc ranks or other programs; `ss -ltnp` shows which). Each rank listens on one port "
                   "per rail and one for its control agent: widen R2CC_PORT_RANGE (and the firewall rule with it), "
                   "stop what holds the ports, or set R2CC_PORT_RANGE=0 to take any free port.")


class GroupAbortedError(R2CCError):
    """The group is aborted (by abort(), an operator, or a peer): every later call raises too."""

    kind = "aborted"


class RailsDownError(GroupAbortedError):
    """Every rail to a peer stayed down past the grace period while a collective waited on it."""

    kind = "rails_down"


class PeerGoneError(GroupAbortedError):
    """A peer's process is gone (closed its communicator, or its host refuses every connection)."""

    kind = "peer_gone"


class CallMismatchError(GroupAbortedError):
    """The ranks made different calls (op, dtype, count, reduce op or root differ)."""

    kind = "call_mismatch"


class CollectiveTimeoutError(GroupAbortedError):
    """A collective did not finish within R2CC_OP_TIMEOUT_S."""

    kind = "timeout"


class PeerStalledError(CollectiveTimeoutError):
    """The collective timed out because a peer's process stalled (its host kept acknowledging)."""

    kind = "peer_stalled"


class CommunicatorClosedError(GroupAbortedError):
    """The communicator was closed; it cannot run collectives any more."""

    kind = "closed"


class LastRailError(R2CCError):
    """An operator action would take away the last healthy rail to a peer; nothing was changed."""


class PeerGaveUpError(R2CCError):
    """Another rank could not join the group it was forming (its own error is in the message).
    Raised while forming the group, before the core runs: no kind."""
