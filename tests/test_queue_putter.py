"""QueueStore.put as one C call (``_native.QueuePutter``) against its twin, the Python method: the same
puts land in the same queues in the same order, and every put the compiled one does not take itself (a
large or non-bytes message, a name to check, a closed store) fails as the twin fails. Two stores side by
side, one putting through each."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from examples import examples
from queuekit import small_queue_config
from stratalog.native import native
from stratalog.queues import QueueStore

SMALL_BYTES_MAX = 64
NAMES = st.one_of(st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12),
                  st.sampled_from(["", "x" * 255, "x" * 256, "caf\u00e9", "a/b", "a b", "\x00"]),
                  st.sampled_from([b"q", None, 7]))
MESSAGES = st.one_of(st.binary(max_size=SMALL_BYTES_MAX), st.binary(min_size=SMALL_BYTES_MAX + 1, max_size=300),
                     st.binary(max_size=8).map(bytearray), st.binary(max_size=8).map(memoryview),
                     st.sampled_from(["text", None, 3, b"x" * 5000]))
_rounds = itertools.count()


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[QueueStore, QueueStore]]:
    if native is None:
        pytest.fail("the compiled core is not built: make test builds it")
    config = small_queue_config(small_message_bytes_max=SMALL_BYTES_MAX)
    compiled = QueueStore.open(tmp_path_factory.mktemp("compiled"), config=config)
    twin = QueueStore.open(tmp_path_factory.mktemp("twin"), config=config)
    assert "put" in vars(compiled), "the compiled putter is in place"
    try:
        yield compiled, twin
    finally:
        compiled.close()
        twin.close()


def outcome(put: object, name: object, message: object) -> tuple[str, str]:
    try:
        put(name, message)  # type: ignore[operator]
    except Exception as e:
        return type(e).__name__, str(e)
    return "put", ""


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(puts=st.lists(st.tuples(NAMES, MESSAGES), max_size=30))
def test_puts_land_and_fail_alike(stores: tuple[QueueStore, QueueStore],
                                  puts: list[tuple[object, object]]) -> None:
    compiled, twin = stores
    prefix = f"r{next(_rounds)}-"   # each example its own queues
    for name, message in puts:
        named = prefix + name if isinstance(name, str) and name else name
        assert outcome(compiled.put, named, message) == outcome(QueueStore.put.__get__(twin), named, message)
    compiled.flush()
    twin.flush()
    for name in {prefix + n for n, _ in puts if isinstance(n, str) and n}:
        assert compiled.get(name, 0, 100) == twin.get(name, 0, 100)


def test_a_closed_store_refuses_puts_alike(tmp_path: Path) -> None:
    config = small_queue_config()
    compiled = QueueStore.open(tmp_path / "compiled", config=config)
    twin = QueueStore.open(tmp_path / "twin", config=config)
    put = compiled.put    # held across the close, as a caller's bound put would be
    compiled.close()
    twin.close()
    assert outcome(put, "q", b"m") == outcome(twin.put, "q", b"m") != ("put", "")
    assert "put" not in vars(compiled), "close drops the compiled putter (and the cycle through it)"
