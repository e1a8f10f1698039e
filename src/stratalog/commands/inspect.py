"""``stratalog inspect``: what a store holds, read without changing anything."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.progress import track
from rich.table import Table

from stratalog.engine.batch import CorruptBatchError, read_batch_info
from stratalog.engine.metadata import Metadata, RangeRow
from stratalog.engine.objformat import FOOTER_BYTES, CorruptObjectError, check_block, decode_footer, decode_index
from stratalog.objects.store import ObjectStore
from stratalog.queues.format import OBJECT_FOOTER_BYTES as RUN_FOOTER_BYTES
from stratalog.queues.format import OBJECT_VERSION as RUN_OBJECT_VERSION
from stratalog.queues.format import PAGE_BYTES as RUN_PAGE_BYTES
from stratalog.queues.format import CorruptBulkError, page_crcs
from stratalog.queues.format import decode_footer as decode_run_footer
from stratalog.queues.format import decode_index as decode_run_index
from stratalog.wal.inspect import open_read_only, read_headers, read_records
from stratalog.wal.recovery import RecoveryStats


@click.command()
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--object-store", "object_store_uri", default=None, metavar="URI",
              help="Where the store's objects are (default: the local directory under DATA_DIR).")
@click.option("--stream", "stream_ref", default=None, metavar="ID|NAME", help="List the ranges of one stream.")
@click.option("--wal", "dump_wal", is_flag=True,
              help="Dump the WAL's header slots and the records recovery would return.")
@click.option("--object", "object_key", default=None, metavar="KEY",
              help="Dump one object's footer and index (a stream object, or a queue store's run object); with "
                   "--verify, check every block's (or page's) CRC.")
@click.option("--verify", is_flag=True, help="With --object: read every block (or page of runs) and check its CRC.")
@click.option("--limit", default=50, show_default=True, help="At most this many rows per table.")
def inspect(data_dir: Path, object_store_uri: str | None, stream_ref: str | None, dump_wal: bool,
            object_key: str | None, verify: bool, limit: int) -> None:
    """Print a store's streams, objects and ranges (a queue store's queues and run objects); or dump its WAL
    or one object.

    Reads only: safe beside a running store.
    """
    console = Console()
    if dump_wal:
        _dump_wal(console, data_dir / "wal", limit)
        return
    if object_key is not None:
        from stratalog.objects.uri import open_object_store

        meta_path = data_dir / "meta.sqlite"
        placed = None
        if meta_path.exists():
            meta = Metadata(meta_path, read_only=True)
            try:
                placed = {row.position: row for row in meta.ranges_of_object(object_key)}
            finally:
                meta.close()
        _dump_object(console, open_object_store(object_store_uri, data_dir), object_key, verify, limit, placed)
        return
    meta_path = data_dir / "meta.sqlite"
    if not meta_path.exists():
        raise click.ClickException(f"{data_dir} holds no stratalog store (no meta.sqlite)")
    if stream_ref is None and _queue_summary(console, data_dir, object_store_uri, limit):
        return
    meta = Metadata(meta_path, read_only=True)
    try:
        if stream_ref is not None:
            _dump_stream(console, meta, stream_ref, limit)
        else:
            _summary(console, meta, limit)
    finally:
        meta.close()


def _queue_summary(console: Console, data_dir: Path, object_store_uri: str | None, limit: int) -> bool:
    """A queue store's queues and run objects, from its queue manifest; False when the store is not a queue
    store (its object store holds no queue manifest)."""
    from stratalog.objects.store import ObjectNotFoundError
    from stratalog.objects.uri import open_object_store
    from stratalog.queues.manifest import QUEUE_MANIFEST_KEY, QueueManifestError, decode_manifest

    store = open_object_store(object_store_uri, data_dir)
    try:
        raw = store.get(QUEUE_MANIFEST_KEY)
    except ObjectNotFoundError:
        return False
    finally:
        store.close()
    try:
        manifest = decode_manifest(raw)
    except (QueueManifestError, CorruptBulkError) as e:
        raise click.ClickException(f"{QUEUE_MANIFEST_KEY} is damaged: {e}") from None
    total = sum(o.size_bytes for o in manifest.objects)
    console.print(f"queue store: {manifest.stream_count:,} queues in {len(manifest.objects):,} run objects, "
                  f"{total:,} bytes (queue manifest {manifest.seq}; puts not yet uploaded are in the WAL: --wal)")
    table = Table(title="run objects, oldest place first (--object KEY shows one's queues and runs)")
    for col in ("key", "bytes"):
        table.add_column(col, justify="left" if col == "key" else "right")
    for o in manifest.objects[:limit]:
        table.add_row(o.key, f"{o.size_bytes:,}")
    console.print(table)
    return True


def _summary(console: Console, meta: Metadata, limit: int) -> None:
    streams = meta.streams()
    table = Table(title=f"{len(streams)} streams (commit {meta.commit_seq})")
    for col in ("id", "name", "start", "end in objects", "bytes in objects", "retention"):
        table.add_column(col, justify="right" if col != "name" else "left")
    for s in streams[:limit]:
        retention = ", ".join(x for x in (f"{s.retention_ms} ms" if s.retention_ms is not None else "",
                                          f"{s.retention_bytes} B" if s.retention_bytes is not None else "") if x)
        table.add_row(str(s.stream_id), s.name or "", f"{s.start_offset:,}", f"{s.committed_end_offset:,}",
                      f"{s.committed_bytes:,}", retention or "-")
    console.print(table)
    objects = meta.objects()
    table = Table(title=f"{len(objects)} objects, {sum(o.size_bytes for o in objects):,} bytes")
    for col in ("id", "key", "bytes", "state"):
        table.add_column(col)
    for o in objects[:limit]:
        table.add_row(str(o.object_id), o.key, f"{o.size_bytes:,}", "live" if o.unreferenced_ms is None else
                      "unreferenced (deleted after the grace period)")
    console.print(table)


def _dump_stream(console: Console, meta: Metadata, ref: str, limit: int) -> None:
    sm = meta.stream(int(ref) if ref.isdigit() else ref)
    rows = meta.ranges(sm.stream_id, sm.start_offset, None, limit=limit)
    table = Table(title=f"stream {sm.stream_id} {sm.name or ''}: offsets {sm.start_offset:,}.."
                        f"{sm.committed_end_offset:,} in objects")
    for col in ("start", "end", "records", "object", "position", "bytes", "max timestamp ms"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r.start_offset:,}", f"{r.end_offset:,}", f"{r.record_count:,}", r.key, f"{r.position:,}",
                      f"{r.size_bytes:,}", str(r.max_timestamp_ms))
    console.print(table)


def _dump_wal(console: Console, path: Path, limit: int) -> None:
    if not path.exists():
        raise click.ClickException(f"no WAL at {path}")
    device = open_read_only(path)
    try:
        view = read_headers(device)
        table = Table(title=f"WAL {path}")
        for col in ("slot", "sequence", "capacity", "trim offset", "window", "shutdown"):
            table.add_column(col)
        for i, h in enumerate(view.slots):
            if h is None:
                table.add_row(str(i), "invalid", "", "", "", "")
            else:
                table.add_row(str(i), str(h.sequence), f"{h.capacity_bytes:,}", f"{h.trim_offset:,}",
                              f"{h.window_bytes_max:,}", h.shutdown.name.lower())
        console.print(table)
        stats = RecoveryStats()
        records = Table(title="records after the trim (as recovery returns them)")
        for col in ("offset", "bytes", "stream", "base offset", "count"):
            records.add_column(col, justify="right")
        for n, rec in enumerate(read_records(device, view, stats)):
            if n < limit:
                try:
                    info = read_batch_info(rec.data)
                    records.add_row(f"{rec.offset:,}", f"{len(rec.data):,}", str(info.stream_id),
                                    f"{info.base_offset:,}", str(info.count))
                except CorruptBatchError:
                    records.add_row(f"{rec.offset:,}", f"{len(rec.data):,}", "-", "-", "-")
        console.print(records)
        console.print(f"{stats.records:,} records ({stats.record_bytes:,} bytes), {stats.trimmed_records} trimmed "
                      f"read past, {stats.bad_body_records} with a bad body CRC, {stats.invalid_positions:,} invalid "
                      f"positions scanned; the writer would continue at {stats.next_offset:,}")
    finally:
        device.close()


def _dump_object(console: Console, store: ObjectStore, key: str, verify: bool, limit: int,
                 placed: dict[int, RangeRow] | None) -> None:
    """The object's footer and index. A provisional object (a Spark write's) holds provisional stream ids
    and task-relative offsets; ``placed`` (metadata's rows for this key, by position) gives the real ones.
    A queue store's run object is shown by :func:`_dump_run_object`."""
    size = store.size(key)
    try:
        footer = decode_footer(store.get(key, size - FOOTER_BYTES, size), size)
    except CorruptObjectError as stream_error:
        try:
            _dump_run_object(console, store, key, size, verify, limit)
        except CorruptBulkError as queue_error:
            raise click.ClickException(f"{key} is neither a stream object ({stream_error}) nor a queue run object "
                                       f"({queue_error}): not a stratalog object, or damaged") from queue_error
        return
    entries = decode_index(store.get(key, footer.index_position, footer.index_position + footer.index_bytes), footer)
    title = f"{key}: {size:,} bytes, {len(entries)} blocks, format version {footer.version}"
    show_placement = footer.provisional and bool(placed)
    table = Table(title=title)
    columns = ("stream", "start", "end", "records", "position", "bytes", "crc")
    if footer.provisional:
        columns = ("provisional stream", "task start", "task end", *columns[3:],
                   *(("stream", "start", "end") if show_placement else ()))
    for col in (*columns, *(("check",) if verify else ())):
        table.add_column(col, justify="right")
    bad = 0
    for i, e in enumerate(entries):
        check: tuple[str, ...] = ()
        if verify:
            try:
                check_block(store.get(key, e.position, e.position + e.size_bytes), e)
                check = ("ok",)
            except Exception as exc:
                bad += 1
                check = (f"BAD: {exc}",)
        placement: tuple[str, ...] = ()
        if show_placement:
            assert placed is not None
            row = placed.get(e.position)
            placement = ("-", "-", "-") if row is None else (str(row.stream_id), f"{row.start_offset:,}",
                                                             f"{row.end_offset:,}")
        if i < limit:
            table.add_row(str(e.stream_id), f"{e.start_offset:,}", f"{e.end_offset:,}", f"{e.record_count:,}",
                          f"{e.position:,}", f"{e.size_bytes:,}", f"{e.crc:08x}", *placement, *check)
    console.print(table)
    if footer.provisional:
        where = ("the last three columns are where the store's metadata places each block (authoritative)"
                 if show_placement else "the store's metadata or manifest says where each block belongs "
                 "(no metadata names this object: it is staged, or not yet committed)")
        console.print(f"provisional object (a Spark write's): stream ids and offsets in its index and batch "
                      f"headers are the task's own; {where}")
    if verify and bad:
        raise click.ClickException(f"{bad} of {len(entries)} blocks failed their check")


#: A --verify of a run object reads its runs this many bytes (whole pages) at a time.
VERIFY_READ_BYTES = 16 << 20


def _dump_run_object(console: Console, store: ObjectStore, key: str, size: int, verify: bool, limit: int) -> None:
    """A queue store's run object (docs/formats/queues.md): its footer, and each stream's run (a merge's
    piece has runs for its queue range only); with ``verify``, every page of runs against its CRC."""
    footer = decode_run_footer(store.get(key, size - RUN_FOOTER_BYTES, size), size)
    names, ends, positions, pages = decode_run_index(
        store.get(key, footer.names_position, size - RUN_FOOTER_BYTES), footer)
    runs = np.flatnonzero(np.diff(positions.astype(np.int64)) > 0)
    named_here = (f"names streams {footer.first_stream:,} .. {footer.stream_count - 1:,}"
                  if footer.first_stream < footer.stream_count else "names no new stream")
    console.print(f"{key}: {size:,} bytes, queue run object, format version {RUN_OBJECT_VERSION}: {named_here}, "
                  f"{footer.stream_count:,} streams in its index, {len(runs):,} runs, {footer.message_count:,} "
                  f"messages, {footer.names_position:,} bytes of runs in {len(pages):,} pages")
    table = Table(title=f"runs (the first {min(limit, len(runs)):,})")
    for col in ("stream", "name", "end offset after", "position", "bytes"):
        table.add_column(col, justify="left" if col == "name" else "right")
    named = dict(names)
    for s in runs[:limit].tolist():
        table.add_row(str(s), named.get(s, ""), f"{int(ends[s]):,}", f"{int(positions[s]):,}",
                      f"{int(positions[s + 1] - positions[s]):,}")
    console.print(table)
    if not verify:
        return
    bad: list[int] = []
    for at in track(range(0, footer.names_position, VERIFY_READ_BYTES), description="checking pages",
                    console=console, transient=True):
        chunk = store.get(key, at, min(at + VERIFY_READ_BYTES, footer.names_position))
        first = at // RUN_PAGE_BYTES
        crcs = page_crcs(chunk)
        bad.extend(first + int(i) for i in np.flatnonzero(crcs != pages[first:first + len(crcs)]))
    if bad:
        raise click.ClickException(f"{len(bad)} of {len(pages)} pages failed their CRC (the first: page {bad[0]}, "
                                   f"bytes {bad[0] * RUN_PAGE_BYTES:,} ..): the runs in them are unreadable")
    console.print(f"ok: the index and all {len(pages):,} pages match their CRCs")
