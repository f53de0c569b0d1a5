"""The cffi builder of decoctl's C ABI bridge, ``decoctl._abi`` (out-of-line API mode).

setup.py runs it at install time through ``cffi_modules=["abi/build_bridge.py:ffibuilder"]``; by hand:
``python abi/build_bridge.py`` compiles the module into the current directory.

The declarations come from abi/decoctl.h itself (between its DECOCTL_CDEF_BEGIN / DECOCTL_CDEF_END markers),
so the header stays the single contract. Constants are declared ``...`` and their values taken from the
compiled header. On top of the header the bridge declares:
- the host functions as ``extern "Python"`` callbacks (implemented with ``@ffi.def_extern`` in core/abi/_host.py,
  and in core/abi/_rows.py for the rows and outputs of ABI 1.3);
- the host's mirror (decoctl_bridge_host, decoctl_bridge_role): C structs decoctl.abi keeps up to date, from which
  C functions answer the cheap read-only queries (length, remaining, done, max_length, logits) without entering
  Python, and the function that fills a host table with them and the callbacks;
- a few C helpers to open a library and find its entry symbol with the platform loader's own error text;
- ``decoctl_bridge_top2``: a row's argmax, maximum and runner-up in one pass (decoctl.processing.top2).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADER = HERE / "decoctl.h"

# The host table's functions, implemented in Python (core/abi/_host.py, core/abi/_rows.py). One line per
# decoctl_host member; the names are decoctl_py_<member>.
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
extern "Python" int32_t decoctl_py_argmax(void *, const float *, int64_t, int64_t, const int64_t *, int64_t,
                                          int64_t *);
extern "Python" int32_t decoctl_py_fork(void *, decoctl_role *, int32_t, int32_t *);
extern "Python" int32_t decoctl_py_reorder(void *, decoctl_role *, const int32_t *, int64_t);
extern "Python" int32_t decoctl_py_release(void *, decoctl_role *, int32_t);
extern "Python" int32_t decoctl_py_step_rows(void *, decoctl_role *, const int32_t *, const int64_t *, int64_t,
                                             decoctl_rows *);
extern "Python" int32_t decoctl_py_row_forward(void *, decoctl_role *, int32_t, const int64_t *, int64_t,
                                               decoctl_rows *);
extern "Python" int32_t decoctl_py_row_logits(void *, decoctl_role *, int32_t, decoctl_rows *);
extern "Python" int32_t decoctl_py_row_rewind(void *, decoctl_role *, int32_t, int64_t);
extern "Python" int64_t decoctl_py_row_length(void *, decoctl_role *, int32_t);
extern "Python" int32_t decoctl_py_row_tokens(void *, decoctl_role *, int32_t, const int64_t **, int64_t *);
extern "Python" int32_t decoctl_py_new_output(void *, int32_t *);
extern "Python" int32_t decoctl_py_commit_to(void *, int32_t, const int64_t *, int64_t, int64_t *);
extern "Python" int32_t decoctl_py_output_done(void *, int32_t);
extern "Python" int32_t decoctl_py_score(void *, int32_t, double);
extern "Python" int32_t decoctl_py_rank_outputs(void *, const int32_t *, int64_t);
extern "Python" int32_t decoctl_py_process_outputs(void *, const float *, int64_t, int64_t, const int32_t *,
                                                   decoctl_rows *);
extern "Python" int32_t decoctl_py_source_tokens(void *, const int64_t **, int64_t *);
"""

HELPERS_CDEF = """
typedef struct decoctl_bridge_role {
    int64_t length;
    const float *logits;
    int64_t logits_n;
    int64_t logits_width;
} decoctl_bridge_role;

typedef struct decoctl_bridge_host {
    int32_t bound;
    int32_t done;
    int64_t remaining;
    int64_t max_length;
    decoctl_bridge_role **roles;
    int64_t n_roles;
} decoctl_bridge_host;

void decoctl_bridge_fill_table(decoctl_host *table, decoctl_bridge_host *mirror);
void decoctl_bridge_serve(decoctl_bridge_host *mirror);
int64_t decoctl_bridge_top2(const float *row, int64_t n, float *out);
void *decoctl_bridge_open(const char *path);
void *decoctl_bridge_symbol(void *library, const char *name);
void decoctl_bridge_close(void *library);
const char *decoctl_bridge_loader_error(void);
"""

HELPERS_SOURCE = r"""
#include <math.h>
#include <stddef.h>

#include "decoctl.h"

/* ---- the host's mirror -------------------------------------------------------------------------------------

   An extern "Python" callback costs a C -> Python -> C crossing (about 1 us), which would make even length() cost
   a microsecond. The read-only queries below are answered in C from a mirror of the host's state that decoctl.abi
   writes before it hands control to C (create, step, reset) and again after every callback that changes that
   state (forward, forward_tree, forward_features, keep, rewind: the role; commit: the generation). host_data
   points at the instance's decoctl_bridge_host, a decoctl_role * at one of its decoctl_bridge_role; both are
   allocated by Python (ffi.new) and live as long as the instance.

   Whatever the mirror cannot answer (a host function called outside create/step/reset or from another thread, a
   foreign host_data, an unknown role handle, a NULL or too small decoctl_rows, no current logits) goes to the
   function's extern "Python" twin, which refuses it exactly as before: the exception kept and raised when the C
   call returns, host_error's text, the log line for a call outside create/step/reset. */

typedef struct decoctl_bridge_role {
    int64_t length;       /* tokens in the role's KV cache */
    const float *logits;  /* the last forward's logits (kept alive by decoctl.abi), or NULL when there are none */
    int64_t logits_n;
    int64_t logits_width;
} decoctl_bridge_role;

typedef struct decoctl_bridge_host {
    int32_t bound;                /* 1 while a generation (a Host) is bound to the instance */
    int32_t done;
    int64_t remaining;
    int64_t max_length;
    decoctl_bridge_role **roles;  /* the role handles given out so far (Python-owned array) */
    int64_t n_roles;
} decoctl_bridge_host;

/* The mirror whose create/step/reset is running on this thread (NULL: none). A thread-local pointer compared with
   host_data, never a flag read through host_data: a foreign host_data is never dereferenced, and a call from
   another thread or from destroy finds NULL here. decoctl.abi sets it around every create/step/reset, restoring
   the outer instance's when calls nest. */
#if defined(_MSC_VER)
static __declspec(thread) decoctl_bridge_host *decoctl_bridge_current;
#else
static _Thread_local decoctl_bridge_host *decoctl_bridge_current;
#endif

void decoctl_bridge_serve(decoctl_bridge_host *mirror) { decoctl_bridge_current = mirror; }

/* cffi defines the extern "Python" callbacks (static) after this code: declare them for the code below. */
DECOCTL_BRIDGE_CALLBACKS

static const decoctl_bridge_host *decoctl_bridge_host_of(void *host_data) {
    const decoctl_bridge_host *host = decoctl_bridge_current;
    return host != NULL && (void *)host == host_data && host->bound ? host : NULL;
}

static const decoctl_bridge_role *decoctl_bridge_role_of(void *host_data, decoctl_role *role) {
    const decoctl_bridge_host *host = decoctl_bridge_host_of(host_data);
    if (host == NULL) return NULL;
    for (int64_t i = 0; i < host->n_roles; i++)
        if ((void *)host->roles[i] == (void *)role) return host->roles[i];
    return NULL;
}

static int64_t decoctl_bridge_length(void *host_data, decoctl_role *role) {
    const decoctl_bridge_role *mirror = decoctl_bridge_role_of(host_data, role);
    return mirror != NULL ? mirror->length : decoctl_py_length(host_data, role);
}

static int32_t decoctl_bridge_logits(void *host_data, decoctl_role *role, decoctl_rows *out_rows) {
    const decoctl_bridge_role *mirror = decoctl_bridge_role_of(host_data, role);
    /* the host writes no decoctl_rows field beyond the plugin's struct_size */
    if (mirror == NULL || mirror->logits == NULL || out_rows == NULL
        || out_rows->struct_size < offsetof(decoctl_rows, width) + sizeof(out_rows->width))
        return decoctl_py_logits(host_data, role, out_rows);
    out_rows->data = mirror->logits;
    out_rows->n = mirror->logits_n;
    out_rows->width = mirror->logits_width;
    return DECOCTL_OK;
}

static int32_t decoctl_bridge_done(void *host_data) {
    const decoctl_bridge_host *host = decoctl_bridge_host_of(host_data);
    return host != NULL ? host->done : decoctl_py_done(host_data);
}

static int64_t decoctl_bridge_max_length(void *host_data) {
    const decoctl_bridge_host *host = decoctl_bridge_host_of(host_data);
    return host != NULL ? host->max_length : decoctl_py_max_length(host_data);
}

static int64_t decoctl_bridge_remaining(void *host_data) {
    const decoctl_bridge_host *host = decoctl_bridge_host_of(host_data);
    return host != NULL ? host->remaining : decoctl_py_remaining(host_data);
}

/* ---- a numeric helper of the Python host ------------------------------------------------------------------

   The first index of the row's maximum, as numpy's argmax gives it (the first NaN when there is one), with the
   maximum in out[0] and the largest of the other entries in out[1] (-inf for a one-entry row; equal to out[0]
   when the maximum is tied). One pass over the row: greedy decoding under a logits chain asks this of every
   unprocessed row (decoctl.processing), where numpy needs three calls, each cold right after a forward. */
int64_t decoctl_bridge_top2(const float *row, int64_t n, float *out) {
    int64_t best = 0;
    float top = row[0], second = -INFINITY;
    if (isnan(top)) {
        out[0] = top;
        out[1] = -INFINITY;
        return 0;
    }
    for (int64_t i = 1; i < n; i++) {
        float value = row[i];
        if (isnan(value)) {
            out[0] = value;
            out[1] = top;
            return i;
        }
        if (value > top) {
            second = top;
            top = value;
            best = i;
        } else if (value > second) {
            second = value;
        }
    }
    out[0] = top;
    out[1] = second;
    return best;
}

/* The instance's host table: the mirror as host_data, the C queries above and the extern "Python" rest. */
void decoctl_bridge_fill_table(decoctl_host *table, decoctl_bridge_host *mirror) {
    table->struct_size = (uint32_t)sizeof(decoctl_host);
    table->abi_major = DECOCTL_ABI_MAJOR;
    table->abi_minor = DECOCTL_ABI_MINOR;
    table->host_data = mirror;
    table->role = decoctl_py_role;
    table->forward = decoctl_py_forward;
    table->forward_tree = decoctl_py_forward_tree;
    table->keep = decoctl_py_keep;
    table->logits = decoctl_bridge_logits;
    table->hidden_states = decoctl_py_hidden_states;
    table->rewind = decoctl_py_rewind;
    table->length = decoctl_bridge_length;
    table->tokens = decoctl_py_tokens;
    table->has_capability = decoctl_py_has_capability;
    table->commit = decoctl_py_commit;
    table->done = decoctl_bridge_done;
    table->is_eos = decoctl_py_is_eos;
    table->max_length = decoctl_bridge_max_length;
    table->remaining = decoctl_bridge_remaining;
    table->process = decoctl_py_process;
    table->uniform = decoctl_py_uniform;
    table->log_message = decoctl_py_log_message;
    table->host_error = decoctl_py_host_error;
    table->forward_features = decoctl_py_forward_features;
    table->argmax = decoctl_py_argmax;
    /* ABI 1.3: rows and outputs (decoctl.abi._rows) */
    table->fork = decoctl_py_fork;
    table->reorder = decoctl_py_reorder;
    table->release = decoctl_py_release;
    table->step_rows = decoctl_py_step_rows;
    table->row_forward = decoctl_py_row_forward;
    table->row_logits = decoctl_py_row_logits;
    table->row_rewind = decoctl_py_row_rewind;
    table->row_length = decoctl_py_row_length;
    table->row_tokens = decoctl_py_row_tokens;
    table->new_output = decoctl_py_new_output;
    table->commit_to = decoctl_py_commit_to;
    table->output_done = decoctl_py_output_done;
    table->score = decoctl_py_score;
    table->rank_outputs = decoctl_py_rank_outputs;
    table->process_outputs = decoctl_py_process_outputs;
    /* ABI 1.4: an encoder-decoder target's source (decoctl.abi._host) */
    table->source_tokens = decoctl_py_source_tokens;
}

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
/* dlerror() is cleared by the next loader call: decoctl.abi opens libraries under one lock and reads the text
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


# the callbacks' forward declarations, made from CALLBACKS so that the two never disagree
HELPERS_SOURCE = HELPERS_SOURCE.replace("DECOCTL_BRIDGE_CALLBACKS", CALLBACKS.replace('extern "Python"', "static"))

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
