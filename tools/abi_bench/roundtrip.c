/*
 * roundtrip.c: what one host primitive costs when called from C (docs/BENCHMARKS.md, the C ABI rows).
 *
 * A greedy controller (token for token the built-in greedy) whose create() first times `calls` back-to-back calls
 * of four primitives that do no model work: remaining() (per generation), length() (per role), logits() (a
 * zero-copy view of host memory) and tokens() (another zero-copy view). The bridge answers the first three in C
 * from its mirror of the host's state (abi/build_bridge.py); tokens() still crosses C -> Python (cffi extern
 * "Python") -> the host -> back, so its figure is the cost of a primitive that enters Python. The figures
 * (nanoseconds per call) come back through stats_json.
 *
 *   cc -O2 -shared -fPIC -I abi -o build/libroundtrip.so tools/abi_bench/roundtrip.c
 *   .venv/bin/python tools/abi_bench/bench_abi.py MODEL
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c11 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decoctl.h"

typedef struct roundtrip_state {
    const decoctl_host *host; /* host-owned, valid until destroy */
    decoctl_role *target;     /* host-owned handle, valid until destroy */
    double ns_remaining, ns_length, ns_logits, ns_tokens;
    int64_t calls;
    char stats[256];
    char error[256];
} roundtrip_state;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int32_t fail(roundtrip_state *s, int32_t status, const char *what) {
    const char *detail = s->host->host_error(s->host->host_data);
    snprintf(s->error, sizeof(s->error), "%s failed (%d): %s", what, status, detail ? detail : "no detail");
    return status;
}

/* config_json is {"calls": N} (the schema below fills the default); a plain scan is enough for one integer. */
static int64_t calls_option(const char *config_json) {
    const char *at = config_json ? strstr(config_json, "\"calls\"") : NULL;
    if (!at) return 100000;
    at = strchr(at, ':');
    return at ? strtoll(at + 1, NULL, 10) : 100000;
}

static int32_t roundtrip_create(const decoctl_host *host, const char *config_json, void **out_state) {
    roundtrip_state *s = calloc(1, sizeof(*s));
    if (!s) return DECOCTL_ERR_FAILED;
    s->host = host;
    *out_state = s;
    int32_t status = host->role(host->host_data, "target", &s->target);
    if (status < 0) return fail(s, status, "role(\"target\")");
    s->calls = calls_option(config_json);
    int64_t sink = 0;
    double start = now_ns();
    for (int64_t i = 0; i < s->calls; i++) sink += host->remaining(host->host_data);
    s->ns_remaining = (now_ns() - start) / (double)s->calls;
    start = now_ns();
    for (int64_t i = 0; i < s->calls; i++) sink += host->length(host->host_data, s->target);
    s->ns_length = (now_ns() - start) / (double)s->calls;
    decoctl_rows rows = DECOCTL_ROWS_INIT;
    start = now_ns();
    for (int64_t i = 0; i < s->calls; i++) {
        status = host->logits(host->host_data, s->target, &rows);
        if (status < 0) return fail(s, status, "logits");
        sink += rows.n;
    }
    s->ns_logits = (now_ns() - start) / (double)s->calls;
    const int64_t *tokens;
    int64_t n_tokens;
    start = now_ns();
    for (int64_t i = 0; i < s->calls; i++) {
        status = host->tokens(host->host_data, s->target, &tokens, &n_tokens);
        if (status < 0) return fail(s, status, "tokens");
        sink += n_tokens;
    }
    s->ns_tokens = (now_ns() - start) / (double)s->calls;
    return sink < 0 ? DECOCTL_ERR_FAILED : DECOCTL_OK; /* sink keeps the loops from being optimised away */
}

static int64_t argmax(const float *row, int64_t width) {
    int64_t best = 0;
    for (int64_t i = 1; i < width; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

static int32_t roundtrip_step(void *state) {
    roundtrip_state *s = state;
    const decoctl_host *h = s->host;
    decoctl_rows logits = DECOCTL_ROWS_INIT, processed = DECOCTL_ROWS_INIT;
    int32_t status = h->logits(h->host_data, s->target, &logits);
    if (status < 0) return fail(s, status, "logits");
    const float *last = logits.data + (logits.n - 1) * logits.width;
    status = h->process(h->host_data, last, 1, logits.width, NULL, 0, &processed);
    if (status < 0) return fail(s, status, "process");
    int64_t token = argmax(processed.data, processed.width);
    status = h->commit(h->host_data, &token, 1, NULL);
    if (status < 0) return fail(s, status, "commit");
    if (h->done(h->host_data)) return DECOCTL_OK;
    status = h->forward(h->host_data, s->target, &token, 1, NULL);
    return status < 0 ? fail(s, status, "forward") : DECOCTL_OK;
}

static void roundtrip_destroy(void *state) { free(state); }

static const char *roundtrip_last_error(void *state) {
    roundtrip_state *s = state;
    return s && s->error[0] ? s->error : NULL;
}

static const char *roundtrip_stats(void *state) {
    roundtrip_state *s = state;
    snprintf(s->stats, sizeof(s->stats),
             "{\"calls\": %lld, \"ns_remaining\": %.1f, \"ns_length\": %.1f, \"ns_logits\": %.1f, "
             "\"ns_tokens\": %.1f}",
             (long long)s->calls, s->ns_remaining, s->ns_length, s->ns_logits, s->ns_tokens);
    return s->stats;
}

static const decoctl_controller roundtrip = {
    .struct_size = sizeof(decoctl_controller),
    .name = "roundtrip",
    .summary = "greedy, after timing host primitive round trips from C (tools/abi_bench)",
    .roles = "target",
    .options_json = "[{\"name\": \"calls\", \"type\": \"int\", \"default\": 100000, \"minimum\": 1}]",
    .create = roundtrip_create,
    .step = roundtrip_step,
    .destroy = roundtrip_destroy,
    .last_error = roundtrip_last_error,
    .reset = NULL,
    .stats_json = roundtrip_stats,
};

static const decoctl_controller *const controllers[] = {&roundtrip};

DECOCTL_EXPORT const decoctl_plugin decoctl_plugin_entry = DECOCTL_PLUGIN(controllers);
