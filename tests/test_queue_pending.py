"""Pending puts (queues/pending.py): what puts hand over comes out of take in order, counted and bounded."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pyarrow as pa
import pytest

from stratalog.engine.store import StoreClosedError, StoreFailedError
from stratalog.queues.errors import PutBackpressureError, QueueStoreFullError
from stratalog.queues.format import I64
from stratalog.queues.pending import BulkPut, PendingPuts, SinglePuts


def _pending(wake: int = 4, messages_max: int = 8, bytes_max: int = 1 << 20) -> PendingPuts:
    return PendingPuts(wake, messages_max, bytes_max)


def test_take_returns_single_and_bulk_puts_in_the_order_they_were_made() -> None:
    pending = _pending()
    names, known, batch = pa.array(["b", "c"]), np.array([-1, 3], I64), pa.array([b"2", b"3"], pa.binary())
    pending.add("a", b"1")
    pending.add_bulk(names, known, batch, 2, 1)
    pending.add("d", b"4")
    pending.add_large("e", b"5")
    taken = pending.take()
    assert taken is not None
    parts = list(taken.parts())
    assert parts[0] == SinglePuts(["a"], [b"1"])
    assert isinstance(parts[1], BulkPut) and parts[1].names is names and parts[1].known is known \
        and parts[1].messages is batch and parts[1].unknown == 1
    assert parts[2] == SinglePuts(["d", "e"], [b"4", b"5"])
    assert len(parts) == 3
    assert pending.take() is None and not pending.waiting()


def test_single_puts_alone_come_out_as_one_run() -> None:
    pending = _pending()
    for i in range(3):
        pending.add(f"q{i}", b"%d" % i)
    taken = pending.take()
    assert taken is not None and list(taken.parts()) == [SinglePuts(["q0", "q1", "q2"], [b"0", b"1", b"2"])]


def test_add_says_when_the_writer_should_wake() -> None:
    pending = _pending(wake=3)
    assert [pending.add("q", b"m") for _ in range(4)] == [False, False, True, True]


def test_taken_puts_stay_waiting_until_written() -> None:
    """A get that finds no pending put must still wait for puts a drain has taken and not yet written."""
    pending = _pending()
    pending.add("q", b"m")
    assert pending.waiting() and not pending.empty()
    assert pending.take() is not None
    assert pending.empty() and pending.waiting()
    pending.written()
    assert not pending.waiting()


def test_the_bounds_count_single_puts_and_the_bytes_of_large_and_bulk_ones() -> None:
    pending = _pending(messages_max=2, bytes_max=10)
    pending.add("q", b"m")
    assert not pending.full()
    pending.add("q", b"m")
    assert pending.full()
    pending.take()
    assert not pending.full()
    pending.add_bulk(pa.array(["q"]), np.array([-1], I64), pa.array([b"x" * 10], pa.binary()), 10, 1)
    assert pending.full()
    pending.take()
    pending.add_large("q", b"x" * 9)
    assert not pending.full()


def test_a_put_waits_for_room_and_gives_up_after_its_bound() -> None:
    pending = _pending(messages_max=1)
    pending.add("q", b"m")
    with pytest.raises(PutBackpressureError, match=r"0\.05 s"):
        pending.wait_for_room(0.05, lambda: None)
    threading.Timer(0.05, pending.take).start()
    pending.wait_for_room(5.0, lambda: None)    # returns once the writer took the puts
    assert not pending.full()


class _Owner:
    def check_open(self) -> None:
        raise StoreFailedError("stopped")


def test_refused_puts_raise_the_owners_error() -> None:
    pending = _pending()
    owner = _Owner()
    pending.refuse(owner.check_open)
    with pytest.raises(StoreFailedError):
        pending.add("q", b"m")
    with pytest.raises(StoreFailedError):
        pending.add_large("q", b"m")
    with pytest.raises(StoreFailedError):
        pending.add_bulk(pa.array(["q"]), np.array([-1], I64), pa.array([b"m"], pa.binary()), 1, 1)


def test_refused_puts_do_not_keep_their_owner_alive() -> None:
    """The store holds its pending puts: were they to hold it back, a closed store would wait for a full
    garbage collection to be freed."""
    pending = _pending()
    owner = _Owner()
    pending.refuse(owner.check_open)
    gone = weakref.ref(owner)
    gc.disable()
    try:
        del owner
        assert gone() is None, "refused puts keep their owner alive"
    finally:
        gc.enable()
    with pytest.raises(StoreClosedError):
        pending.add("q", b"m")


class _Gate:
    """An owner whose admit refuses while ``full``, and resumes the puts once not."""

    def __init__(self, pending: PendingPuts) -> None:
        self.pending = pending
        self.full = True

    def admit(self) -> None:
        if self.full:
            raise QueueStoreFullError("the disk is nearly full")
        self.pending.resume()


def test_paused_puts_are_refused_then_land_once_admitted_and_a_put_that_raced_the_pause_is_kept() -> None:
    pending = _pending()
    gate = _Gate(pending)
    before = pending.slots
    pending.pause(gate.admit)
    before.extend(("q", b"raced", -1))   # a put that read the list just before the pause
    with pytest.raises(QueueStoreFullError):
        pending.add("q", b"refused")
    with pytest.raises(QueueStoreFullError):
        pending.add_bulk(pa.array(["q"]), np.array([-1], I64), pa.array([b"m"], pa.binary()), 1, 1)
    assert pending.waiting()
    taken = pending.take()
    assert taken is not None and taken.messages == [b"raced"], "the writer drains the raced put all the same"
    gate.full = False
    pending.add("q", b"admitted")    # admit resumes, and this put lands
    assert pending.slots is pending.accepting
    pending.add("q", b"after")
    taken = pending.take()
    assert taken is not None and taken.messages == [b"admitted", b"after"]


def test_a_store_that_stopped_while_paused_stays_refused() -> None:
    pending = _pending()
    gate = _Gate(pending)
    owner = _Owner()
    pending.pause(gate.admit)
    pending.refuse(owner.check_open)
    pending.resume()
    pending.pause(gate.admit)
    with pytest.raises(StoreFailedError):
        pending.add("q", b"m")
