"""Whether a connection reads requests now, and why not: one value instead of six flags, with no I/O (the
connection tells the gate what happened and does what it answers: pause or resume the socket).

A connection is *open* (it reads), *held* (it reads nothing for now, for one or more reasons at once),
or *done* (it reads nothing more, for good: the peer closed, sent garbage or timed out, or the broker is
stopping). The reasons to hold, :class:`Hold`, each set and cleared by its own event; one more reason
is not a flag: the connection's in-flight bound (``in_flight_requests_max`` responses pending), which the
connection passes as ``room`` when it asks to go on. Transitions (every one has a test in
tests/test_read_gate.py):

=============================  =========================  =========================================
state                          event                      next state (what the connection does)
=============================  =========================  =========================================
open                           hold(reason or NONE)       held (pause the socket)
held                           hold(reason)               held, with that reason too (nothing)
held                           release(reason)            held, without it (nothing)
held, no reason left           go_on(room=True)           open (resume the socket, read what waits)
held                           go_on(room=False)          held (nothing)
held by WAITING_FOR_ROOM       admit()                    held without it, its next request admitted
open or held                   end()                      done (nothing read again)
done                           any                        done
=============================  =========================  =========================================

An admitted connection reads its next request whatever the broker's queue holds then
(``take_admission`` says so once): it was woken from the waiting room in turn.
"""

from __future__ import annotations

from enum import Enum, Flag, auto


class Hold(Flag):
    """Why a connection reads nothing for now; several may hold at once."""

    NONE = 0
    #: The socket takes less than is written (asyncio's pause_writing): responses would pile up.
    WRITE_BLOCKED = auto()
    #: A throttle time runs: the client exceeded a quota (Kafka's muting).
    MUTED = auto()
    #: Requests queued across connections reached requests_queued_max: it waits in the waiting room.
    WAITING_FOR_ROOM = auto()


class ReadState(Enum):
    OPEN = "open"
    HELD = "held"
    DONE = "done"


class ReadGate:
    __slots__ = ("_admitted", "holds", "state")

    def __init__(self) -> None:
        self.state = ReadState.OPEN
        self.holds = Hold.NONE
        self._admitted = False

    @property
    def done(self) -> bool:
        return self.state is ReadState.DONE

    @property
    def held(self) -> bool:
        return self.state is ReadState.HELD

    def hold(self, reason: Hold = Hold.NONE) -> bool:
        """Read nothing for now, for ``reason`` (NONE: the in-flight bound); True when the socket must be
        paused now (it was open)."""
        if self.state is ReadState.DONE:
            return False
        self.holds |= reason
        if self.state is ReadState.HELD:
            return False
        self.state = ReadState.HELD
        return True

    def release(self, reason: Hold) -> None:
        """``reason`` holds no more (the connection then asks :meth:`go_on`)."""
        self.holds &= ~reason

    def admit(self) -> None:
        """Woken from the waiting room in turn: no longer held for room, and its next request is read
        whatever the queue holds then."""
        self.holds &= ~Hold.WAITING_FOR_ROOM
        self._admitted = True

    def take_admission(self) -> bool:
        """Whether this request may be read past a full queue (once per admission)."""
        admitted, self._admitted = self._admitted, False
        return admitted

    def go_on(self, room: bool) -> bool:
        """Read again if nothing holds any more and ``room`` (fewer requests in flight than the bound);
        True when the socket must be resumed now."""
        if self.state is not ReadState.HELD or self.holds or not room:
            return False
        self.state = ReadState.OPEN
        return True

    def end(self) -> None:
        """Read nothing more, for good."""
        self.state = ReadState.DONE
