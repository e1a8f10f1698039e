"""What both kill -9 harnesses share besides running the child: the error that ends a run, and its loop."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

RoundT = TypeVar("RoundT")


class MustBeZeroFigures:
    """A run's figures judged by counts that each break a promise unless zero: ``must_be_zero`` names
    them (fields of the dataclass this is mixed into)."""

    __slots__ = ()
    must_be_zero: ClassVar[tuple[str, ...]] = ()

    @property
    def failures(self) -> int:
        return sum(int(getattr(self, name)) for name in self.must_be_zero)

    @property
    def ok(self) -> bool:
        return self.failures == 0

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "failures": self.failures, "ok": self.ok}  # type: ignore[call-overload]


class ChaosHarnessError(RuntimeError):
    """The harness itself could not run a round (the child did not start, or died by itself too early)."""


def _never() -> bool:
    return False


def run_rounds(
    rounds: int,
    play: Callable[[int], RoundT],
    on_round: Callable[[RoundT], None] | None = None,
    stop: Callable[[], bool] = _never,
) -> tuple[list[RoundT], float]:
    """Play rounds ``0, 1, ... rounds - 1`` in order, or until ``stop()`` says so after one.

    ``on_round`` sees each round's figures as soon as it ends. Returns every round's figures and the
    seconds the rounds took.
    """
    played: list[RoundT] = []
    started = time.monotonic()
    for index in range(rounds):
        figures = play(index)
        played.append(figures)
        if on_round is not None:
            on_round(figures)
        if stop():
            break
    return played, time.monotonic() - started
