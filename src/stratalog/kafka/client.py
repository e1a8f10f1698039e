"""A small blocking Kafka client for what librdkafka cannot send: the broker's own requests.

The Spark driver commits a write with StratalogCommitStaged (kafka/staged_commit.py), which no Kafka
client library knows. This client connects as they do, with the same settings (librdkafka's names, as
Spark users give them in ``kafka.*`` options): ``security.protocol`` PLAINTEXT, SSL, SASL_PLAINTEXT or
SASL_SSL; ``sasl.mechanism`` PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 with ``sasl.username`` and
``sasl.password``; ``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``,
``ssl.key.password`` and ``ssl.endpoint.identification.algorithm`` (``https``, the default, or ``none``).
Other settings are librdkafka's alone and are ignored here. Everything else (topics, offsets, records)
goes through librdkafka.
"""

from __future__ import annotations

import itertools
import socket
import ssl
from collections.abc import Sequence
from typing import Any

from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from stratalog.errors import StratalogError
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.codec import FRAME_SIZE, decode_response, encode_request

#: Connecting, and each request's answer: a healthy broker takes milliseconds; a commit waits for uploads.
TIMEOUT_S = 60.0
#: The largest response frame read (the broker's own responses are under a kilobyte).
RESPONSE_BYTES_MAX = 1 << 20
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class BrokerConnectionError(StratalogError):
    """The broker could not be reached, refused the login, or answered with something else than a response."""


class LoginRefusedError(BrokerConnectionError):
    """The broker refused the credentials: asking again with the same ones gets the same answer."""


def _setting(settings: dict[str, str], *names: str, default: str | None = None) -> str | None:
    for name in names:
        if name in settings:
            return settings[name]
    return default


class KafkaConnection:
    """One connection to one of the bootstrap servers, logged in as the settings say. Close it."""

    def __init__(self, bootstrap: str, settings: dict[str, str], client_id: str = "stratalog-spark",
                 timeout_s: float = TIMEOUT_S) -> None:
        self.client_id = client_id
        self._ids = itertools.count(1)
        protocol = (_setting(settings, "security.protocol", default="PLAINTEXT") or "").upper()
        if protocol not in PROTOCOLS:
            raise BrokerConnectionError(f"security.protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
        errors = []
        for server in bootstrap.split(","):
            host, _, port = server.rpartition(":")
            host = host.strip("[]")
            try:
                raw = socket.create_connection((host, int(port)), timeout=timeout_s)
            except OSError as e:
                errors.append(f"{server}: {e}")
                continue
            self._sock: socket.socket = raw
            try:
                if protocol.endswith("SSL"):
                    self._sock = _tls_context(settings).wrap_socket(raw, server_hostname=host)
                if protocol.startswith("SASL"):
                    self._login(settings)
                return
            except BaseException:
                self._sock.close()  # the TLS socket when there is one, which closes the raw one too
                raw.close()
                raise
        raise BrokerConnectionError(f"no broker of {bootstrap} accepted a connection: {'; '.join(errors)}")

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> KafkaConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, api_key: int, api_version: int, body: Any) -> Any:
        """Send a request of Kafka's schemas; its response body."""
        return self.call_pipelined([(api_key, api_version, body)])[0]

    def call_pipelined(self, requests: Sequence[tuple[int, int, Any]]) -> list[Any]:
        """Send every request (api key, version, body) before reading any response, as clients with several
        requests in flight do; their response bodies, in order (a broker answers a connection in order)."""
        ids = [next(self._ids) for _ in requests]
        frames = []
        for correlation_id, (api_key, api_version, body) in zip(ids, requests, strict=True):
            frame = encode_request(api_key, api_version, correlation_id, self.client_id, body)
            frames.append(FRAME_SIZE.pack(len(frame)) + frame)
        try:
            self._sock.sendall(b"".join(frames))
            responses = []
            for correlation_id, (api_key, api_version, _) in zip(ids, requests, strict=True):
                answered, response = decode_response(self._read_frame(), api_key, api_version)
                if answered != correlation_id:
                    raise BrokerConnectionError(f"the broker answered request {answered}, not {correlation_id}")
                responses.append(response)
        except OSError as e:
            raise BrokerConnectionError(f"the connection to the broker failed: {e}") from e
        return responses

    def exchange(self, frame: bytes) -> bytes:
        """Send a whole request frame (its size first); the response frame, without its size."""
        try:
            self._sock.sendall(frame)
            return self._read_frame()
        except OSError as e:
            raise BrokerConnectionError(f"the connection to the broker failed: {e}") from e

    def _read_frame(self) -> bytes:
        size = FRAME_SIZE.unpack(self._read(FRAME_SIZE.size))[0]
        if not 0 < size <= RESPONSE_BYTES_MAX:
            raise BrokerConnectionError(f"the broker announced a response of {size} bytes")
        return self._read(size)

    def next_correlation_id(self) -> int:
        return next(self._ids)

    def _read(self, count: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < count:
            chunk = self._sock.recv(count - len(chunks))
            if not chunk:
                raise BrokerConnectionError("the broker closed the connection")
            chunks += chunk
        return bytes(chunks)

    def _login(self, settings: dict[str, str]) -> None:
        mechanism = (_setting(settings, "sasl.mechanism", "sasl.mechanisms", default="PLAIN") or "").upper()
        username = _setting(settings, "sasl.username")
        password = _setting(settings, "sasl.password")
        if mechanism not in MECHANISMS or username is None or password is None:
            raise BrokerConnectionError(f"SASL needs sasl.mechanism (one of {', '.join(MECHANISMS)}), sasl.username "
                                        "and sasl.password")
        handshake = self.call(ApiKey.SASL_HANDSHAKE, 1, SaslHandshakeRequest(mechanism=mechanism))
        if handshake.error_code != 0:
            raise BrokerConnectionError(f"the broker does not offer SASL {mechanism} (it offers "
                                        f"{', '.join(handshake.mechanisms)})")
        if mechanism == "PLAIN":
            self._authenticate(b"\0" + username.encode() + b"\0" + password.encode())
            return
        from scramp import ScramClient

        scram = ScramClient([mechanism], username, password)
        server_first = self._authenticate(scram.get_client_first().encode())
        scram.set_server_first(server_first.decode())
        server_final = self._authenticate(scram.get_client_final().encode())
        scram.set_server_final(server_final.decode())

    def _authenticate(self, token: bytes) -> bytes:
        response = self.call(ApiKey.SASL_AUTHENTICATE, 2, SaslAuthenticateRequest(auth_bytes=token))
        if response.error_code != 0:
            raise LoginRefusedError(f"the broker refused the login: {response.error_message}")
        return bytes(response.auth_bytes)


def _tls_context(settings: dict[str, str]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=_setting(settings, "ssl.ca.location"))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    certificate = _setting(settings, "ssl.certificate.location")
    if certificate is not None:
        context.load_cert_chain(certificate, _setting(settings, "ssl.key.location"),
                                _setting(settings, "ssl.key.password"))
    if (_setting(settings, "ssl.endpoint.identification.algorithm", default="https") or "").lower() == "none":
        context.check_hostname = False
    return context
