"""Every bound of the queue store, named, with the reason for its default."""

from __future__ import annotations

from dataclasses import dataclass, field

from stratalog.free_space import Headroom
from stratalog.io.libc import CACHED_READ_BYTES_MAX
from stratalog.queues.format import LAY_OUT_SLICE_BYTES, OBJECT_BYTES_MAX
from stratalog.wal.config import WALConfig

#: Longest queue name, in characters (at most 1020 bytes of UTF-8: fits the formats' u16 length).
QUEUE_NAME_CHARS_MAX = 255
#: Longest consumer group name, in characters.
GROUP_NAME_CHARS_MAX = 255
#: Most queues a store can hold: queue ids are dense u32 in the formats, and ``stream_count`` a u32.
QUEUES_FORMAT_MAX = (1 << 32) - 1


def _queue_wal() -> WALConfig:
    # Bulk records of up to 16 MiB: each carries one writer pass (a few ms of puts). The window and the
    # write buffer must hold a few of the largest blocks.
    return WALConfig(record_bytes_max=16 << 20, window_bytes_max=64 << 20, buffered_bytes_max=128 << 20)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    #: Largest message. 64 KiB: queues here carry small messages (the million-queue race's are ~58 bytes); a bound
    #: keeps one bulk record, and the buffer of puts not yet written, within known sizes.
    message_bytes_max: int = 64 << 10
    #: Messages up to this size take put's lock-free path and count as one pending message each; larger
    #: ones count by their bytes too, so ``pending_bytes_max`` bounds what big messages can hold.
    small_message_bytes_max: int = 1024
    #: Queues at most. Each queue costs about 200 bytes of memory (its name twice, its state, 8 bytes per
    #: object in the index) whether or not it holds messages: lower it to bound that. At most
    #: QUEUES_FORMAT_MAX. A put_many that would pass it raises TooManyQueuesError and puts nothing; a single
    #: put's queue is made by the writer, after put returned, so the store stops with that error instead
    #: (flush and every later call raise it: the puts after it are never acknowledged).
    queues_max: int = QUEUES_FORMAT_MAX
    #: Puts not yet handed to the WAL. The writer wakes once this many wait (or after ``linger_s``) ...
    pending_messages_wake: int = 32768
    #: ... and put waits (up to ``put_wait_s_max``) once this many wait, or once messages above 1 KiB and
    #: bulk puts hold ``pending_bytes_max``: the writer is behind. Beside many producer threads the writer
    #: gets the GIL for one switch interval in several, so this bound is what keeps the puts it takes
    #: recent enough to be in the CPU's caches: 64 Ki sent more than 256 Ki at a million queues with 8
    #: threads, and larger bounds take more memory.
    pending_messages_max: int = 1 << 16
    pending_bytes_max: int = 64 << 20
    linger_s: float = 0.05
    put_wait_s_max: float = 30.0
    #: A bulk record is closed at about this many bytes of messages (the WAL's record bound less room
    #: for the message ends and runs that go with them).
    record_bytes_target: int = 8 << 20
    #: The WAL ring: only data not yet in objects lives there (the log cache's bytes and the records'
    #: framing and padding).
    wal_capacity_bytes: int = 1 << 30
    wal: WALConfig = field(default_factory=_queue_wal)
    #: Messages in the WAL but not yet in objects, held in memory (about 1.3x these bytes at a million
    #: queues: each run's offsets and counts beside its messages). When full, the writer waits for uploads.
    #: Twice an upload, so the writer goes on while one is made.
    log_cache_bytes_max: int = 512 << 20
    #: A local object store syncs an upload or merge this often as it writes it (its own default, 1 MiB,
    #: keeps the stream engine's append latency low during uploads). 16 MiB: the disk writes an object
    #: faster in fewer syncs, and put_many at a million queues sends more.
    upload_sync_bytes: int = 16 << 20
    #: Upload once this much waits (one object per upload, so this sets objects' size and with it the
    #: number of index entries per queue, 8 bytes per queue per object, and how many objects the merges
    #: have to catch up with) ... What a send leaves in the log cache is read from there, a run per
    #: record (a queue's messages spread over every record), until it is uploaded. 384 MiB with a log
    #: cache of 768 was measured: a put_many send to a million queues left 6-7 objects
    #: instead of 9-13 and its consumers were faster, but the put layout's reads were slower, and at 100 k
    #: queues x 10 M, whose data then stayed in the log cache, index checks and consumers much slower.
    upload_bytes_threshold: int = 256 << 20
    #: ... or once no put came for this long (a finished producer's tail goes to objects soon) ...
    upload_idle_s: float = 0.5
    #: ... or once the oldest waiting data is this old.
    upload_interval_s: float = 10.0
    #: An upload lays its object out this many bytes at a time (each slice fresh memory beside the log
    #: cache; see format.LAY_OUT_SLICE_BYTES).
    upload_slice_bytes: int = LAY_OUT_SLICE_BYTES
    #: Checked runs kept for sequential readers: a consumer reads a whole run (all of a queue's messages
    #: in one object) once and takes its next gets from here. Random reads are not kept.
    read_cache_bytes_max: int = 128 << 20
    #: Consumers walking the queues in order (their runs neighbours in each object) read each object this
    #: much at a time, a chunk serving the next queues' runs from memory. 0: each run is read alone. A
    #: multiple of 4 KiB, at most CACHED_READ_BYTES_MAX (so it is taken from the page cache without
    #: giving up the GIL).
    read_ahead_bytes: int = 64 << 10
    #: The chunks kept, all objects together (each object its share, at least
    #: ``read_ahead_chunks_per_object_min``): consumer threads
    #: that share the walk drift apart, and a chunk dropped before the slowest reached it is read again.
    #: 8 threads consuming 20% of a million queues in 13 objects made 6.3 object reads per queue with 16
    #: chunks an object (13 MiB), 3.1 with 128 (104 MiB), 2.0 with 256 (208 MiB).
    read_ahead_cache_bytes: int = 128 << 20
    #: A read of the log cache rebuilds its index of runs at most this often (a build sorts every cached
    #: run); records written since the last build are searched one by one ...
    tail_rebuild_s: float = 0.05
    #: ... and a reader that would search more than this many records one by one waits for the rebuild.
    tail_lookups_max: int = 16
    #: Read-ahead across queues starts where a sequential reader's run starts within 1/this of
    #: ``read_ahead_bytes`` of where the last sequential read in its object ended (consumers walking the
    #: queues in order) ...
    read_ahead_walk_span: int = 16
    #: ... and goes on into the next chunk while the last one served at least this many runs: a chunk costs
    #: what several reads of one run do (the copy and a CRC per page), so it must serve well more.
    read_ahead_walk_runs_min: int = 16
    #: Each object keeps at least this many chunks read ahead, whatever its share of
    #: ``read_ahead_cache_bytes``: reader threads sharing a walk drift apart by a few chunks.
    read_ahead_chunks_per_object_min: int = 16
    #: Object uploads retry a failed step this many times, backing off, before the store stops.
    upload_attempts_max: int = 5
    upload_backoff_s: float = 0.2
    #: Compaction merges this many consecutive objects of one size tier into one (0: never), so a queue's
    #: messages sit in a few runs rather than one per upload: at a million queues an upload leaves ~3
    #: messages per queue. Tier t holds objects of upload_bytes_threshold * fanout^t / 2 up to the next.
    #: Each tier rewrites the data once more.
    compact_fanout: int = 4
    #: A merge's runs are cut by stream range into objects of at most this many bytes (run positions are
    #: u32: at most 4 GiB) ...
    compact_object_bytes_max: int = 2 << 30
    #: ... and a merge takes at most this many bytes of objects: each tier rewrites the data once more, and
    #: a merge of 16 GiB already rewrites 16 GiB.
    compact_merge_bytes_max: int = 16 << 30
    #: Once no put and no get has come for ``compact_idle_s`` and the log cache is empty, the newest merge units are
    #: merged into one even if the tiers would not yet: a store at rest will serve its next readers from fewer runs.
    #: After a 100 M-message send to a million queues the tiers leave 5-7 objects and a consumer reads 4-6 runs per
    #: queue; merging the newest (2.3-2.5 GB) leaves 2, and consumers and index checks are faster for it.
    #: An older unit joins the merge only while it is at most ``compact_fanout`` times the newer ones
    #: it would join (so a trickle of small uploads never rewrites a big old object: each byte is rewritten a bounded
    #: number of times, as the tiers do) and the merge stays within ``compact_idle_bytes_max`` (0: no merges at rest),
    #: short enough to end before the store is busy again.
    compact_idle_s: float = 1.0
    compact_idle_bytes_max: int = 4 << 30
    #: A merge reads about this much of its sources at a time; its working memory is about 3x this.
    compact_slice_bytes: int = 32 << 20
    #: With a local object store, merges run in a worker process with a core (and a GIL) of their own, and
    #: uploads go on beside them; otherwise in a thread of the store, uploads waiting for each merge.
    compact_in_worker: bool = True
    #: Merged-away objects stay readable this long (a get in flight may hold one), then are deleted; or
    #: sooner, once no get of this store is in flight (readers in other processes, such as Spark tasks
    #: planned on an older manifest, find the object gone and read the merged one).
    compact_retire_s: float = 10.0
    #: With a local object store, a merged-away object's file is kept (up to this many bytes of them) for
    #: the next upload or merge to write over instead of a new file: no blocks to allocate, and pages the
    #: page cache may still hold (where freed memory goes back to a VM's host, writing new pages costs
    #: a fault each). 0: deleted at once. Spare files count in the store's disk use; they are deleted
    #: once no put has come for ``compact_idle_s`` (a store not being written needs none) and at close.
    spare_bytes_max: int = 2 << 30

    #: Puts are refused (QueueStoreFullError) while the filesystem of the data directory, or of a local
    #: object store, has less free than the larger of these two, so that what the store must still write
    #: once it stops taking puts has room: the uploads of its log cache (log_cache_bytes_max, 512 MiB) and
    #: the metadata's journal. Merges wait meanwhile (a merge writes its output before the objects it
    #: replaces go), and the spare files are deleted. Gets go on; puts resume by themselves once space is
    #: back. 0 and 0: refuse only when a write finds the disk full.
    free_bytes_min: int = 512 << 20
    free_percent_min: float = 1.0
    #: Free space is looked at this often (by the uploader thread) ...
    free_space_check_interval_s: float = 1.0
    #: ... and at a refused put, when the last look is older than this.
    free_space_recheck_interval_s: float = 0.1

    @property
    def headroom(self) -> Headroom:
        return Headroom(self.free_bytes_min, self.free_percent_min, self.free_space_check_interval_s,
                        self.free_space_recheck_interval_s)

    def validate(self) -> None:
        if not 1 <= self.queues_max <= QUEUES_FORMAT_MAX:
            raise ValueError(f"queues_max must be within 1 .. {QUEUES_FORMAT_MAX} (queue ids are u32)")
        if self.small_message_bytes_max < 0:
            raise ValueError("small_message_bytes_max must be >= 0")
        if self.tail_rebuild_s < 0 or self.tail_lookups_max < 0:
            raise ValueError("tail_rebuild_s and tail_lookups_max must be >= 0")
        if self.read_ahead_walk_span < 1 or self.read_ahead_walk_runs_min < 0 \
                or self.read_ahead_chunks_per_object_min < 1:
            raise ValueError("read_ahead_walk_span and read_ahead_chunks_per_object_min must be >= 1, "
                             "read_ahead_walk_runs_min >= 0")
        if not 1 <= self.message_bytes_max <= self.record_bytes_target:
            raise ValueError("message_bytes_max must be within 1 .. record_bytes_target")
        if self.record_bytes_target * 3 // 2 > self.wal.record_bytes_max:
            raise ValueError("wal.record_bytes_max must hold a bulk record of record_bytes_target bytes and "
                             "its message ends")
        if not 1 <= self.pending_messages_wake <= self.pending_messages_max:
            raise ValueError("pending_messages_wake must be within 1 .. pending_messages_max")
        self.headroom.validate("")
        if self.upload_slice_bytes < 1:
            raise ValueError("upload_slice_bytes must be positive")
        if self.upload_bytes_threshold > self.log_cache_bytes_max:
            raise ValueError("upload_bytes_threshold must not exceed log_cache_bytes_max")
        if self.log_cache_bytes_max >= self.wal_capacity_bytes:
            raise ValueError("the WAL must be larger than the log cache: it holds everything not yet uploaded")
        if not 0 <= self.read_ahead_bytes <= CACHED_READ_BYTES_MAX or self.read_ahead_bytes % 4096:
            raise ValueError(f"read_ahead_bytes must be a multiple of 4096 within 0 .. {CACHED_READ_BYTES_MAX}")
        if self.read_ahead_cache_bytes < 0:
            raise ValueError("read_ahead_cache_bytes must be >= 0")
        if self.upload_sync_bytes < 1:
            raise ValueError("upload_sync_bytes must be >= 1")
        if self.upload_attempts_max < 1:
            raise ValueError("upload_attempts_max must be >= 1")
        if self.compact_fanout == 1 or self.compact_fanout < 0:
            raise ValueError("compact_fanout must be 0 (no compaction) or at least 2")
        if not self.upload_bytes_threshold <= self.compact_object_bytes_max <= OBJECT_BYTES_MAX:
            raise ValueError(f"compact_object_bytes_max must be within upload_bytes_threshold .. {OBJECT_BYTES_MAX}")
        if self.compact_merge_bytes_max < self.upload_bytes_threshold:
            raise ValueError("compact_merge_bytes_max must be at least upload_bytes_threshold")
        if self.compact_idle_s < 0 or self.compact_idle_bytes_max < 0:
            raise ValueError("compact_idle_s and compact_idle_bytes_max must be >= 0")
        if self.spare_bytes_max < 0:
            raise ValueError("spare_bytes_max must be >= 0")
        if self.compact_slice_bytes < 1 or self.compact_retire_s < 0:
            raise ValueError("compact_slice_bytes must be >= 1 and compact_retire_s >= 0")
        self.wal.validate(self.wal_capacity_bytes - 8192)
