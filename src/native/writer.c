/* BlockWriter: positioned writes (and syncs) by threads that never take the GIL; the twin and spec is
 * stratalog.io.block_io.ThreadedBlockIO, and stratalog.io.block_io.NativeBlockIO wraps this type.
 *
 * submit() holds the caller's buffer (a buffer export: an mmap cannot be closed under the write) and
 * queues the job; a worker thread writes all of it at its position, syncs when asked (fdatasync,
 * serialized, one sync for every write that finished while the last one ran), and puts the job on the done list, then adds one to an eventfd. reap() takes the done
 * jobs, releases their buffers and returns (token, errno) pairs; errno 0 is success. Results are taken
 * either by a thread that waits in wait() (backstop 0: as soon as one is there), or by an event loop that
 * watches the eventfd, with a thread in wait() as its backstop (set_backstop(s): it returns only for a
 * result left unreaped that long, since the loop may be blocked). A sync that fails
 * fails every later sync of this writer (an fsync that succeeds after a failed one may cover data the
 * kernel dropped), so nothing written after the failure is reported durable. Workers touch no Python
 * object: a job's token and buffer are taken and released by the caller's thread, with the GIL. */

#include "native.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

typedef struct Job {
    struct Job *next;
    Py_buffer view;
    Py_ssize_t length;
    long long position;
    PyObject *token;
    int error;
    long long done_ns; /* CLOCK_MONOTONIC, when it went on the done list */
} Job;

typedef struct {
    Job *head;
    Job *tail;
} Queue;

typedef struct {
    PyObject_HEAD
    int fd;
    int sync_each;
    int event_fd;
    pthread_mutex_t lock; /* queue, done, stopping, stale_ns */
    pthread_cond_t wake;
    pthread_cond_t done_wake; /* CLOCK_MONOTONIC: wait() sleeps on it */
    long long stale_ns;       /* the backstop: 0, wait() is woken by each result; else it looks when due */
    Queue queue;
    Queue done;
    int stopping;
    pthread_mutex_t sync_lock; /* sync_failed, syncing, syncs_started, syncs_done */
    pthread_cond_t sync_done;
    int sync_failed; /* errno of the first failed sync */
    int syncing;     /* a thread is in fdatasync */
    unsigned long long syncs_started;
    unsigned long long syncs_done; /* the number of the last sync that succeeded */
    pthread_t *threads;
    int threads_started;
    int stopped; /* no more submits; the threads have written what was queued and left */
    int closed;  /* the eventfd and locks are gone too */
} BlockWriter;

static void queue_push(Queue *queue, Job *job) {
    job->next = NULL;
    if (queue->tail != NULL) {
        queue->tail->next = job;
    } else {
        queue->head = job;
    }
    queue->tail = job;
}

static Job *queue_take_all(Queue *queue) {
    Job *all = queue->head;
    queue->head = queue->tail = NULL;
    return all;
}

/* The whole buffer at `position`, as FileDevice.pwrite: a short write goes on, no progress is EIO. */
static int write_all(int fd, const uint8_t *data, Py_ssize_t length, long long position) {
    Py_ssize_t done = 0;
    while (done < length) {
        ssize_t n = pwrite(fd, data + done, (size_t)(length - done), (off_t)(position + done));
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno;
        }
        if (n == 0) {
            return EIO;
        }
        done += n;
    }
    return 0;
}

static long long monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static struct timespec as_timespec(long long ns) {
    struct timespec at = {.tv_sec = (time_t)(ns / 1000000000LL), .tv_nsec = (long)(ns % 1000000000LL)};
    return at;
}

/* Make every write finished before this call durable: group commit. Only a sync that starts after the
 * call covers those writes (one already running may have started before they finished), so the caller
 * waits for the next sync to start and end; one thread runs it for every caller waiting, as the syncs are
 * serialized. Once a sync fails, it and every later call fail with its errno (fsyncgate: a later sync
 * could report success for data the kernel dropped), and no sync runs again. */
static int sync_covering(BlockWriter *writer) {
    pthread_mutex_lock(&writer->sync_lock);
    unsigned long long needed = writer->syncs_started + 1;
    while (writer->syncs_done < needed && writer->sync_failed == 0) {
        if (writer->syncing) {
            pthread_cond_wait(&writer->sync_done, &writer->sync_lock);
            continue;
        }
        writer->syncing = 1;
        unsigned long long mine = ++writer->syncs_started;
        pthread_mutex_unlock(&writer->sync_lock);
        int error = fdatasync(writer->fd) == 0 ? 0 : errno;
        pthread_mutex_lock(&writer->sync_lock);
        writer->syncing = 0;
        if (error == 0) {
            writer->syncs_done = mine;
        } else {
            writer->sync_failed = error;
        }
        pthread_cond_broadcast(&writer->sync_done);
    }
    int error = writer->syncs_done >= needed ? 0 : writer->sync_failed;
    pthread_mutex_unlock(&writer->sync_lock);
    return error;
}

static void *worker(void *arg) {
    BlockWriter *writer = arg;
    for (;;) {
        pthread_mutex_lock(&writer->lock);
        while (writer->queue.head == NULL && !writer->stopping) {
            pthread_cond_wait(&writer->wake, &writer->lock);
        }
        Job *job = writer->queue.head;
        if (job == NULL) { /* stopping, and nothing left to write */
            pthread_mutex_unlock(&writer->lock);
            return NULL;
        }
        writer->queue.head = job->next;
        if (writer->queue.head == NULL) {
            writer->queue.tail = NULL;
        }
        pthread_mutex_unlock(&writer->lock);
        job->error = write_all(writer->fd, job->view.buf, job->length, job->position);
        if (job->error == 0 && writer->sync_each) {
            job->error = sync_covering(writer);
        }
        job->done_ns = monotonic_ns();
        pthread_mutex_lock(&writer->lock);
        queue_push(&writer->done, job);
        int signal = writer->stale_ns == 0; /* a polling waiter finds it at its next look */
        pthread_mutex_unlock(&writer->lock);
        if (signal) {
            pthread_cond_signal(&writer->done_wake);
        }
        uint64_t one = 1;
        while (write(writer->event_fd, &one, sizeof one) < 0 && errno == EINTR) {
        }
    }
}

/* Release the jobs of a list (with the GIL): their buffers and tokens. */
static void release_jobs(Job *job) {
    while (job != NULL) {
        Job *next = job->next;
        PyBuffer_Release(&job->view);
        Py_XDECREF(job->token);
        PyMem_RawFree(job);
        job = next;
    }
}

/* Stop the workers once they have written what is queued, and wait for them (with the GIL released). */
static void stop_workers(BlockWriter *writer) {
    pthread_mutex_lock(&writer->lock);
    writer->stopping = 1;
    pthread_cond_broadcast(&writer->wake);
    pthread_cond_broadcast(&writer->done_wake);
    pthread_mutex_unlock(&writer->lock);
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < writer->threads_started; i++) {
        pthread_join(writer->threads[i], NULL);
    }
    Py_END_ALLOW_THREADS
    writer->threads_started = 0;
}

static void writer_close(BlockWriter *writer) {
    if (writer->closed) {
        return;
    }
    writer->closed = 1;
    writer->stopped = 1;
    stop_workers(writer);
    release_jobs(queue_take_all(&writer->done));
    release_jobs(queue_take_all(&writer->queue));
    if (writer->event_fd >= 0) {
        close(writer->event_fd);
        writer->event_fd = -1;
    }
    PyMem_RawFree(writer->threads);
    writer->threads = NULL;
    pthread_cond_destroy(&writer->wake);
    pthread_cond_destroy(&writer->done_wake);
    pthread_mutex_destroy(&writer->lock);
    pthread_cond_destroy(&writer->sync_done);
    pthread_mutex_destroy(&writer->sync_lock);
}

static PyObject *writer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"fd", "threads", "sync_each", NULL};
    int fd, threads, sync_each;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iip:BlockWriter", keywords, &fd, &threads, &sync_each)) {
        return NULL;
    }
    if (fd < 0 || threads < 1 || threads > 64) {
        PyErr_SetString(PyExc_ValueError, "BlockWriter needs an open fd and 1 to 64 threads");
        return NULL;
    }
    BlockWriter *writer = (BlockWriter *)type->tp_alloc(type, 0);
    if (writer == NULL) {
        return NULL;
    }
    writer->fd = fd;
    writer->sync_each = sync_each;
    writer->closed = 1; /* until everything below is made */
    writer->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (writer->event_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(writer);
        return NULL;
    }
    pthread_mutex_init(&writer->lock, NULL);
    pthread_mutex_init(&writer->sync_lock, NULL);
    pthread_cond_init(&writer->sync_done, NULL);
    pthread_cond_init(&writer->wake, NULL);
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&writer->done_wake, &monotonic);
    pthread_condattr_destroy(&monotonic);
    writer->closed = 0;
    writer->threads = PyMem_RawCalloc((size_t)threads, sizeof(pthread_t));
    if (writer->threads == NULL) {
        PyErr_NoMemory();
        Py_DECREF(writer);
        return NULL;
    }
    for (int i = 0; i < threads; i++) {
        int error = pthread_create(&writer->threads[i], NULL, worker, writer);
        if (error != 0) {
            errno = error;
            PyErr_SetFromErrno(PyExc_OSError);
            Py_DECREF(writer);
            return NULL;
        }
        writer->threads_started++;
    }
    return (PyObject *)writer;
}

static void writer_dealloc(PyObject *self) {
    BlockWriter *writer = (BlockWriter *)self;
    if (!writer->closed) {
        writer_close(writer);
    }
    Py_TYPE(self)->tp_free(self);
}

static PyObject *writer_submit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    BlockWriter *writer = (BlockWriter *)self;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "submit takes 4 arguments (buffer, length, position, token), not %zd", nargs);
        return NULL;
    }
    Py_ssize_t length = PyLong_AsSsize_t(args[1]);
    long long position = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (writer->stopped) {
        PyErr_SetString(PyExc_ValueError, "the BlockWriter is stopped");
        return NULL;
    }
    Job *job = PyMem_RawCalloc(1, sizeof(Job));
    if (job == NULL) {
        return PyErr_NoMemory();
    }
    if (PyObject_GetBuffer(args[0], &job->view, PyBUF_SIMPLE) < 0) {
        PyMem_RawFree(job);
        return NULL;
    }
    if (length <= 0 || length > job->view.len || position < 0) {
        PyErr_Format(PyExc_ValueError, "cannot write %zd bytes of a %zd-byte buffer at %lld", length, job->view.len,
                     position);
        PyBuffer_Release(&job->view);
        PyMem_RawFree(job);
        return NULL;
    }
    job->length = length;
    job->position = position;
    Py_INCREF(args[3]);
    job->token = args[3];
    pthread_mutex_lock(&writer->lock);
    queue_push(&writer->queue, job);
    pthread_mutex_unlock(&writer->lock);
    pthread_cond_signal(&writer->wake); /* after the unlock: the woken thread does not wait for the lock */
    Py_RETURN_NONE;
}

static PyObject *writer_reap(PyObject *self, PyObject *unused) {
    (void)unused;
    BlockWriter *writer = (BlockWriter *)self;
    if (writer->closed) {
        return PyList_New(0);
    }
    uint64_t count;
    while (read(writer->event_fd, &count, sizeof count) < 0 && errno == EINTR) {
    }
    pthread_mutex_lock(&writer->lock);
    Job *done = queue_take_all(&writer->done);
    pthread_mutex_unlock(&writer->lock);
    PyObject *out = PyList_New(0);
    for (Job *job = done; job != NULL && out != NULL; job = job->next) {
        PyObject *pair = Py_BuildValue("(Oi)", job->token, job->error);
        if (pair == NULL || PyList_Append(out, pair) < 0) {
            Py_CLEAR(out);
        }
        Py_XDECREF(pair);
    }
    release_jobs(done);
    return out;
}

/* Block, without the GIL, until a finished job has waited the writer's backstop unreaped (True), or until
 * the writer stops (False). With a backstop of 0 a result wakes it at once; otherwise it looks when the
 * oldest result falls due, and a result costs the workers no wake-up of this thread. The backstop is read
 * under the lock at each look, so a change by set_backstop() is never missed. */
static PyObject *writer_wait(PyObject *self, PyObject *unused) {
    (void)unused;
    BlockWriter *writer = (BlockWriter *)self;
    if (writer->closed) {
        Py_RETURN_FALSE;
    }
    int ready = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&writer->lock);
    while (!writer->stopping) {
        long long now = monotonic_ns();
        long long stale_ns = writer->stale_ns;
        if (writer->done.head != NULL && now - writer->done.head->done_ns >= stale_ns) {
            ready = 1;
            break;
        }
        if (stale_ns == 0) {
            pthread_cond_wait(&writer->done_wake, &writer->lock);
        } else {
            long long due = writer->done.head != NULL ? writer->done.head->done_ns + stale_ns : now + stale_ns;
            struct timespec at = as_timespec(due);
            pthread_cond_timedwait(&writer->done_wake, &writer->lock, &at);
        }
    }
    pthread_mutex_unlock(&writer->lock);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ready);
}

/* How long a finished job may wait unreaped before wait() returns for it: 0 (each at once) to 60 s. */
static PyObject *writer_set_backstop(PyObject *self, PyObject *arg) {
    BlockWriter *writer = (BlockWriter *)self;
    double stale_s = PyFloat_AsDouble(arg);
    if (stale_s == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (!(stale_s >= 0.0 && stale_s <= 60.0)) {
        PyErr_Format(PyExc_ValueError, "the backstop takes 0 to 60 seconds, not %R", arg);
        return NULL;
    }
    if (!writer->closed) {
        pthread_mutex_lock(&writer->lock);
        writer->stale_ns = (long long)(stale_s * 1e9);
        pthread_mutex_unlock(&writer->lock);
        pthread_cond_broadcast(&writer->done_wake); /* a waiter looks again, by the new backstop */
    }
    Py_RETURN_NONE;
}

static PyObject *writer_syncs(PyObject *self, PyObject *unused) {
    (void)unused;
    BlockWriter *writer = (BlockWriter *)self;
    if (writer->closed) {
        return PyLong_FromUnsignedLongLong(writer->syncs_started);
    }
    pthread_mutex_lock(&writer->sync_lock);
    unsigned long long started = writer->syncs_started;
    pthread_mutex_unlock(&writer->sync_lock);
    return PyLong_FromUnsignedLongLong(started);
}

static PyObject *writer_fileno(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromLong(((BlockWriter *)self)->event_fd);
}

static PyObject *writer_stop(PyObject *self, PyObject *unused) {
    (void)unused;
    BlockWriter *writer = (BlockWriter *)self;
    if (!writer->stopped) {
        writer->stopped = 1;
        stop_workers(writer);
    }
    Py_RETURN_NONE;
}

static PyMethodDef writer_methods[] = {
    {"submit", (PyCFunction)(void (*)(void))writer_submit, METH_FASTCALL,
     "submit(buffer, length, position, token): write buffer[:length] at position, in a thread without the GIL."},
    {"reap", writer_reap, METH_NOARGS,
     "reap() -> [(token, errno)]: the jobs finished since the last reap (errno 0: written, and synced if asked)."},
    {"wait", writer_wait, METH_NOARGS,
     "wait() -> bool: block without the GIL until a finished job has waited the backstop unreaped (True),\n"
     "or until stop() (False)."},
    {"set_backstop", writer_set_backstop, METH_O,
     "set_backstop(seconds): how long a finished job may wait unreaped before wait() returns (0 to 60; 0: at once)."},
    {"syncs", writer_syncs, METH_NOARGS, "syncs() -> int: the fdatasync calls made so far (one covers many writes)."},
    {"fileno", writer_fileno, METH_NOARGS, "fileno() -> int: an eventfd, readable while finished jobs wait for reap()."},
    {"stop", writer_stop, METH_NOARGS,
     "stop(): refuse new jobs, let the threads write what is queued, wait for them; reap() still works. The\n"
     "eventfd is closed and unreaped jobs dropped when the writer is freed."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject native_block_writer_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stratalog._native.BlockWriter",
    .tp_basicsize = sizeof(BlockWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BlockWriter(fd, threads, sync_each): positioned writes by threads that never take the GIL\n"
              "(stratalog.io.block_io.ThreadedBlockIO is its twin).",
    .tp_new = writer_new,
    .tp_dealloc = writer_dealloc,
    .tp_methods = writer_methods,
};
