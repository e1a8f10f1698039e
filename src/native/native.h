/* stratalog._native: the compiled twins of the loops a profile named (docs/ARCHITECTURE.md, "Native
 * code"). Each function here has a Python twin that stays its reference and spec. */

#ifndef STRATALOG_NATIVE_H
#define STRATALOG_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Raise the twin's exception: the class `name` of stratalog.kafka.records, with `message`. */
void native_raise(const char *name, PyObject *message);
/* Raise the class `name` of the module `module_name` with `message`. */
void native_raise_from(const char *module_name, const char *name, PyObject *message);

/* An index of records: INDEX_COLUMNS int64 columns of `count` rows each, one after the other, in a new
 * bytes object; *columns points at its first. NULL with MemoryError set where it cannot be made. The
 * columns: timestamp, key start and bytes, value start and bytes, headers start and count, offset delta
 * (kafka/record_index.py's INDEX_COLUMNS). */
#define INDEX_COLUMNS 8
PyObject *native_new_index(Py_ssize_t count, long long **columns);

PyObject *native_walk_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_index_kafka_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_index_native_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern PyTypeObject native_block_writer_type;
extern PyTypeObject native_queue_putter_type;
PyObject *native_check_array_counts(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_encode_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* CRC32C from a library's crc32c_extend (crc.c): NULL until stratalog.native hands one over. */
#include <stddef.h>
#include <stdint.h>
typedef uint32_t (*native_crc32c_fn)(uint32_t crc, const uint8_t *data, size_t length);
extern native_crc32c_fn native_crc32c;
PyObject *native_use_crc32c(PyObject *module, PyObject *arg);
PyObject *native_crc32c_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_read_messages_cached(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_read_run_cached(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_read_random_cached(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_decode_produce(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_sort_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_lay_out_runs(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_merge_runs(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_lookup_names(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_place_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *native_read_tail(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* Chunks of messages (chunks.c): a tuple of (int32 offsets, data), messages numbered across them. */
typedef struct {
    Py_buffer *buffers;    /* two per chunk: offsets, data */
    Py_ssize_t count;      /* chunks */
    Py_ssize_t held;       /* buffers held */
    Py_ssize_t *starts;    /* the number of each chunk's first message; then the messages in all */
} NativeChunks;
/* Hold `tuple`'s chunks (its shape checked; `who` names the caller in errors): 0, or -1 with an error set
 * (release them either way). */
int native_hold_chunks(PyObject *tuple, const char *who, NativeChunks *chunks);
void native_release_chunks(NativeChunks *chunks);
/* Message `index` (0 <= index < starts[count]): its bytes and *size, or NULL where its offsets do not lie
 * within its chunk's bytes. No GIL needed. */
const uint8_t *native_chunk_message(const NativeChunks *chunks, long long index, int32_t *size);

#endif
