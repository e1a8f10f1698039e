/* CRC32C for the compiled core: the function of a CRC32C library (google-crc32c's crc32c_extend, the
 * Python package's own shared library), handed over by stratalog.native once it has loaded it; the
 * Python twin is the crc32c package (stratalog.wal.format.crc32c). Until one is handed over, functions
 * that need a CRC raise RuntimeError and their callers take the twins. */

#include "native.h"

#include <stdint.h>
#include <string.h>

native_crc32c_fn native_crc32c = NULL;

/* _use_crc32c(address): take the function at `address` (uint32_t f(uint32_t crc, const uint8_t *data,
 * size_t length), as crc32c_extend) once it gives CRC32C's check value; 0 forgets it. */
PyObject *native_use_crc32c(PyObject *module, PyObject *arg) {
    (void)module;
    unsigned long long address = PyLong_AsUnsignedLongLong(arg);
    if (address == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (address == 0) {
        native_crc32c = NULL;
        Py_RETURN_NONE;
    }
    uintptr_t at = (uintptr_t)address;
    native_crc32c_fn candidate;
    memcpy(&candidate, &at, sizeof candidate); /* ISO C has no cast from an integer to a function */
    static const uint8_t check_input[] = "123456789";
    if (candidate(0, check_input, 9) != 0xE3069283u) { /* the CRC32C check value */
        PyErr_SetString(PyExc_ValueError, "the function given does not compute CRC32C");
        return NULL;
    }
    native_crc32c = candidate;
    Py_RETURN_NONE;
}

/* crc32c(data, value=0) -> int, as the crc32c package's crc32c. */
PyObject *native_crc32c_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "crc32c takes data and an optional value, not %zd arguments", nargs);
        return NULL;
    }
    if (native_crc32c == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no CRC32C library is loaded (stratalog.native)");
        return NULL;
    }
    unsigned long value = 0;
    if (nargs == 2) {
        value = PyLong_AsUnsignedLong(args[1]);
        if (value == (unsigned long)-1 && PyErr_Occurred()) {
            return NULL;
        }
        if (value > 0xFFFFFFFFul) {
            PyErr_SetString(PyExc_OverflowError, "value must fit in 32 bits");
            return NULL;
        }
    }
    Py_buffer data;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint32_t crc = native_crc32c((uint32_t)value, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}
