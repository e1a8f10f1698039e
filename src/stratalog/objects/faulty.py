"""A wrapper that makes any object store fail the way real ones do, driven by one seed.

Faults, on chosen calls or with a probability per call:

- ``fail_before``: the request never reached the store; an error is raised and nothing changed.
- ``fail_after``: the store did the work, then the answer was lost; an error is raised although the put
  landed (or the delete or rename happened). The caller cannot tell this from ``fail_before``, which is
  the point.
- ``delay``: the call is slow (a bounded sleep, then it goes on), as when a request times out and is
  retried; a caller with a deadline sees its timeout fire.
- ``interrupt_put``: an upload cut off part way; nothing lands and an error is raised.

Injected errors are :class:`InjectedFaultError`, an :class:`~stratalog.objects.store.ObjectStoreError`, so
code under test handles them exactly like real ones. Every call is counted by kind, every fault by kind.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from stratalog.objects.store import ObjectInfo, ObjectStore, ObjectStoreError

CallKind = Literal["put", "get", "size", "list", "delete", "rename"]
CALL_KINDS: frozenset[CallKind] = frozenset({"put", "get", "size", "list", "delete", "rename"})
#: Longest injected delay: past any sane client timeout, short enough to keep a test run bounded.
DELAY_S_MAX = 10.0


class Fault(StrEnum):
    FAIL_BEFORE = "fail_before"
    FAIL_AFTER = "fail_after"
    DELAY = "delay"
    INTERRUPT_PUT = "interrupt_put"


class InjectedFaultError(ObjectStoreError):
    """A fault that :class:`FaultyStore` injected on purpose."""


@dataclass
class ObjectFaultPlan:
    """Which calls meet which fault. Call numbers count from 1 per kind of call, over the wrapper's life."""

    fail_before: dict[CallKind, set[int]] = field(default_factory=dict)
    fail_after: dict[CallKind, set[int]] = field(default_factory=dict)
    delay: dict[CallKind, set[int]] = field(default_factory=dict)
    interrupt_puts: set[int] = field(default_factory=set)
    #: Chance that a call meets each fault, drawn from the wrapper's seed (only for ``random_kinds``).
    fail_before_probability: float = 0.0
    fail_after_probability: float = 0.0
    delay_probability: float = 0.0
    interrupt_put_probability: float = 0.0
    random_kinds: frozenset[CallKind] = CALL_KINDS
    #: How long a delayed call sleeps before it goes on.
    delay_s: float = 0.05

    def validate(self) -> None:
        """Raise ValueError naming the first setting that makes no sense."""
        for name in ("fail_before_probability", "fail_after_probability", "delay_probability",
                     "interrupt_put_probability"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within 0..1")
        if not 0.0 <= self.delay_s <= DELAY_S_MAX:
            raise ValueError(f"delay_s must be within 0..{DELAY_S_MAX} s")
        for name in ("fail_before", "fail_after", "delay"):
            unknown = set(getattr(self, name)) - CALL_KINDS
            if unknown:
                raise ValueError(f"{name} names unknown calls {sorted(unknown)}; use {sorted(CALL_KINDS)}")
        if not self.random_kinds <= CALL_KINDS:
            raise ValueError(f"random_kinds must be a subset of {sorted(CALL_KINDS)}")


@dataclass(frozen=True, slots=True)
class InjectedFault:
    """One fault as it happened: which call (kind and number) met which fault."""

    kind: CallKind
    call_number: int
    fault: Fault


class FaultyStore:
    """An :class:`~stratalog.objects.store.ObjectStore` around ``inner`` that injects ``plan``'s faults.

    Probabilistic faults come from ``random.Random(seed)`` with four draws per call whatever the plan, so
    one seed replays the same faults on the same calls. ``sleep`` is the delay's clock (tests pass a
    recorder to stay fast).
    """

    def __init__(self, inner: ObjectStore, seed: int = 0, plan: ObjectFaultPlan | None = None, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.inner = inner
        self.plan = plan or ObjectFaultPlan()
        self.plan.validate()
        self._rng = random.Random(seed)
        self._sleep = sleep
        self._lock = threading.Lock()
        #: Calls made, by kind (including the ones that failed).
        self.calls: Counter[CallKind] = Counter()
        #: Faults injected, by fault.
        self.faults: Counter[Fault] = Counter()
        #: Every injected fault in order.
        self.history: list[InjectedFault] = []

    def __repr__(self) -> str:
        return f"FaultyStore({self.inner!r})"

    # ObjectStore protocol ---------------------------------------------------------------------------

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        number, faults = self._before("put")
        if Fault.INTERRUPT_PUT in faults:
            self._record("put", number, Fault.INTERRUPT_PUT)
            raise InjectedFaultError(f"injected fault: upload of {key!r} interrupted (put #{number}); "
                                     "nothing was stored")
        self.inner.put(key, data)
        self._after("put", number, faults, key)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        number, faults = self._before("get")
        data = self.inner.get(key, start, end)
        self._after("get", number, faults, key)
        return data

    def size(self, key: str) -> int:
        number, faults = self._before("size")
        size_bytes = self.inner.size(key)
        self._after("size", number, faults, key)
        return size_bytes

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        number, faults = self._before("list")
        # Read the listing to its end now: the call has "succeeded" only once all of it came back.
        found = [*self.inner.list(prefix)]
        self._after("list", number, faults, prefix)
        return iter(found)

    def delete(self, key: str) -> None:
        number, faults = self._before("delete")
        self.inner.delete(key)
        self._after("delete", number, faults, key)

    def rename(self, src: str, dst: str) -> None:
        number, faults = self._before("rename")
        self.inner.rename(src, dst)
        self._after("rename", number, faults, f"{src} -> {dst}")

    def close(self) -> None:
        self.inner.close()

    # Internals --------------------------------------------------------------------------------------

    def _before(self, kind: CallKind) -> tuple[int, set[Fault]]:
        """Count the call, choose its faults, then play the ones that happen before the store is called."""
        plan = self.plan
        with self._lock:
            self.calls[kind] += 1
            number = self.calls[kind]
            draws = [self._rng.random() for _ in range(4)]
        by_chance = kind in plan.random_kinds
        faults: set[Fault] = set()
        if number in plan.delay.get(kind, ()) or (by_chance and draws[0] < plan.delay_probability):
            faults.add(Fault.DELAY)
        if number in plan.fail_before.get(kind, ()) or (by_chance and draws[1] < plan.fail_before_probability):
            faults.add(Fault.FAIL_BEFORE)
        if kind == "put" and (number in plan.interrupt_puts
                              or (by_chance and draws[2] < plan.interrupt_put_probability)):
            faults.add(Fault.INTERRUPT_PUT)
        if number in plan.fail_after.get(kind, ()) or (by_chance and draws[3] < plan.fail_after_probability):
            faults.add(Fault.FAIL_AFTER)
        if Fault.DELAY in faults:
            self._record(kind, number, Fault.DELAY)
            self._sleep(plan.delay_s)
        if Fault.FAIL_BEFORE in faults:
            self._record(kind, number, Fault.FAIL_BEFORE)
            raise InjectedFaultError(f"injected fault: {kind} #{number} failed before reaching the store")
        return number, faults

    def _after(self, kind: CallKind, number: int, faults: set[Fault], key: str) -> None:
        if Fault.FAIL_AFTER in faults:
            self._record(kind, number, Fault.FAIL_AFTER)
            raise InjectedFaultError(f"injected fault: {kind} #{number} of {key!r} took effect, then its "
                                     "answer was lost")

    def _record(self, kind: CallKind, number: int, fault: Fault) -> None:
        with self._lock:
            self.faults[fault] += 1
            self.history.append(InjectedFault(kind, number, fault))
