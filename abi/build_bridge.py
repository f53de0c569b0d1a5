"""The cffi builder of decoctl's C ABI bridge, ``decoctl._abi`` (out-of-line API mode).

setup.py runs it at install time through ``cffi_modules=["abi/build_bridge.py:ffibuilder"]``; by hand:
``python abi/build_bridge.py`` compiles the module into the current directory.

The declarations come from abi/decoctl.h itself (between its DECOCTL_CDEF_BEGIN / DECOCTL_CDEF_END markers),
so the header stays the single contract. Constants are declared ``...`` and their values taken from the
compiled header. On top of the header the bridge declares:
- the host functions as ``extern "Python"`` callbacks (implemented in core/abi.py with ``@ffi.def_extern``);
- a few C helpers to open a library and find its entry symbol with the platform loader's own error text.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADER = HERE / "decoctl.h"

# The host table's functions, implemented in Python (core/abi.py). One line per decoctl_host member, in the same
# order; the names are decoctl_py_<member>.
CALLBACKS = """
extern "Python" int32_t decoctl_py_role(void *, const char *, decoctl_role **);
extern "Python" int32_t decoctl_py_forward(void *, decoctl_role *, const int64_t *, int64_t, decoctl_rows *);
extern "Python" int32_t decoctl_py_forward_tree(void *, decoctl_role *, const int64_t *, const int32_t *, int64_t,
                                                decoctl_rows *);
extern "Python" int32_t decoctl_py_keep(void *, decoctl_role *, const int64_t *, int64_t);
extern "Python" int32_t decoctl_py_logits(void *, decoctl_role *, decoctl_rows *);
extern "Python" int32_t decoctl_py_hidden_states(void *, decoctl_role *, const char *, decoctl_rows *);
extern "Python" int32_t decoctl_py_rewind(void *, decoctl_role *, int64_t);
extern "Python" int64_t decoctl_py_length(void *, decoctl_role *);
extern "Python" int32_t decoctl_py_tokens(void *, decoctl_role *, const int64_t **, int64_t *);
extern "Python" int32_t decoctl_py_has_capability(void *, decoctl_role *, const char *);
extern "Python" int32_t decoctl_py_commit(void *, const int64_t *, int64_t, int64_t *);
extern "Python" int32_t decoctl_py_done(void *);
extern "Python" int32_t decoctl_py_is_eos(void *, int64_t);
extern "Python" int64_t decoctl_py_max_length(void *);
extern "Python" int64_t decoctl_py_remaining(void *);
extern "Python" int32_t decoctl_py_process(void *, const float *, int64_t, int64_t, const int64_t *, int64_t,
                                           decoctl_rows *);
extern "Python" int32_t decoctl_py_uniform(void *, double *);
extern "Python" int32_t decoctl_py_log_message(void *, int32_t, const char *);
extern "Python" const char *decoctl_py_host_error(void *);
extern "Python" int32_t decoctl_py_forward_features(void *, decoctl_role *, const int64_t *, const int32_t *, int64_t,
                                                    const float *, int64_t, decoctl_rows *);
"""

HELPERS_CDEF = """
void *decoctl_bridge_open(const char *path);
void *decoctl_bridge_symbol(void *library, const char *name);
void decoctl_bridge_close(void *library);
const char *decoctl_bridge_loader_error(void);
"""

HELPERS_SOURCE = r"""
#include "decoctl.h"

#if defined(_WIN32)
#include <windows.h>
static char decoctl_bridge_error_text[512];

static void decoctl_bridge_remember_error(void) {
    DWORD code = GetLastError();
    if (!FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL, code, 0,
                        decoctl_bridge_error_text, sizeof(decoctl_bridge_error_text), NULL))
        decoctl_bridge_error_text[0] = '\0';
}

void *decoctl_bridge_open(const char *path) {
    void *library = (void *)LoadLibraryA(path);
    if (!library) decoctl_bridge_remember_error();
    return library;
}

void *decoctl_bridge_symbol(void *library, const char *name) {
    void *found = (void *)GetProcAddress((HMODULE)library, name);
    if (!found) decoctl_bridge_remember_error();
    return found;
}

void decoctl_bridge_close(void *library) { FreeLibrary((HMODULE)library); }

const char *decoctl_bridge_loader_error(void) { return decoctl_bridge_error_text; }
#else
#include <dlfcn.h>
/* dlerror() is cleared by the next loader call: core/abi.py opens libraries under one lock and reads the text
   right after the failing call. */
static const char *decoctl_bridge_last = "";

void *decoctl_bridge_open(const char *path) {
    /* RTLD_LOCAL: two plugin libraries never see each other's symbols. */
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!library) { const char *e = dlerror(); decoctl_bridge_last = e ? e : ""; }
    return library;
}

void *decoctl_bridge_symbol(void *library, const char *name) {
    void *found;
    dlerror();
    found = dlsym(library, name);
    if (!found) { const char *e = dlerror(); decoctl_bridge_last = e ? e : "symbol is NULL"; }
    return found;
}

void decoctl_bridge_close(void *library) { dlclose(library); }

const char *decoctl_bridge_loader_error(void) { return decoctl_bridge_last; }
#endif
"""


def header_declarations(header: Path = HEADER) -> str:
    """The cdef part of decoctl.h, with every ``#define NAME VALUE`` turned into ``#define NAME ...`` (cffi then
    reads the value from the compiled header, so the header may write ``(-1)``)."""
    text = header.read_text(encoding="utf-8")
    match = re.search(r"DECOCTL_CDEF_BEGIN[^\n]*\n(.*?)/\*\s*DECOCTL_CDEF_END", text, re.S)
    if match is None:
        raise RuntimeError(f"{header} has no DECOCTL_CDEF_BEGIN ... DECOCTL_CDEF_END section")
    return re.sub(r"^(#define\s+\w+)\s+.*$", r"\1 ...", match.group(1), flags=re.M)


ffibuilder = FFI()
ffibuilder.cdef(header_declarations() + CALLBACKS + HELPERS_CDEF)
ffibuilder.set_source(
    "decoctl._abi",
    HELPERS_SOURCE,
    include_dirs=[str(HERE)],
    libraries=[] if sys.platform == "win32" else ["dl"],
    depends=[str(HEADER)],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
