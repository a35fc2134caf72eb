"""Link rates as tc writes them ('1gbit', '100mbit', '500kbps'): checked, normalised, in bits/s."""

from __future__ import annotations

import re

from r2cc_serve.errors import UserError

_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")
_RATE_FACTOR = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
                "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9,
                "tbps": 8 * 10**12}


def check_rate(rate: str) -> str:
    """Normalised tc rate string; UserError naming the accepted forms if malformed."""
    text = str(rate).strip().lower()
    if not _RATE_RE.match(text) or rate_bits(text) <= 0:
        raise UserError(f"rate {rate!r} is not valid: use a number and a tc unit, e.g. "
                        "100mbit, 1gbit, 2.5gbit, 500kbit (bit/s) or 10mbps (bytes/s)")
    return text


UNSHAPED = ("unshaped", "none")


def check_lab_rate(rate: str | None) -> str | None:
    """A lab's rail rate: a tc rate, or 'unshaped' (None: no shaper, the veth's own speed)."""
    if rate is None or str(rate).strip().lower() in UNSHAPED:
        return None
    try:
        return check_rate(rate)
    except UserError as exc:
        raise UserError(f"{exc}; or unshaped") from None


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate string (already checked)."""
    number, unit = _RATE_RE.match(rate).groups()
    return float(number) * _RATE_FACTOR[unit]
