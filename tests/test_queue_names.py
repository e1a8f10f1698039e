"""NameIndex: put_many's batch lookup of queue ids, against a dict; a found id is always the right one. Every
test runs on both lookups, the compiled one (``_native.lookup_names``) and its NumPy twin, and a property
test holds the two to the same ids on the same tables, forged slots included."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import examples
from stratalog.native import native
from stratalog.queues import names as names_module
from stratalog.queues.names import NameIndex, lookup_native, lookup_numpy, name_array, name_hashes

U64 = np.uint64


@pytest.fixture(autouse=True, params=["native", "numpy"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native":
        if native is None:
            pytest.fail("the compiled core is not loaded: make test builds it")
        monkeypatch.setattr(names_module, "_lookup", lookup_native)
    else:
        monkeypatch.setattr(names_module, "_lookup", lookup_numpy)
    return str(request.param)


def _lookup(index: NameIndex, names: list[str]) -> list[int]:
    return index.lookup(name_array(names)).tolist()


def test_added_names_are_found_and_others_are_not() -> None:
    index = NameIndex()
    index.add(["a", "bb", "queue-1"], np.array([0, 1, 2]))
    index.add(["x" * 1000, "é" * 255, "キュー"], np.array([3, 4, 5]))

    assert _lookup(index, ["queue-1", "a", "nope", "", "x" * 1000, "x" * 999, "é" * 255, "キュー", "bb"]) \
        == [2, 0, -1, -1, 3, -1, 4, 5, 1]
    assert len(index) == 6


def test_prefixes_and_extensions_of_a_name_are_other_names() -> None:
    index = NameIndex()
    index.add(["abcdefgh", "abcdefghi"], np.array([0, 1]))

    assert _lookup(index, ["abcdefg", "abcdefgh", "abcdefghi", "abcdefghij", "abcdefgi"]) == [-1, 0, 1, -1, -1]


def test_nulls_and_a_sliced_array_are_looked_up_by_their_own_bytes() -> None:
    index = NameIndex()
    index.add(["p", "q", "r"], np.array([7, 8, 9]))
    array = pa.array(["zz", "q", None, "r", "p"]).slice(1)

    assert index.lookup(array).tolist() == [8, -1, 9, 7]


def _hash(name: str) -> int:
    """A name's 64-bit hash, as the table places it (the NumPy one: the compiled lookup's must equal it)."""
    array = name_array([name])
    starts, lengths, data = names_module._padded(array)
    return int(name_hashes(lengths, names_module._passes(starts, lengths, data))[0])


def _slot(index: NameIndex, name: str, stream_id: int) -> tuple[int, int]:
    """The home slot of ``name`` and an entry that claims it for ``stream_id``."""
    snap = index._snap
    hashed = _hash(name)
    return hashed & snap.mask, ((hashed >> 32) | 1) << 32 | stream_id


def test_a_slot_that_claims_a_name_for_another_id_gives_none() -> None:
    # A forged (or colliding) tag: the slot says "other" has id 0 and "n1" has id 2. The bytes check finds
    # that those ids are other names': -1 (the store then asks its dict), never a wrong id.
    index = NameIndex()
    index.add(["n0", "n1", "n2"], np.arange(3))
    for name, claimed in (("other", 0), ("n1", 2)):
        home, entry = _slot(index, name, claimed)
        index._snap.slots[home] = U64(entry)

    assert _lookup(index, ["other", "n1", "n0", "n2"]) == [-1, -1, 0, 2]


def test_names_that_share_a_home_slot_are_found_along_its_probe_sequence() -> None:
    # Sixty names with one home slot: the longest probe sequence is as long, and each is found.
    index = NameIndex()
    mask = index._snap.mask
    candidates = [f"n{i}" for i in range(200_000)]
    starts, lengths, data = names_module._padded(name_array(candidates))
    homes = name_hashes(lengths, names_module._passes(starts, lengths, data)) & U64(mask)
    same_home = [candidates[i] for i in np.flatnonzero(homes == 7)[:60]]
    index.add(same_home, np.arange(60))

    assert index._snap.probes_max >= 60
    assert _lookup(index, [*reversed(same_home), "n-none"]) == [*range(59, -1, -1), -1]


def test_the_table_grows_and_keeps_every_name() -> None:
    index = NameIndex()
    names = [f"queue-{i}" for i in range(20_000)]
    for start in range(0, len(names), 1_500):
        chunk = names[start:start + 1_500]
        index.add(chunk, np.arange(start, start + len(chunk)))

    assert _lookup(index, names) == list(range(len(names)))
    assert index.nbytes < 64 * len(names) + 1024 * 1024


def test_ids_need_not_come_in_order() -> None:
    index = NameIndex()
    index.add(["c", "a", "b"], np.array([2, 0, 1]))
    index.add(["z"], np.array([10]))

    assert _lookup(index, ["a", "b", "c", "z"]) == [0, 1, 2, 10]


def test_lookups_beside_a_writer_find_the_right_id_or_none() -> None:
    index = NameIndex()
    names = [f"q{i:07d}" for i in range(60_000)]
    index.add(names[:1_000], np.arange(1_000))
    stop = threading.Event()
    wrong: list[tuple[str, int]] = []
    array = name_array(names)

    def reader() -> None:
        while not stop.is_set():
            for i, found in enumerate(index.lookup(array).tolist()):
                if found not in (i, -1):
                    wrong.append((names[i], found))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for start in range(1_000, len(names), 997):
        chunk = names[start:start + 997]
        index.add(chunk, np.arange(start, start + len(chunk)))
    stop.set()
    for t in threads:
        t.join()

    assert wrong == []
    assert index.lookup(array).tolist() == list(range(len(names)))


#: Queue names are valid Unicode: no lone surrogates (they have no UTF-8).
_names = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(_names.filter(bool), min_size=1, max_size=200, unique=True), st.lists(_names, max_size=50),
       st.integers(1, 50))
def test_lookup_agrees_with_a_dict(known: list[str], probes: list[str], chunk: int) -> None:
    index = NameIndex()
    model: dict[str, int] = {}
    for start in range(0, len(known), chunk):
        part = known[start:start + chunk]
        index.add(part, np.arange(start, start + len(part)))
        model.update(zip(part, range(start, start + len(part)), strict=True))
    asked = [*probes, *known]

    assert _lookup(index, asked) == [model.get(p, -1) for p in asked]


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(_names.filter(bool), min_size=1, max_size=120, unique=True), st.lists(_names, max_size=40),
       st.lists(st.tuples(st.integers(0, 1023), st.integers(0, 200), st.integers(0, 2**31)), max_size=30),
       st.data())
def test_the_compiled_lookup_gives_its_twins_ids(known: list[str], probes: list[str],
                                                   forged: list[tuple[int, int, int]], data: st.DataObject) -> None:
    # The two lookups on one table, whose slots are then forged: a random slot, or a probe name's home,
    # claims a tag (random, or the probed name's own) for an id (one of the table's, past its extents, or
    # a name's that has none).
    if native is None:
        pytest.fail("the compiled core is not loaded: make test builds it")
    index = NameIndex()
    index.add(known, np.arange(len(known)))
    asked = [*probes, *known]
    slots = index._snap.slots
    for random_slot, stream_id, tag in forged:
        slot, entry = random_slot, (tag | 1) << 32 | stream_id
        if asked and data.draw(st.booleans()):
            slot, entry = _slot(index, data.draw(st.sampled_from(asked)), stream_id)
        slots[slot & index._snap.mask] = U64(entry)
    array = name_array(asked).slice(data.draw(st.integers(0, len(asked))))

    assert lookup_native(index._snap, array).tolist() == lookup_numpy(index._snap, array).tolist()


@pytest.mark.parametrize("case", ["offsets past the bytes", "offsets going back", "no slots", "slots not a power "
                                  "of two", "found too short"])
def test_the_compiled_lookup_refuses_arrays_that_do_not_fit(case: str) -> None:
    if native is None:
        pytest.fail("the compiled core is not loaded: make test builds it")
    offsets, data = np.array([0, 2, 5], np.int32), b"abcde"
    slots, extents, stored = np.zeros(8, U64), np.zeros(1, np.int64), np.zeros(8, np.uint8)
    found = np.zeros(2, np.int64)
    if case == "offsets past the bytes":
        offsets = np.array([0, 2, 6], np.int32)
    elif case == "offsets going back":
        offsets = np.array([0, 3, 2], np.int32)
    elif case == "no slots":
        slots = np.zeros(0, U64)
    elif case == "slots not a power of two":
        slots = np.zeros(6, U64)
    else:
        found = np.zeros(1, np.int64)

    with pytest.raises(ValueError, match="lookup_names"):
        native.lookup_names(offsets, data, slots, extents, stored, 1, found)
