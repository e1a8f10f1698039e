"""Pending puts: what put and put_many handed over and the writer has not taken yet.

A put costs a list ``extend`` and nothing more: each single put adds its name, its message and a slot
for its id to one flat list (the writer finds the ids of all it takes at once, NameIndex); a put_many
adds its batch (names, the ids its caller found, messages) with a marker in the id slot. One extend of a
tuple is atomic under the GIL, so a put's slots are never split; the tuple comes from CPython's free
list and dies at once: no object per pending put, nothing for the cyclic GC to track. The slots are this
module's business (QueueStore.put inlines :meth:`PendingPuts.add`, and so does the compiled put,
``_native.QueuePutter``, three appends under the GIL): the writer gets the taken puts as
:class:`SinglePuts` and :class:`BulkPut`, in order.

Small messages count against ``pending_messages_max``; large ones and bulk puts also by their bytes
(``pending_bytes_max``). Once the store stops, :meth:`PendingPuts.refuse` makes every later put raise the
store's error, at no cost to the puts of a store that runs; while its disk is low, :meth:`PendingPuts.pause`
does the same until the space comes back. A put that read the list just before either swap lands in it
all the same: the writer always drains the list puts were taken into (``accepting``), so a paused put
that got in is written and made durable like any other.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from stratalog.engine.store import StoreClosedError
from stratalog.invariant import invariant
from stratalog.queues.errors import PutBackpressureError
from stratalog.queues.format import Ids

#: Slots of the pending list a single put takes: name, message, id.
PUT_SLOTS = 3
#: The id slot of a put_many (its first slot holds the batch): compared by identity only.
_BULK = object()
#: The id slot of a single put: its id is the writer's to find.
UNKNOWN_ID = -1


@dataclass(frozen=True, slots=True)
class SinglePuts:
    """Consecutive single puts: names (checked str) and messages (bytes), in order."""

    names: list[str]
    messages: list[bytes]


@dataclass(frozen=True, slots=True)
class BulkPut:
    """One put_many: names (an Arrow string array), their ids where known (-1: not yet), messages (Arrow),
    and how many ids are not known yet (0: the writer has nothing to resolve)."""

    names: Any
    known: Ids
    messages: Any
    unknown: int


@dataclass(frozen=True, slots=True)
class TakenPuts:
    """What one :meth:`PendingPuts.take` took, in the order the puts were made."""

    names: list[Any]
    messages: list[Any]
    known: list[Any]    # the id slots, taken only when a bulk put is among them

    def parts(self) -> Iterator[SinglePuts | BulkPut]:
        """The puts as runs of single puts and bulk puts, in order."""
        known = self.known
        if not known:
            yield SinglePuts(self.names, self.messages)
            return
        start = 0
        while start < len(known):
            # The id slots hold ints and _BULK only (added here), so index() finds _BULK by identity and
            # never calls a caller's __eq__.
            try:
                bulk = known.index(_BULK, start)
            except ValueError:
                bulk = len(known)
            if bulk > start:
                yield SinglePuts(self.names[start:bulk], self.messages[start:bulk])
            if bulk < len(known):
                yield BulkPut(*self.names[bulk])
            start = bulk + 1


class PendingPuts:
    """Puts not yet taken by the writer, bounded by ``messages_max`` single puts and ``bytes_max`` bytes
    of large and bulk puts. Any thread adds; one drain at a time takes (the writer's lock)."""

    def __init__(self, messages_wake: int, messages_max: int, bytes_max: int) -> None:
        #: The flat list of slots: single puts add ``(name, message, UNKNOWN_ID)``, put_many its batch. Read
        #: it anew for each put (:meth:`refuse` swaps it).
        self.slots: list[Any] = []
        #: The list puts land in when the store takes them: what the writer drains, whatever ``slots`` is.
        self.accepting = self.slots
        #: Slots at which the writer should wake.
        self.wake_slots = PUT_SLOTS * messages_wake
        self._max_slots = PUT_SLOTS * messages_max
        self._bytes_max = bytes_max
        # Large and bulk puts add under it, so what take resets is exactly what it takes.
        self._cond = threading.Condition(threading.Lock())
        self._large_bytes = 0
        self._bulk_count = 0
        self._in_flight = False     # a drain has taken puts and not yet written them

    def add(self, name: str, message: bytes) -> bool:
        """Add a single put (a checked name, a small message); True once the writer should wake. No lock:
        an extend of a tuple is atomic under the GIL, and take only ever removes a prefix. (QueueStore.put
        does the same inline: one Python call is a tenth of a put's cost.)"""
        slots = self.slots
        slots.extend((name, message, UNKNOWN_ID))
        return len(slots) >= self.wake_slots

    def add_large(self, name: str, message: bytes) -> None:
        """Add a single put whose message counts by its bytes too."""
        with self._cond:
            self._large_bytes += len(message)
            self.slots.extend((name, message, UNKNOWN_ID))

    def add_bulk(self, names: Any, known: Ids, messages: Any, size_bytes: int, unknown: int) -> None:
        """Add a put_many: names (an Arrow string array), the ids its caller found (-1: not known), the
        messages (an Arrow binary array), their bytes, and how many ids are -1."""
        with self._cond:
            self._large_bytes += size_bytes
            self._bulk_count += 1
            self.slots.extend(((names, known, messages, unknown), None, _BULK))

    def waiting(self) -> bool:
        """Puts are pending or taken and not yet written: a get must drain first to see them."""
        return bool(self.accepting) or self._in_flight

    def empty(self) -> bool:
        return not self.accepting

    def full(self) -> bool:
        return len(self.accepting) >= self._max_slots or self._large_bytes >= self._bytes_max

    def wait_for_room(self, wait_s_max: float, check_open: Callable[[], None]) -> None:
        """Wait while the pending puts are at their bound; PutBackpressureError after ``wait_s_max``."""
        deadline = time.monotonic() + wait_s_max
        with self._cond:
            while self.full():
                check_open()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PutBackpressureError(f"puts waited {wait_s_max} s for the writer: "
                                               "the disk or the uploads are too slow")
                self._cond.wait(min(remaining, 0.1))

    def take(self) -> TakenPuts | None:
        """Take every pending put (None: there was none); :meth:`written` once they are written."""
        with self._cond:
            # Lock-free puts may add meanwhile; they land after the prefix taken here.
            slots = self.accepting
            taken = len(slots)
            # Set before the puts leave the list: a get that finds it empty then sees them in flight and
            # waits for this drain (a get sees every put made before it).
            self._in_flight = taken > 0
            # Each slot straight from the list (a copy of the prefix first, then of its slots, cost more
            # under the GIL); the id slots are needed only beside bulk puts.
            names, messages = slots[0:taken:PUT_SLOTS], slots[1:taken:PUT_SLOTS]
            known = slots[2:taken:PUT_SLOTS] if self._bulk_count else []
            del slots[:taken]
            self._bulk_count = 0
            self._large_bytes = 0
            self._cond.notify_all()
        if not taken:
            return None
        invariant(taken % PUT_SLOTS == 0, "a put's slots are added together")
        return TakenPuts(names, messages, known)

    def written(self) -> None:
        """The puts the last take took are written (or failed)."""
        self._in_flight = False

    def refuse(self, check_open: Callable[[], None]) -> None:
        """From now on every put raises what ``check_open`` raises (the store's error). A put that read the
        list before the swap lands in it, and is written only if the writer still runs: a stopped store
        acknowledges nothing more (flush raises)."""
        self.slots = _RefusedPuts(check_open)
        with self._cond:
            self._cond.notify_all()

    def pause(self, admit: Callable[[], None]) -> None:
        """Until :meth:`resume`, every put calls ``admit`` first: it raises the reason puts are refused, or
        returns once they may go on (having resumed them), and the put lands. Nothing if refused for good."""
        if type(self.slots) is list:
            self.slots = _PausedPuts(admit, self.accepting)

    def resume(self) -> None:
        """Puts land again (unless the store stopped or closed meanwhile)."""
        if type(self.slots) is _PausedPuts:
            self.slots = self.accepting


class _PausedPuts(list[Any]):
    """The slots of a store that refuses puts for a while (its disk is low): a put asks ``admit``, which
    raises the refusal, or returns once puts go on again, and then the put lands in ``accepting``.

    ``admit`` is held weakly, as :class:`_RefusedPuts` holds its check."""

    def __init__(self, admit: Callable[[], None], accepting: list[Any]) -> None:
        super().__init__()
        self._admit = weakref.WeakMethod(admit)
        self._accepting = accepting

    def extend(self, items: Any) -> None:
        admit = self._admit()
        if admit is None:
            raise StoreClosedError("the queue store is closed")
        admit()
        self._accepting.extend(items)


class _RefusedPuts(list[Any]):
    """The slots of a store that stopped or closed: any put raises at once.

    It holds the check (a bound method of the store) weakly: the store holds this list, and a cycle would keep a
    closed store's memory (its log cache, indexes and names: gigabytes at a million queues) until a full
    garbage collection."""

    def __init__(self, check_open: Callable[[], None]) -> None:
        super().__init__()
        self._check = weakref.WeakMethod(check_open)

    def extend(self, items: Any) -> None:
        check = self._check()
        if check is not None:
            check()
        raise StoreClosedError("the queue store is closed")    # reached only once the store is gone

