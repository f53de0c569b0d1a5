/*
 * source_lookup.c: prompt lookup that also copies from the generation's source (ABI 1.4 source_tokens).
 *
 * The lookup context is the source (an encoder-decoder target's encoded prompt; empty for a decoder-only target),
 * then the target's tokens (the decoder's start token and the output so far), then `pending`: the same index as
 * decoctl_speculative's PromptLookupDrafter. Each step drafts up to k tokens copied after the latest earlier
 * occurrence of the context's last n tokens (n from `ngram` down to 1) and verifies them in one target forward;
 * the output is greedy's token for token.
 *
 * stats_json reports what the host gave: "has_source_tokens" (DECOCTL_HAS), "source_n", the first 64 source ids
 * ("source"), how many drafts began inside the source ("from_source") and the usual counters. On a host older
 * than 1.4 it runs as plain prompt lookup (has_source_tokens 0).
 *
 * Options (config_json): {"k": 4, "ngram": 2}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoctl.h"

#define SHOWN 64 /* source ids echoed in stats_json */

typedef struct lookup_state {
    const decoctl_host *host; /* host-owned, valid until destroy */
    decoctl_role *target;     /* host-owned handle, valid until destroy */
    int64_t k, ngram;
    int has_source;
    const int64_t *source; /* host-owned, valid until reset or destroy */
    int64_t n_source;
    int started;
    int64_t pending; /* the last committed token, not yet in the target's KV cache */
    int64_t *feed;   /* k + 2 tokens: pending, the draft, and room for the token after it */
    int64_t steps, forwards, drafted, accepted, from_source;
    char error[256];
    char stats[2048];
} lookup_state;

static int64_t json_int(const char *json, const char *key, int64_t fallback) {
    char quoted[64];
    snprintf(quoted, sizeof(quoted), "\"%s\"", key);
    const char *at = json ? strstr(json, quoted) : NULL;
    if (!at) return fallback;
    at += strlen(quoted);
    while (*at == ' ') at++;
    if (*at != ':') return fallback;
    char *end;
    long long value = strtoll(at + 1, &end, 10);
    return end == at + 1 ? fallback : (int64_t)value;
}

static int64_t argmax(const float *row, int64_t width) {
    int64_t best = 0;
    for (int64_t i = 1; i < width; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

static int32_t fail(lookup_state *s, int32_t status, const char *what) {
    const char *detail = s->host->host_error(s->host->host_data);
    snprintf(s->error, sizeof(s->error), "%s failed (%d): %s", what, status, detail ? detail : "no detail");
    return status;
}

typedef struct context {
    const int64_t *source, *cached;
    int64_t n_source, n_cached, pending;
} context;

/* Position i of the context: the source, the target's tokens, then pending. */
static int64_t at(const context *c, int64_t i) {
    if (i < c->n_source) return c->source[i];
    i -= c->n_source;
    return i < c->n_cached ? c->cached[i] : c->pending;
}

/* Up to max tokens copied after the latest earlier occurrence of the context's last g tokens (g from ngram down
 * to 1) into draft; *in_source: 1 when the copy starts inside the source. */
static int64_t find_draft(const lookup_state *s, const context *c, int64_t *draft, int64_t max, int *in_source) {
    int64_t length = c->n_source + c->n_cached + 1;
    *in_source = 0;
    for (int64_t g = s->ngram < length - 1 ? s->ngram : length - 1; g >= 1 && max > 0; g--) {
        for (int64_t start = length - g - 1; start >= 0; start--) {
            int64_t i = 0;
            while (i < g && at(c, start + i) == at(c, length - g + i)) i++;
            if (i < g) continue;
            int64_t n = 0;
            for (int64_t j = start + g; j < length && n < max; j++) draft[n++] = at(c, j);
            *in_source = start + g < c->n_source;
            return n;
        }
    }
    return 0;
}

static int32_t lookup_start(lookup_state *s) {
    const decoctl_host *h = s->host;
    s->source = NULL;
    s->n_source = 0;
    s->has_source = DECOCTL_HAS(h, decoctl_host, source_tokens);
    if (s->has_source) {
        int32_t status = h->source_tokens(h->host_data, &s->source, &s->n_source);
        if (status < 0) return fail(s, status, "source_tokens");
    }
    decoctl_rows logits = DECOCTL_ROWS_INIT, processed = DECOCTL_ROWS_INIT;
    int32_t status = h->logits(h->host_data, s->target, &logits);
    if (status < 0) return fail(s, status, "logits");
    status = h->process(h->host_data, logits.data + (logits.n - 1) * logits.width, 1, logits.width, NULL, 0,
                        &processed);
    if (status < 0) return fail(s, status, "process");
    s->pending = argmax(processed.data, processed.width);
    s->started = 1;
    status = h->commit(h->host_data, &s->pending, 1, NULL);
    return status < 0 ? fail(s, status, "commit") : DECOCTL_OK;
}

static int32_t lookup_step(void *state) {
    lookup_state *s = state;
    const decoctl_host *h = s->host;
    s->steps++;
    if (!s->started) return lookup_start(s);

    int64_t length = h->length(h->host_data, s->target);
    int64_t remaining = h->remaining(h->host_data);
    int64_t max_length = h->max_length(h->host_data);
    if (length < 0 || remaining < 0 || max_length < 0) return fail(s, DECOCTL_ERR_HOST, "length/remaining");
    int64_t max = s->k;
    if (max > remaining - 1) max = remaining - 1;
    if (max > max_length - length - 1) max = max_length - length - 1;
    if (max < 0) max = 0;

    context c = {s->source, NULL, s->n_source, 0, s->pending};
    int32_t status = h->tokens(h->host_data, s->target, &c.cached, &c.n_cached);
    if (status < 0) return fail(s, status, "tokens");
    int64_t *draft = s->feed + 1;
    int in_source;
    int64_t n_draft = find_draft(s, &c, draft, max, &in_source);
    s->from_source += n_draft > 0 && in_source;
    s->feed[0] = s->pending;

    decoctl_rows logits = DECOCTL_ROWS_INIT, processed = DECOCTL_ROWS_INIT;
    status = h->forward(h->host_data, s->target, s->feed, n_draft + 1, &logits);
    if (status < 0) return fail(s, status, "forward");
    s->forwards++;
    status = h->process(h->host_data, logits.data, logits.n, logits.width, draft, n_draft, &processed);
    if (status < 0) return fail(s, status, "process");
    int64_t accepted = 0;
    while (accepted < n_draft &&
           argmax(processed.data + accepted * processed.width, processed.width) == draft[accepted])
        accepted++;
    int64_t next = argmax(processed.data + accepted * processed.width, processed.width);
    s->drafted += n_draft;
    s->accepted += accepted;
    if (accepted < n_draft) {
        status = h->rewind(h->host_data, s->target, length + 1 + accepted);
        if (status < 0) return fail(s, status, "rewind");
    }
    draft[accepted] = next;
    status = h->commit(h->host_data, draft, accepted + 1, NULL);
    if (status < 0) return fail(s, status, "commit");
    s->pending = next;
    return DECOCTL_OK;
}

static int32_t lookup_reset(void *state) {
    lookup_state *s = state;
    s->started = 0;
    s->steps = s->forwards = s->drafted = s->accepted = s->from_source = 0;
    s->error[0] = '\0';
    return DECOCTL_OK;
}

static int32_t lookup_create(const decoctl_host *host, const char *config_json, void **out_state) {
    lookup_state *s = calloc(1, sizeof(*s));
    if (!s) return DECOCTL_ERR_FAILED;
    *out_state = s;
    s->host = host;
    s->k = json_int(config_json, "k", 4);
    s->ngram = json_int(config_json, "ngram", 2);
    s->feed = malloc((size_t)(s->k + 2) * sizeof(int64_t));
    if (!s->feed) return DECOCTL_ERR_FAILED;
    int32_t status = host->role(host->host_data, "target", &s->target);
    return status < 0 ? fail(s, status, "role(\"target\")") : DECOCTL_OK;
}

static void lookup_destroy(void *state) {
    lookup_state *s = state;
    if (s) free(s->feed);
    free(s);
}

static const char *lookup_last_error(void *state) {
    lookup_state *s = state;
    return s && s->error[0] ? s->error : NULL;
}

static const char *lookup_stats_json(void *state) {
    lookup_state *s = state;
    int used = snprintf(s->stats, sizeof(s->stats),
                        "{\"abi_minor\": %u, \"has_source_tokens\": %d, \"source_n\": %lld, \"source_null\": %d, "
                        "\"steps\": %lld, \"forwards\": %lld, \"drafted\": %lld, \"accepted\": %lld, "
                        "\"from_source\": %lld, \"source\": [",
                        s->host->abi_minor, s->has_source, (long long)s->n_source, s->source == NULL,
                        (long long)s->steps, (long long)s->forwards, (long long)s->drafted, (long long)s->accepted,
                        (long long)s->from_source);
    for (int64_t i = 0; i < s->n_source && i < SHOWN; i++)
        used += snprintf(s->stats + used, sizeof(s->stats) - (size_t)used, "%s%lld", i ? ", " : "",
                         (long long)s->source[i]);
    snprintf(s->stats + used, sizeof(s->stats) - (size_t)used, "]}");
    return s->stats;
}

static const decoctl_controller source_lookup = {
    .struct_size = sizeof(decoctl_controller),
    .name = "source_lookup",
    .summary = "greedy output, drafting by n-gram copy from the source and the output (C, ABI 1.4)",
    .roles = "target",
    .options_json = "["
                    "{\"name\": \"k\", \"type\": \"int\", \"default\": 4, \"minimum\": 1, \"maximum\": 64},"
                    "{\"name\": \"ngram\", \"type\": \"int\", \"default\": 2, \"minimum\": 1, \"maximum\": 16}"
                    "]",
    .create = lookup_create,
    .step = lookup_step,
    .destroy = lookup_destroy,
    .last_error = lookup_last_error,
    .reset = lookup_reset,
    .stats_json = lookup_stats_json,
};

static const decoctl_controller *const controllers[] = {&source_lookup};

DECOCTL_EXPORT const decoctl_plugin decoctl_plugin_entry = DECOCTL_PLUGIN(controllers);
