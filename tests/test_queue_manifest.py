"""The queue manifest (stratalog.queues.manifest): its bytes, and when the queue store publishes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from queuekit import small_queue_config
from stratalog.chaos import fuzz_queues
from stratalog.objects.local import LocalDirStore
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.queues import QueueStore
from stratalog.queues.format import CorruptBulkError
from stratalog.queues.manifest import (
    QUEUE_MANIFEST_KEY,
    QueueManifest,
    QueueManifestError,
    QueueObjectRef,
    decode_manifest,
    encode_manifest,
    read_queue_manifest,
)
from stratalog.queues.objects import QUEUE_PREFIX
from waiting import wait_until

#: The worked example of docs/formats/queues.md, "Queue manifest".
GOLDEN = QueueManifest(7, 3, (QueueObjectRef("queues/0000000000000001-0000000000000005.slq", 1000),
                              QueueObjectRef("queues/0000000000000006.slq", 300)))
GOLDEN_HEX = (
    "534c514d" "0100" "0000" "0700000000000000" "03000000" "02000000"
    "e803000000000000" "2c00" + b"queues/0000000000000001-0000000000000005.slq".hex()
    + "2c01000000000000" "1b00" + b"queues/0000000000000006.slq".hex()
    + "7402977c"
)


def test_manifest_encodes_to_the_documented_bytes() -> None:
    assert encode_manifest(GOLDEN).hex() == GOLDEN_HEX
    assert decode_manifest(bytes.fromhex(GOLDEN_HEX)) == GOLDEN


def test_empty_manifest_round_trips() -> None:
    empty = QueueManifest(1, 0, ())
    assert decode_manifest(encode_manifest(empty)) == empty


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
def test_damaged_manifest_is_refused(damage: str) -> None:
    raw = bytearray(encode_manifest(GOLDEN))
    if damage == "flip":
        raw[30] ^= 0x01
    elif damage == "truncate":
        del raw[10:]
    else:
        raw[-4:-4] = b"x"
    with pytest.raises(CorruptBulkError):
        decode_manifest(bytes(raw))


def test_a_store_without_manifest_says_so(tmp_path: Path) -> None:
    with pytest.raises(QueueManifestError, match="queue store's object storage"):
        read_queue_manifest(LocalDirStore(tmp_path))


def _live_keys(tmp_path: Path) -> list[str]:
    root = tmp_path / LOCAL_DIR_NAME
    return sorted(str(p.relative_to(root)) for p in (root / QUEUE_PREFIX).glob("*.slq"))


def _manifest(tmp_path: Path) -> QueueManifest:
    return read_queue_manifest(LocalDirStore(tmp_path / LOCAL_DIR_NAME))


def test_manifest_follows_uploads_merges_and_reopen(tmp_path: Path) -> None:
    config = small_queue_config(compact_fanout=2, upload_idle_s=3600.0)   # uploads when this test asks
    with QueueStore.open(tmp_path, config=config) as qs:
        qs.put_many([f"q{i}" for i in range(50)], [b"m" * 100] * 50)
        qs.flush()
        qs.uploader.upload()
        assert _manifest(tmp_path).stream_count == 50   # published with the upload's commit
        first = _manifest(tmp_path)
        assert len(first.objects) >= 1
        for round_ in range(1, 6):
            qs.put_many([f"q{i}" for i in range(50 + round_)], [b"n" * 3000] * (50 + round_))
            qs.flush()
            qs.uploader.upload()
        # The manifest follows each change of the view (and merged-away objects go after a grace period).
        wait_until(lambda: qs.stats()["compactions"] >= 2 and not qs.compactor.retiring
                   and [o.key for o in _manifest(tmp_path).objects] == [o.key for o in qs.log_cache.view.objects]
                   and len(_live_keys(tmp_path)) == len(qs.log_cache.view.objects),
                   lambda: f"two merges in the manifest: {qs.stats()}, {_manifest(tmp_path)}")
        merged = _manifest(tmp_path)
        assert merged.seq > first.seq
        assert merged.stream_count == 55
        assert any("-" in o.key for o in merged.objects)
        assert sorted(o.key for o in merged.objects) == _live_keys(tmp_path)
        sizes = {o.key: o.size_bytes for o in merged.objects}
        assert all((tmp_path / LOCAL_DIR_NAME / k).stat().st_size == size for k, size in sizes.items())
    closed = _manifest(tmp_path)
    with QueueStore.open(tmp_path, config=config) as qs:
        reopened = _manifest(tmp_path)
        # Orphan cleanup at open must leave the manifest (it lies outside queues/), and open publishes anew.
        assert reopened.seq > closed.seq
        assert [o.key for o in reopened.objects] == [o.key for o in qs.log_cache.view.objects]
        assert reopened.stream_count == 55
    assert (tmp_path / LOCAL_DIR_NAME / QUEUE_MANIFEST_KEY).exists()


def test_first_open_publishes_an_empty_manifest(tmp_path: Path) -> None:
    with QueueStore.open(tmp_path, config=small_queue_config()):
        assert _manifest(tmp_path) == QueueManifest(1, 0, ())


def test_fuzz_finding_an_object_key_that_is_not_utf8_is_corrupt() -> None:
    # Found by `stratalog chaos fuzz` (queue_manifest): UnicodeDecodeError escaped decode_manifest.
    data = bytes.fromhex(
        "01534c514d0100000007000000000000000300000002000000e8030000000000002c00717565752865732f3030303030"
        "0000303030303030303030303939c7c7c739393939393939352e736c7114000000000000001b007175657565732f3030"
        "30303030303030303030303030362e736c717f35cbe9")
    with pytest.raises(CorruptBulkError, match="not UTF-8"):
        fuzz_queues.check_queue_manifest(data)
