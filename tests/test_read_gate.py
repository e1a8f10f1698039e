"""A connection's read gate (broker/read_gate.py): one test per row of its transition table, then the
admission rule."""

from __future__ import annotations

import pytest

from stratalog.broker.read_gate import Hold, ReadGate, ReadState

REASONS = [Hold.WRITE_BLOCKED, Hold.MUTED, Hold.WAITING_FOR_ROOM]


def held(*reasons: Hold) -> ReadGate:
    gate = ReadGate()
    gate.hold()
    for reason in reasons:
        gate.hold(reason)
    return gate


@pytest.mark.parametrize("reason", [Hold.NONE, *REASONS])
def test_open_then_hold_pauses_the_socket_once(reason: Hold) -> None:
    gate = ReadGate()
    assert gate.state is ReadState.OPEN
    assert gate.hold(reason) is True
    assert gate.state is ReadState.HELD and gate.holds == reason


@pytest.mark.parametrize("reason", REASONS)
def test_held_then_hold_adds_the_reason_and_pauses_nothing(reason: Hold) -> None:
    gate = held()
    assert gate.hold(reason) is False
    assert gate.state is ReadState.HELD and reason in gate.holds


@pytest.mark.parametrize("reason", REASONS)
def test_held_then_release_drops_that_reason_only(reason: Hold) -> None:
    others = [r for r in REASONS if r is not reason]
    gate = held(reason, *others)
    gate.release(reason)
    assert gate.state is ReadState.HELD and reason not in gate.holds
    assert all(r in gate.holds for r in others)
    assert gate.go_on(room=True) is False   # the others still hold


@pytest.mark.parametrize("reason", [Hold.NONE, *REASONS])
def test_held_with_no_reason_left_goes_on_once_there_is_room(reason: Hold) -> None:
    gate = held(reason)
    gate.release(reason)
    assert gate.go_on(room=True) is True
    assert gate.state is ReadState.OPEN and gate.holds == Hold.NONE
    assert gate.go_on(room=True) is False   # open already: nothing to resume


def test_held_without_room_stays_held() -> None:
    gate = held()
    assert gate.go_on(room=False) is False
    assert gate.state is ReadState.HELD


def test_admit_drops_the_wait_for_room_and_admits_the_next_request_once() -> None:
    gate = held(Hold.WAITING_FOR_ROOM, Hold.MUTED)
    gate.admit()
    assert Hold.WAITING_FOR_ROOM not in gate.holds and Hold.MUTED in gate.holds
    assert gate.take_admission() is True
    assert gate.take_admission() is False


@pytest.mark.parametrize("start", ["open", "held"])
def test_end_is_for_good(start: str) -> None:
    gate = ReadGate() if start == "open" else held(Hold.MUTED)
    gate.end()
    assert gate.done and gate.state is ReadState.DONE


def test_done_answers_every_event_with_done() -> None:
    gate = held(Hold.WRITE_BLOCKED)
    gate.end()
    for reason in REASONS:
        gate.release(reason)
    gate.admit()
    assert gate.hold(Hold.MUTED) is False
    assert gate.go_on(room=True) is False
    assert gate.state is ReadState.DONE


def test_a_new_gate_admits_nothing_past_a_full_queue() -> None:
    assert ReadGate().take_admission() is False
