"""The queue store's kill -9 child: puts rounds of messages to every queue, flushes after each round,
and says so on stdout; the parent kills it at a random moment and checks what survived.

Lines (see stratalog.chaos.lines): ``opened``; ``flushed <round>`` once every message of rounds
0 .. round is durable. Message of (iteration i, queue q, round r): ``i:q:r``.
"""

from __future__ import annotations

import argparse
import os
import sys

from stratalog.chaos.lines import LineWriter

TAG_OPENED = "opened"
TAG_FLUSHED = "flushed"


def message(iteration: int, queue: int, round_number: int) -> bytes:
    return f"{iteration}:{queue}:{round_number}".encode()


def queue_name(queue: int) -> str:
    return f"queue-{queue}"


def small_config() -> object:
    """Small bounds: uploads every few rounds, laid out in slices, and merges of every two objects, cut into
    pieces of an upload's size, so kills land in uploads (between slices too), merges (between pieces too),
    commits and WAL trims."""
    from stratalog.queues import QueueConfig
    from stratalog.wal.config import WALConfig

    return QueueConfig(wal_capacity_bytes=64 << 20, wal=WALConfig(record_bytes_max=2 << 20, window_bytes_max=8 << 20,
                                                                  buffered_bytes_max=16 << 20),
                       record_bytes_target=1 << 20, log_cache_bytes_max=8 << 20, upload_bytes_threshold=256 << 10,
                       upload_slice_bytes=48 << 10,
                       upload_idle_s=0.02, linger_s=0.002, compact_fanout=2, compact_retire_s=0.05,
                       compact_object_bytes_max=256 << 10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="queue-chaos-child")
    parser.add_argument("data_dir")
    parser.add_argument("--iteration", type=int, required=True)
    parser.add_argument("--queues", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=1 << 30)
    args = parser.parse_args(argv)
    from stratalog.queues import QueueConfig, QueueStore

    lines = LineWriter(sys.stdout.fileno())
    config = small_config()
    assert isinstance(config, QueueConfig)
    store = QueueStore.open(args.data_dir, config=config)
    lines.write(f"{TAG_OPENED}\n")
    for r in range(args.rounds):
        if r % 2:
            store.put_many([queue_name(q) for q in range(args.queues)],
                           [message(args.iteration, q, r) for q in range(args.queues)])
        else:
            for q in range(args.queues):
                store.put(queue_name(q), message(args.iteration, q, r))
        store.flush()
        lines.write(f"{TAG_FLUSHED} {r}\n")
    store.close()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
