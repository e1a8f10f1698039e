/* check_array_counts: a Kafka request walked by its schema's plan, to refuse an array that claims more
 * elements than the frame has bytes left, before kio reserves room for them. The twin and spec is
 * stratalog.kafka.array_bounds.walk_array_counts; the plan is that module's (plan_of):
 *
 *     plan = (entity_name, flexible, steps),  step = (field_name, kind, is_array, arg)
 *
 * kind 0 fixed (arg: its bytes), 1 string, 2 bytes, 3 entity (arg: its plan). A frame that ends before
 * the walk does is left to kio (None, as for a frame that passes). Every length is checked against the
 * bytes left before the walk moves past it; the recursion follows the plan, never the input. */

#include "native.h"

#include <stdint.h>

enum { FIXED, STRING, BYTES, ENTITY };
/* A varint longer than this is not one Kafka writes (a uint32 takes at most 5 bytes). */
#define VARINT_BYTES_MAX 5

typedef struct {
    const uint8_t *data;
    Py_ssize_t size;
    Py_ssize_t pos;
} Walk;

/* Outcomes: go on, the frame ended (leave it to kio), or an error was raised (over-count, bad plan). */
typedef enum { OK, TRUNCATED, RAISED } Outcome;

static Outcome skip(Walk *walk, long long size) {
    if (size < 0 || size > walk->size - walk->pos) {
        return TRUNCATED;
    }
    walk->pos += (Py_ssize_t)size;
    return OK;
}

static Outcome uvarint(Walk *walk, long long *value) {
    uint64_t out = 0;
    for (int i = 0; i < VARINT_BYTES_MAX; i++) {
        if (walk->pos >= walk->size) {
            return TRUNCATED;
        }
        uint8_t byte = walk->data[walk->pos++];
        out |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (byte < 0x80) {
            *value = (long long)out;
            return OK;
        }
    }
    return TRUNCATED; /* kio refuses an over-long varint */
}

/* A string's (small: int16 when not flexible), bytes' or array's length; -1: null. */
static Outcome length(Walk *walk, int flexible, int small, long long *value) {
    if (flexible) {
        Outcome got = uvarint(walk, value);
        *value -= 1;
        return got;
    }
    Py_ssize_t width = small ? 2 : 4;
    if (width > walk->size - walk->pos) {
        return TRUNCATED;
    }
    const uint8_t *at = walk->data + walk->pos;
    *value = small ? (long long)(int16_t)(uint16_t)((unsigned)at[0] << 8 | at[1])
                   : (long long)(int32_t)((uint32_t)at[0] << 24 | (uint32_t)at[1] << 16 | (uint32_t)at[2] << 8 | at[3]);
    walk->pos += width;
    return OK;
}

static Outcome tagged_fields(Walk *walk) {
    long long count;
    Outcome got = uvarint(walk, &count);
    for (long long i = 0; got == OK && i < count; i++) {
        long long tag, size;
        got = uvarint(walk, &tag);
        if (got == OK) {
            got = uvarint(walk, &size);
        }
        if (got == OK) {
            got = skip(walk, size);
        }
    }
    return got;
}

static int bad_plan(void) {
    PyErr_SetString(PyExc_TypeError, "check_array_counts: a plan is (name, flexible, ((field, kind, is_array, arg), ...))");
    return -1;
}

static Outcome entity(Walk *walk, PyObject *plan) {
    if (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != 3 || !PyTuple_Check(PyTuple_GET_ITEM(plan, 2))) {
        bad_plan();
        return RAISED;
    }
    int flexible = PyObject_IsTrue(PyTuple_GET_ITEM(plan, 1));
    if (flexible < 0) {
        return RAISED;
    }
    PyObject *steps = PyTuple_GET_ITEM(plan, 2);
    for (Py_ssize_t s = 0; s < PyTuple_GET_SIZE(steps); s++) {
        PyObject *step = PyTuple_GET_ITEM(steps, s);
        if (!PyTuple_Check(step) || PyTuple_GET_SIZE(step) != 4) {
            bad_plan();
            return RAISED;
        }
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(step, 1));
        int is_array = PyObject_IsTrue(PyTuple_GET_ITEM(step, 2));
        PyObject *arg = PyTuple_GET_ITEM(step, 3);
        long long fixed_bytes = kind == FIXED ? PyLong_AsLongLong(arg) : 0;
        if (PyErr_Occurred() || is_array < 0) {
            return RAISED;
        }
        long long count = 1;
        if (is_array) {
            Outcome got = length(walk, flexible, 0, &count);
            if (got != OK) {
                return got;
            }
            Py_ssize_t left = walk->size - walk->pos;
            if (count > left) {
                PyObject *message = PyUnicode_FromFormat("%S.%S: an array of %lld elements in a frame with %zd bytes left",
                                                         PyTuple_GET_ITEM(plan, 0), PyTuple_GET_ITEM(step, 0), count, left);
                if (message != NULL) {
                    native_raise_from("stratalog.kafka.array_bounds", "ArrayCountError", message);
                    Py_DECREF(message);
                }
                return RAISED;
            }
        }
        for (long long i = 0; i < count; i++) {
            Outcome got;
            if (kind == FIXED) {
                got = skip(walk, fixed_bytes);
            } else if (kind == ENTITY) {
                got = entity(walk, arg);
            } else {
                long long size;
                got = length(walk, flexible, kind == STRING, &size);
                if (got == OK) {
                    got = skip(walk, size > 0 ? size : 0);
                }
            }
            if (got != OK) {
                return got;
            }
        }
    }
    return flexible ? tagged_fields(walk) : OK;
}

PyObject *native_check_array_counts(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "check_array_counts takes 3 arguments (frame, position, plan), not %zd", nargs);
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    if (position == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Walk walk = {view.buf, view.len, position};
    Outcome got = position < 0 || position > view.len ? TRUNCATED : entity(&walk, args[2]);
    PyBuffer_Release(&view);
    if (got == RAISED) {
        return NULL;
    }
    Py_RETURN_NONE;
}
