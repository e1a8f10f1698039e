"""The web console in a real browser: Debian's chromium, headless, driven by selenium against a live
`stratalog serve --console`. A topic produced to appears with its count, a group's lag shows and drops to
0 once it consumes, a JSON value renders (and a hostile one stays text); screenshots of each page are kept
in build/test-artifacts/console/."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from brokerkit import BrokerProcess, console_address, running_broker
from waiting import wait_until

pytestmark = pytest.mark.slow
pytest_plugins = ["browserkit"]

@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("console")
    config = data / "broker.toml"
    config.write_text("[groups]\ngroup_initial_rebalance_delay_ms = 0\n")
    with running_broker(data / "data", "--config", str(config), "--console", "127.0.0.1:0") as process:
        yield process
        assert process.stop() == 0, "".join(process.output)


@pytest.fixture(scope="module")
def console(broker: BrokerProcess) -> str:
    return console_address(broker.output)


def topic_with(broker: BrokerProcess, values: list[bytes], keys: list[bytes] | None = None) -> str:
    topic = f"console-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=keys[i] if keys else None)
    assert producer.flush(60) == 0
    return topic


def consume(broker: BrokerProcess, topic: str, group: str, count: int) -> None:
    """Read ``count`` records as ``group`` and commit their offsets."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    read = 0
    while read < count:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            read += 1
            if read == count:
                consumer.commit(message, asynchronous=False)
    consumer.close()


def cell(browser: Any, css: str) -> str:
    return str(browser.find_element(By.CSS_SELECTOR, css).text)


def test_a_topic_produced_to_appears_with_its_record_count(broker: BrokerProcess, console: str, screenshot: Any,
                                                            browser: Any) -> None:
    topic = topic_with(broker, [b"r%d" % i for i in range(7)])
    browser.get(f"{console}/topics")
    assert cell(browser, f'tr[data-topic="{topic}"] td.records') == "7"
    screenshot("topics")
    browser.find_element(By.LINK_TEXT, topic).click()
    assert cell(browser, "#records") == "7"
    assert cell(browser, 'tr[data-partition="0"]').split()[:4] == ["0", "0", "7", "7"]
    screenshot("topic")
    browser.get(f"{console}/")
    assert cell(browser, "#writable") == "yes"
    assert re.fullmatch(r"[\d,]+ \([\d,.]+ (B|KiB|MiB)\)", cell(browser, "#objects"))
    assert re.fullmatch(r"[\d,.]+ (B|KiB|MiB)", cell(browser, "#wal-used"))
    assert re.fullmatch(r"[\d,]+ ms", cell(browser, "#upload-lag"))
    screenshot("broker")


def test_a_groups_lag_shows_and_drops_to_zero_once_it_consumes(broker: BrokerProcess, console: str, screenshot: Any,
                                                                browser: Any) -> None:
    topic, group = topic_with(broker, [b"e%d" % i for i in range(5)]), f"billing-{uuid.uuid4().hex[:6]}"
    consume(broker, topic, group, 2)
    browser.get(f"{console}/groups")
    assert cell(browser, f'tr[data-group="{group}"] td.lag') == "3"
    browser.find_element(By.LINK_TEXT, group).click()
    assert cell(browser, "#lag") == "3"
    assert cell(browser, f'tr[data-partition="{topic}/0"] td.lag') == "3"
    screenshot("group-lagging")
    consume(broker, topic, group, 3)

    def lag() -> str | None:
        browser.refresh()
        return cell(browser, "#lag") if cell(browser, "#lag") == "0" else None

    wait_until(lag, "the page to show lag 0")
    screenshot("group-caught-up")


def test_a_json_value_renders_and_a_hostile_one_stays_text(broker: BrokerProcess, console: str, screenshot: Any,
                                                           browser: Any) -> None:
    value = {"amount": 3, "to": "Zoë", "note": "<b id='injected'>bold</b>"}
    topic = topic_with(broker, [b"plain", json.dumps(value).encode()], keys=[b"k0", b"<script>alert(1)</script>"])
    browser.get(f"{console}/topics/{topic}")
    browser.find_element(By.NAME, "offset").send_keys("1")
    Select(browser.find_element(By.NAME, "format")).select_by_visible_text("json")
    browser.find_element(By.CSS_SELECTOR, "#messages-form button").click()
    row = 'tr[data-offset="1"]'
    # The click submits the form; the page with the records comes when the browser has loaded it.
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, f"{row} pre.value"), "the page of records")
    assert json.loads(cell(browser, f"{row} pre.value")) == value
    assert cell(browser, f"{row} pre.value") == json.dumps(value, indent=2, ensure_ascii=False)
    assert cell(browser, f"{row} pre.key") == "<script>alert(1)</script>"
    assert not browser.find_elements(By.ID, "injected"), "a value's markup must not become the page's"
    assert browser.find_elements(By.CSS_SELECTOR, 'tr[data-offset="0"]') == []
    screenshot("messages-json")


def test_a_page_asked_for_something_missing_or_malformed_says_so(console: str) -> None:
    for path, status, said in [("/topics/nope", 404, "no topic &#39;nope&#39;"), ("/nope", 404, "no page /nope"),
                               ("/topics/x/messages?partition=-1", 400, "expected a whole number")]:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(console + path, timeout=30)
        with e.value:
            assert e.value.code == status and said in e.value.read().decode()
    request = urllib.request.Request(console + "/topics", method="POST", data=b"x")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=30)
    with e.value:
        assert e.value.code == 405
