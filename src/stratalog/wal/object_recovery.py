"""Object WAL recovery: read one owner's objects from the trim point and yield every record, in order.

The decision table (docs/formats/object-wal.md, "Recovery"). ``expected`` starts at ``trim + 1`` and is
the offset the next object must start at; objects are taken in key (= offset) order:

| # | what the next listed object is                                    | verdict                      |
|---|-------------------------------------------------------------------|------------------------------|
| 1 | the next one also starts at or below ``expected``                 | trimmed leftover: deleted    |
| 2 | valid, starts at ``expected``                                     | records returned             |
| 3 | valid, the first one, starts below ``expected``, reaches past it  | records past the trim returned |
| 4 | valid, the first one, ends at or below ``expected``               | trimmed leftover: deleted    |
| 5 | valid, not the first one, starts below ``expected``               | overlap: LostRecordsError    |
| 6 | starts above ``expected`` (a gap), at most W - 1 objects from it on | unacknowledged tail: deleted |
| 7 | as 6, more than W - 1 objects                                     | missing object: LostRecordsError |
| 8 | damaged (magic, CRC, size, offsets), nothing listed after it      | torn tail: moved aside       |
| 9 | damaged, objects listed after it                                  | LostRecordsError             |
| 10| a newer format version                                            | RecoveryReadError (upgrade)  |
| 11| a get or list fails ``read_attempts_max`` times, or a listed object is gone | RecoveryReadError |

W is the largest ``puts_in_flight_max`` the objects after the gap were written with: the writer puts no
object more than W - 1 batches past the oldest unacknowledged one (its window) and acknowledges in offset
order, so after a crash at most W - 1 objects can lie past a missing one, none of them acknowledged.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from stratalog import retrying
from stratalog.errors import RecoveryReadError
from stratalog.objects.store import ObjectNotFoundError, ObjectStore, ObjectStoreError
from stratalog.wal.config import ObjectWALConfig
from stratalog.wal.object_format import (
    OBJECT_HEADER_BYTES,
    TRIM_KEY,
    DamagedObjectError,
    NewerFormatError,
    decode_object,
    decode_object_header,
    decode_trim_marker,
    offset_of_key,
)
from stratalog.wal.recovery import RecoveredRecord

log = logging.getLogger("stratalog.wal.objects")

_T = TypeVar("_T")


class LostRecordsError(RecoveryReadError):
    """The objects show that acknowledged records are missing or damaged; recovery stopped rather than
    skip them. Nothing was changed in the store."""


@dataclass(slots=True)
class ObjectRecoveryStats:
    """What a recovery saw; filled in as it runs."""

    records: int = 0
    record_bytes: int = 0
    #: Records read from an object that straddles the trim point, at or below it: not returned.
    trimmed_records: int = 0
    objects_read: int = 0
    bytes_read: int = 0
    #: Objects wholly at or below the trim point (a trim's deletes cut off by a crash): deleted.
    trimmed_objects: int = 0
    #: Objects past a missing one (puts in flight at a crash, never acknowledged): deleted.
    unacknowledged_objects: int = 0
    #: A damaged last object (never acknowledged after a crash; see the spec): moved aside.
    damaged_objects: int = 0
    #: Records in that damaged object, as its header says (1 when the header is unreadable). The stream
    #: store reads this name from either WAL to warn that acknowledged records may be lost.
    bad_body_records: int = 0
    trim_offset: int = -1
    #: Where the writer continues: the offset after the last record returned (or the trim point).
    next_offset: int = 0
    finished: bool = False


@dataclass(frozen=True, slots=True)
class LiveObject:
    """An object the log keeps: it holds offsets ``first_offset .. end_offset - 1``."""

    first_offset: int
    end_offset: int
    key: str


@dataclass(slots=True)
class Cleanup:
    """What recovery decided to change in the store before a writer may put new objects."""

    delete: list[str] = field(default_factory=list)
    move_aside: list[str] = field(default_factory=list)
    live: list[LiveObject] = field(default_factory=list)


def with_retries(what: str, step: Callable[[], _T], attempts: int, backoff_s: float, retry_s_min: float = 0.0,
                 backoff_s_max: float = float("inf")) -> _T:
    """``step()``, tried again on ObjectStoreError (not on a missing object): stratalog.retrying's policy."""
    return retrying.with_retries(what, step, attempts=attempts, backoff_s=backoff_s, log=log,
                                 retry_s_min=retry_s_min, backoff_s_max=backoff_s_max,
                                 retry_on=(ObjectStoreError,), never_on=(ObjectNotFoundError,))


class ObjectReader:
    """Gets objects with retries; turns every store error into RecoveryReadError."""

    def __init__(self, store: ObjectStore, config: ObjectWALConfig, stats: ObjectRecoveryStats) -> None:
        self._store = store
        self._config = config
        self._stats = stats

    def get(self, key: str, end: int | None = None) -> bytes:
        try:
            data = with_retries(f"reading WAL object {key}", lambda: self._store.get(key, 0, end),
                                self._config.read_attempts_max, self._config.put_backoff_s)
        except ObjectNotFoundError as e:
            raise RecoveryReadError(
                f"WAL object {key} was listed but is gone: another process is trimming or recovering this "
                "prefix; stop it, then reopen") from e
        except ObjectStoreError as e:
            raise RecoveryReadError(f"reading WAL object {key} failed ({e}); recovery stopped instead of "
                                    "guessing where the log ends: check the object store, then reopen") from e
        self._stats.bytes_read += len(data)
        return data

    def list(self, prefix: str) -> list[str]:
        try:
            return with_retries(f"listing {prefix}", lambda: [i.key for i in self._store.list(prefix)],
                                self._config.read_attempts_max, self._config.put_backoff_s)
        except ObjectStoreError as e:
            raise RecoveryReadError(f"listing the WAL objects under {prefix} failed ({e}): check the object "
                                    "store, then reopen") from e


def read_trim(reader: ObjectReader, prefix: str, keys: list[str]) -> int:
    """The trim offset the marker holds (-1 without a marker); RecoveryReadError for a damaged marker."""
    key = prefix + TRIM_KEY
    if key not in keys:
        return -1
    try:
        return decode_trim_marker(reader.get(key))
    except DamagedObjectError as e:
        raise RecoveryReadError(
            f"the WAL trim marker {key} is unreadable ({e}): recovery cannot tell where the log starts. "
            "Restore it, or move it aside to replay from the oldest object kept") from e


def scan_objects(store: ObjectStore, prefix: str, config: ObjectWALConfig, stats: ObjectRecoveryStats,
                 cleanup: Cleanup) -> Iterator[RecoveredRecord]:
    """Yield the records after the trim point in offset order; fill ``stats`` and ``cleanup`` (see the
    module doc). Changes nothing in the store: the caller applies ``cleanup``."""
    reader = ObjectReader(store, config, stats)
    keys = reader.list(prefix)
    trim = read_trim(reader, prefix, keys)
    stats.trim_offset = trim
    listed = sorted((offset, key) for key in keys if (offset := offset_of_key(prefix, key)) is not None)
    expected = trim + 1
    first_kept = 0
    while first_kept + 1 < len(listed) and listed[first_kept + 1][0] <= expected:  # row 1
        cleanup.delete.append(listed[first_kept][1])
        stats.trimmed_objects += 1
        first_kept += 1
    rest = listed[first_kept:]
    with ThreadPoolExecutor(config.recovery_gets_in_flight_max, thread_name_prefix="stratalog-owal-read") as pool:
        ahead: deque[Future[bytes]] = deque()
        for index, (first, key) in enumerate(rest):
            while len(ahead) < config.recovery_gets_in_flight_max and index + len(ahead) < len(rest):
                ahead.append(pool.submit(reader.get, rest[index + len(ahead)][1]))
            if first > expected:  # rows 6, 7
                for future in ahead:
                    future.cancel()
                _after_gap(reader, rest[index:], expected, config, stats, cleanup)
                break
            data = ahead.popleft().result()
            stats.objects_read += 1
            try:
                header, bodies = decode_object(first, data)
            except NewerFormatError as e:  # row 10
                raise RecoveryReadError(f"WAL object {key}: {e}") from e
            except DamagedObjectError as e:
                follow = len(rest) - index - 1
                if follow:  # row 9
                    raise LostRecordsError(
                        f"WAL object {key} is damaged ({e}) and {follow} object(s) follow it, so it was "
                        "acknowledged: its records are lost. Recovery stopped; restore the object from a "
                        "copy, or move it aside to accept the loss") from e
                _damaged_tail(key, data, e, stats, cleanup)  # row 8
                break
            if first < expected and index > 0:  # row 5
                raise LostRecordsError(
                    f"WAL object {key} starts at offset {first}, inside the previous object (which ends at "
                    f"{expected}): two writers on one prefix? Recovery stopped; keep one writer per owner")
            if header.end_offset <= expected:  # row 4
                cleanup.delete.append(key)
                stats.trimmed_objects += 1
                continue
            for i, body in enumerate(bodies):  # rows 2, 3
                offset = first + i
                if offset <= trim:
                    stats.trimmed_records += 1
                    continue
                stats.records += 1
                stats.record_bytes += len(body)
                yield RecoveredRecord(offset, body)
            cleanup.live.append(LiveObject(first, header.end_offset, key))
            expected = header.end_offset
    stats.next_offset = expected
    stats.finished = True


def _after_gap(reader: ObjectReader, after: list[tuple[int, str]], expected: int, config: ObjectWALConfig,
               stats: ObjectRecoveryStats, cleanup: Cleanup) -> None:
    """Rows 6 and 7: no object starts at ``expected``, and ``after`` are listed past it."""
    windows = []
    for _, key in after:
        # A damaged header tells nothing; the others (or our config) bound the window.
        with contextlib.suppress(DamagedObjectError):
            windows.append(decode_object_header(reader.get(key, OBJECT_HEADER_BYTES)).puts_in_flight_max)
    window = max(windows) if windows else config.puts_in_flight_max
    if len(after) > window - 1:
        raise LostRecordsError(
            f"no WAL object holds offset {expected}, but {len(after)} object(s) follow (from {after[0][1]}); "
            f"a writer with {window} puts in flight leaves at most {window - 1} after a crash, so acknowledged "
            "records are missing. Recovery stopped; restore the missing object, or move the later ones aside "
            "to accept the loss")
    log.info("WAL recovery: no object at offset %d; %d object(s) after it were never acknowledged and are "
             "deleted", expected, len(after))
    cleanup.delete.extend(key for _, key in after)
    stats.unacknowledged_objects += len(after)


def _damaged_tail(key: str, data: bytes, error: DamagedObjectError, stats: ObjectRecoveryStats,
                  cleanup: Cleanup) -> None:
    """Row 8: the last object is damaged."""
    try:
        count = decode_object_header(data).record_count
    except DamagedObjectError:
        count = 1
    log.error("WAL recovery: the last object %s is damaged (%s); its %d record(s) are dropped and it is moved "
              "aside. A crash cannot leave an acknowledged object damaged, but damage at rest can: "
              "acknowledged records may be lost", key, str(error), count)
    stats.damaged_objects += 1
    stats.bad_body_records += count
    cleanup.move_aside.append(key)
