"""A real `stratalog serve` for tests: a child process on 127.0.0.1, stopped by the test."""

from stratalog.chaos.broker_process import BrokerProcess, running_broker, start_broker

__all__ = ["BrokerProcess", "running_broker", "start_broker"]
