"""The manifest: committed state published in the object store, for readers that have only the store.

Spark executors (and any other reader without the store's SQLite) find every committed object and range
here. Each metadata commit publishes a small *delta*; every ``manifest_snapshot_every`` commits, and at
an open that finds the published chain short of the last commit, a full *snapshot*. Each delta names
the manifest published just before it (``prev``), so a reader follows an unbroken chain from the newest
snapshot and stops at the first missing link: what it sees is always a state the store really
committed, never a mix.

Several publishers may share one object store and one metadata (the brokers of a cluster, each committing
the partitions it leads in PostgreSQL): each names its documents with an id of its own, and a delta names
the publisher of its ``prev`` too, so no two publishers overwrite each other's documents and each
publisher's deltas form a chain of their own. A reader merges them (:func:`read_manifest`): the newest
snapshot (of any publisher: a snapshot holds the whole shared metadata), then every delta after it whose
chain reaches back to that snapshot unbroken, in commit order. Where a lost delta left a stream's blocks
with a hole (its publisher died between a commit and its manifest), the stream is covered only up to the
hole: a reader with a broker reads the rest through it, never a wrong record.

Keys: ``manifest/<seq:020d>.<publisher>.snapshot.json`` and ``manifest/<seq:020d>.<publisher>.delta.json``
(``manifest/<seq:020d>.snapshot.json`` and ``.delta.json``, without a publisher, as stores before
publishers had ids wrote them: still read, as publisher ``""``). JSON documents::

    {"format": 1, "kind": "snapshot"|"delta", "seq": N, "prev": N|null, "from": "<publisher>",
     "prev_from": "<publisher>"|null,
     "streams": [{"id": 1, "name": "a", "start": 0, "end": 10}],
     "objects": [{"key": "data/...", "blocks": [[stream, start, end, position, size, count, max_ts, crc]]}],
     "removed": ["data/..."]}

docs/formats/object.md has the rules and an example.
"""

from __future__ import annotations

import json
import re
import secrets
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
#: Random bytes of a publisher's id (hex in its keys): enough that publishers of one store never share one.
PUBLISHER_ID_BYTES = 6
#: A manifest key after the prefix: the commit, the publisher (absent in keys of older stores), the kind.
_KEY = re.compile(r"(\d{20})(?:\.([0-9a-f]{1,64}))?\.(snapshot|delta)\.json")

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
    """Publishes one store's manifests, remembering the last one so each delta can name it. Each publisher
    has an id of its own: publishers sharing a store (a cluster's brokers) never write the same key."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self.publisher_id = secrets.token_hex(PUBLISHER_ID_BYTES)
        #: (seq, publisher) of the last document this chain holds.
        self._last: tuple[int, str] | None = None

    def resume(self, seq: int) -> bool:
        """Continue the chain an earlier process published, if its newest manifest is for commit ``seq``
        (so it is whole: a failed publication is always followed by a snapshot). False: the chain does
        not reach ``seq`` (a crash between a commit and its manifest, or a new store), so the next
        publication must be a snapshot."""
        names = [name for info in self._store.list(MANIFEST_PREFIX) if (name := parse_key(info.key)) is not None]
        if not names:
            return False
        newest = max(names)
        if newest[0] != seq:
            return False
        with self._lock:
            self._last = (newest[0], newest[1])
        return True

    def delta(self, seq: int, streams: Sequence[StreamMeta], objects: Sequence[NewObject],
              removed_keys: Sequence[str] = ()) -> None:
        with self._lock:
            last = self._last
            self._put({
                "format": MANIFEST_FORMAT, "kind": "delta", "seq": seq, "prev": None if last is None else last[0],
                "from": self.publisher_id, "prev_from": None if last is None else last[1],
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
                "from": self.publisher_id, "prev_from": None,
                "streams": [_stream_doc(s) for s in streams],
                "objects": [{"key": k, "blocks": v} for k, v in sorted(by_key.items())],
                "removed": [],
            })
            self._prune()

    def _prune(self) -> None:
        """Delete manifests older than the second-newest snapshot, whoever published them (a snapshot holds
        the whole metadata, so it covers every publisher's older deltas).

        One older snapshot and its deltas stay, so a reader that listed the store just before the newest
        snapshot landed still finds every file of the chain it is following.
        """
        keys = [info.key for info in self._store.list(MANIFEST_PREFIX) if parse_key(info.key) is not None]
        snapshots = sorted(_seq_of(k) for k in keys if k.endswith(".snapshot.json"))
        if len(snapshots) < SNAPSHOTS_KEPT:
            return
        oldest_kept = snapshots[-SNAPSHOTS_KEPT]
        for key in keys:
            if _seq_of(key) < oldest_kept:
                self._store.delete(key)

    def _put(self, doc: dict[str, object]) -> None:
        seq = int(doc["seq"])  # type: ignore[call-overload]
        self._store.put(f"{MANIFEST_PREFIX}{seq:020d}.{self.publisher_id}.{doc['kind']}.json",
                        json.dumps(doc, separators=(",", ":")).encode())
        self._last = (seq, self.publisher_id)


def parse_key(key: str) -> tuple[int, str, str] | None:
    """(seq, publisher, kind) of a manifest's key (publisher ``""`` in an older store's keys); None for
    any other key."""
    found = _KEY.fullmatch(key[len(MANIFEST_PREFIX):]) if key.startswith(MANIFEST_PREFIX) else None
    return None if found is None else (int(found[1]), found[2] or "", found[3])


def _seq_of(key: str) -> int:
    return int(key[len(MANIFEST_PREFIX):].split(".", maxsplit=1)[0])


def read_manifest(store: ObjectStore) -> Manifest:
    """The committed state the published manifests show: the newest snapshot, then every delta after it
    whose chain of ``prev`` links reaches back to it unbroken (each publisher's, in commit order), each
    stream covered up to its first hole."""
    names = {name: info.key for info in store.list(MANIFEST_PREFIX) if (name := parse_key(info.key)) is not None}
    snapshots = sorted(name for name in names if name[2] == "snapshot")
    if not snapshots:
        raise ManifestError("no manifest snapshot in the object store: open the store once to publish one")
    newest = snapshots[-1]
    snap = _load(store, names[newest])
    manifest = Manifest(seq=newest[0])
    _apply(manifest, snap)
    # A delta's prev was published before it, at a lower seq: in seq order, its link is decided first.
    linked: set[tuple[int, str]] = set()
    for name in sorted(n for n in names if n[2] == "delta" and n[0] > newest[0]):
        doc = _load(store, names[name])
        prev, prev_from = doc["prev"], doc.get("prev_from") or ""
        if prev is None or (prev > newest[0] and (prev, prev_from) not in linked):
            continue   # a missing link: this publisher's chain is broken from here on
        linked.add((name[0], name[1]))
        _apply(manifest, doc)
        manifest.seq = max(manifest.seq, name[0])
    _cover_to_first_hole(manifest)
    return manifest


def _cover_to_first_hole(manifest: Manifest) -> None:
    """Each stream's blocks, once each, tile it from its start: a stream ends at its first hole or overlap.

    A store's blocks tile each stream (a compaction keeps offsets, an empty run becomes an empty batch),
    so a hole means a delta that was never published (its publisher died between the commit and its
    manifest) and an overlap a delta applied over a snapshot that already held its commit's successor.
    Either way what follows is not known here; a reader through a broker reads it from the broker."""
    for stream_id, info in list(manifest.streams.items()):
        unique = {(r.key, r.entry.start_offset, r.entry.end_offset): r for r in manifest.blocks.get(stream_id, ())}
        covered: list[BlockRef] = []
        at = info.start_offset
        for ref in sorted(unique.values(), key=lambda r: (r.entry.start_offset, r.entry.end_offset)):
            if ref.entry.end_offset <= info.start_offset:
                continue
            if ref.entry.start_offset > at or (covered and ref.entry.start_offset != at):
                break
            covered.append(ref)
            at = ref.entry.end_offset
        manifest.blocks[stream_id] = covered
        if at < info.end_offset:
            manifest.streams[stream_id] = StreamInfo(stream_id, info.name, info.start_offset, at)


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
            and all(doc.get(f) is None or type(doc[f]) is str for f in ("from", "prev_from"))
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
        # Both only grow: a delta applied over a snapshot that already held a later commit takes nothing back.
        end = max(info.end_offset, old.end_offset) if old else info.end_offset
        start = max(info.start_offset, old.start_offset) if old else info.start_offset
        info = StreamInfo(info.stream_id, info.name, start, end)
        manifest.streams[info.stream_id] = info
        refs = manifest.blocks.get(info.stream_id, [])
        manifest.blocks[info.stream_id] = sorted((r for r in refs if r.entry.end_offset > info.start_offset),
                                                 key=lambda r: r.entry.start_offset)
