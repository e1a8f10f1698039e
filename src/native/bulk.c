/* sort_record: a bulk record's messages sorted by queue, as one C call. Its twin and spec is
 * stratalog.queues.record_sort.sort_record_numpy (docs/formats/queues.md has the record itself):
 *
 *     sort_record(ids, lo, chunks, next_offsets, messages_max)
 *         -> (stream_ids, base_offsets, counts, runs_u32, data, message_at)
 *
 * ids[i] is the queue of message lo + i of the chunks (Arrow binary arrays given as (offsets, data):
 * int32 offsets into data, one more than the chunk's messages), taken one after the other. The messages
 * are sorted by queue, stably (a queue's messages keep their order); each queue's run starts at its next
 * offset, and no run may take a queue past messages_max (QueueError, as the twin). Out: the runs as int64
 * columns (stream ids, base offsets, counts) and as the record's u32 run section (the three columns one
 * after the other), the messages' bytes in the new order and their int32 ends after a leading 0.
 *
 * The GIL stays held: the writer calls this beside producer threads, and a writer that lets the GIL go
 * waits for it to come back longer than this call takes (a record of 8 MiB: about a millisecond). */

#include "native.h"

#include <stdint.h>
#include <string.h>

/* The radix sort's digit: 11 bits, three passes cover 33 bits of queue id (ids fit 32). */
#define DIGIT_BITS 11
#define DIGITS (1 << DIGIT_BITS)
#define POSITION_BITS 32
#define U32_MAX 0xFFFFFFFFULL

typedef struct {
    const uint8_t *at;
    int32_t size;
} Source;

typedef struct {
    Py_buffer ids, next_offsets;
    int held;
    NativeChunks chunks;
} Inputs;

static void release_inputs(Inputs *in) {
    if (in->held > 0) {
        PyBuffer_Release(&in->ids);
    }
    if (in->held > 1) {
        PyBuffer_Release(&in->next_offsets);
    }
    native_release_chunks(&in->chunks);
}

static int value_error(const char *message) {
    PyErr_SetString(PyExc_ValueError, message);
    return -1;
}

/* Each message lo .. lo + count - 1 of the chunks, where its bytes are (in `sources`). */
static int find_sources(const NativeChunks *chunks, Py_ssize_t lo, Py_ssize_t count, Source *sources) {
    Py_ssize_t total = chunks->starts[chunks->count];
    for (Py_ssize_t i = 0; i < count && i < total - lo; i++) {
        sources[i].at = native_chunk_message(chunks, lo + i, &sources[i].size);
        if (sources[i].at == NULL) {
            return value_error("sort_record: a message lies outside its chunk's bytes");
        }
    }
    if (count > 0 && lo > total - count) {
        return value_error("sort_record: the chunks hold fewer messages than the ids name");
    }
    return 0;
}

/* keys[i] = id << 32 | i, sorted (LSD radix on the id's bits; stable, so a queue's messages keep their
 * order). `spare` has room for as many keys. Returns the sorted array (keys or spare). */
static uint64_t *radix_sort(uint64_t *keys, uint64_t *spare, Py_ssize_t count, uint64_t id_max) {
    static const int shifts[] = {0, DIGIT_BITS, 2 * DIGIT_BITS};
    Py_ssize_t counts[DIGITS];
    for (int p = 0; p < 3 && (p == 0 || (id_max >> shifts[p]) != 0); p++) {
        int shift = POSITION_BITS + shifts[p];
        memset(counts, 0, sizeof counts);
        for (Py_ssize_t i = 0; i < count; i++) {
            counts[(keys[i] >> shift) & (DIGITS - 1)]++;
        }
        Py_ssize_t total = 0;
        for (int d = 0; d < DIGITS; d++) {
            Py_ssize_t here = counts[d];
            counts[d] = total;
            total += here;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            spare[counts[(keys[i] >> shift) & (DIGITS - 1)]++] = keys[i];
        }
        uint64_t *swap = keys;
        keys = spare;
        spare = swap;
    }
    return keys;
}

static PyObject *new_bytes(Py_ssize_t size, void **at) {
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, size);
    if (bytes != NULL) {
        *at = PyBytes_AS_STRING(bytes);
    }
    return bytes;
}

/* The runs, their columns and the gathered messages, from the sorted keys. */
static PyObject *lay_out(const uint64_t *sorted, Py_ssize_t count, const Source *sources, const int64_t *next,
                         long long messages_max) {
    Py_ssize_t runs = 0, total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        runs += i == 0 || (sorted[i] >> POSITION_BITS) != (sorted[i - 1] >> POSITION_BITS);
        total += sources[(uint32_t)sorted[i]].size;
        if (total > INT32_MAX) {
            value_error("sort_record: a record's messages exceed 2 GiB");
            return NULL;
        }
    }
    int64_t *stream_ids = NULL, *bases = NULL, *counts = NULL;
    uint32_t *runs_u32 = NULL;
    int32_t *message_at = NULL;
    uint8_t *data = NULL;
    PyObject *out[6] = {
        new_bytes(runs * 8, (void **)&stream_ids), new_bytes(runs * 8, (void **)&bases),
        new_bytes(runs * 8, (void **)&counts),     new_bytes(runs * 12, (void **)&runs_u32),
        new_bytes(total, (void **)&data),          new_bytes((count + 1) * 4, (void **)&message_at),
    };
    for (int k = 0; k < 6; k++) {
        if (out[k] == NULL) {
            for (int j = 0; j < 6; j++) {
                Py_XDECREF(out[j]);
            }
            return NULL;
        }
    }
    Py_ssize_t run = -1;
    int32_t end = 0;
    message_at[0] = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t id = sorted[i] >> POSITION_BITS;
        if (i == 0 || id != (sorted[i - 1] >> POSITION_BITS)) {
            run++;
            stream_ids[run] = (int64_t)id;
            bases[run] = next[id];
            counts[run] = 0;
        }
        counts[run]++;
        const Source *source = &sources[(uint32_t)sorted[i]];
        memcpy(data + end, source->at, (size_t)source->size);
        end += source->size;
        message_at[i + 1] = end;
    }
    for (Py_ssize_t r = 0; r < runs; r++) {
        if (bases[r] + counts[r] > messages_max) {
            for (int j = 0; j < 6; j++) {
                Py_DECREF(out[j]);
            }
            PyObject *message = PyUnicode_FromFormat("a queue would exceed %lld messages", messages_max);
            if (message != NULL) {
                native_raise_from("stratalog.queues.errors", "QueueError", message);
                Py_DECREF(message);
            }
            return NULL;
        }
        runs_u32[r] = (uint32_t)stream_ids[r];
        runs_u32[runs + r] = (uint32_t)bases[r];
        runs_u32[2 * runs + r] = (uint32_t)counts[r];
    }
    return Py_BuildValue("(NNNNNN)", out[0], out[1], out[2], out[3], out[4], out[5]);
}

static PyObject *sort_held(Inputs *in, PyObject *chunks, Py_ssize_t lo, long long messages_max) {
    if (in->ids.len % (Py_ssize_t)sizeof(int64_t) || (uintptr_t)in->ids.buf % sizeof(int64_t) ||
        in->next_offsets.len % (Py_ssize_t)sizeof(int64_t) || (uintptr_t)in->next_offsets.buf % sizeof(int64_t)) {
        value_error("sort_record: ids and next_offsets are aligned int64 arrays");
        return NULL;
    }
    if (lo < 0 || messages_max < 0 || (unsigned long long)messages_max > U32_MAX) {
        value_error("sort_record: lo >= 0 and messages_max within 0 .. 2**32 - 1");
        return NULL;
    }
    Py_ssize_t count = in->ids.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t queues = in->next_offsets.len / (Py_ssize_t)sizeof(int64_t);
    if ((unsigned long long)count > U32_MAX) {
        value_error("sort_record: at most 2**32 - 1 messages a record");
        return NULL;
    }
    const int64_t *ids = in->ids.buf;
    size_t room = (size_t)count + 1;
    Source *sources = PyMem_Malloc(room * sizeof(Source));
    uint64_t *keys = PyMem_Malloc(room * sizeof(uint64_t)), *spare = PyMem_Malloc(room * sizeof(uint64_t));
    PyObject *result = NULL;
    if (sources == NULL || keys == NULL || spare == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t id_max = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (ids[i] < 0 || ids[i] >= queues) {
            value_error("sort_record: a queue id past the queues' next offsets");
            goto done;
        }
        keys[i] = (uint64_t)ids[i] << POSITION_BITS | (uint64_t)i;
        id_max = (uint64_t)ids[i] > id_max ? (uint64_t)ids[i] : id_max;
    }
    if (native_hold_chunks(chunks, "sort_record", &in->chunks) < 0 ||
        find_sources(&in->chunks, lo, count, sources) < 0) {
        goto done;
    }
    result = lay_out(radix_sort(keys, spare, count, id_max), count, sources, in->next_offsets.buf, messages_max);
done:
    PyMem_Free(sources);
    PyMem_Free(keys);
    PyMem_Free(spare);
    return result;
}

PyObject *native_sort_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "sort_record takes 5 arguments (ids, lo, chunks, next_offsets, "
                                      "messages_max), not %zd", nargs);
        return NULL;
    }
    Py_ssize_t lo = PyLong_AsSsize_t(args[1]);
    long long messages_max = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Inputs in = {.held = 0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(args[0], &in.ids, PyBUF_SIMPLE) == 0) {
        in.held = 1;
        if (PyObject_GetBuffer(args[3], &in.next_offsets, PyBUF_SIMPLE) == 0) {
            in.held = 2;
            result = sort_held(&in, args[2], lo, messages_max);
        }
    }
    release_inputs(&in);
    return result;
}
