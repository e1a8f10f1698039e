"""Waiting on an event a test cannot be told of directly: poll a condition until it holds.

The one wait helper of the tests: a test that waits for something to happen waits here, on the condition
that shows it happened, never for a fixed time.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic, sleep
from typing import TypeVar

#: How long a test waits for something that should happen in well under a second on a quiet machine.
WAIT_S = 60.0
#: Between polls: short against what is awaited, long enough not to load a busy machine.
POLL_S = 0.02

_T = TypeVar("_T")


def wait_until(condition: Callable[[], _T | None], what: str | Callable[[], str], timeout_s: float = WAIT_S,
               poll_s: float = POLL_S) -> _T:
    """``condition()``'s first true value; AssertionError naming ``what`` after ``timeout_s``.

    ``what`` may be a function, called only on a timeout, to say how far things got. ``poll_s=0`` suits a
    condition that itself blocks for a while (a consumer's poll), so no time is lost between calls."""
    deadline = monotonic() + timeout_s
    while not (value := condition()):
        if monotonic() > deadline:
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {said}")
        if poll_s:
            sleep(poll_s)
    return value


def wait_progressing(condition: Callable[[], _T | None], progress: Callable[[], object],
                     what: str | Callable[[], str], stall_s: float = WAIT_S, poll_s: float = POLL_S) -> _T:
    """``condition()``'s first true value, waiting as long as ``progress()`` keeps changing.

    For work whose length depends on the machine (a Spark job on a busy one): the wait fails only when
    ``progress()`` (a count, a set of files) has not changed for ``stall_s``, so a slow machine takes
    longer and a stuck one still ends with an AssertionError naming ``what``."""
    seen = progress()
    stalled_since = monotonic()
    while not (value := condition()):
        now = progress()
        if now != seen:
            seen, stalled_since = now, monotonic()
        elif monotonic() - stalled_since > stall_s:
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"nothing moved for {stall_s:g} s (last progress: {seen!r}) waiting for {said}")
        if poll_s:
            sleep(poll_s)
    return value
