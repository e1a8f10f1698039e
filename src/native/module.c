/* The module stratalog._native: its functions, and the one way they raise the twins' errors. */

#include "native.h"

void native_raise_from(const char *module_name, const char *name, PyObject *message) {
    /* Imported when an error is raised, not at load: the modules that define the errors import this one. */
    PyObject *module = PyImport_ImportModule(module_name);
    if (module == NULL) {
        return;
    }
    PyObject *type = PyObject_GetAttrString(module, name);
    Py_DECREF(module);
    if (type == NULL) {
        return;
    }
    PyErr_SetObject(type, message);
    Py_DECREF(type);
}

void native_raise(const char *name, PyObject *message) {
    native_raise_from("stratalog.kafka.records", name, message);
}

PyObject *native_new_index(Py_ssize_t count, long long **columns) {
    if (count > PY_SSIZE_T_MAX / (INDEX_COLUMNS * (Py_ssize_t)sizeof(long long))) {
        PyErr_NoMemory();
        return NULL;
    }
    PyObject *index = PyBytes_FromStringAndSize(NULL, count * INDEX_COLUMNS * (Py_ssize_t)sizeof(long long));
    if (index != NULL) {
        *columns = (long long *)(void *)PyBytes_AS_STRING(index);
    }
    return index;
}

static PyMethodDef native_methods[] = {
    {"walk_records", (PyCFunction)(void (*)(void))native_walk_records, METH_FASTCALL,
     "walk_records(data, position, count) -> int\n\n"
     "Check `count` records of a Kafka batch's records at data[position:] (uncompressed bytes); the\n"
     "position after the last. Raises CorruptRecordError or InvalidRecordError as\n"
     "stratalog.kafka.record_check.walk_records, its Python twin, does."},
    {"index_kafka_records", (PyCFunction)(void (*)(void))native_index_kafka_records, METH_FASTCALL,
     "index_kafka_records(data, position, count, last_offset_delta, base_timestamp_ms, append_timestamp_ms)\n"
     "    -> bytes\n\n"
     "Where each of `count` Kafka records at data[position:] (uncompressed, ending at the data's end) of a\n"
     "stored batch keeps its fields, its offset delta among them (they increase up to last_offset_delta:\n"
     "compaction leaves gaps): eight int64 columns, one after the other\n"
     "(stratalog.kafka.record_index.INDEX_COLUMNS).\n"
     "Raises as stratalog.kafka.record_index.index_kafka_records, its Python twin, does."},
    {"index_native_records", (PyCFunction)(void (*)(void))native_index_native_records, METH_FASTCALL,
     "index_native_records(data, position, end, count) -> bytes\n\n"
     "The same index for `count` records of the store's own batch encoding at data[position:end].\n"
     "Raises as stratalog.engine.record_index.index_native_records, its Python twin, does."},
    {"encode_records", (PyCFunction)(void (*)(void))native_encode_records, METH_FASTCALL,
     "encode_records(out, keys, values, dest, key_start, key_bytes, value_start, value_bytes, timestamp_ms)\n\n"
     "Lay out one record of the store's encoding per row into `out` at `dest`, its key and value copied\n"
     "from `keys` and `values` (int64 columns, one value per row; a key of -1 bytes is null). Raises as\n"
     "stratalog.engine.record_layout.encode_records, its Python twin, does."},
    {"check_array_counts", (PyCFunction)(void (*)(void))native_check_array_counts, METH_FASTCALL,
     "check_array_counts(frame, position, plan) -> None\n\n"
     "Walk a Kafka request body at frame[position:] by its schema's plan; raise ArrayCountError for an\n"
     "array that claims more elements than bytes remain. As stratalog.kafka.array_bounds.walk_array_counts,\n"
     "its Python twin."},
    {"_use_crc32c", native_use_crc32c, METH_O,
     "_use_crc32c(address) -> None\n\n"
     "Compute CRC32C with the function at `address` (a library's crc32c_extend, as stratalog.native loads\n"
     "it); 0 forgets it. Raises ValueError where the function does not give CRC32C's check value."},
    {"crc32c", (PyCFunction)(void (*)(void))native_crc32c_of, METH_FASTCALL,
     "crc32c(data, value=0) -> int\n\n"
     "CRC32C of `data`, extending `value`, as the crc32c package's crc32c (its twin)."},
    {"read_messages_cached", (PyCFunction)(void (*)(void))native_read_messages_cached, METH_FASTCALL,
     "read_messages_cached(fd, runs_bytes, pages, key, start, end, count, stream_id, first, stop)\n"
     "    -> (list[bytes], int) | None\n\n"
     "Messages first .. stop - 1 of the run at bytes start .. end of a run object, read from the page\n"
     "cache with its pages checked, and the bytes read; None where the page cache does not hold them.\n"
     "As stratalog.queues.objects.read_messages_cached, its Python twin."},
    {"read_run_cached", (PyCFunction)(void (*)(void))native_read_run_cached, METH_FASTCALL,
     "read_run_cached(fd, runs_bytes, pages, key, start, end, count, stream_id) -> (bytes, int) | None\n\n"
     "The run at bytes start .. end of a run object, read from the page cache with its pages checked and\n"
     "its frame checked, and the bytes read; None where the page cache does not hold them. As\n"
     "stratalog.queues.objects.read_run_cached, its Python twin."},
    {"read_random_cached", (PyCFunction)(void (*)(void))native_read_random_cached, METH_FASTCALL,
     "read_random_cached(ends, positions, capacity, objects, stream_id, pos, stop)\n"
     "    -> (list[bytes], int, int, int)\n\n"
     "A random get's part in the objects as far as the page cache serves it: the messages, where they stop,\n"
     "the reads and the bytes read. As stratalog.queues.objects.read_random_cached, its Python twin."},
    {"decode_produce", (PyCFunction)(void (*)(void))native_decode_produce, METH_FASTCALL,
     "decode_produce(frame, flexible) -> (client_id, transactional_id, acks, timeout_ms, topics)\n\n"
     "A Produce request frame (v3-v9; flexible: v9) read, topics as ((name, ((index, records), ...)), ...).\n"
     "As stratalog.kafka.produce_request.decode_produce_fields, its Python twin."},
    {"lookup_names", (PyCFunction)(void (*)(void))native_lookup_names, METH_FASTCALL,
     "lookup_names(offsets, data, slots, extents, stored, probes_max, found) -> None\n\n"
     "The id of each name of a string array (int32 offsets into data) in a NameIndex snapshot (slots,\n"
     "extents, stored bytes), -1 where it is not known, written into found (int64, one per name), with the\n"
     "GIL released. As stratalog.queues.names.lookup_numpy, its Python twin."},
    {"sort_record", (PyCFunction)(void (*)(void))native_sort_record, METH_FASTCALL,
     "sort_record(ids, lo, chunks, next_offsets, messages_max)\n"
     "    -> (stream_ids, base_offsets, counts, runs_u32, data, message_at)\n\n"
     "A bulk record's messages sorted by queue (stably), with its runs, as bytes. As\n"
     "stratalog.queues.record_sort.sort_record_numpy, its Python twin."},
    {"lay_out_runs", (PyCFunction)(void (*)(void))native_lay_out_runs, METH_FASTCALL,
     "lay_out_runs(chunks, order, run_first, a, b, out) -> None\n\n"
     "Runs a .. b - 1 of a run object into out (exactly their size), each its messages' u32 ends then\n"
     "their bytes, gathered from the chunks by order, with the GIL released. As the slices of stratalog.queues.format._laid_parts, its\n"
     "Python twin."},
    {"merge_runs", (PyCFunction)(void (*)(void))native_merge_runs, METH_FASTCALL,
     "merge_runs(sources, starts, counts, out) -> True | None\n\n"
     "A slice of a merge's new runs into out (exactly their size), each stream's runs of every source joined\n"
     "(their message ends shifted, then their data); None where a run's last end is not its length. As the Arrow takes of\n"
     "stratalog.queues.compaction._merge_slice, its Python twin."},
    {"read_tail", (PyCFunction)(void (*)(void))native_read_tail, METH_FASTCALL,
     "read_tail(out, stream_id, pos, stop, record_min, starts, run_record, run_first, run_base, run_end, datas,\n"
     "          message_ats) -> int\n\n"
     "Messages pos .. stop - 1 of a stream that a log cache's TailIndex holds (in its records from record_min\n"
     "on) appended to out; the offset reached. As stratalog.queues.index.TailIndex.read_python, its Python\n"
     "twin."},
    {"place_record", (PyCFunction)(void (*)(void))native_place_record, METH_FASTCALL,
     "place_record(buf, pos, parts, offset) -> int\n\n"
     "A WAL data record at buf[pos:]: the parts copied as its body, its CRCs and header; the record's end.\n"
     "Bodies of 64 KiB and more are copied with the GIL released. As\n"
     "stratalog.wal.format.place_record_python, its Python twin."},
    {NULL, NULL, 0, NULL},
};


static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "stratalog._native",
    .m_doc = "The compiled core of stratalog: twins of Python functions a profile named (stratalog.native).",
    .m_size = 0,
    .m_methods = native_methods,
};

PyMODINIT_FUNC PyInit__native(void);

PyMODINIT_FUNC PyInit__native(void) {
    /* Single-phase: the module holds static types (BlockWriter, QueuePutter) and no state of its own. */
    if (PyType_Ready(&native_block_writer_type) < 0 || PyType_Ready(&native_queue_putter_type) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&native_module);
    if (module != NULL &&
        (PyModule_AddObjectRef(module, "BlockWriter", (PyObject *)&native_block_writer_type) < 0 ||
         PyModule_AddObjectRef(module, "QueuePutter", (PyObject *)&native_queue_putter_type) < 0)) {
        Py_CLEAR(module);
    }
    return module;
}
