"""The errors of `streams.wire`, one small hierarchy.

`SerializationError` is the base; `DecodeError` (also a `ValueError`) means the
bytes are unusable and belong on the dead-letter topic; `RegistryError` means the
registry could not be asked, which is worth a retry.
"""

from __future__ import annotations

__all__ = ["DecodeError", "RegistryError", "SerializationError"]


class SerializationError(Exception):
    """Base of the errors of `streams.wire`."""


class DecodeError(SerializationError, ValueError):
    """The bytes are not a record of the expected kind; the message says why."""


class RegistryError(SerializationError):
    """The schema registry failed or refused; `status` is the HTTP status, if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
