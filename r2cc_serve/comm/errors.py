"""Maps the C++ core's errors to the r2cc exception types users catch (by kind, not by text)."""

from __future__ import annotations

import contextlib

from r2cc_serve.errors import (CallMismatchError, CollectiveTimeoutError, CommunicatorClosedError, GroupAbortedError,
                               LastRailError, PeerGoneError, PeerStalledError, PortRangeError, R2CCError,
                               RailsDownError)

BY_KIND: dict[str, type[GroupAbortedError]] = {cls.kind: cls for cls in (
    GroupAbortedError, RailsDownError, PeerGoneError, CallMismatchError, CollectiveTimeoutError, PeerStalledError,
    CommunicatorClosedError)}


@contextlib.contextmanager
def translate_errors():
    from r2cc_serve import _C

    try:
        yield
    except _C.AbortedError as exc:
        raise BY_KIND.get(getattr(exc, "kind", ""), GroupAbortedError)(str(exc)) from None
    except _C.LastRailError as exc:
        raise LastRailError(str(exc)) from None
    except _C.PortRangeError as exc:
        raise PortRangeError.exhausted(f"a rail on {exc.address}", *exc.ports) from None
    except (ValueError, IndexError) as exc:  # std::invalid_argument / out_of_range from the core
        raise R2CCError(str(exc)) from None
    except RuntimeError as exc:
        if isinstance(exc, R2CCError):
            raise
        raise R2CCError(str(exc)) from None
