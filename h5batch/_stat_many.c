/* h5batch._stat_many: stat a run of paths in one call, without the interpreter.
 *
 * Rule: the optional fast path of h5batch.walker.stat_blob (the Python fallback there gives
 * the same answers). Reason: a sync of a 100,000-file corpus stats every file (its largest
 * fixed cost); os.stat spends ~2 us per file building a stat_result beside the ~2.5 us of the
 * system call, and holds the GIL, so one process stats on one core. Here the loop makes no
 * Python object per file and releases the GIL: two threads of one process stat on two cores.
 *
 * stat_blob(root, blob, width, start, stop) -> (sizes, mtimes_ns, failed)
 *   root:  the folder the paths are relative to (str or bytes);
 *   blob:  the paths' bytes, each padded with NULs to `width` (a numpy "S" array's bytes: a
 *          path holds no NUL); entries [start, stop) are stat-ed;
 *   sizes, mtimes_ns: bytes of native int64, one per entry (-1 where it failed);
 *   failed: [(index, errno)], index counted from 0 for the whole blob.
 * Each run of one folder's files is stat-ed through one descriptor of that folder
 * (fstatat resolves one name, not the whole path), as h5batch.walker.stat_lists does; symlinks
 * are followed, as os.stat does. A folder that cannot be opened fails each of its files with
 * the folder's errno.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    Py_ssize_t index;
    int err;
} Failure;

static PyObject *stat_blob(PyObject *self, PyObject *args) {
    PyObject *root_obj, *root_bytes = NULL;
    Py_buffer blob;
    Py_ssize_t width, start, stop;
    if (!PyArg_ParseTuple(args, "Oy*nnn", &root_obj, &blob, &width, &start, &stop))
        return NULL;
    PyObject *result = NULL, *sizes_obj = NULL, *mtimes_obj = NULL, *failed_obj = NULL;
    Failure *failures = NULL;
    char *folder = NULL, *path = NULL;
    Py_ssize_t n_failed = 0;
    if (start < 0 || stop < start || (stop > start && (width <= 0 || stop > blob.len / width))) {
        PyErr_SetString(PyExc_ValueError, "stat_blob: start, stop and width do not fit the blob");
        goto done;
    }
    if (width <= 0)  /* nothing to stat (stop == start) */
        width = 1;
    if (!PyUnicode_FSConverter(root_obj, &root_bytes))
        goto done;
    Py_ssize_t n = stop - start;
    sizes_obj = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    mtimes_obj = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    failures = PyMem_RawMalloc((size_t)(n > 0 ? n : 1) * sizeof(Failure));
    folder = PyMem_RawMalloc((size_t)width + 1);
    path = PyMem_RawMalloc((size_t)width + 1);
    if (!sizes_obj || !mtimes_obj || !failures || !folder || !path) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *sizes = (int64_t *)PyBytes_AS_STRING(sizes_obj);
    int64_t *mtimes = (int64_t *)PyBytes_AS_STRING(mtimes_obj);
    const char *base = PyBytes_AS_STRING(root_bytes);
    const char *data = (const char *)blob.buf;
    int root_err = 0;

    Py_BEGIN_ALLOW_THREADS
    int root_fd = open(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root_fd < 0)
        root_err = errno;
    int fd = -1, folder_err = 0;
    size_t folder_len = (size_t)-1;  /* none yet */
    for (Py_ssize_t i = start; i < stop; i++) {
        const char *entry = data + i * width;
        size_t len = strnlen(entry, (size_t)width);
        memcpy(path, entry, len);
        path[len] = '\0';
        char *slash = strrchr(path, '/');
        size_t dlen = slash ? (size_t)(slash - path) : 0;
        const char *name = slash ? slash + 1 : path;
        if (dlen != folder_len || memcmp(folder, path, dlen) != 0) {
            if (fd >= 0 && fd != root_fd)
                close(fd);
            memcpy(folder, path, dlen);
            folder[dlen] = '\0';
            folder_len = dlen;
            folder_err = 0;
            if (root_fd < 0) {
                fd = -1;
                folder_err = root_err;
            } else if (dlen == 0) {
                fd = root_fd;
            } else {
                fd = openat(root_fd, folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (fd < 0)
                    folder_err = errno;
            }
        }
        struct stat st;
        int err = fd < 0 ? folder_err : (fstatat(fd, name, &st, 0) == 0 ? 0 : errno);
        if (err) {
            failures[n_failed].index = i;
            failures[n_failed].err = err;
            n_failed++;
            sizes[i - start] = -1;
            mtimes[i - start] = -1;
        } else {
            sizes[i - start] = (int64_t)st.st_size;
            mtimes[i - start] = (int64_t)st.st_mtim.tv_sec * 1000000000 + (int64_t)st.st_mtim.tv_nsec;
        }
    }
    if (fd >= 0 && fd != root_fd)
        close(fd);
    if (root_fd >= 0)
        close(root_fd);
    Py_END_ALLOW_THREADS

    failed_obj = PyList_New(n_failed);
    if (!failed_obj)
        goto done;
    for (Py_ssize_t k = 0; k < n_failed; k++) {
        PyObject *pair = Py_BuildValue("(ni)", failures[k].index, failures[k].err);
        if (!pair)
            goto done;
        PyList_SET_ITEM(failed_obj, k, pair);
    }
    result = PyTuple_Pack(3, sizes_obj, mtimes_obj, failed_obj);

done:
    PyBuffer_Release(&blob);
    Py_XDECREF(root_bytes);
    Py_XDECREF(sizes_obj);
    Py_XDECREF(mtimes_obj);
    Py_XDECREF(failed_obj);
    PyMem_RawFree(failures);
    PyMem_RawFree(folder);
    PyMem_RawFree(path);
    return result;
}

static PyMethodDef methods[] = {
    {"stat_blob", stat_blob, METH_VARARGS,
     "stat_blob(root, blob, width, start, stop) -> (sizes, mtimes_ns, failed): see the module source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_stat_many", "Stat a run of paths in one call (h5batch.walker.stat_blob).", -1, methods,
};

PyMODINIT_FUNC PyInit__stat_many(void) { return PyModule_Create(&module); }
