"""The console of a broker that checks its clients (SASL, ACLs): it asks who looks, in a real browser, and
shows each user what its ACLs let it describe: a user without Describe on a topic does not see it, nor can
it open the topic's page; the super user sees everything, the store's figures included."""

from __future__ import annotations

import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from selenium.webdriver.common.by import By

from brokerkit import BrokerProcess, console_address, running_broker
from stratalog.cli import cli
from waiting import wait_until

pytestmark = pytest.mark.slow
pytest_plugins = ["browserkit"]

PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret"}
PUBLIC, SECRET = "public-orders", "secret-payroll"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("console-login")
    data = root / "data"
    for user, password in PASSWORDS.items():
        subprocess.run([sys.executable, "-c", "from stratalog.cli import main; main()", "users", "add", user,
                        "--password-stdin", "--data-dir", str(data)], input=password + "\n", text=True,
                       check=True, capture_output=True, timeout=60)
    admin = root / "admin.properties"
    admin.write_text(f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\nsasl.username=admin\n"
                     f"sasl.password={PASSWORDS['admin']}\n")
    with running_broker(data, "--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--acls", "--super-user", "User:admin",
                        "--console", "127.0.0.1:0") as process:
        bootstrap = process.listeners()["SASL_PLAINTEXT"]

        def as_admin(*args: str) -> None:
            result = CliRunner().invoke(cli, [*args, "--bootstrap", bootstrap, "--command-config", str(admin)])
            assert result.exit_code == 0, result.output

        for topic in (PUBLIC, SECRET):
            as_admin("topics", "create", topic)
        as_admin("acls", "create", "--allow", "User:alice", "--operation", "Describe", "--topic", "public-",
                 "--pattern", "prefixed")
        yield process
        assert process.stop() == 0, "".join(process.output)


@pytest.fixture(scope="module")
def console(broker: BrokerProcess) -> str:
    return console_address(broker.output)


def log_in(browser: Any, console: str, user: str, password: str) -> None:
    browser.get(f"{console}/logout")
    browser.find_element(By.NAME, "user").send_keys(user)
    browser.find_element(By.NAME, "password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()


def listed_topics(browser: Any) -> set[str]:
    return {row.get_attribute("data-topic") for row in browser.find_elements(By.CSS_SELECTOR, "tr[data-topic]")}


def test_the_console_asks_who_looks_and_refuses_a_wrong_password(console: str, browser: Any) -> None:
    browser.get(f"{console}/logout")
    browser.get(f"{console}/topics")
    assert urllib.parse.urlsplit(browser.current_url).path == "/login", "no page before a login"
    log_in(browser, console, "alice", "not-her-password")
    assert browser.find_element(By.ID, "failed").text == "unknown user or wrong password"
    log_in(browser, console, "nobody", "whatever")
    assert browser.find_element(By.ID, "failed").text == "unknown user or wrong password", "alike for a stranger"


def test_a_user_sees_only_the_topics_its_acls_let_it_describe(console: str, browser: Any) -> None:
    log_in(browser, console, "alice", PASSWORDS["alice"])
    wait_until(lambda: browser.find_elements(By.ID, "viewer"), "the logged-in page")
    assert browser.find_element(By.ID, "viewer").text == "User:alice"
    browser.get(f"{console}/topics")
    assert listed_topics(browser) == {PUBLIC}
    browser.get(f"{console}/topics/{SECRET}")
    assert browser.find_element(By.ID, "error").text == f"no topic '{SECRET}'", "as if it did not exist"
    browser.get(f"{console}/topics/{PUBLIC}/messages?partition=0")
    assert browser.find_element(By.ID, "error").text == f"User:alice may not read topic '{PUBLIC}'"
    browser.get(f"{console}/")
    assert not browser.find_elements(By.ID, "store"), "the store's figures are for who may describe the cluster"


def test_the_super_user_sees_everything(console: str, browser: Any) -> None:
    log_in(browser, console, "admin", PASSWORDS["admin"])
    wait_until(lambda: browser.find_elements(By.ID, "viewer"), "the logged-in page")
    browser.get(f"{console}/topics")
    assert listed_topics(browser) >= {PUBLIC, SECRET}
    browser.get(f"{console}/")
    assert browser.find_elements(By.ID, "store")
