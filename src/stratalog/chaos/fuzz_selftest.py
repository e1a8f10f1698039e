"""Targets with a planted bug, for the tests of the harness itself: a fuzzing run that reports no
finding on these is a broken harness, not a clean parser.

``selftest_exception`` wraps the queue manifest's decoder and raises KeyError (outside its contract) when
the input starts with ``BUG!``; its seed starts with ``BUG?``, one byte away. ``selftest_allocation``
allocates 64 MiB for an input starting with ``B``, far beyond its bound; its seed starts with ``A``.
"""

from __future__ import annotations

from stratalog.chaos.fuzz_targets import FuzzTarget
from stratalog.queues.format import CorruptBulkError
from stratalog.queues.manifest import QueueManifest, decode_manifest, encode_manifest

PLANTED_PREFIX = b"BUG!"
PLANTED_ALLOCATION_BYTES = 64 << 20


def planted_exception(data: bytes) -> None:
    if data[:len(PLANTED_PREFIX)] == PLANTED_PREFIX:
        raise KeyError("planted")
    decode_manifest(data)


def planted_allocation(data: bytes) -> None:
    if data[:1] == b"B":
        bytearray(PLANTED_ALLOCATION_BYTES)
    decode_manifest(data)


def _seeds() -> list[bytes]:
    return [b"BUG?" + encode_manifest(QueueManifest(1, 1, ()))]


def _allocation_seeds() -> list[bytes]:
    return [b"A" + encode_manifest(QueueManifest(1, 1, ()))]


TARGETS = (
    FuzzTarget("selftest_exception", "planted: KeyError on inputs starting BUG!", planted_exception,
               (CorruptBulkError,), _seeds),
    FuzzTarget("selftest_allocation", "planted: 64 MiB allocated for inputs starting B", planted_allocation,
               (CorruptBulkError,), _allocation_seeds),
)
