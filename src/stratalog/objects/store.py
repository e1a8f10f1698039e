"""The object-store protocol. Only stratalog.objects talks to object storage; everything above uses this."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

from stratalog.errors import OutOfSpaceError, StratalogError


class ObjectStoreError(StratalogError):
    """An object-store call failed (network, permissions, server error). Safe to retry the whole step."""


class ObjectStoreFullError(ObjectStoreError, OutOfSpaceError):
    """The object store has no room for a put: a local directory's disk is full (ENOSPC, EDQUOT), an S3
    bucket is over its quota or its backend out of storage. Retrying at once does not help; making room
    does."""


class ObjectNotFoundError(ObjectStoreError, KeyError):
    """No object under that key."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size_bytes: int


class ObjectStore(Protocol):
    """Keys are '/'-separated strings relative to the store's root (bucket + prefix, or a directory).

    Every store refuses, with ValueError, a key that is empty, absolute, has an empty, '.' or '..'
    segment, or breaks a length limit (see :func:`stratalog.objects.local.check_key`), so objects can move
    between stores unchanged. Operating failures raise ObjectStoreError; retrying the whole call is safe.
    """

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` under ``key``, all or nothing: a reader never sees part of it. Durable on return."""
        ...

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object (``end=None``: to its end). ObjectNotFoundError if absent.

        Like a slice, a range reaching past the object's end is cut at the end (empty when ``start`` is at
        or past it). A negative ``start`` or an ``end`` below ``start`` is a ValueError.
        """
        ...

    def size(self, key: str) -> int:
        """The object's length in bytes. ObjectNotFoundError if absent."""
        ...

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order (code point order, as S3 sorts).

        ``prefix`` is a plain string prefix, not a directory: "a/b" lists "a/b", "a/b-1" and "a/b/c".
        """
        ...

    def delete(self, key: str) -> None:
        """Remove the object; deleting an absent key is not an error."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Move the object at ``src`` to ``dst`` (replacing any object there) without sending its bytes
        through the caller. Durable on return: ``dst`` holds the bytes ``src`` held and ``src`` is gone.
        ObjectNotFoundError if ``src`` is absent.

        A reader never sees part of ``dst``. Whether both keys can exist for a moment depends on the
        store: a local directory renames atomically; S3 copies server-side, then deletes ``src``, so a
        failure between the two leaves both (retrying then raises ObjectNotFoundError for ``src``).
        """
        ...

    def close(self) -> None:
        """Release connections; the store is not used after this."""
        ...


def put_parts(store: ObjectStore, key: str, parts: Iterable[bytes | bytearray | memoryview], *,
              sync_every_bytes: int | None = None, size_hint: int | None = None) -> None:
    """Store an object made of ``parts``, as :meth:`ObjectStore.put` does. A store that can write parts
    as they come (``put_parts``: the local directory store) never holds the whole object; any other gets
    the parts joined. ``sync_every_bytes``: the local store's piece size for this put (None: its own);
    ``size_hint``: the object's expected size (the local store picks a spare file by it)."""
    method = getattr(store, "put_parts", None)
    if callable(method):
        method(key, parts, sync_every_bytes=sync_every_bytes, size_hint=size_hint)
    else:
        store.put(key, b"".join(parts))


_P = TypeVar("_P")
_END = object()


def made_ahead(parts: Iterable[_P], thread_name: str) -> Generator[_P, None, None]:
    """``parts``, each made in a thread of its own while the caller writes the one before: making a part
    (Arrow and NumPy calls) and writing one (a system call) both run without the GIL, so on two cores they
    overlap. At most two parts exist at once: the one returned and the next being made. Closing this
    iterator (or an error in the caller) waits for the part being made, then closes ``parts``; an error
    making a part is raised here, in the caller's thread."""
    it = iter(parts)
    with ThreadPoolExecutor(1, thread_name_prefix=thread_name) as pool:
        nxt: Future[object] = pool.submit(next, it, _END)
        try:
            while (part := nxt.result()) is not _END:
                nxt = pool.submit(next, it, _END)
                yield cast(_P, part)
        finally:
            wait([nxt])    # the part being made is done with before ``parts`` is closed
            close = getattr(it, "close", None)
            if callable(close):
                pool.submit(close).result()   # in the thread that ran it
