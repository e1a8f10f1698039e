"""NameIndex: put_many's batch lookup of queue ids, against a dict; a found id is always the right one."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratalog.queues import names as names_module
from stratalog.queues.names import NameIndex, name_array


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


def test_a_hash_shared_by_every_name_never_gives_a_wrong_id(monkeypatch: pytest.MonkeyPatch) -> None:
    # Names crafted (here: forced) to collide land in the same slots; the bytes check tells them apart,
    # and what it cannot place is -1 (the store then asks its dict), never another name's id.
    monkeypatch.setattr(names_module, "name_hashes", lambda lengths, passes: np.full(len(lengths), 12345, np.uint64))
    index = NameIndex()
    names = [f"n{i}" for i in range(50)]
    index.add(names, np.arange(50))

    found = _lookup(index, [*names, "other"])

    assert found[0] == 0
    assert all(f in (i, -1) for i, f in enumerate(found[:50]))
    assert found[50] == -1


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


@settings(max_examples=60, deadline=None)
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
