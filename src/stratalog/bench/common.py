"""What every benchmark shares: a description of the machine, latency summaries, JSON output."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

MIB_BYTES = 1 << 20
KIB_BYTES = 1 << 10
MS_PER_S = 1000.0

#: Percentiles in a latency summary, as (key, percentile). p999 needs ~1000 samples to mean anything;
#: it is reported anyway, with the sample count beside it.
LATENCY_PERCENTILES = (("p50", 50.0), ("p99", 99.0), ("p999", 99.9))


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
    """Write ``document`` as indented JSON, replacing ``path`` atomically (no half-written results)."""
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(document, indent=2) + "\n")
    partial.replace(target)


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
        if len(fields) < 3:
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
