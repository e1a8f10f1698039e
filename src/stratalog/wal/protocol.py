"""What a store needs from a write-ahead log: the device WAL (:class:`~stratalog.wal.log.WriteAheadLog`)
and the object WAL (:class:`~stratalog.wal.object_wal.ObjectWAL`) both provide it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from stratalog.errors import WALFailedError
from stratalog.io.block_io import CompletionWatch
from stratalog.wal.log import AppendResult
from stratalog.wal.recovery import RecoveredRecord


class RecoveryCounts(Protocol):
    @property
    def bad_body_records(self) -> int:
        """Records recovery found damaged and dropped (acknowledged ones may be among them)."""
        ...


class WAL(Protocol):
    """Records in offset order, acknowledged in offset order once durable; see either implementation."""

    def recover(self) -> Iterator[RecoveredRecord]:
        """Every record after the trim point, in offset order; runs once, before the first append."""
        ...

    def append(self, data: bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview], *,
               wait_s_max: float | None = None) -> AppendResult:
        ...

    def wait_for_room(self, size_bytes: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until a record of ``size_bytes`` would find room in the write buffer,
        or the log stopped; whether it would."""
        ...

    def trim(self, offset: int) -> None:
        """Drop records at offsets <= ``offset`` (a durable record's); durable when it returns."""
        ...

    @property
    def durable_offset(self) -> int:
        ...

    @property
    def trim_offset(self) -> int:
        ...

    @property
    def failure(self) -> WALFailedError | None:
        ...

    @property
    def recovery_stats(self) -> RecoveryCounts:
        ...

    def watch_completions(self, backstop_s: float) -> CompletionWatch | None:
        """Let the calling thread (an event loop) complete the appends: see ``CompletionWatch``; None where
        the log's own threads complete them."""
        ...

    def close(self) -> None:
        ...


if TYPE_CHECKING:  # mypy checks here that both logs provide the protocol
    from stratalog.wal.log import WriteAheadLog
    from stratalog.wal.object_wal import ObjectWAL

    _DEVICE_WAL: type[WAL] = WriteAheadLog
    _OBJECT_WAL: type[WAL] = ObjectWAL
