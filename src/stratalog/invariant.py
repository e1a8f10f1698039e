"""Assertions of programmer errors that survive ``python -O``."""

from typing import NoReturn


class InvariantError(AssertionError):
    """A bug: an internal assumption did not hold."""


def _raise(message: str) -> NoReturn:
    raise InvariantError(message)


def invariant(condition: bool, message: str = "invariant violated") -> None:
    """Raise InvariantError when ``condition`` is false, even under ``python -O``."""
    if not condition:
        _raise(message)
