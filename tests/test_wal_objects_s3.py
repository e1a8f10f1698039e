"""The object WAL on a real S3 API server (SeaweedFS on 127.0.0.1): a crash's gap and a damaged last
object are handled through real listing, ranged gets, deletes and server-side renames."""

from __future__ import annotations

import secrets

from conftest import SeaweedS3
from owalkit import OWNER, PREFIX, key, small_config
from stratalog.objects.s3 import S3Config, S3Store
from stratalog.wal.object_wal import ObjectWAL, read_records
from waiting import WAIT_S


def test_recovery_on_s3_drops_a_crash_tail_and_keeps_every_acknowledged_record(seaweedfs: SeaweedS3) -> None:
    s3 = S3Store(seaweedfs.bucket, f"t-{secrets.token_hex(6)}", endpoint_url=seaweedfs.endpoint_url,
                 region=seaweedfs.region, access_key=seaweedfs.access_key, secret_key=seaweedfs.secret_key,
                 config=S3Config(attempts_max=2))
    try:
        wal = ObjectWAL.open(s3, OWNER, small_config(puts_in_flight_max=4))
        assert list(wal.recover()) == []
        results = [wal.append(b"record-%d" % i) for i in range(8)]  # one object per record
        assert results[-1].future.result(WAIT_S) == 8
        wal.trim(1)
        wal.close()
        # The state a crash leaves: object 5's put never landed, 6 and 7 did (within the window of 4).
        s3.delete(key(5))
        assert [r.offset for r in read_records(s3, OWNER, small_config())] == [2, 3, 4]
        again = ObjectWAL.open(s3, OWNER, small_config())
        assert [(r.offset, r.data) for r in again.recover()] == [(i, b"record-%d" % i) for i in (2, 3, 4)]
        assert again.recovery_stats.unacknowledged_objects == 2
        assert again.append(b"new five").future.result(WAIT_S) == 6
        again.close()
        # A damaged last object is moved aside with a server-side rename.
        s3.put(key(5), s3.get(key(5))[:-3])
        third = ObjectWAL.open(s3, OWNER, small_config())
        assert [r.offset for r in third.recover()] == [2, 3, 4]
        assert third.recovery_stats.damaged_objects == 1
        third.close()
        keys = [info.key for info in s3.list(PREFIX)]
        assert keys[:3] == [key(2), key(3), key(4)] and key(5) not in keys
        assert any(k.startswith(PREFIX + "damaged/") for k in keys) and PREFIX + "trim" in keys
    finally:
        s3.close()
