"""Damage for property tests of parsers: bytes set, inserted and deleted where hypothesis says."""

from __future__ import annotations

from hypothesis import strategies as st

#: (what, where, which byte) for mutated(): places wrap around the data's length.
MUTATIONS = st.lists(st.tuples(st.sampled_from(["set", "insert", "delete"]), st.integers(0, 1 << 16),
                               st.integers(0, 255)), min_size=1, max_size=4)


def mutated(data: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
    """``data`` with each mutation applied in turn."""
    out = bytearray(data)
    for kind, place, byte in mutations:
        at = place % (len(out) + 1)
        if kind == "set" and at < len(out):
            out[at] = byte
        elif kind == "insert":
            out.insert(at, byte)
        elif kind == "delete" and at < len(out):
            del out[at]
    return bytes(out)
