"""Free ports for the servers the harnesses start on fixed ports (SeaweedFS, PostgreSQL, cluster brokers).

A port picked free may be taken before its server binds it. Ports the system hands out itself (a bind to
port 0, the local port of every outgoing connection) come from its ephemeral range, where a busy machine
takes them all the time; so the picks are drawn at random from below that range, where nothing is handed
out unasked. Each pick is checked by binding it; the starters still move on when a port was taken.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

_T = TypeVar("_T")

LOOPBACK = "127.0.0.1"
#: Where the system's ephemeral ports start when it does not say (Linux's default).
EPHEMERAL_LOW_DEFAULT = 32768
#: The lowest port drawn: above the registered services that commonly listen (PostgreSQL's 5432, 8080...).
PICK_LOW = 10000
#: Draws before giving up: a free port is found within a few unless the range is nearly all taken.
DRAWS_MAX = 1000
#: Starts on newly picked ports before a port taken at each is an error.
PORT_PICKS_MAX = 5


def ephemeral_low() -> int:
    """The first port of the system's ephemeral range (``ip_local_port_range``)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return EPHEMERAL_LOW_DEFAULT


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports free on ``host`` now, drawn below the ephemeral range."""
    high = ephemeral_low()
    if high - PICK_LOW < 4 * count:   # an unusual range: let the system pick, as a bind to port 0 does
        return _system_picks(count, host)
    picks: list[int] = []
    with contextlib.ExitStack() as stack:   # held until all are drawn, so none repeats
        for _ in range(DRAWS_MAX):
            if len(picks) == count:
                break
            port = random.randrange(PICK_LOW, high)
            if port in picks:
                continue
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind((host, port))
            except OSError:
                continue
            picks.append(port)
    if len(picks) < count:
        raise OSError(f"no {count} free ports on {host} between {PICK_LOW} and {high}")
    return picks


def free_port(host: str = LOOPBACK) -> int:
    """One port free on ``host`` now, drawn below the ephemeral range."""
    (port,) = free_ports(1, host)
    return port


def start_on_free_ports(start: Callable[[], _T], taken: Callable[[Exception], bool],
                        pick_again: Callable[[], None]) -> _T:
    """``start()``; while it fails because a port picked for it was taken (``taken``), ``pick_again()``
    and start again, PORT_PICKS_MAX times at most. Only for a server's first start: a restart keeps the
    ports its clients know."""
    for pick in range(1, PORT_PICKS_MAX + 1):
        try:
            return start()
        except Exception as e:
            if pick == PORT_PICKS_MAX or not taken(e):
                raise
            pick_again()
    raise AssertionError("unreachable")


def _system_picks(count: int, host: str) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
