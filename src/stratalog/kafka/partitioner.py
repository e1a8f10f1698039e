"""Kafka's default partitioner for keyed records: partition = (murmur2(key) & 0x7fffffff) % partitions.

Writers that choose partitions for keyed records (a Spark write given a topic and no partition) must
choose as Kafka's producers do, or records of one key written both ways would land in two partitions
and lose their order. MurmurHash2 (Austin Appleby's), 32-bit, with the seed Kafka's clients use.
"""

from __future__ import annotations

import struct

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """MurmurHash2 of ``data`` as an unsigned 32-bit number (Kafka's ``Utils.murmur2``, bit for bit)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    words = length // 4
    for (word,) in struct.iter_unpack("<I", data[:words * 4]):
        k = (word * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = data[words * 4:]
    if tail:
        for shift, byte in enumerate(tail):
            h ^= byte << (8 * shift)
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a record with ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
