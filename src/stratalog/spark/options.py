"""Reading the data source's options: Spark passes every option as a string, with its name lower-cased."""

from __future__ import annotations


def option(options: dict[str, str], name: str, default: str | None = None) -> str | None:
    """Option ``name``: Spark passes options with lower-cased names (they are case-insensitive)."""
    return options.get(name.lower(), default)


def required(options: dict[str, str], name: str) -> str:
    value = option(options, name)
    if not value:
        raise ValueError(f"the stratalog data source needs option {name!r}")
    return value


def bool_option(options: dict[str, str], name: str, default: bool) -> bool:
    raw = (option(options, name) or str(default)).lower()
    if raw not in ("true", "false"):
        raise ValueError(f"option {name!r} must be true or false, not {raw!r}")
    return raw == "true"


def include_headers(options: dict[str, str]) -> bool:
    return bool_option(options, "includeHeaders", False)


def int_option(options: dict[str, str], name: str, default: int) -> int:
    raw = option(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"option {name!r} must be an integer, not {raw!r}") from None
    if value < 1:
        raise ValueError(f"option {name!r} must be at least 1, not {value}")
    return value


def kafka_options(options: dict[str, str]) -> dict[str, str]:
    """Options named ``kafka.<setting>``, passed to the Kafka client as ``<setting>`` (as Spark's Kafka
    source does): ``kafka.security.protocol``, ``kafka.sasl.mechanism``, ``kafka.sasl.username``, ..."""
    return {name[len("kafka."):]: value for name, value in options.items() if name.startswith("kafka.")}
