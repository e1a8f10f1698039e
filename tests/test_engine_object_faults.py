"""The engine over an object store that fails: errors before and after a put lands, interrupted uploads,
slow calls. Acknowledged records are never lost or doubled, and no orphan survives the next open."""

from __future__ import annotations

from pathlib import Path

from enginekit import abandon, small_store_config
from stratalog.engine.store import DATA_PREFIX, StoreFailedError, StreamStore
from stratalog.errors import StratalogError
from stratalog.objects.faulty import FaultyStore, ObjectFaultPlan
from stratalog.objects.local import LocalDirStore

SEEDS = 12
STREAMS = 4


def faulty(root: Path, seed: int) -> FaultyStore:
    plan = ObjectFaultPlan(fail_before_probability=0.15, fail_after_probability=0.15,
                           interrupt_put_probability=0.1, delay_probability=0.05, delay_s=0.01,
                           random_kinds=frozenset({"put", "delete"}))
    return FaultyStore(LocalDirStore(root), seed=seed, plan=plan)


def test_object_store_faults_lose_nothing_and_leave_no_orphans(tmp_path: Path) -> None:
    tried = {"puts": 0, "faults": 0, "store_stopped": 0, "orphans_deleted": 0, "acknowledged": 0}
    for seed in range(SEEDS):
        data_dir, objects_dir = tmp_path / f"d{seed}", tmp_path / f"o{seed}"
        wrapper = faulty(objects_dir, seed)
        store = StreamStore.open(data_dir, wrapper, small_store_config(upload_attempts_max=3,
                                                                       upload_backoff_s=0.001))
        streams = [store.create_stream(f"s{i}") for i in range(STREAMS)]
        acked: dict[str, list[bytes]] = {s.name or "": [] for s in streams}
        try:
            for round_ in range(30):
                for s in streams:
                    batch = [b"%s-%d-%d" % (s.name.encode() if s.name else b"", round_, j) for j in range(3)]
                    s.append(batch).result()
                    acked[s.name or ""].extend(batch)
                if round_ % 5 == 4:
                    store.flush()
        except (StratalogError, StoreFailedError):
            tried["store_stopped"] += 1  # retries ran out: the store stops; the WAL keeps the data
        tried["puts"] += wrapper.calls["put"]
        tried["faults"] += len(getattr(wrapper, "history", []))
        abandon(store)
        reopened = StreamStore.open(data_dir, LocalDirStore(objects_dir), small_store_config())
        tried["orphans_deleted"] += reopened.recovery.orphan_objects_deleted
        for name, values in acked.items():
            got = reopened.open_stream(name).fetch(0, max_bytes=1 << 30)
            assert [r.offset for r in got] == list(range(len(got))), "gap or duplicate"
            assert [r.value for r in got][:len(values)] == values, f"seed {seed}: stream {name} lost records"
            tried["acknowledged"] += len(values)
        reopened.flush()
        on_disk = {i.key for i in LocalDirStore(objects_dir).list(DATA_PREFIX)}
        assert on_disk == {o.key for o in reopened.metadata.objects()}, "an orphan object survived"
        reopened.close()
    print(tried)
    assert tried["faults"] > 20 and tried["acknowledged"] > 1000
    assert tried["orphans_deleted"] > 0, "no fault left an orphan: the scenario does not test cleanup"
