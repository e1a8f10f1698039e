"""A real `stratalog serve` for tests: a child process on 127.0.0.1, stopped by the test."""

import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from stratalog.chaos.broker_process import BrokerProcess, running_broker, start_broker

__all__ = ["BrokerProcess", "console_address", "metrics_address", "running_broker", "scrape_metrics", "start_broker"]

Sample = tuple[str, tuple[tuple[str, str], ...]]


def metrics_address(output: list[str]) -> str:
    """``http://HOST:PORT`` of the metrics endpoint a broker's banner names."""
    found = re.search(r"metrics on (\S+)/metrics", "".join(output))
    assert found, "".join(output)
    return found.group(1)


def scrape_metrics(address: str) -> dict[Sample, float]:
    """Every sample of ``address``'s /metrics, by name and sorted labels."""
    with urllib.request.urlopen(f"{address}/metrics", timeout=60) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def console_address(output: list[str]) -> str:
    """``http://HOST:PORT`` of the web console a broker's banner names."""
    found = re.search(r"console on (http://\S+)/", "".join(output))
    assert found, "".join(output)
    return found.group(1)
