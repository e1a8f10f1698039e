"""Table manifests of materialized topics, without Spark: contiguity, trims, retired files, round trips."""

from __future__ import annotations

import pytest

from enginekit import MemoryStore
from stratalog.spark.tables import (
    MANIFESTS_KEPT,
    Retired,
    TableFile,
    TableManifest,
    TableManifestError,
    after_trims,
    expired,
    file_key,
    read_table_manifest,
    write_table_manifest,
)


def tfile(partition: int, start: int, end: int) -> TableFile:
    return TableFile(file_key("t", partition, start, end, 86_400_000), partition, start, end, 100, 0, 1)


def test_file_keys_name_topic_partition_day_and_offsets() -> None:
    assert file_key("clicks", 3, 10, 20, 86_400_000 * 365) == \
        "tables/clicks/3/1971-01-01/00000000000000000010-00000000000000000020.parquet"


def test_a_manifest_round_trips_and_only_the_newest_few_are_kept() -> None:
    store = MemoryStore()
    assert read_table_manifest(store, "t") == TableManifest("t")
    for seq in range(1, MANIFESTS_KEPT + 4):
        write_table_manifest(store, TableManifest("t", seq, [tfile(0, 0, 10), tfile(0, 10, 25), tfile(1, 5, 6)],
                                                  [Retired("tables/t/old", 5)]))
    newest = read_table_manifest(store, "t")
    assert newest.seq == MANIFESTS_KEPT + 3 and newest.ends() == {0: 25, 1: 6}
    assert len(list(store.list("tables/t/manifest/"))) == MANIFESTS_KEPT + 1


@pytest.mark.parametrize("files", [[tfile(0, 0, 10), tfile(0, 11, 20)], [tfile(0, 0, 10), tfile(0, 5, 20)],
                                   [tfile(0, 7, 7)]])
def test_files_of_a_partition_must_follow_each_other(files: list[TableFile]) -> None:
    with pytest.raises(TableManifestError, match="does not follow"):
        write_table_manifest(MemoryStore(), TableManifest("t", 1, files))


def test_trims_retire_whole_files_and_grace_decides_deletion() -> None:
    manifest = TableManifest("t", 4, [tfile(0, 0, 10), tfile(0, 10, 20), tfile(1, 0, 5)])
    trimmed = after_trims(manifest, {0: 15, 1: 5}, now_ms=1_000_000)
    assert [(f.partition, f.start) for f in trimmed.files] == [(0, 10)], "a file straddling the start stays"
    assert {r.key for r in trimmed.retired} == {tfile(0, 0, 10).key, tfile(1, 0, 5).key}
    assert expired(trimmed, now_ms=1_000_000 + 1000, grace_s=10)[0] == []
    gone, left = expired(trimmed, now_ms=1_000_000 + 10_000, grace_s=10)
    assert set(gone) == {tfile(0, 0, 10).key, tfile(1, 0, 5).key} and left.retired == []
