"""The object-store protocol. Only stratalog.objects talks to object storage; everything above uses this."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from stratalog.errors import StratalogError


class ObjectStoreError(StratalogError):
    """An object-store call failed (network, permissions, server error). Safe to retry the whole step."""


class ObjectNotFoundError(ObjectStoreError, KeyError):
    """No object under that key."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size_bytes: int


class ObjectStore(Protocol):
    """Keys are '/'-separated strings relative to the store's root (bucket + prefix, or a directory)."""

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` under ``key``, all or nothing: a reader never sees part of it. Durable on return."""
        ...

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object (``end=None``: to its end). ObjectNotFoundError if absent."""
        ...

    def size(self, key: str) -> int:
        """The object's length in bytes. ObjectNotFoundError if absent."""
        ...

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; deleting an absent key is not an error."""
        ...

    def close(self) -> None: ...
