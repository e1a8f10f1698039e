/* stratalog._native: the compiled twins of the loops a profile named (docs/ARCHITECTURE.md, "Native
 * code"). Each function here has a Python twin that stays its reference and spec. */

#ifndef STRATALOG_NATIVE_H
#define STRATALOG_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Raise the twin's exception: the class `name` of stratalog.kafka.records, with `message`. */
void native_raise(const char *name, PyObject *message);

PyObject *native_walk_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
