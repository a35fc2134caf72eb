"""When a fault starts and how long it stays: the two suffixes of the one fault notation.

    h<HOST>:<RAIL>:<KIND>[:ARGS][@WHEN][+FOR]

WHEN  seconds into the run (@3s, @2.5s, @500ms; a bare number is seconds), or, for `r2cc bench`,
      a share of each measured op's fault-free duration (@30%)
FOR   seconds the fault stays before the command undoes it (+10s); a flap ends by itself

For example h0:1:lossy:5%@3s+10s, h1:all-down@30%, h0:2:degrade:100mbit+20s. Each command says
which parts it takes and what it does when one is left out (its --help); one it cannot use is
refused with the form it can. docs/faults.md is the reference; model.parse_timed builds the
FaultSpec from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from r2cc_serve.errors import UserError

_TIMED = re.compile(r"^(?P<fault>[^@+]+)(?:@(?P<at>[^@+]*))?(?:\+(?P<hold>[^@+]*))?$")
_SECONDS = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|min)?$")
_SHARE = re.compile(r"^(\d+(?:\.\d+)?)%$")
_UNIT_S = {None: 1.0, "s": 1.0, "ms": 1e-3, "min": 60.0}
NOTATION = "h<HOST>:<RAIL>:<KIND>[:ARGS][@WHEN][+FOR]"
EXAMPLES = "h0:1:down, h0:1:lossy:5%@3s+10s, h0:2:degrade:100mbit+20s, h1:all-down@30%"


@dataclass(frozen=True)
class Timing:
    """The fault's own text, and what its suffixes said (None where left out)."""
    fault: str
    after_s: float | None = None  # @SECONDS
    share: float | None = None    # @N%, as a fraction
    hold_s: float | None = None   # +FOR


def looks_like_notation(text: str) -> bool:
    """'h0:1:down', '0:1:down', 'h1:all-down@30%' (not the older 'down' or 'degrade:100mbit')."""
    return bool(re.match(r"^\s*h?\d+:", str(text)))


def parse_seconds(text: str, what: str) -> float:
    """'3', '3s', '2.5s', '500ms', '1min' -> seconds."""
    m = _SECONDS.match(text.strip())
    if not m:
        raise UserError(f"{what} {text!r} is not a time: use seconds like 3s, 2.5s, 500ms or 1min")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def split_timing(text: str, at: str = "seconds", hold: bool = True) -> Timing:
    """The fault's text and its @WHEN and +FOR, checked against what the caller can use.
    at: 'seconds' (@3s), 'share' (@30%, r2cc bench) or 'none' (no @: in place for the whole run).
    hold: whether +FOR is taken."""
    m = _TIMED.match(str(text).strip())
    if not m:
        raise UserError(f"not valid: use {NOTATION}, e.g. {EXAMPLES}")
    share, after_s, hold_s = None, None, None
    if m.group("at") is not None:
        share, after_s = _parse_at(m.group("at"), at)
    if m.group("hold") is not None:
        if not hold:
            raise UserError(f"+{m.group('hold')}: this command keeps the fault in place for its whole "
                            f"run; leave out +FOR")
        hold_s = parse_seconds(m.group("hold"), "+FOR")
        if hold_s <= 0:
            raise UserError(f"+{m.group('hold')}: a fault must stay for more than 0 s")
    return Timing(m.group("fault"), after_s, share, hold_s)


def _parse_at(when: str, at: str) -> tuple[float | None, float | None]:
    """@WHEN -> (share, seconds), one of them None."""
    if at == "none":
        raise UserError(f"@{when}: this command keeps the fault in place for its whole run; leave out @WHEN")
    share = _SHARE.match(when.strip())
    if at == "share":
        if not share:
            raise UserError(f"@{when}: r2cc bench places a fault inside each measured op; give a share of "
                            f"its duration like @30%")
        value = float(share.group(1)) / 100
        if value > 10:
            raise UserError(f"@{when}: the share must be between 0% and 1000%")
        return value, None
    if share:
        raise UserError(f"@{when}: a share of an op is for r2cc bench; give seconds into the run, like @3s")
    return None, parse_seconds(when, "@WHEN")
