"""A real `stratalog serve` for tests: a child process on 127.0.0.1, stopped by the test."""

import re

from stratalog.chaos.broker_process import BrokerProcess, running_broker, start_broker

__all__ = ["BrokerProcess", "console_address", "running_broker", "start_broker"]


def console_address(output: list[str]) -> str:
    """``http://HOST:PORT`` of the web console a broker's banner names."""
    found = re.search(r"console on (http://\S+)/", "".join(output))
    assert found, "".join(output)
    return found.group(1)
