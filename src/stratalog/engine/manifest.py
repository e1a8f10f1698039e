"""The manifest: committed state published in the object store, for readers that have only the store.

Spark executors (and any other reader without the store's SQLite) find every committed object and range
here. Each metadata commit publishes a small *delta*; every ``manifest_snapshot_every`` commits, and at
an open that finds the published chain short of the last commit, a full *snapshot*. Each delta names
the manifest published just before it (``prev``), so a reader follows an unbroken chain from the newest
snapshot and stops at the first missing link: what it sees is always a state the store really
committed, never a mix.

Keys: ``manifest/<seq:020d>.snapshot.json`` and ``manifest/<seq:020d>.delta.json``. JSON documents::

    {"format": 1, "kind": "snapshot"|"delta", "seq": N, "prev": N|null,
     "streams": [{"id": 1, "name": "a", "start": 0, "end": 10}],
     "objects": [{"key": "data/...", "blocks": [[stream, start, end, position, size, count, max_ts, crc]]}],
     "removed": ["data/..."]}
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stratalog.engine.metadata import Metadata, NewObject, StreamMeta
from stratalog.engine.objformat import BlockEntry
from stratalog.errors import StratalogError
from stratalog.objects.store import ObjectStore

MANIFEST_PREFIX = "manifest/"
MANIFEST_FORMAT = 1
#: Snapshots (with the deltas after the older one) kept in the store; older manifests are deleted.
SNAPSHOTS_KEPT = 2
#: A block row: stream, start, end, position, size, count, max_ts, crc (BlockEntry's fields, in order).
BLOCK_ROW_FIELDS = 8

class ManifestError(StratalogError):
    """The manifest is missing or unreadable: the store was never opened against this object store?"""


@dataclass(frozen=True, slots=True)
class StreamInfo:
    stream_id: int
    name: str | None
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class BlockRef:
    """A data block and the object holding it."""

    key: str
    entry: BlockEntry


@dataclass
class Manifest:
    seq: int
    streams: dict[int, StreamInfo] = field(default_factory=dict)
    blocks: dict[int, list[BlockRef]] = field(default_factory=dict)

    def stream_by_name(self, name: str) -> StreamInfo | None:
        return next((s for s in self.streams.values() if s.name == name), None)


def _stream_doc(sm: StreamMeta) -> dict[str, object]:
    return {"id": sm.stream_id, "name": sm.name, "start": sm.start_offset, "end": sm.committed_end_offset}


def _block_row(e: BlockEntry) -> list[int]:
    return [e.stream_id, e.start_offset, e.end_offset, e.position, e.size_bytes, e.record_count,
            e.max_timestamp_ms, e.crc]


class ManifestPublisher:
    """Publishes one store's manifests, remembering the last one so each delta can name it."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._last_seq: int | None = None

    def resume(self, seq: int) -> bool:
        """Continue the chain an earlier process published, if its newest manifest is for commit ``seq``
        (so it is whole: a failed publication is always followed by a snapshot). False: the chain does
        not reach ``seq`` (a crash between a commit and its manifest, or a new store), so the next
        publication must be a snapshot."""
        seqs = [_seq_of(info.key) for info in self._store.list(MANIFEST_PREFIX)]
        if not seqs or max(seqs) != seq:
            return False
        with self._lock:
            self._last_seq = seq
        return True

    def delta(self, seq: int, streams: Sequence[StreamMeta], objects: Sequence[NewObject],
              removed_keys: Sequence[str] = ()) -> None:
        with self._lock:
            self._put({
                "format": MANIFEST_FORMAT, "kind": "delta", "seq": seq, "prev": self._last_seq,
                "streams": [_stream_doc(s) for s in streams],
                "objects": [{"key": o.key, "blocks": [_block_row(b) for b in o.blocks]} for o in objects],
                "removed": list(removed_keys),
            })

    def snapshot(self, seq: int, meta: Metadata) -> None:
        by_key: dict[str, list[list[int]]] = {}
        streams = meta.streams()
        for sm in streams:
            for row in meta.ranges(sm.stream_id, sm.start_offset, None, limit=1 << 62):
                by_key.setdefault(row.key, []).append(_block_row(row.entry()))
        with self._lock:
            self._put({
                "format": MANIFEST_FORMAT, "kind": "snapshot", "seq": seq, "prev": None,
                "streams": [_stream_doc(s) for s in streams],
                "objects": [{"key": k, "blocks": v} for k, v in sorted(by_key.items())],
                "removed": [],
            })
            self._prune()

    def _prune(self) -> None:
        """Delete manifests older than the second-newest snapshot.

        One older snapshot and its deltas stay, so a reader that listed the store just before the newest
        snapshot landed still finds every file of the chain it is following.
        """
        keys = [info.key for info in self._store.list(MANIFEST_PREFIX)]
        snapshots = sorted(_seq_of(k) for k in keys if k.endswith(".snapshot.json"))
        if len(snapshots) < SNAPSHOTS_KEPT:
            return
        oldest_kept = snapshots[-SNAPSHOTS_KEPT]
        for key in keys:
            if _seq_of(key) < oldest_kept:
                self._store.delete(key)

    def _put(self, doc: dict[str, object]) -> None:
        seq = int(doc["seq"])  # type: ignore[call-overload]
        self._store.put(f"{MANIFEST_PREFIX}{seq:020d}.{doc['kind']}.json",
                        json.dumps(doc, separators=(",", ":")).encode())
        self._last_seq = seq


def _seq_of(key: str) -> int:
    return int(key[len(MANIFEST_PREFIX):].split(".", maxsplit=1)[0])


def read_manifest(store: ObjectStore) -> Manifest:
    """The newest committed state reachable by an unbroken chain from the newest snapshot."""
    keys = [info.key for info in store.list(MANIFEST_PREFIX)]
    snapshots = sorted(k for k in keys if k.endswith(".snapshot.json"))
    if not snapshots:
        raise ManifestError("no manifest snapshot in the object store: open the store once to publish one")
    snap = _load(store, snapshots[-1])
    manifest = Manifest(seq=snap["seq"])
    _apply(manifest, snap)
    deltas = {}
    for key in keys:
        if key.endswith(".delta.json") and _seq_of(key) > manifest.seq:
            doc = _load(store, key)
            deltas[doc["prev"]] = doc
    while manifest.seq in deltas and deltas[manifest.seq]["seq"] > manifest.seq:
        doc = deltas[manifest.seq]
        _apply(manifest, doc)
        manifest.seq = doc["seq"]
    return manifest


def _is_int(value: object) -> bool:
    return type(value) is int   # not bool, which JSON's true would give


def _load(store: ObjectStore, key: str) -> dict[str, Any]:
    """The document at ``key``, its shape checked: a manifest that is not JSON, or not a manifest, let
    JSONDecodeError, KeyError, TypeError, RecursionError and UnicodeDecodeError out of read_manifest, or
    became blocks whose fields were strings (found by fuzzing)."""
    try:
        doc = json.loads(store.get(key))
    except (ValueError, RecursionError) as e:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ManifestError(f"manifest {key} is not JSON ({e})") from None
    if type(doc) is not dict:
        raise ManifestError(f"manifest {key} is not a JSON object")
    if doc.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"manifest format {doc.get('format')!r}; this stratalog reads {MANIFEST_FORMAT}")
    streams, objects, removed = doc.get("streams"), doc.get("objects"), doc.get("removed")
    if not (_is_int(doc.get("seq")) and "prev" in doc and (doc["prev"] is None or _is_int(doc["prev"]))
            and type(streams) is list and type(objects) is list and type(removed) is list
            and all(type(k) is str for k in removed)
            and all(type(s) is dict and all(_is_int(s.get(f)) for f in ("id", "start", "end"))
                    and "name" in s and (s["name"] is None or type(s["name"]) is str) for s in streams)
            and all(type(o) is dict and type(o.get("key")) is str and type(o.get("blocks")) is list
                    and all(type(row) is list and len(row) == BLOCK_ROW_FIELDS and all(map(_is_int, row))
                            for row in o["blocks"]) for o in objects)):
        raise ManifestError(f"manifest {key} does not have the shape of a manifest: damaged, or not ours")
    return doc


def _apply(manifest: Manifest, doc: dict[str, Any]) -> None:
    """Apply a document ``_load`` checked."""
    removed = set(doc["removed"])
    if removed:
        for stream_id, refs in manifest.blocks.items():
            manifest.blocks[stream_id] = [r for r in refs if r.key not in removed]
    for obj in doc["objects"]:
        for row in obj["blocks"]:
            entry = BlockEntry(*row)
            manifest.blocks.setdefault(entry.stream_id, []).append(BlockRef(obj["key"], entry))
    for s in doc["streams"]:
        info = StreamInfo(s["id"], s["name"], s["start"], s["end"])
        old = manifest.streams.get(info.stream_id)
        end = max(info.end_offset, old.end_offset) if old else info.end_offset
        manifest.streams[info.stream_id] = StreamInfo(info.stream_id, info.name, info.start_offset, end)
        refs = manifest.blocks.get(info.stream_id, [])
        manifest.blocks[info.stream_id] = sorted((r for r in refs if r.entry.end_offset > info.start_offset),
                                                 key=lambda r: r.entry.start_offset)
