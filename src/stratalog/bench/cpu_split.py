"""A benchmark's server on vCPUs of its own, its clients on the others (`bench kafka --server-cpus`).

On a machine of few vCPUs the clients of a throughput run share them with the server, and a run then
measures the server's share of the CPUs beside its clients as much as the server. Clients differ in
what they take: librdkafka's idempotent (and so every transactional) producer keeps one produce request
per partition in flight and polls without sleeping until its answer comes (BENCHMARKS.md,
"Transactions."), taking from the broker it waits for CPU that the plain producer leaves it. With the
split, the server runs alone on its vCPUs and every client process on the others, in every phase of a
run: what one kind of client takes then slows the clients, and the server only through what they send.

The split uses the Linux affinity mask, which a thread passes on to every process it starts: the bench
takes the clients' vCPUs for the whole run (its producer and consumer processes inherit them) and the
server's for the moment it starts a server (whose threads inherit those).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass


class CpuSplitError(ValueError):
    """The split asked for cannot be made on this machine (a vCPU not there, none left for the clients)."""


@dataclass(frozen=True, slots=True)
class CpuSplit:
    server_cpus: frozenset[int]
    client_cpus: frozenset[int]

    @classmethod
    def of(cls, server_cpus: frozenset[int]) -> CpuSplit:
        """The servers on ``server_cpus``, the clients on every other vCPU this process may use."""
        usable = frozenset(os.sched_getaffinity(0))
        if not server_cpus:
            raise CpuSplitError("no vCPU named for the servers")
        if missing := server_cpus - usable:
            raise CpuSplitError(f"vCPU {cpu_list(missing)} is not one this process may run on ({cpu_list(usable)})")
        clients = usable - server_cpus
        if not clients:
            raise CpuSplitError(f"vCPUs {cpu_list(usable)} are all the servers': none is left for the clients")
        return cls(server_cpus, clients)

    def describe(self) -> dict[str, list[int]]:
        return {"server_cpus": sorted(self.server_cpus), "client_cpus": sorted(self.client_cpus)}


def parse_cpu_list(text: str) -> frozenset[int]:
    """``0``, ``0,2`` or ``0-3`` (taskset's list form) as vCPU numbers."""
    cpus: set[int] = set()
    try:
        for part in (p.strip() for p in text.split(",")):
            first, _, last = part.partition("-")
            low, high = int(first), int(last or first)
            if low < 0 or high < low:
                raise ValueError(part)
            cpus.update(range(low, high + 1))
    except ValueError:
        raise CpuSplitError(f"{text!r} is not a list of vCPUs such as 0, 0,2 or 0-3") from None
    return frozenset(cpus)


def cpu_list(cpus: frozenset[int] | set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


@contextlib.contextmanager
def running_on(cpus: frozenset[int] | None) -> Iterator[None]:
    """This thread, and every process it starts meanwhile, on ``cpus`` (None: left as it is)."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
