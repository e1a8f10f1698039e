"""Whether a store may take writes: free space under its directories above a headroom, and its object store
not out of room. Both stores (StreamStore, QueueStore) keep one.

A store that filled its disk used to find out from an upload's ENOSPC, retry it for half a minute and stop,
taking every write with it until a restart. With a headroom the store refuses new writes while the
filesystem still has room for what it must finish (the uploads of what it already acknowledged, the
metadata's journal), keeps serving reads, and takes writes again by itself once space is back. The object
store's own "full" (ENOSPC under a local directory, an S3 quota) is the backstop: it refuses writes too,
until an upload goes through again.

States, and what moves between them (``refusal`` is None only in the first):

==================  ===========================================  =====================================
state               entered when                                 left when
==================  ===========================================  =====================================
writable            a check finds every directory above the      a check finds one below it, or an
                    headroom and no upload is out of room        upload runs out of room
disk low            a check finds a directory's free bytes       a check finds them all above it
                    below the headroom (timer, or a refusal)     again
objects full        an upload fails for want of room (object     an upload goes through
                    storage, or the metadata database)
==================  ===========================================  =====================================

Both "not writable" states may hold at once; the refusal names the disk first. Each change is logged once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Percentages are of this.
PERCENT = 100.0


@dataclass(frozen=True, slots=True)
class Usage:
    """A filesystem's size and the bytes an unprivileged writer may still use (statvfs's f_bavail)."""

    total_bytes: int
    free_bytes: int


def disk_usage(path: Path) -> Usage:
    st = os.statvfs(path)
    return Usage(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)


@dataclass(frozen=True, slots=True)
class Headroom:
    """Writes are refused while a directory's filesystem has less free than the larger of ``bytes_min``
    and ``percent_min`` of its size; checked every ``check_interval_s`` and at a refusal (at most once
    per ``recheck_interval_s``, so a storm of refused writes costs one statvfs now and then)."""

    bytes_min: int
    percent_min: float
    check_interval_s: float
    recheck_interval_s: float

    def validate(self, prefix: str) -> None:
        if self.bytes_min < 0 or not 0 <= self.percent_min < PERCENT:
            raise ValueError(f"{prefix}free_bytes_min must be >= 0 and {prefix}free_percent_min within 0..100")
        if self.check_interval_s <= 0 or self.recheck_interval_s < 0:
            raise ValueError(f"{prefix}free_space_check_interval_s must be > 0")

    def bound_bytes(self, usage: Usage) -> int:
        return max(self.bytes_min, int(usage.total_bytes * self.percent_min / PERCENT))


class SpaceGuard:
    """The writable state of one store (see the module's table). ``refusal`` is a plain attribute read,
    cheap enough for every write; :meth:`check` runs statvfs on each directory."""

    def __init__(self, paths: Sequence[Path], headroom: Headroom, log: logging.Logger, *,
                 usage: Callable[[Path], Usage] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._paths = tuple(dict.fromkeys(Path(p) for p in paths))
        self._headroom = headroom
        self._log = log
        #: (Looked up at each call unless given: a test may replace disk_usage for every store at once.)
        self._usage = usage or _current_disk_usage
        self._clock = clock
        self._lock = threading.Lock()
        self._disk_low: str | None = None
        self._objects_full: str | None = None
        self._checked_at = -float("inf")
        #: Why writes are refused now, or None: what a write reads.
        self.refusal: str | None = None
        #: The last check's figures, per directory: (free bytes, the bound).
        self.figures: dict[Path, tuple[int, int]] = {}

    def stats(self) -> dict[str, int]:
        """The last check's figures for the tightest directory (the least free above its bound), and whether
        writes are refused: what an operator's metrics show."""
        figures = self.figures
        free, bound = min(figures.values(), key=lambda f: f[0] - f[1]) if figures else (-1, -1)
        return {"space_free_bytes": free, "space_kept_free_bytes": bound,
                "space_refusing": int(self.refusal is not None)}

    def check(self) -> str | None:
        """Look at every directory's free space now; return the refusal that holds after it."""
        low: str | None = None
        figures = {}
        for path in self._paths:
            try:
                usage = self._usage(path)
            except OSError as e:   # a directory that cannot be looked at says nothing about space
                self._log.warning("free space under %s unknown: %s", path, e)
                continue
            bound = self._headroom.bound_bytes(usage)
            figures[path] = (usage.free_bytes, bound)
            if usage.free_bytes < bound and low is None:
                low = (f"the disk under {path} is nearly full: {_mib(usage.free_bytes)} free, below the "
                       f"{_mib(bound)} kept free (free_bytes_min, free_percent_min); writes are refused until "
                       "space is freed there, and resume by themselves")
        with self._lock:
            self._checked_at = self._clock()
            self.figures = figures
            self._set(low, self._objects_full)
            return self.refusal

    def recheck(self) -> str | None:
        """At a refused write: :meth:`check` again if the last check is older than the recheck interval."""
        if self._clock() - self._checked_at >= self._headroom.recheck_interval_s:
            return self.check()
        return self.refusal

    def objects_full(self, error: BaseException) -> None:
        """An upload failed for want of room (in object storage, or in the metadata database it commits
        to): refuse writes until one goes through."""
        with self._lock:
            self._set(self._disk_low, f"an upload ran out of room ({error}); writes are refused until an "
                                      "upload goes through again (it is retried meanwhile)")

    def objects_ok(self) -> None:
        """An upload went through."""
        if self._objects_full is not None:
            with self._lock:
                self._set(self._disk_low, None)

    def _set(self, disk_low: str | None, objects_full: str | None) -> None:
        """Enter the state these reasons make (lock held); log once when the state, not its figures, changed."""
        before = (self._disk_low is not None, self._objects_full is not None)
        self._disk_low, self._objects_full = disk_low, objects_full
        self.refusal = disk_low or objects_full
        if (disk_low is not None, objects_full is not None) != before:
            if self.refusal is None:
                self._log.warning("writes accepted again: space is back")
            else:
                self._log.error("%s", self.refusal)


def _current_disk_usage(path: Path) -> Usage:
    return disk_usage(path)


def _mib(size_bytes: int) -> str:
    return f"{size_bytes / (1 << 20):,.0f} MiB"
