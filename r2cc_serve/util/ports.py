"""A listener on the first free port of a range (R2CC_PORT_RANGE) for the listeners Python opens
(the control agent); the C++ core does the same for the rails (csrc/net.cc listen_on)."""

from __future__ import annotations

import errno
from typing import Callable, TypeVar

from r2cc_serve.errors import PortRangeError

T = TypeVar("T")


def listen_in_range(listen: Callable[[int], T], ports: tuple[int, int], listener: str) -> T:
    """listen(port) on each port of ports = (first, last) in turn until one is not in use;
    (0, 0): listen(0), any port. Raises PortRangeError naming `listener` ("the control agent on
    10.0.0.1") when every port is taken; any other failure of listen() passes through."""
    first, last = ports
    if not first:
        return listen(0)
    for port in range(first, last + 1):
        try:
            return listen(port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise PortRangeError.exhausted(listener, first, last)
