/*
 * greedy.c: the greedy baseline as a C controller. Each step commits the argmax of the target's (processed)
 * last logits row and feeds it back, one target forward per token: token for token what
 * `decoctl generate --controller greedy` does.
 *
 *   make && decoctl generate --controller ./build/libgreedy.so:greedy "def fib(n):"
 */
#include <stdio.h>
#include <stdlib.h>

#include "decoctl.h"

typedef struct greedy_state {
    const decoctl_host *host; /* host-owned, valid until destroy */
    decoctl_role *target;     /* host-owned handle, valid until destroy */
    char error[256];
} greedy_state;

static int64_t argmax(const float *row, int64_t width) {
    int64_t best = 0;
    for (int64_t i = 1; i < width; i++)
        if (row[i] > row[best]) best = i; /* the first of equal maxima, as numpy's argmax */
    return best;
}

/* Record why a host call failed; the host raises its own exception anyway, this is for the C side's message. */
static int32_t fail(greedy_state *s, int32_t status, const char *what) {
    const char *detail = s->host->host_error(s->host->host_data);
    snprintf(s->error, sizeof(s->error), "%s failed (%d): %s", what, status, detail ? detail : "no detail");
    return status;
}

/* The argmax of the processed row: the host's argmax where it has one (ABI 1.2: the chain may skip processors
 * that keep a unique maximum, such as top_k or temperature), else process() and a scan (a 1.0 or 1.1 host). */
static int32_t choose(greedy_state *s, const float *row, int64_t width, int64_t *out_token) {
    const decoctl_host *h = s->host;
    if (DECOCTL_HAS(h, decoctl_host, argmax)) {
        int32_t status = h->argmax(h->host_data, row, 1, width, NULL, 0, out_token);
        return status < 0 ? fail(s, status, "argmax") : DECOCTL_OK;
    }
    decoctl_rows processed = DECOCTL_ROWS_INIT;
    int32_t status = h->process(h->host_data, row, 1, width, NULL, 0, &processed);
    if (status < 0) return fail(s, status, "process");
    *out_token = argmax(processed.data, processed.width);
    return DECOCTL_OK;
}

static int32_t greedy_create(const decoctl_host *host, const char *config_json, void **out_state) {
    (void)config_json; /* greedy takes no options */
    greedy_state *s = calloc(1, sizeof(*s));
    if (!s) return DECOCTL_ERR_FAILED;
    s->host = host;
    *out_state = s;
    int32_t status = host->role(host->host_data, "target", &s->target);
    return status < 0 ? fail(s, status, "role(\"target\")") : DECOCTL_OK;
}

static int32_t greedy_step(void *state) {
    greedy_state *s = state;
    const decoctl_host *h = s->host;
    decoctl_rows logits = DECOCTL_ROWS_INIT;
    int32_t status = h->logits(h->host_data, s->target, &logits);
    if (status < 0) return fail(s, status, "logits");
    const float *last = logits.data + (logits.n - 1) * logits.width; /* the row predicting the next token */
    int64_t token;
    status = choose(s, last, logits.width, &token);
    if (status < 0) return status;
    status = h->commit(h->host_data, &token, 1, NULL);
    if (status < 0) return fail(s, status, "commit");
    if (h->done(h->host_data)) return DECOCTL_OK;
    status = h->forward(h->host_data, s->target, &token, 1, NULL);
    return status < 0 ? fail(s, status, "forward") : DECOCTL_OK;
}

static void greedy_destroy(void *state) { free(state); }

static const char *greedy_last_error(void *state) {
    greedy_state *s = state;
    return s && s->error[0] ? s->error : NULL;
}

static const decoctl_controller greedy = {
    .struct_size = sizeof(decoctl_controller),
    .name = "greedy",
    .summary = "argmax of the target's logits, one token per forward (C)",
    .roles = "target",
    .options_json = NULL,
    .create = greedy_create,
    .step = greedy_step,
    .destroy = greedy_destroy,
    .last_error = greedy_last_error,
    .reset = NULL,
    .stats_json = NULL,
};

static const decoctl_controller *const controllers[] = {&greedy};

DECOCTL_EXPORT const decoctl_plugin decoctl_plugin_entry = DECOCTL_PLUGIN(controllers);
