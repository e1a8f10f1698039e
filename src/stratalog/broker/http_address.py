"""Where the broker's HTTP services (``/metrics`` and the probes, the web console) listen, and on what
terms, as its Kafka listeners: a loopback address serves plain HTTP to anyone on the machine; any other
address only over HTTPS (the broker's ``--tls-cert``) with a login, unless ``--allow-plaintext-anywhere``
says plain HTTP without a login is wanted there too.

    127.0.0.1:9644            plain HTTP, no login (loopback only)
    https://0.0.0.0:9644      HTTPS; /metrics asks for a user's password (HTTP Basic), the console its form
    http://0.0.0.0:9644       refused, unless --allow-plaintext-anywhere
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from stratalog.errors import StratalogError

SCHEMES = ("http", "https")


class HttpAddressError(StratalogError, ValueError):
    """An address an HTTP service may not listen on, or that is not one: the message says why."""


@dataclass(frozen=True)
class HttpAddress:
    host: str
    port: int
    #: HTTPS, and a login before anything but the probes.
    secure: bool

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.secure else 'http'}://{host}:{self.port}"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def parse_http_address(text: str, service: str, allow_plaintext_anywhere: bool = False) -> HttpAddress:
    """``[http://|https://]HOST:PORT`` for ``service`` (named in errors), on the rules above."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "http", text
    if scheme not in SCHEMES:
        raise HttpAddressError(f"{text!r}: {scheme}:// is not http:// or https://")
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not host:
        raise HttpAddressError(f"{text!r} is not [https://]HOST:PORT (for example 127.0.0.1:9644)")
    secure = scheme == "https"
    if not secure and not is_loopback(host) and not allow_plaintext_anywhere:
        raise HttpAddressError(f"{host} is not a loopback address: {service} serves plain HTTP without a login "
                               f"there only with --allow-plaintext-anywhere; use https://{host}:{port} (the "
                               "broker's --tls-cert, and a user's password) or a loopback address")
    return HttpAddress(host, int(port), secure)
