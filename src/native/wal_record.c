/* A WAL data record laid into its block (docs/formats/wal.md): the body's parts copied after the header
 * room, the body's CRC32C taken over each piece just copied (still in the cache), then the header. The
 * twin and spec is stratalog.wal.format.place_record_python. A large body is copied with the GIL released:
 * the block's buffer and the parts are held (buffer exports) for the call, so none can be closed or
 * resized under it, and the appender holds the WAL's lock, so no other thread writes the block. */

#include "native.h"

#include <stdint.h>
#include <string.h>

#define RECORD_MAGIC 0x52574C53u
#define RECORD_HEADER_BYTES 24
#define RECORD_HEADER_CRC_COVERS_BYTES 20
/* Bodies at least this large are copied without the GIL: below it, giving it up and taking it back costs
 * more than the copy (a 64 KiB copy and CRC take about 10 us). */
#define GIL_FREE_BYTES_MIN (64 << 10)
/* The CRC follows the copy a piece at a time, so the bytes it reads are still in the cache. */
#define PIECE_BYTES (16 << 10)

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint32_t copy_parts(uint8_t *to, const Py_buffer *parts, Py_ssize_t count) {
    uint32_t crc = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const uint8_t *from = parts[i].buf;
        Py_ssize_t left = parts[i].len;
        while (left > 0) {
            size_t n = left < PIECE_BYTES ? (size_t)left : PIECE_BYTES;
            memcpy(to, from, n);
            crc = native_crc32c(crc, to, n);
            to += n;
            from += n;
            left -= (Py_ssize_t)n;
        }
    }
    return crc;
}

/* place_record(buf, pos, parts, offset) -> int: the record's end in buf. */
PyObject *native_place_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "place_record takes 4 arguments, not %zd", nargs);
        return NULL;
    }
    if (native_crc32c == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no CRC32C library is loaded (stratalog.native)");
        return NULL;
    }
    long long pos = PyLong_AsLongLong(args[1]);
    if (pos == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long long offset = PyLong_AsLongLong(args[3]);
    if (offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (offset < 0) {
        PyErr_Format(PyExc_ValueError, "place_record: offset %lld < 0", offset);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[2], "parts must be a sequence of buffers");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    Py_buffer buf, *parts = PyMem_New(Py_buffer, count > 0 ? count : 1);
    if (parts == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    int have_buf = 0;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_WRITABLE) < 0) {
        PyErr_SetString(PyExc_TypeError, "place_record: buf must be a writable buffer");
        goto done;
    }
    have_buf = 1;
    for (; held < count; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &parts[held], PyBUF_SIMPLE) < 0) {
            goto done;
        }
    }
    long long body = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        body += parts[i].len;
    }
    if (body > UINT32_MAX || pos < 0 || pos > buf.len || buf.len - pos < RECORD_HEADER_BYTES + body) {
        PyErr_Format(PyExc_ValueError, "place_record: a body of %lld bytes at %lld does not fit a buffer of %zd",
                     body, pos, buf.len);
        goto done;
    }
    uint8_t *at = (uint8_t *)buf.buf + pos;
    uint32_t crc;
    if (body >= GIL_FREE_BYTES_MIN) {
        Py_BEGIN_ALLOW_THREADS
        crc = copy_parts(at + RECORD_HEADER_BYTES, parts, count);
        Py_END_ALLOW_THREADS
    } else {
        crc = copy_parts(at + RECORD_HEADER_BYTES, parts, count);
    }
    put_u32(at, RECORD_MAGIC);
    put_u32(at + 4, (uint32_t)body);
    put_u64(at + 8, (uint64_t)offset);
    put_u32(at + 16, crc);
    put_u32(at + RECORD_HEADER_CRC_COVERS_BYTES, native_crc32c(0, at, RECORD_HEADER_CRC_COVERS_BYTES));
    result = PyLong_FromLongLong(pos + RECORD_HEADER_BYTES + body);
done:
    if (have_buf) {
        PyBuffer_Release(&buf);
    }
    for (Py_ssize_t i = 0; i < held; i++) {
        PyBuffer_Release(&parts[i]);
    }
    PyMem_Free(parts);
    Py_DECREF(seq);
    return result;
}
