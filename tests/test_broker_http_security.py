"""The broker's HTTP services on the Kafka listeners' terms: plain HTTP on loopback only (elsewhere with
--allow-plaintext-anywhere), HTTPS with the broker's certificate anywhere, and then a login: HTTP Basic
for /metrics, for a user who may describe the cluster; the console's form, its cookie sent over HTTPS only.
The probes answer without a login (an orchestrator asks without one)."""

from __future__ import annotations

import base64
import http.client
import re
import ssl
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from click.testing import CliRunner

from brokerkit import running_broker
from stratalog.broker.http_address import HttpAddress, HttpAddressError, parse_http_address
from stratalog.cli import cli

PASSWORDS = {"admin": "admin-secret", "bob": "bob-secret"}


@pytest.mark.parametrize(("text", "anywhere", "parsed"), [
    ("127.0.0.1:9644", False, HttpAddress("127.0.0.1", 9644, secure=False)),
    ("http://[::1]:0", False, HttpAddress("::1", 0, secure=False)),
    ("localhost:1", False, HttpAddress("localhost", 1, secure=False)),
    ("0.0.0.0:9644", True, HttpAddress("0.0.0.0", 9644, secure=False)),
    ("https://0.0.0.0:9644", False, HttpAddress("0.0.0.0", 9644, secure=True)),
    ("https://127.0.0.1:0", False, HttpAddress("127.0.0.1", 0, secure=True)),
])
def test_an_address_is_taken_on_the_listeners_terms(text: str, anywhere: bool, parsed: HttpAddress) -> None:
    assert parse_http_address(text, "the console", anywhere) == parsed


@pytest.mark.parametrize(("text", "error"), [
    ("0.0.0.0:9644", "0.0.0.0 is not a loopback address: the console serves plain HTTP without a login there "
                     "only with --allow-plaintext-anywhere; use https://0.0.0.0:9644"),
    ("http://10.1.2.3:80", "10.1.2.3 is not a loopback address"),
    ("ftp://127.0.0.1:21", "ftp:// is not http:// or https://"),
    ("9644", "is not \\[https://\\]HOST:PORT"),
    ("127.0.0.1:port", "is not \\[https://\\]HOST:PORT"),
])
def test_an_address_off_those_terms_is_refused_saying_why(text: str, error: str) -> None:
    with pytest.raises(HttpAddressError, match=error):
        parse_http_address(text, "the console")


def test_https_without_the_brokers_certificate_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", "--data-dir", str(tmp_path), "--metrics-listen", "https://127.0.0.1:0"])
    assert result.exit_code == 2 and "HTTPS needs the broker's certificate (--tls-cert)" in result.output


@dataclass(frozen=True)
class Secured:
    metrics: str
    console: str
    tls: ssl.SSLContext


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("https")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(root / "broker.pem"))
    data = root / "data"
    for user, password in PASSWORDS.items():
        subprocess.run([sys.executable, "-c", "from stratalog.cli import main; main()", "users", "add", user,
                        "--password-stdin", "--data-dir", str(data)], input=password + "\n", text=True,
                       check=True, capture_output=True, timeout=60)
    with running_broker(data, "--tls-cert", str(root / "broker.pem"), "--acls", "--super-user", "User:admin",
                        "--metrics-listen", "https://127.0.0.1:0", "--console", "https://127.0.0.1:0") as broker:
        said = "".join(broker.output)
        metrics = re.search(r"metrics on (https://\S+)/metrics", said)
        console = re.search(r"console on (https://\S+)/", said)
        assert metrics and console, said
        tls = ssl.create_default_context()
        ca.configure_trust(tls)
        yield Secured(metrics.group(1), console.group(1), tls)
        assert broker.stop() == 0, said


def get(secured: Secured, base: str, path: str, headers: dict[str, str] | None = None,
        method: str = "GET", body: str | None = None) -> tuple[int, dict[str, str], str]:
    url = urllib.parse.urlsplit(base)
    connection = http.client.HTTPSConnection(url.hostname or "", url.port, context=secured.tls, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_metrics_over_https_ask_for_a_user_who_may_describe_the_cluster(secured: Secured) -> None:
    assert get(secured, secured.metrics, "/healthz")[0] == 200, "the probes ask for no login"
    status, headers, _ = get(secured, secured.metrics, "/metrics")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert get(secured, secured.metrics, "/metrics", basic("admin", "wrong"))[0] == 401
    assert get(secured, secured.metrics, "/metrics", basic("nobody", "wrong"))[0] == 401
    status, _, text = get(secured, secured.metrics, "/metrics", basic("bob", PASSWORDS["bob"]))
    assert status == 403 and "User:bob may not describe the cluster" in text
    status, _, text = get(secured, secured.metrics, "/metrics", basic("admin", PASSWORDS["admin"]))
    assert status == 200 and "kafka_network_requestmetrics_requests_total" in text


def test_the_console_over_https_asks_for_a_login_and_keeps_its_cookie_to_https(secured: Secured) -> None:
    status, headers, _ = get(secured, secured.console, "/")
    assert status == 303 and headers["Location"].startswith("/login")
    form = urllib.parse.urlencode({"user": "admin", "password": PASSWORDS["admin"], "next": "/topics"})
    status, headers, _ = get(secured, secured.console, "/login", {"Content-Type": "application/x-www-form-urlencoded"},
                             "POST", form)
    assert status == 303 and headers["Location"] == "/topics"
    cookie = headers["Set-Cookie"]
    assert "; Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    status, _, page = get(secured, secured.console, "/topics", {"Cookie": cookie.split(";")[0]})
    assert status == 200 and "User:admin" in page
    status, _, text = get(secured, secured.console, "/login", {"Content-Type": "application/x-www-form-urlencoded"},
                          "POST", "user=admin&password=" + "x" * 5000)
    assert status == 413 and "a form of at most 4096 bytes" in text, "the body is bounded before it is read"
