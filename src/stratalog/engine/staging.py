"""Objects staged outside a store (by Spark tasks), committed into it with dense offsets: no Spark here.

A writer stages objects in the store's object storage under ``spark-staging/<write id>/``: the object
format with the *provisional* flag, each stream under a provisional id (its place in the object's
sorted name list) with task-relative offsets (0, 1, ... per stream). :func:`commit_staged` reads each
staged object's footer and index (two ranged gets), checks them against what the task reported, moves
the object to a fresh ``data/<id>.slo`` key unchanged, and has the store register all of them in one
metadata transaction at the streams' ends (StreamStore.commit_external_objects), tasks in partition
order. A Spark driver holding the data directory calls it (spark/write.py), and so does a broker asked
by a Spark driver (broker/api_staged.py): either way one process owns the metadata.

Why the bytes are not rewritten, and why objects are moved rather than registered in place: see
spark/write.py and docs/formats/object.md.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol

from stratalog.engine.metadata import NewObject
from stratalog.engine.objformat import FOOTER_BYTES, BlockEntry, CorruptObjectError, decode_footer, decode_index
from stratalog.engine.store import StreamStore, object_key
from stratalog.errors import StratalogError
from stratalog.objects.store import ObjectStore

log = logging.getLogger("stratalog.staging")

STAGING_PREFIX = "spark-staging/"
#: Staged objects one commit or swap may name: a write of 10,000 tasks staging 10 objects each. Each costs
#: two ranged gets and a rename, so a broker asked for a commit does bounded work.
STAGED_OBJECTS_MAX = 100_000
#: A staged object is put once its batches reach this size (a task holds one in memory while it builds it).
#: Staged objects whose index the driver reads, or that it moves, at once (each call holds a footer or
#: an index in memory at most; on S3 each is a round trip, so several in flight hide the latency).
COMMIT_THREADS = 8
@dataclass(frozen=True, slots=True)
class StagedStream:
    name: str
    #: Task-relative offset of the stream's first record in this object, and how many records it holds.
    start: int
    count: int


@dataclass(frozen=True, slots=True)
class StagedObject:
    key: str
    size_bytes: int
    #: In provisional-id order: provisional id i is streams[i].
    streams: tuple[StagedStream, ...]


class UnknownStreamsError(StratalogError, ValueError):
    """A staged write names streams the store does not have, and may not create."""


class TaskStaged(Protocol):
    """What one writer task staged (spark/write.py's WriteMessage)."""

    @property
    def partition(self) -> int: ...

    @property
    def objects(self) -> tuple[StagedObject, ...]: ...


@dataclass(frozen=True, slots=True)
class StagedWrite:
    """What one task staged, when it comes from elsewhere than Spark (a broker's request)."""

    partition: int
    objects: tuple[StagedObject, ...]


def assign_bases(messages: Sequence[TaskStaged], ends: dict[str, int]) -> dict[tuple[int, str], int]:
    """The offset each task's records of each stream start at: tasks in partition order, each stream
    continuing from ``ends[name]``. Keys are (partition, name); the value is what a task-relative offset
    is shifted by."""
    next_offset = dict(ends)
    shifts: dict[tuple[int, str], int] = {}
    for message in sorted(messages, key=lambda m: m.partition):
        counts: dict[str, int] = {}
        for staged in message.objects:
            for s in staged.streams:
                counts[s.name] = counts.get(s.name, 0) + s.count
        for name, count in sorted(counts.items()):
            shifts[(message.partition, name)] = next_offset[name]
            next_offset[name] += count
    return shifts


def read_staged_index(store: ObjectStore, staged: StagedObject) -> list[BlockEntry]:
    """A staged object's index as it wrote it (provisional ids, task-relative offsets): two ranged gets,
    the footer then the index, and no data block."""
    size = staged.size_bytes
    footer = decode_footer(store.get(staged.key, size - FOOTER_BYTES, size), size)
    if not footer.provisional:
        raise CorruptObjectError(f"{staged.key} is not a staged object (its footer lacks the provisional flag)")
    return decode_index(store.get(staged.key, footer.index_position, footer.index_position + footer.index_bytes),
                        footer)


def place_entries(staged: StagedObject, entries: Sequence[BlockEntry],
                  targets: Sequence[tuple[int, int]]) -> list[BlockEntry]:
    """The index entries of a staged object as metadata registers them: provisional stream ``i`` becomes
    stream ``targets[i][0]`` with its offsets shifted by ``targets[i][1]``; position, size, counts, time and
    CRC stay as the task wrote them (the bytes do not move within the object). Raises CorruptObjectError
    when the index does not hold exactly the records the task reported for each stream."""
    held: dict[int, tuple[int, int]] = {}
    placed = []
    for e in entries:
        if e.stream_id >= len(targets):
            raise CorruptObjectError(f"{staged.key}: index names provisional stream {e.stream_id}; the task "
                                     f"staged {len(targets)} streams")
        first, end = held.get(e.stream_id, (e.start_offset, e.start_offset))
        if e.start_offset != end or e.end_offset - e.start_offset != e.record_count:
            raise CorruptObjectError(f"{staged.key}: blocks of provisional stream {e.stream_id} are not contiguous "
                                     f"at {e.start_offset}")
        held[e.stream_id] = (first, e.end_offset)
        stream_id, shift = targets[e.stream_id]
        placed.append(replace(e, stream_id=stream_id, start_offset=e.start_offset + shift,
                              end_offset=e.end_offset + shift))
    reported = {i: (s.start, s.start + s.count) for i, s in enumerate(staged.streams)}
    if held != reported:
        raise CorruptObjectError(f"{staged.key}: its index holds offsets {held} per provisional stream; the task "
                                 f"reported {reported}")
    placed.sort(key=lambda e: (e.stream_id, e.start_offset))
    return placed


@dataclass(frozen=True, slots=True)
class CommitResult:
    committed: bool
    records: int
    objects: int


def commit_staged(store: StreamStore, messages: Sequence[TaskStaged], marker: tuple[str, int] | None = None, *,
                 create_streams: bool = True,
                 keep_staged_on: tuple[type[BaseException], ...] = ()) -> CommitResult:
    """Register staged objects with dense offsets, moving each under ``data/`` unchanged. Safe while the
    store serves appends: the streams written take the objects at their ends, and appends to them wait
    only for the metadata commit (StreamStore.commit_external_objects).

    With ``marker`` (key, value), a commit that already happened for that value writes nothing. Streams
    that do not exist are created, or with ``create_streams`` False refused (UnknownStreamsError).
    Whatever happens, no moved object stays unless the commit registered it, and no staged object is
    left, except after an error of a ``keep_staged_on`` type (a refusal that the same commit sent elsewhere
    may pass, such as a cluster's fence when the partition moved to another broker): then every object
    goes back to its staged key, so the writer can send the commit again.
    """
    staged_keys = [o.key for m in messages for o in m.objects]
    moved_keys: list[str] = []
    staged_key_of: dict[str, str] = {}
    committed = False
    keep = False
    try:
        if marker is not None and store.metadata.get_meta(marker[0], -1) >= marker[1]:
            return CommitResult(False, 0, 0)
        names = sorted({s.name for m in messages for o in m.objects for s in o.streams})
        existing = {s.name for s in store.streams()}
        missing = [name for name in names if name not in existing]
        if missing and not create_streams:
            raise UnknownStreamsError(f"no stream named {', '.join(map(repr, missing[:5]))} in the store")
        store.create_streams(missing)
        ids = {name: store.open_stream(name).stream_id for name in names}
        objects = store.object_store
        work = [(message.partition, staged, store.metadata.allocate_object_id())
                for message in sorted(messages, key=lambda m: m.partition) for staged in message.objects]
        moved_keys = [object_key(object_id) for _, _, object_id in work]
        staged_key_of = {object_key(object_id): staged.key for _, staged, object_id in work}

        def check(item: tuple[int, StagedObject, int]) -> list[BlockEntry]:
            staged = item[1]
            entries = read_staged_index(objects, staged)
            place_entries(staged, entries, [(0, 0)] * len(staged.streams))  # the index holds what was reported
            return entries

        def move(item: tuple[int, StagedObject, int]) -> None:
            objects.rename(item[1].key, object_key(item[2]))

        # Index gets and renames (server-side copies on S3) wait on the store: a few at once hide the latency.
        with ThreadPoolExecutor(COMMIT_THREADS, thread_name_prefix="stratalog-commit") as pool:
            indexes = list(pool.map(check, work))  # every index checked before anything moves
            list(pool.map(move, work))

        def place(ends: dict[int, int]) -> list[NewObject]:
            shifts = assign_bases(messages, {name: ends[ids[name]] for name in names})
            return [NewObject(object_id, object_key(object_id), staged.size_bytes,
                              place_entries(staged, entries,
                                            [(ids[s.name], shifts[(partition, s.name)]) for s in staged.streams]))
                    for (partition, staged, object_id), entries in zip(work, indexes, strict=True)]

        try:
            committed = store.commit_external_objects(sorted(ids.values()), place, marker=marker) is not None
        except keep_staged_on:
            keep = True
            raise
        records = sum(s.count for _, staged, _ in work for s in staged.streams)
        return CommitResult(committed, records if committed else 0, len(work) if committed else 0)
    finally:
        if keep:
            _move_back(store, staged_key_of)
        elif not committed:
            _delete_unregistered(store, moved_keys)
        if not keep:
            for key in staged_keys:
                store.object_store.delete(key)  # gone already if it moved


def _move_back(store: StreamStore, staged_key_of: dict[str, str]) -> None:
    """Rename each moved object (``data/`` key) back to its staged key: the commit was refused, not made.
    If one cannot go back it is deleted as unregistered instead, and the writer's next commit fails on it."""
    try:
        for moved, staged in staged_key_of.items():
            store.object_store.rename(moved, staged)
    except (StratalogError, OSError) as e:
        log.warning("could not put back the objects of a refused Spark commit: %s", e)
        _delete_unregistered(store, list(staged_key_of))


def _delete_unregistered(store: StreamStore, keys: Sequence[str]) -> None:
    """Delete the objects at ``keys`` that no commit registered (the commit failed, or a replayed batch was
    skipped). If metadata cannot say, they stay: the store deletes unregistered ``data/`` objects when it
    next opens."""
    if not keys:
        return
    try:
        known = {o.key for o in store.metadata.objects()}
        for key in keys:
            if key not in known:
                store.object_store.delete(key)
    except (StratalogError, sqlite3.Error) as e:
        log.warning("could not delete the objects a failed Spark commit moved; the store deletes them when it "
                    "next opens: %s", e)


def delete_staging(store: ObjectStore, prefix: str) -> int:
    """Delete every staged object under ``prefix`` (an aborted write, or one that committed)."""
    keys = [info.key for info in store.list(prefix)]
    for key in keys:
        store.delete(key)
    return len(keys)


def read_final_index(store: ObjectStore, key: str, size_bytes: int) -> list[BlockEntry]:
    """The index of an object written with its real stream ids and offsets (a compaction's output), read
    with two ranged gets; CorruptObjectError for a provisional one."""
    footer = decode_footer(store.get(key, size_bytes - FOOTER_BYTES, size_bytes), size_bytes)
    if footer.provisional:
        raise CorruptObjectError(f"{key} is provisional: a compaction's objects carry their real placement")
    return decode_index(store.get(key, footer.index_position, footer.index_position + footer.index_bytes), footer)


def replace_with_staged(store: StreamStore, replaced_keys: Sequence[str],
                        staged: Sequence[tuple[str, int]]) -> CommitResult:
    """Swap the objects at ``replaced_keys`` for the staged objects ``(key, size)`` (a compaction run beside
    a live store): each staged object is moved under ``data/`` unchanged, then one metadata transaction
    swaps them in, and refuses (ValueError) unless they hold exactly the ranges the replaced objects still
    hold: a trim or another compaction since the plan makes the swap a no-op to plan again, never a loss.
    The replaced objects stay readable until their grace period has passed. Whatever happens, no staged
    object is left, and no moved one stays unless the swap registered it."""
    moved_keys: list[str] = []
    committed = False
    try:
        live = {o.key: o.object_id for o in store.metadata.objects() if o.unreferenced_ms is None}
        gone = [key for key in replaced_keys if key not in live]
        if gone or not replaced_keys or not staged:
            raise ValueError(f"nothing to replace, or objects no longer in the store: {gone[:5]}")
        objects = store.object_store
        work = [(key, size, store.metadata.allocate_object_id()) for key, size in staged]
        moved_keys = [object_key(object_id) for _, _, object_id in work]
        with ThreadPoolExecutor(COMMIT_THREADS, thread_name_prefix="stratalog-commit") as pool:
            indexes = list(pool.map(lambda w: read_final_index(objects, w[0], w[1]), work))
            list(pool.map(lambda w: objects.rename(w[0], object_key(w[2])), work))
        new = [NewObject(object_id, object_key(object_id), size, entries)
               for (_, size, object_id), entries in zip(work, indexes, strict=True)]
        store.replace_objects([live[key] for key in replaced_keys], new)
        committed = True
        return CommitResult(True, sum(e.record_count for entries in indexes for e in entries), len(new))
    finally:
        if not committed:
            _delete_unregistered(store, moved_keys)
        for key, _ in staged:
            store.object_store.delete(key)  # gone already if it moved
