"""Where a streaming sink's committed micro-batches are recorded: keys of the metadata's ``meta`` table.

A streaming write (spark/write.py, broker/api_staged.py) commits each micro-batch with a marker, the key
below and the batch id as value, in the commit's own transaction; a batch id at or below the stored one
is a replay and commits nothing.

- ``spark.sink.<sinkId>``: the last batch committed whole, by a broker alone or a store written
  directly. It stands for every partition the sink writes.
- ``spark.sink-partition.<len>:<sinkId><topic/partition>``: the last batch committed to one partition,
  by a broker of a cluster (each commits the partitions it leads). The sink id's length comes first, so
  no two (sink, partition) pairs share a key, whatever characters either holds.

A partition's markers go with its stream (StreamMetadata.delete_stream): a topic deleted and made again
under the same name starts with none. A whole-sink marker names no partition and stays.
"""

from __future__ import annotations

SINK_MARKER_PREFIX = "spark.sink."
PARTITION_MARKER_PREFIX = "spark.sink-partition."


def sink_marker_key(sink_id: str) -> str:
    """The key of the last batch ``sink_id`` committed whole."""
    return SINK_MARKER_PREFIX + sink_id


def partition_marker_key(sink_id: str, name: str) -> str:
    """The key of the last batch ``sink_id`` committed to partition ``name`` (``topic/partition``)."""
    return f"{PARTITION_MARKER_PREFIX}{len(sink_id)}:{sink_id}{name}"


def marker_partition(key: str) -> str | None:
    """The partition a per-partition marker's key names, None for any other key (or a malformed one)."""
    if not key.startswith(PARTITION_MARKER_PREFIX):
        return None
    length, colon, rest = key[len(PARTITION_MARKER_PREFIX):].partition(":")
    if not colon or not length.isdigit() or len(rest) <= int(length):
        return None
    return rest[int(length):]


def partition_markers_like(name: str) -> str:
    """A LIKE pattern (escape character ``\\``) matching every per-partition marker of partition ``name``,
    and perhaps others whose partition ends the same way: check each match with :func:`marker_partition`
    (SQLite's LIKE also ignores ASCII case)."""
    escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"{PARTITION_MARKER_PREFIX}%{escaped}"
