/* h5batch._stat_many: list a tree and stat a run of paths, each in one call, without the
 * interpreter.
 *
 * Rule: the optional fast path of h5batch.walker.stat_blob (the Python fallback there gives
 * the same answers) and of h5batch.walker.scan_files (without it, the Walker lists). Reason: a sync of a 100,000-file corpus stats every file (its largest
 * fixed cost); os.stat spends ~2 us per file building a stat_result beside the ~2.5 us of the
 * system call, and holds the GIL, so one process stats on one core. Here the loop makes no
 * Python object per file and releases the GIL: two threads of one process stat on two cores.
 *
 * stat_blob(root, blob, width, start, stop[, ids]) -> (sizes, mtimes_ns, failed[, devs, inos])
 *   root:  the folder the paths are relative to (str or bytes);
 *   blob:  the paths' bytes, each padded with NULs to `width` (a numpy "S" array's bytes: a
 *          path holds no NUL); entries [start, stop) are stat-ed;
 *   sizes, mtimes_ns: bytes of native int64, one per entry (-1 where it failed);
 *   failed: [(index, errno)], index counted from 0 for the whole blob;
 *   devs, inos (ids true): bytes of native uint64, each file's st_dev and st_ino (0 where it failed).
 * Each run of one folder's files is stat-ed through one descriptor of that folder
 * (fstatat resolves one name, not the whole path), as h5batch.walker.stat_lists does; symlinks
 * are followed, as os.stat does. A folder that cannot be opened fails each of its files with
 * the folder's errno.
 *
 * scan_tree(root): below, before the function.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
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
    int want_ids = 0;
    if (!PyArg_ParseTuple(args, "Oy*nnn|p", &root_obj, &blob, &width, &start, &stop, &want_ids))
        return NULL;
    PyObject *result = NULL, *sizes_obj = NULL, *mtimes_obj = NULL, *failed_obj = NULL;
    PyObject *devs_obj = NULL, *inos_obj = NULL;
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
    if (want_ids) {
        devs_obj = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint64_t));
        inos_obj = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint64_t));
    }
    if (!sizes_obj || !mtimes_obj || !failures || !folder || !path || (want_ids && (!devs_obj || !inos_obj))) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t *devs = want_ids ? (uint64_t *)PyBytes_AS_STRING(devs_obj) : NULL;
    uint64_t *inos = want_ids ? (uint64_t *)PyBytes_AS_STRING(inos_obj) : NULL;
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
            if (devs) {
                devs[i - start] = 0;
                inos[i - start] = 0;
            }
        } else {
            sizes[i - start] = (int64_t)st.st_size;
            mtimes[i - start] = (int64_t)st.st_mtim.tv_sec * 1000000000 + (int64_t)st.st_mtim.tv_nsec;
            if (devs) {
                devs[i - start] = (uint64_t)st.st_dev;
                inos[i - start] = (uint64_t)st.st_ino;
            }
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
    result = want_ids ? PyTuple_Pack(5, sizes_obj, mtimes_obj, failed_obj, devs_obj, inos_obj)
                      : PyTuple_Pack(3, sizes_obj, mtimes_obj, failed_obj);

done:
    PyBuffer_Release(&blob);
    Py_XDECREF(root_bytes);
    Py_XDECREF(sizes_obj);
    Py_XDECREF(mtimes_obj);
    Py_XDECREF(failed_obj);
    Py_XDECREF(devs_obj);
    Py_XDECREF(inos_obj);
    PyMem_RawFree(failures);
    PyMem_RawFree(folder);
    PyMem_RawFree(path);
    return result;
}


/* scan_tree(root) -> (blob, width, n) or None: the regular files under root, as the paths
 * stat_blob takes (relative, '/'-separated, each padded with NULs to the longest), listed
 * with readdir's d_type (no system call per file) and hidden names (".name") skipped, as
 * h5batch.walker.Walker skips them. None where the tree holds anything but regular files
 * and folders (a symlink, a fifo, a folder it cannot open or list, a name too long): the
 * Python walker then walks it and says what each such entry is. Reason: listing 100,000
 * files through os.scandir builds a DirEntry and a str per file (~0.1 s here, plus ~0.04 s
 * to encode the paths), about half of a sync's walk; getdents here takes ~0.03 s.
 */
typedef struct {
    char *buf;      /* the paths, each NUL-terminated */
    size_t len, cap;
    size_t count, width;
} Paths;

static int paths_add(Paths *p, const char *prefix, size_t plen, const char *name) {
    size_t nlen = strlen(name), total = plen + nlen;
    if (p->len + total + 1 > p->cap) {
        size_t cap = p->cap ? p->cap : 1 << 20;
        while (p->len + total + 1 > cap)
            cap *= 2;
        char *grown = realloc(p->buf, cap);
        if (!grown)
            return -1;
        p->buf = grown;
        p->cap = cap;
    }
    memcpy(p->buf + p->len, prefix, plen);
    memcpy(p->buf + p->len + plen, name, nlen + 1);
    p->len += total + 1;
    p->count++;
    if (total > p->width)
        p->width = total;
    return 0;
}

#define SCAN_OTHER 1  /* something the Python walker must look at */
#define SCAN_NOMEM 2

/* The files of the folder open as dir_fd (its path relative to the root: prefix, plen bytes,
 * ending in '/' unless empty), and of its folders, depth first. Takes dir_fd over. */
static int scan_folder(int dir_fd, char *prefix, size_t plen, size_t pcap, Paths *out, int depth) {
    DIR *dir = fdopendir(dir_fd);
    if (!dir) {
        close(dir_fd);
        return SCAN_OTHER;
    }
    int rc = 0;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(dir)) != NULL) {
        const char *name = e->d_name;
        if (name[0] == '.')  /* ".", ".." and hidden entries */
            continue;
        unsigned char type = e->d_type;
        if (type == DT_UNKNOWN) {  /* a file system without d_type: ask, without following links */
            struct stat st;
            if (fstatat(dirfd(dir), name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
                rc = SCAN_OTHER;
                break;
            }
            type = S_ISREG(st.st_mode) ? DT_REG : S_ISDIR(st.st_mode) ? DT_DIR : DT_LNK;
        }
        if (type == DT_REG) {
            if (paths_add(out, prefix, plen, name) != 0) {
                rc = SCAN_NOMEM;
                break;
            }
        } else if (type == DT_DIR) {
            size_t nlen = strlen(name);
            if (depth >= 256 || plen + nlen + 2 > pcap) {
                rc = SCAN_OTHER;
                break;
            }
            int sub = openat(dirfd(dir), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
                rc = SCAN_OTHER;
                break;
            }
            memcpy(prefix + plen, name, nlen);
            prefix[plen + nlen] = '/';
            rc = scan_folder(sub, prefix, plen + nlen + 1, pcap, out, depth + 1);
            if (rc)
                break;
        } else {
            rc = SCAN_OTHER;
            break;
        }
        errno = 0;
    }
    if (!rc && errno != 0)  /* readdir failed part way */
        rc = SCAN_OTHER;
    closedir(dir);
    return rc;
}

static PyObject *scan_tree(PyObject *self, PyObject *args) {
    PyObject *root_obj, *root_bytes = NULL;
    if (!PyArg_ParseTuple(args, "O", &root_obj))
        return NULL;
    if (!PyUnicode_FSConverter(root_obj, &root_bytes))
        return NULL;
    const char *base = PyBytes_AS_STRING(root_bytes);
    Paths out = {NULL, 0, 0, 0, 0};
    size_t pcap = 1 << 16;
    char *prefix = malloc(pcap);
    int rc = SCAN_NOMEM;
    if (prefix) {
        Py_BEGIN_ALLOW_THREADS
        int fd = open(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        rc = fd < 0 ? SCAN_OTHER : scan_folder(fd, prefix, 0, pcap, &out, 0);
        Py_END_ALLOW_THREADS
    }
    free(prefix);
    Py_DECREF(root_bytes);
    PyObject *result = NULL;
    if (rc == SCAN_NOMEM) {
        PyErr_NoMemory();
    } else if (rc == SCAN_OTHER) {
        result = Py_NewRef(Py_None);
    } else {
        size_t width = out.width ? out.width : 1;
        PyObject *blob = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(out.count * width));
        if (blob) {
            char *dst = PyBytes_AS_STRING(blob);
            memset(dst, 0, out.count * width);
            const char *src = out.buf;
            for (size_t i = 0; i < out.count; i++) {
                size_t len = strlen(src);
                memcpy(dst + i * width, src, len);
                src += len + 1;
            }
            result = Py_BuildValue("(Nnn)", blob, (Py_ssize_t)width, (Py_ssize_t)out.count);
        }
    }
    free(out.buf);
    return result;
}

static PyMethodDef methods[] = {
    {"stat_blob", stat_blob, METH_VARARGS,
     "stat_blob(root, blob, width, start, stop[, ids]) -> (sizes, mtimes_ns, failed[, devs, inos]): see the module source."},
    {"scan_tree", scan_tree, METH_VARARGS,
     "scan_tree(root) -> (blob, width, n) or None: see the module source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_stat_many", "Stat a run of paths in one call (h5batch.walker.stat_blob).", -1, methods,
};

PyMODINIT_FUNC PyInit__stat_many(void) { return PyModule_Create(&module); }
