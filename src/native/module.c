/* The module stratalog._native: its functions, and the one way they raise the twins' errors. */

#include "native.h"

void native_raise(const char *name, PyObject *message) {
    /* Imported when an error is raised, not at load: stratalog.kafka.records imports this module. */
    PyObject *records = PyImport_ImportModule("stratalog.kafka.records");
    if (records == NULL) {
        return;
    }
    PyObject *type = PyObject_GetAttrString(records, name);
    Py_DECREF(records);
    if (type == NULL) {
        return;
    }
    PyErr_SetObject(type, message);
    Py_DECREF(type);
}

static PyMethodDef native_methods[] = {
    {"walk_records", (PyCFunction)(void (*)(void))native_walk_records, METH_FASTCALL,
     "walk_records(data, position, count) -> int\n\n"
     "Check `count` records of a Kafka batch's records at data[position:] (uncompressed bytes); the\n"
     "position after the last. Raises CorruptRecordError or InvalidRecordError as\n"
     "stratalog.kafka.record_check.walk_records, its Python twin, does."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef_Slot native_slots[] = {
    {0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "stratalog._native",
    .m_doc = "The compiled core of stratalog: twins of Python functions a profile named (stratalog.native).",
    .m_size = 0,
    .m_methods = native_methods,
    .m_slots = native_slots,
};

PyMODINIT_FUNC PyInit__native(void);

PyMODINIT_FUNC PyInit__native(void) {
    return PyModuleDef_Init(&native_module);
}
