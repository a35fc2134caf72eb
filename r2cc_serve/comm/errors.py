"""Maps the C++ core's errors to the r2cc exception types users catch."""

from __future__ import annotations

import contextlib

from r2cc_serve.errors import CollectiveTimeoutError, R2CCError, RailsDownError


@contextlib.contextmanager
def translate_errors():
    from r2cc_serve import _C

    try:
        yield
    except _C.AbortedError as exc:
        msg = str(exc)
        if "every rail between two ranks" in msg:
            raise RailsDownError(msg) from None
        if "timed out" in msg:
            raise CollectiveTimeoutError(msg) from None
        raise R2CCError(msg) from None
    except (ValueError, IndexError) as exc:  # std::invalid_argument / out_of_range from the core
        raise R2CCError(str(exc)) from None
    except RuntimeError as exc:
        if isinstance(exc, R2CCError):
            raise
        raise R2CCError(str(exc)) from None
