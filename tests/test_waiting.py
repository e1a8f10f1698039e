"""The progress-based wait: it outlasts its stall window while something moves, and fails once nothing does.

A fake clock (each look at it one second later) keeps these tests independent of the machine's speed."""

from __future__ import annotations

import itertools

import pytest

import waiting
from waiting import wait_progressing


@pytest.fixture(autouse=True)
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    seconds = itertools.count()
    monkeypatch.setattr(waiting, "monotonic", lambda: float(next(seconds)))
    monkeypatch.setattr(waiting, "sleep", lambda _s: None)


def test_a_wait_that_keeps_seeing_progress_outlasts_its_stall_window() -> None:
    looks = itertools.count()
    ticks = itertools.count()
    # 100 looks take far more than the 10 s window on the fake clock; progress moves at every look.
    assert wait_progressing(lambda: next(looks) >= 100 or None, lambda: next(ticks), "100 looks", stall_s=10)


def test_a_wait_without_progress_fails_naming_what_it_waited_for() -> None:
    looks = itertools.count()
    with pytest.raises(AssertionError, match=r"nothing moved for 10 s \(last progress: 7\) waiting for the sink"):
        wait_progressing(lambda: next(looks) >= 100 or None, lambda: 7, lambda: "the sink", stall_s=10)
