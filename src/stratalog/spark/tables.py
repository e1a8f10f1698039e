"""Topics materialized as Parquet: the files, and the table manifest that says which offsets each holds.

Layout in the store's object storage (docs/formats/tables.md)::

    tables/<topic>/<partition>/<YYYY-MM-DD>/<start:020d>-<end:020d>.parquet
    tables/<topic>/manifest/<seq:020d>.json

A file holds offsets ``[start, end)`` of one partition, every record once, in offset order (offsets log
compaction emptied have none), with the data source's columns (stream, offset, timestamp, key, value);
its directory is the UTC day of its first record (1970-01-01 when it has none). The newest manifest lists
the files a reader may use; per partition they are contiguous from wherever retention left the
partition's start. Pure functions over manifests and an ObjectStore: no Spark.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from stratalog.errors import StratalogError
from stratalog.objects.store import ObjectStore

TABLES_PREFIX = "tables/"
#: A file dropped from the manifest (trimmed by retention) is deleted once this long has passed, so a
#: query planned on an older manifest can still read it.
RETIRED_GRACE_S = 600.0
#: Manifests kept besides the newest (older ones go when a new one is written).
MANIFESTS_KEPT = 8


class TableManifestError(StratalogError):
    """A table manifest that cannot be read, or files in it that do not line up."""


@dataclass(frozen=True, slots=True)
class TableFile:
    key: str
    partition: int
    start: int
    end: int
    bytes: int
    min_timestamp_ms: int
    max_timestamp_ms: int

    @property
    def rows(self) -> int:
        """The offsets the file covers: its records, but where log compaction left gaps."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Retired:
    key: str
    since_ms: int


@dataclass(slots=True)
class TableManifest:
    topic: str
    seq: int = 0
    files: list[TableFile] = field(default_factory=list)
    retired: list[Retired] = field(default_factory=list)

    def ends(self) -> dict[int, int]:
        """Per partition, the offset the materialized files reach."""
        out: dict[int, int] = {}
        for f in self.files:
            out[f.partition] = max(out.get(f.partition, 0), f.end)
        return out


def file_key(topic: str, partition: int, start: int, end: int, first_timestamp_ms: int) -> str:
    day = time.strftime("%Y-%m-%d", time.gmtime(first_timestamp_ms / 1000))
    return f"{TABLES_PREFIX}{topic}/{partition}/{day}/{start:020d}-{end:020d}.parquet"


def _manifest_prefix(topic: str) -> str:
    return f"{TABLES_PREFIX}{topic}/manifest/"


def read_table_manifest(store: ObjectStore, topic: str) -> TableManifest:
    """The newest manifest of ``topic``'s table (an empty one at seq 0 when it has none)."""
    keys = sorted(info.key for info in store.list(_manifest_prefix(topic)) if info.key.endswith(".json"))
    if not keys:
        return TableManifest(topic)
    try:
        doc = json.loads(store.get(keys[-1]))
        manifest = TableManifest(doc["topic"], int(doc["seq"]), [TableFile(**f) for f in doc["files"]],
                                 [Retired(**r) for r in doc["retired"]])
    except (ValueError, KeyError, TypeError) as e:
        raise TableManifestError(f"table manifest {keys[-1]} is unreadable: {e}") from e
    check_contiguous(manifest)
    return manifest


def check_contiguous(manifest: TableManifest) -> None:
    """Files of each partition must follow each other without gap or overlap."""
    last: dict[int, int] = {}
    for f in sorted(manifest.files, key=lambda f: (f.partition, f.start)):
        if f.start >= f.end or (f.partition in last and last[f.partition] != f.start):
            raise TableManifestError(f"table {manifest.topic}: file {f.key} covers [{f.start}, {f.end}) of partition "
                                     f"{f.partition}, which does not follow {last.get(f.partition)}")
        last[f.partition] = f.end


def write_table_manifest(store: ObjectStore, manifest: TableManifest) -> None:
    """Publish ``manifest`` (its ``seq`` one above the last) and drop manifests older than MANIFESTS_KEPT."""
    check_contiguous(manifest)
    doc = {"topic": manifest.topic, "seq": manifest.seq, "files": [asdict(f) for f in manifest.files],
           "retired": [asdict(r) for r in manifest.retired]}
    prefix = _manifest_prefix(manifest.topic)
    store.put(f"{prefix}{manifest.seq:020d}.json", json.dumps(doc, separators=(",", ":")).encode())
    keys = sorted(info.key for info in store.list(prefix) if info.key.endswith(".json"))
    for key in keys[:-(MANIFESTS_KEPT + 1)]:
        store.delete(key)


def after_trims(manifest: TableManifest, starts: dict[int, int], now_ms: int) -> TableManifest:
    """The manifest without files wholly below their partition's start (``starts``), which become retired;
    retired files past their grace are left out (the caller deletes them: see :func:`expired`)."""
    kept, retired = [], list(manifest.retired)
    for f in manifest.files:
        if f.end <= starts.get(f.partition, 0):
            retired.append(Retired(f.key, now_ms))
        else:
            kept.append(f)
    return TableManifest(manifest.topic, manifest.seq, kept, retired)


def expired(manifest: TableManifest, now_ms: int, grace_s: float = RETIRED_GRACE_S) -> tuple[list[str], TableManifest]:
    """Keys of retired files past their grace, and the manifest without them."""
    gone = [r.key for r in manifest.retired if r.since_ms <= now_ms - grace_s * 1000]
    left = [r for r in manifest.retired if r.key not in set(gone)]
    return gone, TableManifest(manifest.topic, manifest.seq, list(manifest.files), left)
