"""A disk whose free space the test sets: every store's free-space look (stratalog.free_space.disk_usage)
sees it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratalog import free_space
from stratalog.free_space import Usage


class FakeDisk:
    """Every filesystem the stores look at, with the free bytes the test sets (1 GiB at first)."""

    def __init__(self) -> None:
        self.free_bytes = 1 << 30
        #: How many times a store looked.
        self.looks = 0

    def usage(self, path: Path) -> Usage:
        self.looks += 1
        return Usage(1 << 40, self.free_bytes)


def fake_disk(monkeypatch: pytest.MonkeyPatch) -> FakeDisk:
    fake = FakeDisk()
    monkeypatch.setattr(free_space, "disk_usage", fake.usage)
    return fake
