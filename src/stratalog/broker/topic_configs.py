"""Topic configs the broker knows: Kafka's names, defaults, checks, and what each maps onto.

A topic's configs are what its creator or IncrementalAlterConfigs set; the rest take these defaults.
A config Kafka knows but stratalog does not act on is refused (INVALID_CONFIG) rather than silently
ignored, except where accepting it changes nothing a client can observe (a single node has no
replicas, so ``min.insync.replicas`` is accepted as documentation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from stratalog.engine.cleaner import CleanPolicy
from stratalog.errors import StratalogError
from stratalog.kafka.records import Compression

#: ``compression.type`` values that name a codec (Kafka's names), and the codec each stores batches in.
CODECS: Mapping[str, Compression] = {"uncompressed": Compression.NONE, "gzip": Compression.GZIP,
                                     "snappy": Compression.SNAPPY, "lz4": Compression.LZ4,
                                     "zstd": Compression.ZSTD}


#: cleanup.policy's two policies.
DELETE, COMPACT = "delete", "compact"


class InvalidConfigError(StratalogError, ValueError):
    """A config name or value the broker does not accept (Kafka's INVALID_CONFIG)."""


#: DescribeConfigs v3+ ``config_type``: Kafka's ConfigDef.Type as the wire numbers it.
TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_DOUBLE, TYPE_LIST = 2, 3, 5, 6, 7


@dataclass(frozen=True, slots=True)
class ConfigSpec:
    name: str
    default: str
    check: Callable[[str], None]
    doc: str
    #: The type Kafka gives this config, so admin tools show and parse the value as they would Kafka's.
    config_type: int


def _long(low: int, high: int = 2**63 - 1) -> Callable[[str], None]:
    def check(value: str) -> None:
        try:
            number = int(value)
        except ValueError:
            raise InvalidConfigError(f"{value!r} is not an integer") from None
        if not low <= number <= high:
            raise InvalidConfigError(f"{number} is outside [{low}, {high}]")
    return check


def _one_of(*allowed: str) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value not in allowed:
            raise InvalidConfigError(f"{value!r} is not one of {', '.join(allowed)}")
    return check


def _cleanup_policy(value: str) -> None:
    """Kafka's list of policies: delete (retention), compact (the latest record of each key), or both."""
    policies = [v.strip() for v in value.split(",") if v.strip()]
    unknown = sorted(set(policies) - {DELETE, COMPACT})
    if unknown:
        raise InvalidConfigError(f"cleanup.policy {', '.join(unknown)}: Kafka's policies are delete and compact")
    if not policies or len(set(policies)) != len(policies):
        raise InvalidConfigError(f"cleanup.policy {value!r}: delete, compact, or both, each once")


def _ratio(value: str) -> None:
    try:
        number = float(value)
    except ValueError:
        raise InvalidConfigError(f"{value!r} is not a number") from None
    if not 0.0 <= number <= 1.0:
        raise InvalidConfigError(f"{number} is outside [0, 1]")


SPECS: Mapping[str, ConfigSpec] = {s.name: s for s in (
    ConfigSpec("retention.ms", "604800000", _long(-1),
               "records older than this are deleted (whole uploaded blocks at a time) when cleanup.policy "
               "has delete; -1: kept forever", TYPE_LONG),
    ConfigSpec("retention.bytes", "-1", _long(-1),
               "a partition keeps at most about this many bytes of uploaded data when cleanup.policy has "
               "delete; -1: no limit", TYPE_LONG),
    ConfigSpec("max.message.bytes", "1048588", _long(0, 2**31 - 1),
               "the largest record batch a producer may send to this topic", TYPE_INT),
    ConfigSpec("cleanup.policy", "delete", _cleanup_policy,
               "delete: old records go by retention.ms and retention.bytes; compact: only the latest record of "
               "each key is kept (uploaded data, by the partition's leader); compact,delete: both", TYPE_LIST),
    ConfigSpec("min.cleanable.dirty.ratio", "0.5", _ratio,
               "a compacted partition is cleaned once this share of its uploaded bytes is not yet cleaned",
               TYPE_DOUBLE),
    ConfigSpec("min.compaction.lag.ms", "0", _long(0),
               "records younger than this are not compacted yet", TYPE_LONG),
    ConfigSpec("max.compaction.lag.ms", str(2**63 - 1), _long(1),
               "a partition with a record not yet compacted that is this old is cleaned whatever its dirty "
               "ratio", TYPE_LONG),
    ConfigSpec("delete.retention.ms", "86400000", _long(0),
               "a tombstone (a record with a null value) of a compacted topic is kept this long after its "
               "timestamp, so consumers lagging less see it", TYPE_LONG),
    ConfigSpec("message.timestamp.type", "CreateTime", _one_of("CreateTime"),
               "records keep the timestamp their producer gave", TYPE_STRING),
    ConfigSpec("compression.type", "producer", _one_of("producer", *CODECS),
               "producer: batches are stored as the producer compressed them; a codec: a batch that arrives "
               "in another is recompressed with it before it is stored", TYPE_STRING),
    ConfigSpec("min.insync.replicas", "1", _long(1),
               "accepted for compatibility: one broker, the WAL's fsync is the durability", TYPE_INT),
    ConfigSpec("segment.bytes", "67108864", _long(1 << 14),
               "accepted for compatibility: uploads, not segments, cut the log into objects (what is not "
               "uploaded yet, seconds of it, is the active part that compaction leaves alone)", TYPE_INT),
    ConfigSpec("segment.ms", "604800000", _long(1),
               "accepted for compatibility: uploads, not segments, cut the log into objects (what is not "
               "uploaded yet, seconds of it, is the active part that compaction leaves alone)", TYPE_LONG),
)}


def check_configs(configs: Mapping[str, str | None]) -> dict[str, str]:
    """The configs with their values checked; raises InvalidConfigError naming the first bad one."""
    out = {}
    for name, value in configs.items():
        spec = SPECS.get(name)
        if spec is None:
            raise InvalidConfigError(f"unknown topic config {name!r}")
        if value is None:
            raise InvalidConfigError(f"topic config {name!r} needs a value")
        try:
            spec.check(value)
        except InvalidConfigError as e:
            raise InvalidConfigError(f"topic config {name}: {e}") from None
        out[name] = value
    return out


def effective(configs: Mapping[str, str]) -> dict[str, str]:
    """Every known config: the topic's own values over the defaults."""
    return {name: configs.get(name, spec.default) for name, spec in SPECS.items()}


def config_value(configs: Mapping[str, str], name: str) -> str:
    """One config's value: the topic's own, else the default (what a produce reads, without building
    every config as ``effective`` does)."""
    return configs.get(name, SPECS[name].default)


def policies(configs: Mapping[str, str]) -> set[str]:
    return {v.strip() for v in config_value(configs, "cleanup.policy").split(",") if v.strip()}


def retention(configs: Mapping[str, str]) -> tuple[int | None, int | None]:
    """``(retention_ms, retention_bytes)`` for the engine (None: no limit; both None unless cleanup.policy
    has delete)."""
    if DELETE not in policies(configs):
        return None, None
    ms, size = int(config_value(configs, "retention.ms")), int(config_value(configs, "retention.bytes"))
    return (None if ms < 0 else ms), (None if size < 0 else size)


def clean_policy(configs: Mapping[str, str]) -> CleanPolicy | None:
    """How the engine compacts the topic's partitions, or None when cleanup.policy has no compact."""
    if COMPACT not in policies(configs):
        return None
    return CleanPolicy(delete_retention_ms=int(config_value(configs, "delete.retention.ms")),
                       min_compaction_lag_ms=int(config_value(configs, "min.compaction.lag.ms")),
                       max_compaction_lag_ms=int(config_value(configs, "max.compaction.lag.ms")),
                       min_cleanable_dirty_ratio=float(config_value(configs, "min.cleanable.dirty.ratio")))


def stored_codec(configs: Mapping[str, str]) -> Compression | None:
    """The codec a topic stores its batches in, or None (``producer``): each batch as it came."""
    return CODECS.get(config_value(configs, "compression.type"))
