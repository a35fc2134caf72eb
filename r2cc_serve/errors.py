"""Exceptions a user may see. Each message says what failed and what to do."""


class R2CCError(RuntimeError):
    """Base class of every r2cc error."""


class UserError(R2CCError):
    """Bad input or environment; the CLI prints it without a traceback."""


class RailsDownError(R2CCError):
    """Every rail between two ranks stayed down past the grace period; the group is aborted."""


class CollectiveTimeoutError(R2CCError):
    """A collective did not finish within R2CC_OP_TIMEOUT_S."""
