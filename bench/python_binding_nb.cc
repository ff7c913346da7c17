// The nanobind counterpart of the ctypes read call, for bench/python_binding.py
// only: read_into(handle, name, buffer, offset) -> bytes read, over the same
// monarch_t the ctypes binding opened (passed as an integer), into any
// writable C-contiguous buffer. Like ctypes, it releases the GIL for the read.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "monarch/monarch_c.h"

namespace nb = nanobind;

NB_MODULE(monarch_nb, m) {
  m.def("read_into", [](std::uintptr_t handle, const char* name, nb::handle buffer,
                        std::uint64_t offset) {
    Py_buffer view;
    if (PyObject_GetBuffer(buffer.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
      throw nb::python_error();
    }
    size_t got = 0;
    char* error = nullptr;
    monarch_code code;
    {
      nb::gil_scoped_release release;
      code = monarch_read(reinterpret_cast<monarch_t*>(handle), name, view.buf,
                          static_cast<size_t>(view.len), offset, &got, &error);
    }
    PyBuffer_Release(&view);
    if (code != MONARCH_OK) {
      std::string message = error != nullptr ? error : "monarch_read failed";
      monarch_free(error);
      throw std::runtime_error(message);
    }
    return got;
  });
}
