"""Registers every subcommand on the CLI groups."""

from __future__ import annotations

import click


def register_all(cli: click.Group, *, bench: click.Group, chaos: click.Group) -> None:
    from stratalog.commands import (
        bench_abuse,
        bench_catchup,
        bench_cluster,
        bench_kafka,
        bench_log,
        bench_queues,
        bench_spark,
        bench_streams,
        bench_wal,
        bench_wal_objects,
        chaos_broker,
        chaos_cluster,
        chaos_engine,
        chaos_fuzz,
        chaos_wal,
        demo,
        inspect,
        pipeline,
        serve,
        users,
    )

    cli.add_command(demo.demo)
    cli.add_command(inspect.inspect)
    cli.add_command(pipeline.pipeline)
    cli.add_command(serve.serve)
    cli.add_command(users.users)
    bench.add_command(bench_wal.wal, name="wal")
    bench.add_command(bench_wal_objects.wal_objects, name="wal-objects")
    bench.add_command(bench_log.log, name="log")
    bench.add_command(bench_catchup.catchup, name="catchup")
    bench.add_command(bench_spark.spark, name="spark")
    bench.add_command(bench_streams.streams, name="streams")
    bench.add_command(bench_queues.queues, name="queues")
    bench.add_command(bench_kafka.kafka, name="kafka")
    bench.add_command(bench_abuse.abuse, name="abuse")
    bench.add_command(bench_cluster.cluster, name="cluster")
    chaos.add_command(chaos_wal.wal, name="wal")
    chaos.add_command(chaos_engine.engine, name="engine")
    chaos.add_command(chaos_broker.broker, name="broker")
    chaos.add_command(chaos_cluster.cluster, name="cluster")
    chaos.add_command(chaos_fuzz.fuzz, name="fuzz")
