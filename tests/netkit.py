"""A network namespace for a test that needs a real network between one process and its servers: the
process runs in a namespace of its own (``ip netns exec``), joined to this one by veth links on private
/30 subnets, one link per kind of traffic, so a test can cut exactly one (the host end goes down:
packets vanish, connections hang, as in a partition) and mend it.

The links' addresses exist only on this machine; servers that the namespace must reach listen on the
host end of a link (beside 127.0.0.1). Needs root (CAP_NET_ADMIN), as `make test` runs; everything is
deleted when the block ends.
"""

from __future__ import annotations

import contextlib
import ipaddress
import random
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

#: The private range the links' subnets are drawn from (unlikely to be routed on a test machine).
LINK_RANGE = ipaddress.ip_network("10.213.0.0/16")
#: Tries at drawing a /24 of LINK_RANGE that no interface of this machine uses.
DRAW_TRIES = 50


def _ip(*argv: str) -> str:
    result = subprocess.run(["ip", *argv], check=False, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


@dataclass(frozen=True, slots=True)
class Link:
    """One veth pair: ``host_end`` in this namespace (address ``host``), the other end in the namespace
    (address ``inside``)."""

    name: str
    host_end: str
    host: str
    inside: str


@dataclass(frozen=True, slots=True)
class Namespace:
    name: str
    links: dict[str, Link]

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self, link: str) -> None:
        """A partition on ``link``: its host end goes down, so nothing passes either way."""
        _ip("link", "set", self.links[link].host_end, "down")

    def mend(self, link: str) -> None:
        _ip("link", "set", self.links[link].host_end, "up")


def _free_subnet() -> ipaddress.IPv4Network:
    used = _ip("-o", "-4", "addr", "show")
    choices = list(LINK_RANGE.subnets(new_prefix=24))
    for _ in range(DRAW_TRIES):
        subnet = random.choice(choices)
        first_three = str(subnet.network_address).rsplit(".", 1)[0]
        if f"inet {first_three}." not in used:
            return subnet
    raise RuntimeError(f"found no /24 of {LINK_RANGE} free for a test's links")


@contextlib.contextmanager
def network_namespace(link_names: Sequence[str]) -> Iterator[Namespace]:
    """A namespace with loopback up and one link per name; deleted (links too) when the block ends."""
    tag = secrets.token_hex(3)
    name = f"stratalog-{tag}"
    subnet = _free_subnet()
    _ip("netns", "add", name)
    links: dict[str, Link] = {}
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        for index, link_name in enumerate(link_names):
            base = subnet.network_address + 4 * index
            host, inside = str(base + 1), str(base + 2)
            host_end, inside_end = f"sl{tag}{index}h", f"sl{tag}{index}n"   # at most 15 bytes
            _ip("link", "add", host_end, "type", "veth", "peer", "name", inside_end, "netns", name)
            links[link_name] = Link(link_name, host_end, host, inside)
            _ip("addr", "add", f"{host}/30", "dev", host_end)
            _ip("link", "set", host_end, "up")
            _ip("-n", name, "addr", "add", f"{inside}/30", "dev", inside_end)
            _ip("-n", name, "link", "set", inside_end, "up")
        yield Namespace(name, links)
    finally:
        for link in links.values():
            with contextlib.suppress(RuntimeError):
                _ip("link", "del", link.host_end)   # takes its peer with it
        _ip("netns", "del", name)
