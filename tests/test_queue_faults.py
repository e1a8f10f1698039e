"""The queue store when its disk or its object store fails: a WAL write or sync that fails stops the store
(nothing after it is acknowledged, nothing flushed before it is lost, even with a power cut after it); an
object store that fails makes uploads retry, and one that keeps failing stops the store without losing what
was flushed. Each scenario counts what it tried."""

from __future__ import annotations

import contextlib
import gc
import random
import time
import weakref
from pathlib import Path

import pytest

from queuekit import small_queue_config
from stratalog.engine.store import StoreClosedError, StoreFailedError
from stratalog.errors import StratalogError
from stratalog.io.faulty import FaultPlan, MemDevice
from stratalog.objects.faulty import FaultyStore, ObjectFaultPlan
from stratalog.objects.local import LocalDirStore
from stratalog.queues import QueueConfig, QueueStore

QUEUES = 120
WAL_SEEDS = 24
#: Rounds put after the fault is armed: it lands within the first few WAL writes or syncs.
ROUNDS_AFTER_FAULT_MAX = 60


def _message(q: int, r: int) -> bytes:
    return f"q{q} r{r} ".encode() * (1 + (q + r) % 5)


def _put_round(store: QueueStore, r: int, rng: random.Random) -> None:
    """One message to every queue: single puts or one bulk put."""
    names = [f"q{q}" for q in range(QUEUES)]
    if rng.random() < 0.5:
        store.put_many(names, [_message(q, r) for q in range(QUEUES)])
    else:
        for q, name in enumerate(names):
            store.put(name, _message(q, r))


def _check_reopened(store: QueueStore, flushed: int, label: str) -> int:
    """Every queue holds rounds 0 .. k - 1 for one k >= ``flushed``, dense, in order, each message whole;
    returns the messages checked."""
    checked = 0
    for q in range(QUEUES):
        got = store.get(f"q{q}", 0, 10_000)
        # A round not flushed may survive in part, or not at all: what is there is a prefix of the rounds.
        assert got == [_message(q, r) for r in range(len(got))], f"{label}: q{q} is not its rounds in order"
        assert len(got) >= flushed, f"{label}: q{q} lost flushed rounds ({len(got)} < {flushed})"
        checked += len(got)
    return checked


def _config(**overrides: object) -> QueueConfig:
    return small_queue_config(compact_fanout=2, upload_backoff_s=0.01, **overrides)


def test_a_wal_eio_stops_the_queue_store_and_a_power_cut_after_it_loses_nothing_flushed(tmp_path: Path) -> None:
    config = _config()
    seen = {"refused_by_flush": 0, "refused_by_put": 0, "rounds_flushed_after_arming": 0, "messages_checked": 0,
            "power_cuts": 0}
    for seed in range(WAL_SEEDS):
        rng = random.Random(seed)
        data_dir = tmp_path / f"s{seed}"
        device = MemDevice(config.wal_capacity_bytes)
        store = QueueStore.open(data_dir, config=config, wal_device=device)
        flushed = 0
        for r in range(rng.randint(1, 6)):
            _put_round(store, r, rng)
            store.flush()
            flushed = r + 1
        nth = rng.randint(1, 4)
        lands = rng.choice([0, 512, 4096])
        device.faults = (FaultPlan(fail_writes={device.writes + nth}, failed_write_lands_bytes=lands)
                         if seed % 2 else FaultPlan(fail_syncs={device.syncs + nth}))
        armed_at = flushed
        refused: BaseException | None = None
        r = flushed
        for r in range(flushed, flushed + ROUNDS_AFTER_FAULT_MAX):
            try:
                _put_round(store, r, rng)
            except StratalogError as e:
                refused = e
                seen["refused_by_put"] += 1
                break
            try:
                store.flush()
            except StratalogError as e:
                refused = e
                seen["refused_by_flush"] += 1
                break
            flushed = r + 1
        assert refused is not None, f"seed {seed}: the store went on after the injected EIO"
        assert isinstance(refused, StoreFailedError), f"seed {seed}: {refused!r}"
        seen["rounds_flushed_after_arming"] += flushed - armed_at
        # Stopped: puts and flushes are refused from now on; close does not hang.
        with pytest.raises(StoreFailedError):
            _put_round(store, r + 1, rng)
            store.flush()
        with contextlib.suppress(StratalogError):
            store.close()
        # A power cut now: of the WAL's writes not synced, any may be lost or torn.
        image = device.crash_image(rng)
        device.close()
        seen["power_cuts"] += 1
        reopened_device = MemDevice(config.wal_capacity_bytes, image=image)
        with QueueStore.open(data_dir, config=config, wal_device=reopened_device) as reopened:
            seen["messages_checked"] += _check_reopened(reopened, flushed, f"seed {seed}")
            # It takes puts again.
            reopened.put("q0", b"after")
            reopened.flush()
        reopened_device.close()
    print(f"queue WAL EIO: {seen}")
    assert seen["power_cuts"] == WAL_SEEDS
    assert seen["refused_by_flush"] > 0 and seen["rounds_flushed_after_arming"] > 0
    assert seen["messages_checked"] > 10_000


@pytest.mark.parametrize("stopped", [False, True])
def test_a_closed_store_is_freed_at_once_whether_an_error_stopped_it_or_not(tmp_path: Path, stopped: bool) -> None:
    """Nothing of a closed store is left in a reference cycle (its WAL device, buffers and log cache would
    wait for a full garbage collection: a process that reopened stores after EIO grew by each one's memory)."""
    config = _config()
    rng = random.Random(7)
    gc.disable()
    try:
        device = MemDevice(config.wal_capacity_bytes)
        store = QueueStore.open(tmp_path / "s", config=config, wal_device=device)
        _put_round(store, 0, rng)
        store.flush()
        if stopped:
            device.faults = FaultPlan(fail_syncs={device.syncs + 1})
            try:
                for r in range(1, ROUNDS_AFTER_FAULT_MAX):
                    _put_round(store, r, rng)
                    store.flush()
            except StoreFailedError:
                pass
        with contextlib.suppress(StoreFailedError):
            store.close()
        # A closed store still refuses puts (its buffer holds it weakly).
        try:
            store.put("q0", b"after close")
        except StratalogError as e:
            refused = type(e)
        assert refused is StoreClosedError
        gone = [weakref.ref(store), weakref.ref(device)]
        del store, device
        assert [r() for r in gone] == [None, None], "a closed store is still referenced"
    finally:
        gc.enable()


def test_object_store_faults_are_retried_and_one_that_persists_stops_the_store_losing_nothing(
        tmp_path: Path) -> None:
    config = _config(upload_attempts_max=8)
    seen = {"transient_faults": 0, "uploads_through_them": 0, "stopped": 0, "rounds_flushed": 0,
            "messages_checked": 0}
    for seed in range(6):
        rng = random.Random(seed)
        data_dir = tmp_path / f"s{seed}"
        objects_dir = tmp_path / f"o{seed}"
        plan = ObjectFaultPlan(random_kinds=frozenset({"put", "get", "delete"}))
        faulty = FaultyStore(LocalDirStore(objects_dir), seed=seed, plan=plan)
        store = QueueStore.open(data_dir, faulty, config=config)
        # Transient faults first (each call may fail, and a retry gets through); pauses let uploads go.
        plan.fail_before_probability, plan.fail_after_probability, plan.interrupt_put_probability = 0.2, 0.1, 0.1
        flushed = 0
        for r in range(24):
            _put_round(store, r, rng)
            store.flush()
            flushed = r + 1
            if r % 4 == 3:
                time.sleep(0.1)    # past upload_idle_s: an upload at idle starts and must get through the faults
        store.flush()
        seen["transient_faults"] += faulty.faults.total()
        seen["uploads_through_them"] += store.stats()["objects"] > 0
        # Then an object store that fails every call: uploads give up after their retries (backing off) and
        # the store stops; puts go on until then.
        plan.fail_before_probability = 1.0
        stopped: BaseException | None = None
        deadline = time.monotonic() + 60
        r = flushed
        while time.monotonic() < deadline:
            try:
                _put_round(store, r, rng)
                store.flush()
            except StratalogError as e:
                stopped = e
                break
            r += 1
            flushed = r
            if r % 4 == 0:
                time.sleep(0.05)   # about upload_idle_s: uploads at idle start (and fail) between the puts
        assert isinstance(stopped, StoreFailedError), f"seed {seed}: {stopped!r}"
        with pytest.raises(StoreFailedError):
            store.put("q0", b"after the stop")
        seen["stopped"] += 1
        with contextlib.suppress(StratalogError):
            store.close()
        seen["rounds_flushed"] += flushed
        # The WAL kept everything flushed that no object holds yet: a reopen with a store that works finds it.
        with QueueStore.open(data_dir, LocalDirStore(objects_dir), config=config) as reopened:
            seen["messages_checked"] += _check_reopened(reopened, flushed, f"seed {seed}")
    print(f"queue object store faults: {seen}")
    assert seen["stopped"] == 6 and seen["transient_faults"] > 10 and seen["uploads_through_them"] == 6
