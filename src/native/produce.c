/* decode_produce: a Produce request (versions 3-9) read in one pass into plain tuples. The twin, the spec
 * of the layout and the reference of every error message is stratalog.kafka.produce_request
 * (decode_produce_fields); the tests hold the two to the same values and the same errors.
 *
 * Every length is checked against the bytes left before it is used; an array's count is checked
 * against what the bytes left could hold before its tuple is made, so no allocation is larger than a
 * small multiple of the frame. Records are memoryview slices of the frame, not copies. The GIL is held
 * throughout: each field becomes a Python object. */

#include "native.h"

#include <stdint.h>

/* As the twin's constants. */
#define HEADER_PREFIX_BYTES 8
#define VARINT_BYTES_MAX 5
#define TOPIC_BYTES_MIN 6
#define TOPIC_BYTES_MIN_FLEXIBLE 3
#define PARTITION_BYTES_MIN 8
#define PARTITION_BYTES_MIN_FLEXIBLE 6

typedef struct {
    const uint8_t *data;
    Py_ssize_t size;
    Py_ssize_t pos;
    int flexible;
    PyObject *frame; /* a memoryview of the frame: records are slices of it */
} Reader;

static int malformed(PyObject *message) {
    if (message != NULL) {
        native_raise_from("stratalog.kafka.produce_request", "MalformedProduceError", message);
        Py_DECREF(message);
    }
    return -1;
}

/* Where `size` bytes of `what` begin (in *at); the position moves past them. */
static int take(Reader *r, long long size, const char *what, Py_ssize_t *at) {
    if (size > (long long)(r->size - r->pos)) {
        return malformed(PyUnicode_FromFormat("the request ends in the %s", what));
    }
    *at = r->pos;
    r->pos += (Py_ssize_t)size;
    return 0;
}

static int int16(Reader *r, const char *what, long long *value) {
    Py_ssize_t at;
    if (take(r, 2, what, &at) < 0) {
        return -1;
    }
    *value = (int16_t)(uint16_t)((unsigned)r->data[at] << 8 | r->data[at + 1]);
    return 0;
}

static int int32(Reader *r, const char *what, long long *value) {
    Py_ssize_t at;
    if (take(r, 4, what, &at) < 0) {
        return -1;
    }
    const uint8_t *p = r->data + at;
    *value = (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
    return 0;
}

static int uvarint(Reader *r, const char *what, long long *value) {
    uint64_t out = 0;
    for (int i = 0; i < VARINT_BYTES_MAX; i++) {
        Py_ssize_t at;
        if (take(r, 1, what, &at) < 0) {
            return -1;
        }
        uint8_t byte = r->data[at];
        out |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (byte < 0x80) {
            *value = (long long)out; /* at most 35 bits */
            return 0;
        }
    }
    return malformed(PyUnicode_FromFormat("a varint of over %d bytes in the %s", VARINT_BYTES_MAX, what));
}

/* A string's (small: int16), bytes' or array's length; -1 for null. */
static int length(Reader *r, const char *what, int compact, int small, long long *size) {
    int got;
    if (compact) {
        got = uvarint(r, what, size);
        *size -= 1;
    } else {
        got = small ? int16(r, what, size) : int32(r, what, size);
    }
    if (got < 0) {
        return -1;
    }
    if (*size < -1) {
        return malformed(PyUnicode_FromFormat("the %s has the length %lld", what, *size));
    }
    return 0;
}

/* A new reference: the string, None where null and `nullable`; NULL with an error set. */
static PyObject *string(Reader *r, const char *what, int nullable, int compact) {
    long long size;
    Py_ssize_t at;
    if (length(r, what, compact, 1, &size) < 0) {
        return NULL;
    }
    if (size == -1) {
        if (!nullable) {
            malformed(PyUnicode_FromFormat("the %s is null", what));
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (take(r, size, what, &at) < 0) {
        return NULL;
    }
    return PyUnicode_DecodeUTF8((const char *)r->data + at, (Py_ssize_t)size, "strict");
}

static PyObject *records(Reader *r) {
    long long size;
    Py_ssize_t at;
    if (length(r, "records", r->flexible, 0, &size) < 0) {
        return NULL;
    }
    if (size == -1) {
        Py_RETURN_NONE;
    }
    if (take(r, size, "records", &at) < 0) {
        return NULL;
    }
    /* A view of the frame, which keeps the frame alive. */
    PyObject *start = PyLong_FromSsize_t(at);
    PyObject *stop = start == NULL ? NULL : PyLong_FromSsize_t(at + (Py_ssize_t)size);
    PyObject *slice = stop == NULL ? NULL : PySlice_New(start, stop, NULL);
    PyObject *out = slice == NULL ? NULL : PyObject_GetItem(r->frame, slice);
    Py_XDECREF(start);
    Py_XDECREF(stop);
    Py_XDECREF(slice);
    return out;
}

static int count(Reader *r, const char *what, long long element_bytes_min, Py_ssize_t *out) {
    long long n;
    if (length(r, what, r->flexible, 0, &n) < 0) {
        return -1;
    }
    if (n == -1) {
        return malformed(PyUnicode_FromFormat("the %s are null", what));
    }
    Py_ssize_t left = r->size - r->pos;
    if (n > (long long)left / element_bytes_min) {
        return malformed(PyUnicode_FromFormat("the %s: an array of %lld elements with %zd bytes left", what, n, left));
    }
    *out = (Py_ssize_t)n;
    return 0;
}

static int tagged_fields(Reader *r, const char *what) {
    long long n, tag, size;
    Py_ssize_t at;
    if (uvarint(r, what, &n) < 0) {
        return -1;
    }
    for (long long i = 0; i < n; i++) { /* each takes two bytes at least, or ends the loop with an error */
        if (uvarint(r, what, &tag) < 0 || uvarint(r, what, &size) < 0 || take(r, size, what, &at) < 0) {
            return -1;
        }
    }
    return 0;
}

/* (first, second), a new reference; takes both references (released also where either is NULL or the
 * tuple cannot be made). */
static PyObject *pair_of(PyObject *first, PyObject *second) {
    PyObject *out = first != NULL && second != NULL ? PyTuple_Pack(2, first, second) : NULL;
    Py_XDECREF(first);
    Py_XDECREF(second);
    return out;
}

/* One partition: (index, records or None), a new reference. */
static PyObject *partition(Reader *r) {
    long long index;
    if (int32(r, "partition index", &index) < 0) {
        return NULL;
    }
    PyObject *batch = records(r);
    if (batch != NULL && r->flexible && tagged_fields(r, "partition's tagged fields") < 0) {
        Py_CLEAR(batch);
    }
    return batch == NULL ? NULL : pair_of(PyLong_FromLongLong(index), batch);
}

/* One topic: (name, ((index, records), ...)), a new reference. */
static PyObject *topic(Reader *r) {
    Py_ssize_t n;
    PyObject *name = string(r, "topic name", 0, r->flexible), *partitions = NULL;
    if (name == NULL ||
        count(r, "partitions", r->flexible ? PARTITION_BYTES_MIN_FLEXIBLE : PARTITION_BYTES_MIN, &n) < 0 ||
        (partitions = PyTuple_New(n)) == NULL) {
        goto failed;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *one = partition(r);
        if (one == NULL) {
            goto failed;
        }
        PyTuple_SET_ITEM(partitions, i, one);
    }
    if (r->flexible && tagged_fields(r, "topic's tagged fields") < 0) {
        goto failed;
    }
    return pair_of(name, partitions);
failed:
    Py_XDECREF(name);
    Py_XDECREF(partitions);
    return NULL;
}

static PyObject *topics(Reader *r) {
    Py_ssize_t n;
    if (count(r, "topics", r->flexible ? TOPIC_BYTES_MIN_FLEXIBLE : TOPIC_BYTES_MIN, &n) < 0) {
        return NULL;
    }
    PyObject *out = PyTuple_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *one = topic(r);
        if (one == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, one);
    }
    return out;
}

/* (client_id, transactional_id, acks, timeout_ms, topics), a new reference. */
static PyObject *decode(Reader *r) {
    PyObject *client_id = NULL, *transactional_id = NULL, *all = NULL;
    long long acks, timeout_ms;
    r->pos = HEADER_PREFIX_BYTES;
    client_id = string(r, "client id", 1, 0);
    if (client_id == NULL || (r->flexible && tagged_fields(r, "header's tagged fields") < 0)) {
        goto failed;
    }
    transactional_id = string(r, "transactional id", 1, r->flexible);
    if (transactional_id == NULL || int16(r, "acks", &acks) < 0 || int32(r, "timeout", &timeout_ms) < 0) {
        goto failed;
    }
    all = topics(r);
    if (all == NULL || (r->flexible && tagged_fields(r, "body's tagged fields") < 0)) {
        goto failed;
    }
    PyObject *out = Py_BuildValue("(NNLLN)", client_id, transactional_id, acks, timeout_ms, all);
    return out; /* "N" took the three references, also when it failed */
failed:
    Py_XDECREF(client_id);
    Py_XDECREF(transactional_id);
    Py_XDECREF(all);
    return NULL;
}

PyObject *native_decode_produce(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode_produce(frame, flexible)");
        return NULL;
    }
    int flexible = PyObject_IsTrue(args[1]);
    if (flexible < 0) {
        return NULL;
    }
    PyObject *frame = PyMemoryView_FromObject(args[0]);
    if (frame == NULL) {
        return NULL;
    }
    Py_buffer *view = PyMemoryView_GET_BUFFER(frame);
    if (!PyBuffer_IsContiguous(view, 'C') || view->itemsize != 1) {
        Py_DECREF(frame);
        PyErr_SetString(PyExc_TypeError, "decode_produce: the frame must be contiguous bytes");
        return NULL;
    }
    Reader r = {(const uint8_t *)view->buf, view->len, 0, flexible, frame};
    PyObject *out = decode(&r);
    Py_DECREF(frame);
    return out;
}
