/* monarch._read_bytes: Monarch.read()'s hot path as one compiled call.
 *
 * Through ctypes, reading a file into a new bytes object takes three foreign
 * calls (the file's size, the bytes object, the read), each with its
 * argument objects: about 3.5 us a sample, which a DataLoader worker reading
 * a RAM-tier hit (5 us of copying for 120 KiB) pays on top of the copy
 * (bench/results/python.md). Here it is one call of about 0.5 us.
 *
 * The C library is not linked: bind() receives the addresses of
 * monarch_read, monarch_file_size and monarch_free from the ctypes handle
 * the package already loaded, so both paths use the same library instance
 * (MONARCH_C_LIBRARY or the bundled one) and this module builds without it.
 * Limited API (abi3): one build serves every CPython from 3.8.
 */
#define Py_LIMITED_API 0x03080000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef int (*ReadFn)(void* m, const char* name, void* buffer, size_t n, uint64_t offset,
                      size_t* bytes_read, char** error);
typedef int (*FileSizeFn)(const void* m, const char* name, uint64_t* size, char** error);
typedef void (*FreeFn)(void* p);

static ReadFn monarch_read_fn;
static FileSizeFn monarch_file_size_fn;
static FreeFn monarch_free_fn;

static PyObject* Bind(PyObject* self, PyObject* args) {
  unsigned long long read, file_size, free_fn;
  (void)self;
  if (!PyArg_ParseTuple(args, "KKK", &read, &file_size, &free_fn)) return NULL;
  if (read == 0 || file_size == 0 || free_fn == 0) {
    PyErr_SetString(PyExc_ValueError, "bind: a null function address");
    return NULL;
  }
  monarch_read_fn = (ReadFn)(uintptr_t)read;
  monarch_file_size_fn = (FileSizeFn)(uintptr_t)file_size;
  monarch_free_fn = (FreeFn)(uintptr_t)free_fn;
  Py_RETURN_NONE;
}

/* A failed call: (code, message), for the package to raise what ctypes'
 * path would. Takes (frees) `error`. */
static PyObject* Failure(int code, char* error) {
  PyObject* message = error != NULL
                          ? PyUnicode_DecodeUTF8(error, (Py_ssize_t)strlen(error), "replace")
                          : PyUnicode_FromString("");
  if (error != NULL) monarch_free_fn(error);
  if (message == NULL) return NULL;
  return Py_BuildValue("(iN)", code, message); /* N: the tuple takes `message`. */
}

/* read(handle, name, offset, size) -> bytes, or (code, message) on failure.
 * `handle` is the monarch_t* address, `name` the dataset name (bytes, no
 * NUL), `size` < 0 reads to the end of the file. */
static PyObject* Read(PyObject* self, PyObject* args) {
  unsigned long long handle, offset;
  const char* name;
  Py_ssize_t name_length, size;
  (void)self;
  if (!PyArg_ParseTuple(args, "Ky#Kn", &handle, &name, &name_length, &offset, &size)) {
    return NULL;
  }
  if (monarch_read_fn == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "monarch._read_bytes: bind() was not called");
    return NULL;
  }
  if (handle == 0 || (size_t)name_length != strlen(name)) {
    PyErr_SetString(PyExc_ValueError, "read: a null handle, or a name with a NUL byte");
    return NULL;
  }
  void* m = (void*)(uintptr_t)handle;
  char* error = NULL;
  if (size < 0) {
    uint64_t file_size = 0;
    int code = monarch_file_size_fn(m, name, &file_size, &error);
    if (code != 0) return Failure(code, error);
    const uint64_t rest = file_size > offset ? file_size - offset : 0;
    if (rest > (uint64_t)PY_SSIZE_T_MAX) {
      PyErr_SetString(PyExc_OverflowError, "read: the file is too large for one bytes object");
      return NULL;
    }
    size = (Py_ssize_t)rest;
  }
  PyObject* bytes = PyBytes_FromStringAndSize(NULL, size);
  if (bytes == NULL || size == 0) return bytes;
  char* data = PyBytes_AsString(bytes);
  size_t got = 0;
  int code;
  /* A miss may wait on the source (milliseconds on a PFS): other threads run. */
  Py_BEGIN_ALLOW_THREADS
  code = monarch_read_fn(m, name, data, (size_t)size, offset, &got, &error);
  Py_END_ALLOW_THREADS
  if (code != 0) {
    Py_DECREF(bytes);
    return Failure(code, error);
  }
  if (got < (size_t)size) {  /* Short at the end of the file. */
    PyObject* shorter = PyBytes_FromStringAndSize(data, (Py_ssize_t)got);
    Py_DECREF(bytes);
    return shorter;
  }
  return bytes;
}

static PyMethodDef kMethods[] = {
    {"bind", Bind, METH_VARARGS,
     "bind(read, file_size, free): the addresses of monarch_read, monarch_file_size and "
     "monarch_free in the loaded C library."},
    {"read", Read, METH_VARARGS,
     "read(handle, name, offset, size) -> bytes, or (code, message) if the C call failed."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_read_bytes", "Monarch.read()'s compiled hot path.", -1, kMethods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__read_bytes(void) { return PyModule_Create(&kModule); }
