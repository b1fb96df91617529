"""Errors, grouped by what the caller should do about them.

"Does not fit" is never an error: the allocator returns it as a result. Errors are
for input that is wrong (fix it), state that moved underneath (re-read and retry),
or something that broke for a while (retry later).
"""

from __future__ import annotations


class PlaitError(Exception):
    """Root of every error plait raises on purpose."""


class ValidationError(PlaitError):
    """Input is malformed. ``field`` names the offending field (dotted path)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class NotFound(PlaitError):
    """A named object (machine, entitlement, job, event) does not exist."""

    def __init__(self, kind: str, name: str, message: str | None = None) -> None:
        self.kind = kind
        self.name = name
        super().__init__(message or f"{kind} {name!r} not found")


#: what a create finds where another owner's job holds the name: job names are
#: region-wide, and that is all it is told (not the job's spec, state or entitlement)
NAME_TAKEN = "a name taken in the region (job names are region-wide)"


class Conflict(PlaitError):
    """A compare-and-swap lost: the caller expected one state and found another."""

    def __init__(self, what: str, expected: object, actual: object) -> None:
        self.what = what
        self.expected = expected
        self.actual = actual
        super().__init__(f"{what}: expected {expected!r}, found {actual!r}")


class Taken(Conflict):
    """A conflict said in a sentence of its own (what is in the way, and what to do),
    where an expected/found pair would not read well."""

    def __init__(self, what: str, message: str, **details: float) -> None:
        super().__init__(what, None, None)
        self.args = (message,)
        #: numbers a program reads from the answer beside its message
        self.details = details


class TooLarge(PlaitError):
    """A request or the record it would write is over a size limit (an HTTP 413)."""


class TransientError(PlaitError):
    """Something broke for a while; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        self.retry_after = retry_after
        super().__init__(message)
