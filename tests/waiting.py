"""Waiting on an event a test cannot be told of directly: poll a condition until it holds.

The one wait helper of the tests: a test that waits for something to happen waits here, on the condition
that shows it happened, never for a fixed time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {said}")
        if poll_s:
            time.sleep(poll_s)
    return value
