/* merge_runs: a slice of a merge's new runs, joined from the sources' runs in one C call. Its twin and
 * spec is the Arrow part of stratalog.queues.compaction._merge_slice (docs/formats/queues.md, "Run
 * objects"; the module's doc says what a merge is):
 *
 *     merge_runs(sources, starts, counts, out) -> True | None
 *
 * `sources` holds the sources' pages read for the slice, one source after the other; starts[j] (int64,
 * streams + 1 of them) is where each stream's run of source j begins in it, and its end; counts[j] (int64,
 * one per stream) how many messages the run holds. A run is its messages' ends (u32, from the start of its
 * data), then the data. Into `out` (writable, exactly the runs' bytes: the caller allocates it from Arrow's
 * pool, which reuses memory, where a new bytes object of a slice's size is fresh pages every time): each
 * stream's new run: the ends of every source's messages in source order, each shifted by the data of the
 * sources before it, then every source's data in that order. True; None where a
 * run's last message end is not its data's length (the caller raises CorruptBulkError, as the twin); a run
 * that does not lie within `sources` or whose count does not fit it is a ValueError (the caller's plan is
 * checked before, so neither comes from a file). */

#include "native.h"

#include <stdint.h>
#include <string.h>

typedef struct {
    Py_buffer sources, starts, counts, out;
    int held;
} MergeArgs;

static void release_merge(MergeArgs *m) {
    Py_buffer *all[] = {&m->sources, &m->starts, &m->counts, &m->out};
    for (int i = 0; i < m->held; i++) {
        PyBuffer_Release(all[i]);
    }
}

static uint32_t u32_le(const uint8_t *at) {
    uint32_t value;
    memcpy(&value, at, 4); /* little-endian, as the format and the host are */
    return value;
}

/* Checks every run (within the sources, its count fits it, its last end is its data's length) and sums
 * the bytes out: 1; 0 where a run's ends do not match its length; -1 with ValueError set. */
static int check_runs(const MergeArgs *m, Py_ssize_t source_count, Py_ssize_t streams, Py_ssize_t *size) {
    const long long *starts = m->starts.buf, *counts = m->counts.buf;
    const uint8_t *sources = m->sources.buf;
    Py_ssize_t total = 0;
    int matched = 1;
    for (Py_ssize_t j = 0; j < source_count; j++) {
        const long long *row = starts + j * (streams + 1), *count = counts + j * streams;
        for (Py_ssize_t s = 0; s < streams; s++) {
            if (row[s] < 0 || row[s] > row[s + 1] || row[s + 1] > m->sources.len || count[s] < 0 ||
                count[s] > (row[s + 1] - row[s]) / 4) {
                PyErr_SetString(PyExc_ValueError, "merge_runs: a run does not lie within the sources' bytes");
                return -1;
            }
            long long data_bytes = row[s + 1] - row[s] - 4 * count[s];
            if (count[s] > 0 && u32_le(sources + row[s] + 4 * (count[s] - 1)) != (uint64_t)data_bytes) {
                matched = 0;
            }
            total += (Py_ssize_t)(row[s + 1] - row[s]);
        }
    }
    *size = total;
    return matched;
}

static void join_runs(const MergeArgs *m, Py_ssize_t source_count, Py_ssize_t streams, uint8_t *out) {
    const long long *starts = m->starts.buf, *counts = m->counts.buf;
    const uint8_t *sources = m->sources.buf;
    for (Py_ssize_t s = 0; s < streams; s++) {
        uint32_t shift = 0;
        for (Py_ssize_t j = 0; j < source_count; j++) { /* the ends, shifted */
            const long long *row = starts + j * (streams + 1);
            long long count = counts[j * streams + s];
            for (long long i = 0; i < count; i++) {
                uint32_t end = u32_le(sources + row[s] + 4 * i) + shift;
                memcpy(out, &end, 4);
                out += 4;
            }
            shift += (uint32_t)(row[s + 1] - row[s] - 4 * count);
        }
        for (Py_ssize_t j = 0; j < source_count; j++) { /* the data */
            const long long *row = starts + j * (streams + 1);
            long long header = 4 * counts[j * streams + s];
            size_t data_bytes = (size_t)(row[s + 1] - row[s] - header);
            memcpy(out, sources + row[s] + header, data_bytes);
            out += data_bytes;
        }
    }
}

PyObject *native_merge_runs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "merge_runs takes 4 arguments (sources, starts, counts, out), not %zd",
                     nargs);
        return NULL;
    }
    MergeArgs m = {.held = 0};
    Py_buffer *all[] = {&m.sources, &m.starts, &m.counts, &m.out};
    for (int i = 0; i < 4; i++) {
        if (PyObject_GetBuffer(args[i], all[i], i == 3 ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
            release_merge(&m);
            return NULL;
        }
        m.held = i + 1;
    }
    PyObject *result = NULL;
    Py_ssize_t starts_count = m.starts.len / 8, counts_count = m.counts.len / 8;
    /* starts: sources x (streams + 1); counts: sources x streams; so sources = starts - counts. */
    Py_ssize_t source_count = starts_count - counts_count;
    Py_ssize_t streams = source_count > 0 ? counts_count / source_count : -1;
    if (m.starts.len % 8 || m.counts.len % 8 || (uintptr_t)m.starts.buf % 8 || (uintptr_t)m.counts.buf % 8 ||
        source_count < 1 || streams < 0 || streams * source_count != counts_count) {
        PyErr_SetString(PyExc_ValueError, "merge_runs: starts (sources x streams + 1) and counts (sources x "
                                          "streams) are aligned int64 arrays");
        goto done;
    }
    Py_ssize_t size = 0;
    int checked = check_runs(&m, source_count, streams, &size);
    if (checked < 0) {
        goto done;
    }
    if (checked == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (size != m.out.len) {
        PyErr_Format(PyExc_ValueError, "merge_runs: the runs take %zd bytes, out holds %zd", size, m.out.len);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    join_runs(&m, source_count, streams, m.out.buf);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_True);
done:
    release_merge(&m);
    return result;
}
