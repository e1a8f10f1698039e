"""The 64-bit hash from which both chaos children derive every record, so the parent can rebuild any of them."""

from __future__ import annotations

_U64_MASK = (1 << 64) - 1


def mix64(value: int) -> int:
    """SplitMix64's finalizer: spreads every input bit over the 64 output bits."""
    value = (value + 0x9E3779B97F4A7C15) & _U64_MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _U64_MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _U64_MASK
    return value ^ (value >> 31)
