"""Queue names to ids for a whole batch at once: a hash table in NumPy arrays.

``put_many`` must find the id of every name in its batch. A dict lookup per name at a million queues takes a
cache miss each on the name's str, the dict's index, its entry and the id's int, which alone held put_many
to a fraction of its rate. ``NameIndex`` answers the batch in a few NumPy passes instead: the names as
one Arrow string array (UTF-8 bytes and offsets), a 64-bit hash of each computed eight bytes at a time, an
open-addressing table whose slot holds 31 bits of a name's hash and its id in one word (one cache miss a
probe), and an exact check of every hit against the stored bytes of the name, so a hash collision (by
chance, or a name crafted to collide) is never taken for a match. What it cannot answer is -1, never a
wrong id: the store then resolves that name through its dict (which creates new queues).

Concurrency: lookups run in the callers' threads while the writer adds names. The writer writes a new
name's bytes and extent first and its slot (one 8-byte store) last, so a lookup that sees the slot sees a
complete entry. Anything that grows is rebuilt into new arrays and published as one snapshot; a lookup
works on the snapshot it read when it began, and an id it cannot check in it counts as not found.

Memory: 8 bytes per table slot (at most half full: 16 bytes per name) plus 8 bytes per name of extent plus
the names' UTF-8 bytes: ~36 MB at a million names of 12 characters (room grows by doubling: up to twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from stratalog.invariant import invariant
from stratalog.native import native
from stratalog.queues.format import I64, Ids

U64 = np.uint64
Hashes = npt.NDArray[np.uint64]

#: The table is kept at most this full; at a half, a lookup probes ~1.5 slots on average.
LOAD_MAX = 0.5
TABLE_SLOTS_MIN = 1 << 10
#: A lookup probes the table for the whole batch in NumPy passes until this few names are left, then for
#: each of them alone (see _probe_each).
SCALAR_PROBES_MAX = 64
#: The name bytes' room grows by this factor, the extents' too: a growth copies them, so it must be rare.
GROWTH = 2
#: A word is read at any byte position, so the stored bytes keep this much zeroed room past their end.
WORD_BYTES = 8
#: A slot: the name's tag (high 32 bits: the hash's high half with its low bit set, so never 0) and its id
#: (low 32 bits). An extent: where the name's bytes start (high bits) and its length (low 12 bits; a name
#: is at most 255 characters, 1,020 bytes of UTF-8).
ID_BITS = 32
ID_MAX = (1 << ID_BITS) - 1
LENGTH_BITS = 12

_MULTIPLIER = U64(0x9E3779B97F4A7C15)   # 2**64 / golden ratio, odd
_MIX_1 = U64(0xFF51AFD7ED558CCD)        # the finalizer of MurmurHash3 (public domain constants)
_MIX_2 = U64(0xC4CEB9FE1A85EC53)
_SHIFT_31 = U64(31)
_SHIFT_32 = U64(32)
_SHIFT_33 = U64(33)
_LOW_32 = U64(ID_MAX)
_LENGTH_MASK = (1 << LENGTH_BITS) - 1
#: _WORD_MASKS[n]: the low n bytes of a little-endian word (n = 8: all of it).
_WORD_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(WORD_BYTES)] + [(1 << 64) - 1], U64)


def name_array(names: Any) -> Any:
    """``names`` (a sequence of str, a NumPy array of str, or an Arrow string array) as one Arrow array,
    of type ``string`` if they are all str (or null). Anything else keeps the type Arrow gives it (bytes:
    ``binary``), or raises (ArrowInvalid, ArrowTypeError, UnicodeEncodeError): the caller checks."""
    if isinstance(names, pa.ChunkedArray):
        names = names.combine_chunks()
    if isinstance(names, list | tuple) and _all_str(names):
        # The type given: Arrow's inference of it costs several times the conversion itself (at 10 k
        # names a put_many, a large share of the send's time under the GIL went to the inference).
        names = pa.array(names, pa.string())
    elif not isinstance(names, pa.Array):
        names = pa.array(names)
    if names.type == pa.null() and not len(names):
        return pa.array([], pa.string())
    if pa.types.is_large_string(names.type) or pa.types.is_string_view(names.type):
        return names.cast(pa.string())
    return names


def _all_str(names: list[Any] | tuple[Any, ...]) -> bool:
    """Whether every item is a str, in one C loop. Arrow converts bytes to ``string`` too
    when told the type, so this is checked first: bytes names must stay ``binary`` and be refused."""
    try:
        "".join(names)
    except TypeError:
        return False
    return True


def _words(data: npt.NDArray[np.uint8]) -> Hashes:
    """Every 8-byte little-endian word of ``data``, one starting at each byte: ``_words(d)[i]`` is bytes
    i .. i+7 (no copy: a view with a 1-byte stride)."""
    rows = len(data) - WORD_BYTES + 1
    windows = np.lib.stride_tricks.as_strided(data, shape=(rows, WORD_BYTES), strides=(1, 1), writeable=False)
    return windows.view("<u8")[:, 0]


def _padded(array: Any) -> tuple[Ids, Ids, npt.NDArray[np.uint8]]:
    """Starts, lengths and the UTF-8 bytes (with WORD_BYTES zeros after them) of a string array."""
    offsets = np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset * 4).astype(I64)
    first, last = int(offsets[0]), int(offsets[-1])
    data = np.zeros(last - first + WORD_BYTES, np.uint8)
    if last > first:
        data[:last - first] = np.frombuffer(array.buffers()[2], np.uint8, last - first, first)
    starts = offsets[:-1] - first
    return starts, offsets[1:] - offsets[:-1], data


@dataclass(frozen=True, slots=True)
class _Pass:
    """Bytes base .. base+7 of each name that has any there: ``live`` says which (None: all of them),
    ``words`` holds them (bytes past a name's end zeroed by ``mask``; None: no name ends inside)."""
    base: int
    live: Ids | None
    words: Hashes
    mask: Hashes | None


def _passes(starts: Ids, lengths: Ids, data: npt.NDArray[np.uint8]) -> list[_Pass]:
    """The names' bytes (starts[i] .. starts[i] + lengths[i] of ``data``) eight at a time, as NumPy arrays:
    one pass per word of the longest name, over every name while all are still that long."""
    if not len(lengths):
        return []
    words = _words(data)
    shortest, longest = int(lengths.min()), int(lengths.max())
    passes = []
    for base in range(0, longest, WORD_BYTES):
        if base + WORD_BYTES <= shortest:
            passes.append(_Pass(base, None, words[starts + base], None))
            continue
        live = None if base < shortest else np.flatnonzero(lengths > base)
        at, left = (starts, lengths) if live is None else (starts[live], lengths[live])
        mask = np.take(_WORD_MASKS, np.minimum(left - base, WORD_BYTES))
        passes.append(_Pass(base, live, words[at + base] & mask, mask))
    return passes


def name_hashes(lengths: Ids, passes: list[_Pass]) -> Hashes:
    """A 64-bit hash of each name from its length and its words (see _passes)."""
    hashes = lengths.astype(U64) * _MULTIPLIER
    for one in passes:
        if one.live is None:
            mixed = (hashes ^ one.words) * _MULTIPLIER
            hashes = mixed ^ (mixed >> _SHIFT_31)
        else:
            mixed = (hashes[one.live] ^ one.words) * _MULTIPLIER
            hashes[one.live] = mixed ^ (mixed >> _SHIFT_31)
    hashes ^= hashes >> _SHIFT_33
    hashes *= _MIX_1
    hashes ^= hashes >> _SHIFT_33
    hashes *= _MIX_2
    hashes ^= hashes >> _SHIFT_33
    return hashes




@dataclass(frozen=True, slots=True)
class _Snapshot:
    slots: Hashes                 # tag << 32 | id; 0: empty
    extents: Ids                  # per id: start << LENGTH_BITS | length; -1: no name has this id
    data: npt.NDArray[np.uint8]   # the names' bytes, then zeroed room
    used_bytes: int
    probes_max: int               # the longest probe sequence in the table

    @property
    def mask(self) -> int:
        return len(self.slots) - 1


class NameIndex:
    """The ids of known names, found for a batch at a time (see the module's doc). One writer adds;
    any number of threads look up."""

    def __init__(self) -> None:
        self._snap = _Snapshot(np.zeros(TABLE_SLOTS_MIN, U64), np.zeros(0, I64),
                               np.zeros(WORD_BYTES, np.uint8), 0, 0)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        snap = self._snap
        return snap.slots.nbytes + snap.extents.nbytes + snap.data.nbytes

    def lookup(self, array: Any) -> Ids:
        """The id of each name of an Arrow string array, -1 where the name is not known (or null): one C
        call where the compiled core is built (``_native.lookup_names``), else :func:`lookup_numpy`."""
        found = _lookup(self._snap, array)
        if array.null_count:
            found[np.asarray(array.is_null())] = -1
        return found

    def add(self, names: Any, ids: Ids) -> None:
        """Make ``names[i]`` (new, distinct) known as ``ids[i]``. The writer's alone."""
        array = name_array(names)
        invariant(len(array) == len(ids) and not array.null_count, "one id for each name, no nulls")
        if not len(ids):
            return
        invariant(int(ids.min()) >= 0 and int(ids.max()) <= ID_MAX, "ids fit a slot")
        starts, lengths, data = _padded(array)
        invariant(int(lengths.max()) <= _LENGTH_MASK, "a name's length fits an extent")
        hashes = name_hashes(lengths, _passes(starts, lengths, data))
        snap = self._grown(self._snap, int(ids.max()) + 1, self._count + len(ids), len(data))
        used = snap.used_bytes
        size = len(data) - WORD_BYTES
        snap.data[used:used + size] = data[:size]
        snap.extents[ids] = ((starts + used) << LENGTH_BITS) | lengths
        probes = _insert(snap.slots, hashes, ids)
        self._count += len(ids)
        self._snap = _Snapshot(snap.slots, snap.extents, snap.data, used + size, max(snap.probes_max, probes))

    def _grown(self, snap: _Snapshot, id_count: int, name_count: int, new_bytes: int) -> _Snapshot:
        """``snap``, or a copy with room for what comes (published at once: lookups may be using the old)."""
        slot_count = len(snap.slots)
        while name_count > slot_count * LOAD_MAX:
            slot_count *= 2
        extent_count = len(snap.extents)
        if id_count > extent_count:
            extent_count = max(id_count, GROWTH * extent_count)
        room = len(snap.data)
        if snap.used_bytes + new_bytes > room:
            room = max(snap.used_bytes + new_bytes, GROWTH * room)
        if (slot_count, extent_count, room) == (len(snap.slots), len(snap.extents), len(snap.data)):
            return snap
        extents = np.full(extent_count, -1, I64)
        extents[:len(snap.extents)] = snap.extents
        data = np.zeros(room, np.uint8)
        data[:snap.used_bytes] = snap.data[:snap.used_bytes]
        slots, probes = snap.slots, snap.probes_max
        if slot_count != len(snap.slots):
            # Rehash from the stored names: a slot keeps only part of its name's hash.
            ids = (snap.slots[snap.slots != 0] & _LOW_32).astype(I64)
            known = extents[ids]
            starts, lengths = known >> LENGTH_BITS, known & _LENGTH_MASK
            slots = np.zeros(slot_count, U64)
            probes = _insert(slots, name_hashes(lengths, _passes(starts, lengths, data)), ids)
        grown = _Snapshot(slots, extents, data, snap.used_bytes, probes)
        self._snap = grown
        return grown


def lookup_numpy(snap: _Snapshot, array: Any) -> Ids:
    """The id of each name of ``array`` (an Arrow string array) in ``snap``, -1 where it is not there; nulls
    are the caller's. In NumPy passes over the whole batch; the twin of ``_native.lookup_names``."""
    starts, lengths, data = _padded(array)
    passes = _passes(starts, lengths, data)
    hashes = name_hashes(lengths, passes)
    tags = (hashes >> _SHIFT_32) | U64(1)
    homes = (hashes & U64(snap.mask)).astype(I64)
    # The first probe for all (most names are in their home slot), then for those still going.
    entries = np.take(snap.slots, homes)
    hit = (entries >> _SHIFT_32) == tags
    found = np.where(hit, (entries & _LOW_32).astype(I64), -1)
    pending = np.flatnonzero(~hit & (entries != 0))
    tags, homes = tags[pending], (homes[pending] + 1) & snap.mask
    for done in range(1, snap.probes_max):
        if len(pending) <= SCALAR_PROBES_MAX:
            _probe_each(snap, snap.probes_max - done, pending, tags, homes, found)
            break
        entries = np.take(snap.slots, homes)
        hit = (entries >> _SHIFT_32) == tags
        found[pending[hit]] = entries[hit] & _LOW_32
        going = ~hit & (entries != 0)
        pending, tags, homes = pending[going], tags[going], (homes[going] + 1) & snap.mask
    return _verified(found, lengths, passes, snap)


def lookup_native(snap: _Snapshot, array: Any) -> Ids:
    """:func:`lookup_numpy` as one C call, with the GIL released while it runs (the compiled core's)."""
    offsets = np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset * 4)
    found = np.empty(len(array), I64)
    _lookup_names(offsets, array.buffers()[2] or b"", snap.slots, snap.extents, snap.data, snap.probes_max,
                        found)
    return found


_lookup_names: Any = native.lookup_names if native is not None else None
_lookup = lookup_native if native is not None else lookup_numpy


def _probe_each(snap: _Snapshot, probes: int, pending: Ids, tags: Hashes, homes: Ids, found: Ids) -> None:
    """The last ``probes`` probes of the last few names one at a time: a NumPy pass costs microseconds
    whatever its length, and the longest probe sequences (tens of slots) belong to a handful of names."""
    slots, mask = snap.slots, snap.mask
    for at, tag, home in zip(pending.tolist(), tags.tolist(), homes.tolist(), strict=True):
        slot = home
        for _ in range(probes):
            entry = slots.item(slot)
            if entry >> ID_BITS == tag:
                found[at] = entry & ID_MAX
                break
            if not entry:
                break
            slot = (slot + 1) & mask


def _insert(slots: Hashes, hashes: Hashes, ids: Ids) -> int:
    """Put each (hash, id) in the first free slot from its home on; returns the longest probe sequence
    used. Each round, every entry whose slot is free takes it unless an earlier entry of the round wants the
    same slot; the others move on one slot."""
    mask = len(slots) - 1
    homes = (hashes & U64(mask)).astype(I64)
    entries = (((hashes >> _SHIFT_32) | U64(1)) << _SHIFT_32) | ids.astype(U64)
    probes = 0
    while len(entries):
        probes += 1
        candidates = np.flatnonzero(slots[homes] == 0)
        _, first = np.unique(homes[candidates], return_index=True)
        placing = candidates[first]
        slots[homes[placing]] = entries[placing]
        left = np.ones(len(entries), bool)
        left[placing] = False
        entries, homes = entries[left], (homes[left] + 1) & mask
    return probes


def _verified(found: Ids, lengths: Ids, passes: list[_Pass], snap: _Snapshot) -> Ids:
    """``found`` with every id whose stored name differs from the looked-up one set to -1."""
    # An id past the snapshot's extents was added after it was read: not checkable here, so not found.
    extents = np.take(snap.extents, found, mode="clip") if len(snap.extents) else np.full(len(found), -1, I64)
    same = (found >= 0) & (found < len(snap.extents)) & (extents >= 0) & ((extents & _LENGTH_MASK) == lengths)
    # Where a name is not the same its stored start is garbage: read at 0 instead, results not used.
    # (Indexing, not np.take: take would first copy the strided view of every stored byte.)
    stored = np.where(same, extents >> LENGTH_BITS, 0)
    theirs = _words(snap.data)
    for one in passes:
        at = stored if one.live is None else stored[one.live]
        words = theirs[np.minimum(at + one.base, len(theirs) - 1)]
        if one.mask is not None:
            words &= one.mask
        if one.live is None:
            same &= words == one.words
        else:
            same[one.live] &= words == one.words
    found[~same] = -1
    return found
