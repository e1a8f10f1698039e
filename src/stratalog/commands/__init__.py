"""Where each subcommand lives, as ``module:attribute``: the CLI imports a command's module only when
that command runs (or help lists it), so `stratalog serve` loads the broker and none of the benchmarks."""

from __future__ import annotations

#: Commands of ``stratalog`` itself.
TOP = {
    "acls": "stratalog.commands.acls:acls",
    "consume": "stratalog.commands.consume:consume",
    "demo": "stratalog.commands.demo:demo",
    "groups": "stratalog.commands.groups:groups",
    "inspect": "stratalog.commands.inspect:inspect",
    "pipeline": "stratalog.commands.pipeline:pipeline",
    "produce": "stratalog.commands.produce:produce",
    "quotas": "stratalog.commands.quotas:quotas",
    "serve": "stratalog.commands.serve:serve",
    "topics": "stratalog.commands.topics:topics",
    "users": "stratalog.commands.users:users",
}
#: Commands of ``stratalog bench``.
BENCH = {
    "wal": "stratalog.commands.bench_wal:wal",
    "wal-objects": "stratalog.commands.bench_wal_objects:wal_objects",
    "log": "stratalog.commands.bench_log:log",
    "catchup": "stratalog.commands.bench_catchup:catchup",
    "compaction": "stratalog.commands.bench_compaction:compaction",
    "spark": "stratalog.commands.bench_spark:spark",
    "streams": "stratalog.commands.bench_streams:streams",
    "queues": "stratalog.commands.bench_queues:queues",
    "kafka": "stratalog.commands.bench_kafka:kafka",
    "produce-path": "stratalog.commands.bench_produce_path:produce_path",
    "abuse": "stratalog.commands.bench_abuse:abuse",
    "cluster": "stratalog.commands.bench_cluster:cluster",
}
#: Commands of ``stratalog chaos``.
CHAOS = {
    "wal": "stratalog.commands.chaos_wal:wal",
    "engine": "stratalog.commands.chaos_engine:engine",
    "broker": "stratalog.commands.chaos_broker:broker",
    "cluster": "stratalog.commands.chaos_cluster:cluster",
    "fuzz": "stratalog.commands.chaos_fuzz:fuzz",
}
