/* lookup_names: NameIndex.lookup as one C call. Its twin and spec is stratalog.queues.names.NameIndex's
 * NumPy lookup (lookup_numpy), and the module's doc there says what the table holds:
 *
 *     slot   = tag << 32 | id, 0 when empty; tag = (hash >> 32) | 1; a name's home slot = hash & mask
 *     extent = start << 12 | length of the name's stored UTF-8 bytes; -1 where no name has that id
 *     hash   = length * M, then per 8-byte little-endian word w (the last one zero-padded):
 *              mixed = (hash ^ w) * M, hash = mixed ^ (mixed >> 31); then MurmurHash3's 64-bit finalizer
 *
 * A name is found at the first slot from its home (probes_max of them at most, at least one) whose tag is
 * its own; that id counts only if its stored bytes are the name's; else, and at an empty slot, -1.
 *
 * The table is the writer's: it adds names while lookups run, with the GIL released here. It writes a
 * name's bytes and extent before its slot (one 8-byte store), so a slot read with acquire order leads to a
 * complete entry; anything that grows is a new snapshot, and the arrays passed here are one snapshot,
 * held (buffer exports) for the whole call.
 *
 * The work is done in three passes over the batch so that the cache misses of many names overlap (a
 * million names do not fit in any cache): hash each name and prefetch its home slot; probe and prefetch
 * the id's extent; then check the stored bytes. */

#include "native.h"

#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "names are hashed by little-endian words, read natively: a little-endian host is needed"
#endif

#define MULTIPLIER 0x9E3779B97F4A7C15ULL
#define MIX_1 0xFF51AFD7ED558CCDULL
#define MIX_2 0xC4CEB9FE1A85EC53ULL
#define ID_BITS 32
#define ID_MASK 0xFFFFFFFFULL
#define LENGTH_BITS 12
#define LENGTH_MASK ((1LL << LENGTH_BITS) - 1)
#define WORD_BYTES 8

static uint64_t name_hash(const uint8_t *name, size_t length) {
    uint64_t hash = (uint64_t)length * MULTIPLIER;
    for (size_t base = 0; base < length; base += WORD_BYTES) {
        uint64_t word = 0;
        size_t left = length - base;
        memcpy(&word, name + base, left < WORD_BYTES ? left : WORD_BYTES);
        uint64_t mixed = (hash ^ word) * MULTIPLIER;
        hash = mixed ^ (mixed >> 31);
    }
    hash ^= hash >> 33;
    hash *= MIX_1;
    hash ^= hash >> 33;
    hash *= MIX_2;
    hash ^= hash >> 33;
    return hash;
}

typedef struct {
    Py_buffer offsets, data, slots, extents, stored, found;
    int held; /* how many of the above are held, in that order */
} Buffers;

static void release(Buffers *b) {
    Py_buffer *all[] = {&b->offsets, &b->data, &b->slots, &b->extents, &b->stored, &b->found};
    for (int i = 0; i < b->held; i++) {
        PyBuffer_Release(all[i]);
    }
}

static int hold(Buffers *b, PyObject *const *args) {
    Py_buffer *all[] = {&b->offsets, &b->data, &b->slots, &b->extents, &b->stored, &b->found};
    for (int i = 0; i < 6; i++) {
        int flags = i == 5 ? PyBUF_WRITABLE : PyBUF_SIMPLE;
        if (PyObject_GetBuffer(args[i], all[i], flags) < 0) {
            return -1;
        }
        b->held = i + 1;
    }
    return 0;
}

static int aligned(const Py_buffer *buffer, size_t item) {
    return buffer->len % (Py_ssize_t)item == 0 && (uintptr_t)buffer->buf % item == 0;
}

/* Every name's bytes within `data`, and the arrays' sizes as the table needs them; -1 with ValueError. */
static int check_shapes(const Buffers *b, Py_ssize_t *count) {
    if (!aligned(&b->offsets, sizeof(int32_t)) || b->offsets.len < (Py_ssize_t)sizeof(int32_t) ||
        !aligned(&b->slots, sizeof(uint64_t)) || !aligned(&b->extents, sizeof(int64_t)) ||
        !aligned(&b->found, sizeof(int64_t))) {
        PyErr_SetString(PyExc_ValueError, "lookup_names: offsets int32 (n + 1), slots, extents and found "
                                          "aligned 8-byte arrays");
        return -1;
    }
    Py_ssize_t n = b->offsets.len / (Py_ssize_t)sizeof(int32_t) - 1;
    Py_ssize_t slot_count = b->slots.len / (Py_ssize_t)sizeof(uint64_t);
    if (b->found.len / (Py_ssize_t)sizeof(int64_t) != n) {
        PyErr_SetString(PyExc_ValueError, "lookup_names: found must hold one id per name");
        return -1;
    }
    if (slot_count == 0 || (slot_count & (slot_count - 1)) != 0) {
        PyErr_SetString(PyExc_ValueError, "lookup_names: the slots must be a power of two in number");
        return -1;
    }
    const int32_t *offsets = b->offsets.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (offsets[i] < 0 || offsets[i] > offsets[i + 1] || offsets[i + 1] > b->data.len) {
            PyErr_Format(PyExc_ValueError, "lookup_names: name %zd lies outside the names' bytes", i);
            return -1;
        }
    }
    *count = n;
    return 0;
}

static void lookup(const Buffers *b, Py_ssize_t n, long long probes_max) {
    const int32_t *offsets = b->offsets.buf;
    const uint8_t *data = b->data.buf;
    const uint64_t *slots = b->slots.buf;
    const int64_t *extents = b->extents.buf;
    const uint8_t *stored = b->stored.buf;
    int64_t *found = b->found.buf;
    uint64_t mask = (uint64_t)(b->slots.len / (Py_ssize_t)sizeof(uint64_t)) - 1;
    Py_ssize_t extent_count = b->extents.len / (Py_ssize_t)sizeof(int64_t);
    long long probes = probes_max > 0 ? probes_max : 1;
    /* Pass 1: each name's hash (kept in found until pass 2), its home slot prefetched. */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t hash = name_hash(data + offsets[i], (size_t)(offsets[i + 1] - offsets[i]));
        memcpy(&found[i], &hash, sizeof hash);
        __builtin_prefetch(&slots[hash & mask]);
    }
    /* Pass 2: the probe; the id's extent prefetched. */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t hash;
        memcpy(&hash, &found[i], sizeof hash);
        uint64_t tag = (hash >> ID_BITS) | 1, slot = hash & mask;
        int64_t id = -1;
        for (long long p = 0; p < probes; p++) {
            uint64_t entry = __atomic_load_n(&slots[slot], __ATOMIC_ACQUIRE);
            if (entry >> ID_BITS == tag) {
                id = (int64_t)(entry & ID_MASK);
                break;
            }
            if (entry == 0) {
                break;
            }
            slot = (slot + 1) & mask;
        }
        if (id >= extent_count) { /* added after this snapshot's extents were read: not checkable */
            id = -1;
        }
        found[i] = id;
        if (id >= 0) {
            __builtin_prefetch(&extents[id]);
        }
    }
    /* Pass 3: an id counts only where its stored name is this one, byte for byte. */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t id = found[i];
        if (id < 0) {
            continue;
        }
        int64_t extent = extents[id];
        Py_ssize_t length = offsets[i + 1] - offsets[i];
        int64_t start = extent >> LENGTH_BITS;
        if (extent < 0 || (extent & LENGTH_MASK) != length || start > b->stored.len - length ||
            memcmp(stored + start, data + offsets[i], (size_t)length) != 0) {
            found[i] = -1;
        }
    }
}

PyObject *native_lookup_names(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "lookup_names takes 7 arguments (offsets, data, slots, extents, "
                                      "stored, probes_max, found), not %zd", nargs);
        return NULL;
    }
    long long probes_max = PyLong_AsLongLong(args[5]);
    if (probes_max == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *const buffers[] = {args[0], args[1], args[2], args[3], args[4], args[6]};
    Buffers b = {.held = 0};
    Py_ssize_t n = 0;
    if (hold(&b, buffers) < 0 || check_shapes(&b, &n) < 0) {
        release(&b);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    lookup(&b, n, probes_max);
    Py_END_ALLOW_THREADS
    release(&b);
    Py_RETURN_NONE;
}
