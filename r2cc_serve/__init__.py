"""r2cc-serve: resilient multi-rail tensor-parallel collectives."""

__version__ = "0.1.0"

from r2cc_serve.errors import (CallMismatchError, CollectiveTimeoutError, GroupAbortedError, LastRailError,  # noqa: E402,F401
                               PeerGoneError, PeerStalledError, R2CCError, RailsDownError, UserError)


def __getattr__(name):  # lazy: importing the package must not load torch or the C++ core
    if name == "Communicator":  # the group with its control plane (R2CC_CONTROL): see control/attach.py
        from r2cc_serve.control.attach import Communicator

        return Communicator
    raise AttributeError(name)
