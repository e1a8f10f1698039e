"""What every benchmark shares: a description of the machine, latency summaries, JSON output, and the
plain-disk references each component is measured against.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import mmap
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stratalog.io.device import FileDevice, aligned_buffer

MIB_BYTES = 1 << 20
KIB_BYTES = 1 << 10
MS_PER_S = 1000.0
#: Read size of the reference sequential read: the WAL's recovery_read_bytes default.
REFERENCE_READ_BYTES = 4 << 20

#: Percentiles in a latency summary, as (key, percentile). p999 needs ~1000 samples to mean anything;
#: it is reported anyway, with the sample count beside it.
LATENCY_PERCENTILES = (("p50", 50.0), ("p99", 99.0), ("p999", 99.9))


def run_threads(count: int, target: Callable[[int], None], name: str = "bench") -> None:
    """Run ``target(t)`` for t in 0 .. count - 1 on threads of their own; re-raise the first error."""
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            target(t)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,), name=f"{name}-{t}") for t in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]

def size_label(size_bytes: int) -> str:
    """1024 -> "1 KiB", 1048576 -> "1 MiB", 1000 -> "1000 B"."""
    if size_bytes >= MIB_BYTES and size_bytes % MIB_BYTES == 0:
        return f"{size_bytes // MIB_BYTES} MiB"
    if size_bytes >= KIB_BYTES and size_bytes % KIB_BYTES == 0:
        return f"{size_bytes // KIB_BYTES} KiB"
    return f"{size_bytes} B"


def summarize_latency_ms(latencies_s: npt.NDArray[np.float64]) -> dict[str, float]:
    """avg, p50, p99, p999 and max of ``latencies_s``, in milliseconds (zeros for no samples)."""
    if latencies_s.size == 0:
        return {"avg": 0.0, **{key: 0.0 for key, _ in LATENCY_PERCENTILES}, "max": 0.0, "samples": 0}
    latencies_ms = latencies_s * MS_PER_S
    points = np.percentile(latencies_ms, [pct for _, pct in LATENCY_PERCENTILES])
    summary = {"avg": float(latencies_ms.mean())}
    summary.update({key: float(value) for (key, _), value in zip(LATENCY_PERCENTILES, points, strict=True)})
    summary["max"] = float(latencies_ms.max())
    summary["samples"] = int(latencies_ms.size)
    return summary


def write_json(path: str | os.PathLike[str], document: dict[str, Any]) -> None:
    """Write ``document`` as indented JSON, replacing ``path`` atomically (no half-written results).

    The document gets the run's provenance where it lacks it (:func:`provenance`): a table made from
    the JSON can then say when, on which code and by which command its figures were measured.
    """
    for key, value in provenance().items():
        document.setdefault(key, value)
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(document, indent=2) + "\n")
    partial.replace(target)


#: How long `git rev-parse` may take before the commit is left out: a bench never waits on git.
GIT_TIMEOUT_S = 5.0


def provenance() -> dict[str, Any]:
    """When the run ended (UTC), the commit of the code that ran, and the command line that ran it.

    The commit is that of the checkout holding this package (``None`` for an installed package); the
    working tree may hold changes beyond it, which the commit does not show.
    """
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _git_commit(Path(__file__).resolve().parent),
        "command": shlex.join(["stratalog", *sys.argv[1:]]),
    }


def _git_commit(directory: Path) -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=directory, capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def machine_info(target_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """CPUs, kernel, Python, memory, and the filesystem and disk holding ``target_dir``."""
    mount = _mount_of(Path(target_dir))
    return {
        "cpus": os.cpu_count() or 0,
        "cpu_model": _cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "memory_mib": _memory_mib(),
        "filesystem": mount["fstype"],
        "mount_point": mount["mount_point"],
        "disk_device": mount["source"],
    }


@dataclass(frozen=True, slots=True)
class Activity:
    """Machine-wide CPU and disk-write counters beside this process's own. Two of them, taken before
    and after a run, tell how much else ran on the machine meanwhile: a benchmark shares the CPUs and
    the disk with whatever else is running, and its figures mean little if that was a lot."""

    cpu_busy_s: float
    cpu_steal_s: float
    own_cpu_s: float
    disk_written_bytes: int
    own_written_bytes: int

    @classmethod
    def take(cls, disk_device: str) -> Activity:
        times = os.times()
        busy_s, steal_s = _cpu_busy_and_steal_s()
        return cls(busy_s, steal_s, times.user + times.system, _disk_written_bytes(disk_device),
                   _own_written_bytes())

    def others_since(self, earlier: Activity) -> dict[str, float]:
        """CPU seconds, stolen CPU seconds and MiB written by everything but this process between
        ``earlier`` and now.

        Kernel threads count as others, and some of their work is this run's (block-layer and
        filesystem workers): an idle machine still shows a few CPU-seconds here over a long run.
        """
        own_cpu_s = self.own_cpu_s - earlier.own_cpu_s
        own_written = self.own_written_bytes - earlier.own_written_bytes
        return {
            "other_cpu_s": max(0.0, self.cpu_busy_s - earlier.cpu_busy_s - own_cpu_s),
            # Time the hypervisor ran something else on this machine's CPUs: a virtual machine's
            # neighbours, invisible to it except here.
            "steal_cpu_s": self.cpu_steal_s - earlier.cpu_steal_s,
            # Includes the filesystem's own journal writes for this run's files: a few MiB.
            "other_disk_write_mib": max(0, self.disk_written_bytes - earlier.disk_written_bytes - own_written)
            / MIB_BYTES,
        }


def _cpu_busy_and_steal_s() -> tuple[float, float]:
    """User + nice + system CPU time of everything since boot, and steal time. Interrupt time is left
    out: during a run it is mostly the completions of the run's own I/O, charged to no process."""
    lines = _read_lines("/proc/stat")
    if not lines:
        return 0.0, 0.0
    fields = [int(f) for f in lines[0].split()[1:9]]
    user, nice, system, steal = fields[0], fields[1], fields[2], fields[7]
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    return (user + nice + system) / ticks_per_s, steal / ticks_per_s


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk for ``path``: a file, or every file under a directory (a preallocated file
    counts in full; files deleted while it walks are skipped)."""
    if path.is_file():
        return path.stat().st_blocks * 512
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


#: /proc/diskstats fields (Documentation/admin-guide/iostats.rst): the device's name, and the sectors it
#: has written, counted in 512-byte sectors whatever the device's own sector size.
_DISKSTATS_NAME, _DISKSTATS_SECTORS_WRITTEN, _DISKSTATS_SECTOR_BYTES = 2, 9, 512
#: /proc/self/mounts fields: source, mount point, file system type, ...
_MOUNTS_FSTYPE = 2


def _disk_written_bytes(disk_device: str) -> int:
    name = Path(disk_device).name
    for line in _read_lines("/proc/diskstats"):
        fields = line.split()
        if len(fields) > _DISKSTATS_SECTORS_WRITTEN and fields[_DISKSTATS_NAME] == name:
            return int(fields[_DISKSTATS_SECTORS_WRITTEN]) * _DISKSTATS_SECTOR_BYTES
    return 0


def _own_written_bytes() -> int:
    for line in _read_lines("/proc/self/io"):
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def _cpu_model() -> str:
    for line in _read_lines("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_mib() -> int:
    for line in _read_lines("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * KIB_BYTES // MIB_BYTES
    return 0


def _mount_of(path: Path) -> dict[str, str]:
    """The mount holding ``path``: the longest mount point that is a prefix of its real path."""
    real = path.resolve()
    best = {"mount_point": "", "fstype": "unknown", "source": "unknown"}
    for line in _read_lines("/proc/self/mounts"):
        fields = line.split()
        if len(fields) <= _MOUNTS_FSTYPE:
            continue
        # /proc/self/mounts escapes spaces and tabs in paths as octal (\040, \011).
        source, mount_point, fstype = (f.encode().decode("unicode_escape") for f in fields[:3])
        if real.is_relative_to(mount_point) and len(mount_point) >= len(best["mount_point"]):
            best = {"mount_point": mount_point, "fstype": fstype, "source": source}
    return best


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


# References: the disk with nothing of ours in between ------------------------------------------------
#
# These loops call os.pwritev / os.preadv / os.fdatasync directly, outside io/, on purpose: a reference
# that went through our device layer would hide that layer's cost instead of measuring it.


def open_direct(path: Path, flags: int) -> tuple[int, bool]:
    """Open with O_DIRECT, or without it where the filesystem refuses it (tmpfs)."""
    try:
        return os.open(path, flags | os.O_DIRECT), True
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return os.open(path, flags), False


def preallocate(path: Path, size_bytes: int) -> None:
    """A zero-filled file, so reference writes, like the WAL's, touch no filesystem metadata."""
    FileDevice.open(path, size_bytes=size_bytes, create=True, sync_writes=False).close()


@dataclass(frozen=True, slots=True)
class ReferenceLoad:
    """What the reference writes: blocks of ``write_bytes`` from ``threads`` threads for ``seconds``,
    flat out, or ``writes_per_s`` in all (spread evenly over the threads)."""

    write_bytes: int
    threads: int
    seconds: float
    sync: bool
    writes_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class ReferenceFigures:
    """What one or more reference write loops measured."""

    threads: int
    sync: bool
    direct: bool
    writes: int
    written_bytes: int
    seconds: float
    latencies_s: npt.NDArray[np.float64]
    #: Latency had the writes been acknowledged in order, as a log does: each write counts as done
    #: only once every write due before it is.
    latencies_in_order_s: npt.NDArray[np.float64]

    @property
    def mib_per_s(self) -> float:
        return self.written_bytes / MIB_BYTES / self.seconds if self.seconds else 0.0

    @classmethod
    def merge(cls, parts: list[ReferenceFigures]) -> ReferenceFigures:
        first = parts[0]
        return cls(
            threads=first.threads, sync=first.sync, direct=all(p.direct for p in parts),
            writes=sum(p.writes for p in parts), written_bytes=sum(p.written_bytes for p in parts),
            seconds=sum(p.seconds for p in parts),
            latencies_s=np.concatenate([p.latencies_s for p in parts]),
            latencies_in_order_s=np.concatenate([p.latencies_in_order_s for p in parts]),
        )

    def summary(self) -> dict[str, Any]:
        return {
            "write_bytes_mean": self.written_bytes / self.writes if self.writes else 0.0,
            "threads": self.threads,
            "sync": "fdatasync after each write" if self.sync else "none",
            "direct": self.direct,
            "seconds": self.seconds,
            "mib_per_s": self.mib_per_s,
            "iops": self.writes / self.seconds if self.seconds else 0.0,
            "latency_ms": summarize_latency_ms(self.latencies_s),
            "latency_ms_in_order": summarize_latency_ms(self.latencies_in_order_s),
        }


@dataclass(slots=True)
class _ReferenceWriter:
    """One reference thread: loops over its own region of the file, one write (+ sync) at a time.

    Each write's due time and completion time are kept. Paced, the due time is the schedule's, not
    when the thread got round to it: a write held up behind a slow one counts as late, as a record
    appended to a log during a stall does.
    """

    fd: int
    base_bytes: int
    region_bytes: int
    load: ReferenceLoad
    first_write_s: float
    deadline_s: float
    due_s: array[float]
    done_s: array[float]

    def run(self) -> None:
        size = self.load.write_bytes
        buf = aligned_buffer(size)
        buf.write(os.urandom(size))  # not zeros: a disk that compresses must not gain
        try:
            self._loop(buf)
        finally:
            buf.close()

    def _loop(self, buf: mmap.mmap) -> None:
        fd, base, region = self.fd, self.base_bytes, self.region_bytes
        size, sync = self.load.write_bytes, self.load.sync
        interval_s = self.load.threads / self.load.writes_per_s if self.load.writes_per_s else 0.0
        buffers = [buf]
        put_due, put_done = self.due_s.append, self.done_s.append
        clock = time.perf_counter
        next_s = self.first_write_s
        position = 0
        while (now_s := clock()) < self.deadline_s:
            if interval_s:
                if now_s < next_s:
                    time.sleep(next_s - now_s)
                    continue
                now_s = next_s
                next_s += interval_s
            os.pwritev(fd, buffers, base + position)
            if sync:
                os.fdatasync(fd)
            put_due(now_s)
            put_done(clock())
            position = (position + size) % region


def reference_write(path: Path, load: ReferenceLoad) -> ReferenceFigures:
    """Plain O_DIRECT pwritev (+ fdatasync) loops, one thread per region of the preallocated ``path``."""
    fd, direct = open_direct(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        region_bytes = os.fstat(fd).st_size // load.threads // load.write_bytes * load.write_bytes
        if region_bytes < load.write_bytes:
            raise ValueError(f"the reference file cannot hold {load.threads} regions of {load.write_bytes} B")
        started_s = time.perf_counter()
        # Paced threads start staggered, so together they write evenly spaced, as one producer would.
        stagger_s = 1 / load.writes_per_s if load.writes_per_s else 0.0
        writers = [_ReferenceWriter(fd, i * region_bytes, region_bytes, load, started_s + i * stagger_s,
                                    started_s + load.seconds, array("d"), array("d"))
                   for i in range(load.threads)]
        workers = [threading.Thread(target=w.run, name=f"bench-reference-{i}") for i, w in enumerate(writers)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed_s = time.perf_counter() - started_s
    finally:
        os.close(fd)
    due_s = np.concatenate([np.frombuffer(w.due_s, dtype=np.float64) for w in writers])
    done_s = np.concatenate([np.frombuffer(w.done_s, dtype=np.float64) for w in writers])
    order = np.argsort(due_s, kind="stable")
    done_in_order_s = np.maximum.accumulate(done_s[order])
    return ReferenceFigures(
        threads=load.threads, sync=load.sync, direct=direct, writes=int(due_s.size),
        written_bytes=int(due_s.size) * load.write_bytes, seconds=elapsed_s,
        latencies_s=done_s - due_s, latencies_in_order_s=done_in_order_s - due_s[order],
    )


def reference_read(path: Path, start_bytes: int, length_bytes: int) -> float:
    """MiB/s of one thread reading ``length_bytes`` from ``start_bytes`` with O_DIRECT preadv."""
    fd, _ = open_direct(path, os.O_RDONLY | os.O_CLOEXEC)
    buf = aligned_buffer(REFERENCE_READ_BYTES)
    buffers = [buf]
    try:
        started_s = time.perf_counter()
        position = start_bytes
        end = start_bytes + length_bytes
        while position < end:
            n = os.preadv(fd, buffers, position)
            if n <= 0:
                break
            position += n
        elapsed_s = time.perf_counter() - started_s
    finally:
        os.close(fd)
        buf.close()
    return (position - start_bytes) / MIB_BYTES / elapsed_s
