/*
 * Test controllers for the host functions the bridge answers in C, from its mirror of the host's state: length,
 * remaining, done, max_length and logits (abi/build_bridge.py). Each one either reports what those queries
 * return, for the tests to compare with the Python Sequence and Host, or calls them where they must be refused.
 *
 *   queries               one primitive per step (the script below), then every query; the test drives it step
 *                         by step and compares each report with the Python host
 *   logits_after          forward, then keep or rewind (option "after"), then logits: refused as ever
 *   queries_in_destroy    every query from destroy (outside create/step/reset)
 *   queries_other_thread  every query from a thread the controller starts during its step
 *   queries_foreign       every query with a host_data that is no host (a pointer to its own state)
 */
#define _POSIX_C_SOURCE 200809L /* pthreads under -std=c11 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoctl.h"

typedef struct queries {
    const decoctl_host *host; /* host-owned, valid until destroy */
    decoctl_role *target;     /* host-owned handle, valid until destroy */
    int64_t steps;
    char error[512];
    char stats[1024];
} queries;

static int32_t fail(queries *q, int32_t status, const char *what) {
    const char *detail = q->host->host_error(q->host->host_data);
    snprintf(q->error, sizeof(q->error), "%s returned %d: %s", what, status, detail ? detail : "no detail");
    return status;
}

static int32_t queries_create(const decoctl_host *host, const char *config_json, void **out_state) {
    (void)config_json;
    queries *q = calloc(1, sizeof(*q));
    if (!q) return DECOCTL_ERR_FAILED;
    q->host = host;
    *out_state = q;
    int32_t status = host->role(host->host_data, "target", &q->target);
    return status < 0 ? fail(q, status, "role") : DECOCTL_OK;
}

static void queries_destroy(void *state) { free(state); }

static const char *queries_last_error(void *state) {
    queries *q = state;
    return q && q->error[0] ? q->error : NULL;
}

static const char *queries_stats(void *state) {
    queries *q = state;
    return q->stats[0] ? q->stats : NULL;
}

/* queries: step i does script[i].name and then reads every query (logits only where the script says the role
 * has some: right after keep or rewind it has none, and asking would fail the step). */
typedef struct action {
    const char *name;
    int read_logits;
} action;

static const action script[] = {
    {"start", 1},   /* nothing: what create left (the prompt's last row) */
    {"forward", 1}, /* three tokens: three rows */
    {"keep", 0},    /* the first two of them */
    {"forward", 1}, /* one token */
    {"commit", 1},  /* one token; the logits stay */
    {"rewind", 0},  /* one position back */
    {"finish", 0},  /* commit as many tokens as remain: done */
};

static int32_t queries_step(void *state) {
    queries *q = state;
    const decoctl_host *h = q->host;
    int64_t i = q->steps++;
    if (i >= (int64_t)(sizeof(script) / sizeof(script[0]))) {
        snprintf(q->error, sizeof(q->error), "the script has no step %lld", (long long)i);
        return DECOCTL_ERR_FAILED;
    }
    const char *name = script[i].name;
    int32_t status = DECOCTL_OK;
    if (strcmp(name, "forward") == 0) {
        int64_t three[3] = {5, 6, 7};
        status = h->forward(h->host_data, q->target, i == 1 ? three : three + 2, i == 1 ? 3 : 1, NULL);
    } else if (strcmp(name, "keep") == 0) {
        int64_t indices[2] = {0, 1};
        status = h->keep(h->host_data, q->target, indices, 2);
    } else if (strcmp(name, "commit") == 0) {
        int64_t token = 8;
        status = h->commit(h->host_data, &token, 1, NULL);
    } else if (strcmp(name, "rewind") == 0) {
        status = h->rewind(h->host_data, q->target, h->length(h->host_data, q->target) - 1);
    } else if (strcmp(name, "finish") == 0) {
        int64_t tokens[64];
        int64_t n = h->remaining(h->host_data);
        for (int64_t t = 0; t < n && t < 64; t++) tokens[t] = 9;
        status = h->commit(h->host_data, tokens, n < 64 ? n : 64, NULL);
    }
    if (status < 0) return fail(q, status, name);
    decoctl_rows logits = DECOCTL_ROWS_INIT;
    int32_t logits_status = script[i].read_logits ? h->logits(h->host_data, q->target, &logits) : 0;
    if (logits_status < 0) return fail(q, logits_status, "logits");
    snprintf(q->stats, sizeof(q->stats),
             "{\"action\": \"%s\", \"length\": %lld, \"remaining\": %lld, \"done\": %d, \"max_length\": %lld, "
             "\"read_logits\": %d, \"logits_ptr\": %llu, \"logits_n\": %lld, \"logits_width\": %lld}",
             name, (long long)h->length(h->host_data, q->target), (long long)h->remaining(h->host_data),
             h->done(h->host_data), (long long)h->max_length(h->host_data), script[i].read_logits,
             (unsigned long long)(uintptr_t)logits.data, (long long)logits.n, (long long)logits.width);
    return DECOCTL_OK;
}

/* logits_after: forward two tokens, keep one (or rewind one), then ask for the logits, which are gone. */
static int32_t logits_after_create(const decoctl_host *host, const char *config_json, void **out_state) {
    int32_t status = queries_create(host, config_json, out_state);
    queries *q = *out_state;
    if (q && strstr(config_json, "\"keep\"")) q->steps = 1; /* steps doubles as the option: 1 = keep */
    return status;
}

static int32_t logits_after_step(void *state) {
    queries *q = state;
    const decoctl_host *h = q->host;
    int64_t tokens[2] = {5, 6}, first = 0;
    decoctl_rows rows = DECOCTL_ROWS_INIT;
    int32_t status = h->forward(h->host_data, q->target, tokens, 2, NULL);
    if (status < 0) return fail(q, status, "forward");
    if (q->steps == 1)
        status = h->keep(h->host_data, q->target, &first, 1);
    else
        status = h->rewind(h->host_data, q->target, h->length(h->host_data, q->target) - 1);
    if (status < 0) return fail(q, status, q->steps == 1 ? "keep" : "rewind");
    status = h->logits(h->host_data, q->target, &rows);
    return status < 0 ? fail(q, status, "logits") : DECOCTL_OK;
}

/* The five queries, each one's status (or value) in out[0..4]: length, remaining, done, max_length, logits. */
static void ask_everything(const decoctl_host *h, void *host_data, decoctl_role *role, int64_t out[5]) {
    decoctl_rows rows = DECOCTL_ROWS_INIT;
    out[0] = h->length(host_data, role);
    out[1] = h->remaining(host_data);
    out[2] = h->done(host_data);
    out[3] = h->max_length(host_data);
    out[4] = h->logits(host_data, role, &rows);
}

static int32_t commit_one(queries *q) {
    const decoctl_host *h = q->host;
    int64_t token = 5;
    int32_t status = h->commit(h->host_data, &token, 1, NULL);
    if (status < 0) return fail(q, status, "commit");
    if (h->done(h->host_data)) return DECOCTL_OK;
    status = h->forward(h->host_data, q->target, &token, 1, NULL);
    return status < 0 ? fail(q, status, "forward") : DECOCTL_OK;
}

static int32_t commit_one_step(void *state) { return commit_one(state); }

/* queries_in_destroy: commits one token per step; destroy asks everything (refused and logged by the host). */
static void queries_in_destroy_destroy(void *state) {
    queries *q = state;
    int64_t answers[5];
    ask_everything(q->host, q->host->host_data, q->target, answers);
    free(q);
}

/* queries_other_thread: its first step asks everything from a thread of its own and reports the answers. */
typedef struct asker {
    queries *q;
    int64_t answers[5];
} asker;

static void *ask_from_thread(void *arg) {
    asker *a = arg;
    ask_everything(a->q->host, a->q->host->host_data, a->q->target, a->answers);
    return NULL;
}

static int32_t queries_other_thread_step(void *state) {
    queries *q = state;
    if (q->steps++ == 0) {
        asker a = {q, {0}};
        pthread_t thread;
        if (pthread_create(&thread, NULL, ask_from_thread, &a) != 0 || pthread_join(thread, NULL) != 0) {
            snprintf(q->error, sizeof(q->error), "could not run a thread");
            return DECOCTL_ERR_FAILED;
        }
        snprintf(q->stats, sizeof(q->stats), "{\"answers\": [%lld, %lld, %lld, %lld, %lld]}",
                 (long long)a.answers[0], (long long)a.answers[1], (long long)a.answers[2], (long long)a.answers[3],
                 (long long)a.answers[4]);
    }
    return commit_one(q);
}

/* queries_foreign: asks everything with its own state as host_data, then fails with the answers. */
static int32_t queries_foreign_step(void *state) {
    queries *q = state;
    int64_t answers[5];
    ask_everything(q->host, q, q->target, answers);
    char what[128];
    snprintf(what, sizeof(what), "foreign host_data answers [%lld, %lld, %lld, %lld, %lld]; host_error",
             (long long)answers[0], (long long)answers[1], (long long)answers[2], (long long)answers[3],
             (long long)answers[4]);
    return fail(q, DECOCTL_ERR_ARGUMENT, what);
}

#define CONTROLLER(id, step_fn, ...)                                                                        \
    static const decoctl_controller id = {                                                                   \
        .struct_size = sizeof(decoctl_controller),                                                           \
        .name = #id,                                                                                          \
        .summary = "test controller " #id,                                                                   \
        .roles = "target",                                                                                    \
        .options_json = NULL,                                                                                 \
        .create = queries_create,                                                                             \
        .step = step_fn,                                                                                      \
        .destroy = queries_destroy,                                                                           \
        .last_error = queries_last_error,                                                                     \
        .reset = NULL,                                                                                        \
        .stats_json = queries_stats,                                                                          \
        __VA_ARGS__};

CONTROLLER(queries_script, queries_step, .name = "queries")
CONTROLLER(logits_after, logits_after_step, .create = logits_after_create,
           .options_json = "[{\"name\": \"after\", \"type\": \"str\", \"default\": \"rewind\", "
                           "\"choices\": [\"keep\", \"rewind\"]}]")
CONTROLLER(queries_in_destroy, commit_one_step, .destroy = queries_in_destroy_destroy)
CONTROLLER(queries_other_thread, queries_other_thread_step)
CONTROLLER(queries_foreign, queries_foreign_step)

static const decoctl_controller *const controllers[] = {
    &queries_script, &logits_after, &queries_in_destroy, &queries_other_thread, &queries_foreign,
};

DECOCTL_EXPORT const decoctl_plugin decoctl_plugin_entry = DECOCTL_PLUGIN(controllers);
