"""The error every store raises for a location it cannot use."""

from __future__ import annotations

from typing import Any

from podium.core.redaction import redact_uri
from podium.errors import PodiumError


class StorageError(PodiumError, OSError):
    """A location that cannot be used: unreachable endpoint, rejected credentials, missing bucket, no permission.

    The message is '<location>: <reason>' and never contains credentials.
    """

    def __init__(self, location: str, reason: str):
        self.location, self.reason = redact_uri(location), reason
        super().__init__(f"{self.location}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.location, self.reason)


class ConditionalWritesIgnored(StorageError):
    """A store that accepted a create-only write of an object that exists: no lease, no claim can be built on it
    (podium.storage.preflight.check_conditional_writes)."""
