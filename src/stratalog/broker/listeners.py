"""Listeners: where the broker accepts connections, and how each one is secured.

A listener is written as Kafka writes it, ``PROTOCOL://HOST:PORT``, with one of Kafka's four security
protocols: PLAINTEXT (nothing), SSL (TLS; a client certificate, when asked for, names the principal),
SASL_PLAINTEXT (SASL authentication on a plain socket) and SASL_SSL (both). A bare ``HOST:PORT`` is
PLAINTEXT. The broker may listen on several at once; each connection is served by the rules of the
listener it came in on, and Metadata tells a client the endpoint of that same listener.

A listener on an address other than loopback must authenticate its clients (SASL, or TLS with
client certificates required): a broker reachable from the network with no authentication is refused
unless the operator says so (``allow_plaintext_anywhere``).
"""

from __future__ import annotations

import enum
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from stratalog.errors import StratalogError


class ListenerConfigError(StratalogError, ValueError):
    """A listener or TLS setting that cannot work: the message says which and why."""


class SecurityProtocol(enum.StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


class ClientAuth(enum.StrEnum):
    """Whether a TLS listener asks for client certificates (Kafka's ssl.client.auth)."""

    NONE = "none"
    REQUESTED = "requested"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """Certificates for the TLS listeners, as PEM files."""

    #: The broker's certificate chain, and its private key (None: in the same file as the chain).
    certfile: str | None = None
    keyfile: str | None = None
    #: The CAs that sign client certificates (needed when client_auth is not "none").
    cafile: str | None = None
    client_auth: ClientAuth = ClientAuth.NONE


@dataclass(frozen=True, slots=True)
class Listener:
    protocol: SecurityProtocol
    host: str
    port: int
    #: What Metadata tells clients to connect to; None: the host and port listened on.
    advertised_host: str | None = None
    advertised_port: int | None = None

    @classmethod
    def parse(cls, text: str) -> Listener:
        """``[PROTOCOL://]HOST:PORT``, e.g. ``SASL_SSL://0.0.0.0:9093`` or ``127.0.0.1:9092``."""
        scheme, sep, address = text.partition("://")
        if not sep:
            scheme, address = "PLAINTEXT", text
        try:
            protocol = SecurityProtocol(scheme.upper())
        except ValueError:
            raise ListenerConfigError(
                f"{text!r}: unknown security protocol {scheme!r}; use one of "
                f"{', '.join(p.value for p in SecurityProtocol)}, e.g. SASL_SSL://0.0.0.0:9093") from None
        host, port = parse_address(address, text)
        return cls(protocol, host, port)

    @property
    def name(self) -> str:
        return f"{self.protocol.value}://{self.host}:{self.port}"

    @property
    def endpoint(self) -> tuple[str, int]:
        """The host and port clients are told (Metadata, FindCoordinator)."""
        return self.advertised_host or self.host, self.advertised_port or self.port

    def authenticates(self, tls: TLSConfig) -> bool:
        """Whether every client of this listener proves who it is."""
        return self.protocol.sasl or (self.protocol.tls and tls.client_auth is ClientAuth.REQUIRED)


#: The largest TCP port number.
PORT_MAX = 65535


def parse_address(address: str, text: str | None = None) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 <= int(port) <= PORT_MAX:
        raise ListenerConfigError(f"{text or address!r}: expected HOST:PORT, such as 127.0.0.1:9092")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_listeners(listeners: tuple[Listener, ...], tls: TLSConfig, allow_plaintext_anywhere: bool) -> None:
    """Refuse a set of listeners that cannot work or would expose the broker without authentication."""
    if not listeners:
        raise ListenerConfigError("the broker needs at least one listener")
    seen: set[tuple[str, int]] = set()
    for listener in listeners:
        if listener.port and (listener.host, listener.port) in seen:
            raise ListenerConfigError(f"two listeners on {listener.host}:{listener.port}")
        seen.add((listener.host, listener.port))
        if listener.protocol.tls and tls.certfile is None:
            raise ListenerConfigError(f"listener {listener.name} uses TLS: give the broker's certificate "
                                      "(--tls-cert, and --tls-key if the key is in another file)")
        if not is_loopback(listener.host) and not listener.authenticates(tls) and not allow_plaintext_anywhere:
            raise ListenerConfigError(
                f"refusing to listen on {listener.name}: it is not loopback and does not authenticate clients. "
                "Use SASL_SSL:// or SASL_PLAINTEXT:// (users from `stratalog users add`), SSL:// with "
                "--tls-client-auth required, or pass --allow-plaintext-anywhere to accept anyone")
    if tls.client_auth is not ClientAuth.NONE and tls.cafile is None:
        raise ListenerConfigError("client certificates are asked for (--tls-client-auth) but no CA file "
                                  "says who signs them (--tls-ca)")


def server_ssl_context(tls: TLSConfig) -> ssl.SSLContext:
    """The TLS context of every TLS listener: TLS 1.2 or newer, the system's default ciphers."""
    assert tls.certfile is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.certfile, tls.keyfile)
        if tls.cafile is not None:
            context.load_verify_locations(cafile=tls.cafile)
    except (OSError, ssl.SSLError) as e:
        raise ListenerConfigError(f"cannot load the TLS certificates ({tls.certfile}, {tls.keyfile}, "
                                  f"{tls.cafile}): {e}") from e
    context.verify_mode = {ClientAuth.NONE: ssl.CERT_NONE, ClientAuth.REQUESTED: ssl.CERT_OPTIONAL,
                           ClientAuth.REQUIRED: ssl.CERT_REQUIRED}[tls.client_auth]
    return context


def certificate_principal(peer_cert: dict[str, object] | None) -> str | None:
    """The principal a verified client certificate names: ``User:`` and its subject as Kafka writes a
    distinguished name (most specific part first: ``CN=alice,OU=eng,O=example``)."""
    if not peer_cert:
        return None
    subject = peer_cert.get("subject")
    if not isinstance(subject, tuple):
        return None
    parts = []
    for rdn in reversed(subject):
        for key, value in rdn:
            parts.append(f"{_DN_KEYS.get(key, key)}={_escape_dn_value(str(value))}")
    return "User:" + ",".join(parts) if parts else None


def _escape_dn_value(value: str) -> str:
    """A distinguished name's attribute value escaped as RFC 4514 says, so names stay unambiguous."""
    out = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


#: The names the ssl module gives a subject's attributes, as they appear in a distinguished name.
_DN_KEYS = {"commonName": "CN", "organizationalUnitName": "OU", "organizationName": "O", "localityName": "L",
            "stateOrProvinceName": "ST", "countryName": "C", "domainComponent": "DC", "emailAddress": "EMAILADDRESS"}


def default_listeners() -> tuple[Listener, ...]:
    return (Listener(SecurityProtocol.PLAINTEXT, "127.0.0.1", 9092),)


def tls_config_from(certfile: Path | None, keyfile: Path | None, cafile: Path | None,
                    client_auth: str | None, base: TLSConfig) -> TLSConfig:
    """``base`` (the config file's) with the command line's settings over it."""
    return TLSConfig(
        certfile=str(certfile) if certfile else base.certfile,
        keyfile=str(keyfile) if keyfile else base.keyfile,
        cafile=str(cafile) if cafile else base.cafile,
        client_auth=ClientAuth(client_auth) if client_auth else base.client_auth)
