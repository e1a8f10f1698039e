/* QueuePutter: QueueStore.put as one C call. Its twin and spec is stratalog.queues.store.QueueStore.put:
 * a small bytes message for a plain name (a str of 1 to name_chars_max ASCII characters) is three slots
 * appended to the pending list (name, message, unknown id), all under the GIL, so no other thread sees
 * them apart, and the writer is woken once the list reaches wake_slots. Anything else (a large or non-bytes
 * message, a name to check, a store that refused its puts, whose list is a subclass) goes to the twin
 * itself, so every error is the twin's. The putter holds the store's bound methods: it takes part in
 * the cyclic garbage collection. */

#include "native.h"

typedef struct {
    PyObject_HEAD
    PyObject *pending;      /* PendingPuts: its `slots` list is read at each put (refuse() swaps it) */
    PyObject *twin;         /* QueueStore's Python put, for every put not taken here */
    PyObject *wake;         /* QueueStore._backpressure */
    PyObject *unknown_id;   /* the id slot of a single put */
    PyObject *slots_name;   /* "slots", interned */
    Py_ssize_t small_bytes_max;
    Py_ssize_t name_chars_max;
    Py_ssize_t wake_slots;
} QueuePutter;

static int putter_traverse(PyObject *self, visitproc visit, void *arg) {
    QueuePutter *putter = (QueuePutter *)self;
    Py_VISIT(putter->pending);
    Py_VISIT(putter->twin);
    Py_VISIT(putter->wake);
    Py_VISIT(putter->unknown_id);
    return 0;
}

static int putter_clear(PyObject *self) {
    QueuePutter *putter = (QueuePutter *)self;
    Py_CLEAR(putter->pending);
    Py_CLEAR(putter->twin);
    Py_CLEAR(putter->wake);
    Py_CLEAR(putter->unknown_id);
    Py_CLEAR(putter->slots_name);
    return 0;
}

static void putter_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    putter_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *putter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"pending", "twin", "wake", "unknown_id", "small_bytes_max", "name_chars_max",
                               "wake_slots", NULL};
    PyObject *pending, *twin, *wake, *unknown_id;
    Py_ssize_t small_bytes_max, name_chars_max, wake_slots;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOnnn:QueuePutter", keywords, &pending, &twin, &wake,
                                     &unknown_id, &small_bytes_max, &name_chars_max, &wake_slots)) {
        return NULL;
    }
    if (!PyCallable_Check(twin) || !PyCallable_Check(wake)) {
        PyErr_SetString(PyExc_TypeError, "QueuePutter: twin and wake must be callables");
        return NULL;
    }
    if (small_bytes_max < 0 || name_chars_max < 1 || wake_slots < 1) {
        PyErr_SetString(PyExc_ValueError, "QueuePutter: small_bytes_max >= 0, name_chars_max >= 1, wake_slots >= 1");
        return NULL;
    }
    QueuePutter *putter = (QueuePutter *)type->tp_alloc(type, 0);
    if (putter == NULL) {
        return NULL;
    }
    putter->slots_name = PyUnicode_InternFromString("slots");
    if (putter->slots_name == NULL) {
        Py_DECREF(putter);
        return NULL;
    }
    putter->pending = Py_NewRef(pending);
    putter->twin = Py_NewRef(twin);
    putter->wake = Py_NewRef(wake);
    putter->unknown_id = Py_NewRef(unknown_id);
    putter->small_bytes_max = small_bytes_max;
    putter->name_chars_max = name_chars_max;
    putter->wake_slots = wake_slots;
    return (PyObject *)putter;
}

static PyObject *putter_put(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    QueuePutter *putter = (QueuePutter *)self;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "put takes 2 arguments (queue_name, message), not %zd", nargs);
        return NULL;
    }
    PyObject *name = args[0], *message = args[1];
    int plain = PyBytes_CheckExact(message) && PyBytes_GET_SIZE(message) <= putter->small_bytes_max &&
                PyUnicode_CheckExact(name) && PyUnicode_GET_LENGTH(name) > 0 &&
                PyUnicode_GET_LENGTH(name) <= putter->name_chars_max && PyUnicode_IS_ASCII(name);
    if (!plain) {
        return PyObject_Vectorcall(putter->twin, args, 2, NULL);
    }
    PyObject *slots = PyObject_GetAttr(putter->pending, putter->slots_name);
    if (slots == NULL) {
        return NULL;
    }
    if (!PyList_CheckExact(slots)) { /* a store that stopped or closed: its list raises the store's error */
        Py_DECREF(slots);
        return PyObject_Vectorcall(putter->twin, args, 2, NULL);
    }
    /* Three appends with the GIL held and no Python code between them: as atomic as the twin's extend;
     * where one fails (no memory), the others are taken back, so the slots stay in threes. */
    Py_ssize_t before = PyList_GET_SIZE(slots);
    if (PyList_Append(slots, name) < 0 || PyList_Append(slots, message) < 0 ||
        PyList_Append(slots, putter->unknown_id) < 0) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (PyList_GET_SIZE(slots) > before) {
            (void)PyList_SetSlice(slots, before, PyList_GET_SIZE(slots), NULL);
        }
        PyErr_Restore(type, value, traceback);
        Py_DECREF(slots);
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(slots);
    Py_DECREF(slots);
    if (count >= putter->wake_slots) {
        return PyObject_CallNoArgs(putter->wake);
    }
    Py_RETURN_NONE;
}

static PyMethodDef putter_methods[] = {
    {"put", (PyCFunction)(void (*)(void))putter_put, METH_FASTCALL,
     "put(queue_name, message): QueueStore.put (its Python twin) as one call."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject native_queue_putter_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stratalog._native.QueuePutter",
    .tp_basicsize = sizeof(QueuePutter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "QueuePutter(pending, twin, wake, unknown_id, small_bytes_max, name_chars_max, wake_slots):\n"
              "QueueStore.put as one C call (stratalog.queues.store.QueueStore.put is its twin).",
    .tp_new = putter_new,
    .tp_dealloc = putter_dealloc,
    .tp_traverse = putter_traverse,
    .tp_clear = putter_clear,
    .tp_methods = putter_methods,
};
