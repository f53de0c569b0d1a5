/*
 * prompt_lookup.c: prompt-lookup decoding as a C controller. Greedy output, fewer target forwards.
 *
 * Each step drafts up to k tokens by n-gram copy: find the latest earlier place where the context (prompt and
 * output so far) ends with the same n tokens as now (n from `ngram` down to 1) and propose the tokens that
 * followed it. One target forward over [last, d1..dk] verifies them all: the longest prefix of the draft that
 * greedy would have produced is accepted, plus the target's own token after it, and the target is rewound to
 * what was accepted. Output is token for token greedy's; on repetitive text (code, lists, quoting the prompt)
 * several tokens land per forward.
 *
 * Invariant between steps: the target's KV cache holds the prompt and every committed token but the last one,
 * `pending`, which the next step feeds first.
 *
 * Options (config_json): {"k": 8, "ngram": 3}.
 *   decoctl generate --controller ./build/libprompt_lookup.so:prompt_lookup -o k=8 -o ngram=3 "..."
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoctl.h"

#define DEFAULT_K 8
#define DEFAULT_NGRAM 3

typedef struct lookup_state {
    const decoctl_host *host; /* host-owned, valid until destroy */
    decoctl_role *target;     /* host-owned handle, valid until destroy */
    int64_t k, ngram;
    int started;     /* the first token (from the prompt's logits) is committed */
    int64_t pending; /* the last committed token, not yet in the target's KV cache */
    int64_t *feed;   /* k + 2 tokens: pending, the draft, and room for the token after it */
    int64_t steps, forwards, drafted, accepted;
    char error[256];
    char stats[256];
} lookup_state;

/* The integer value of "key" in a flat JSON object, or fallback. Enough for the host's config_json, which is
 * always a flat object of the declared options; a real plugin would use a JSON library. */
static int64_t json_int(const char *json, const char *key, int64_t fallback) {
    char quoted[64];
    snprintf(quoted, sizeof(quoted), "\"%s\"", key);
    const char *at = json ? strstr(json, quoted) : NULL;
    if (!at) return fallback;
    at += strlen(quoted);
    while (*at == ' ' || *at == '\t' || *at == '\n' || *at == '\r') at++;
    if (*at != ':') return fallback;
    char *end;
    long long value = strtoll(at + 1, &end, 10);
    return end == at + 1 ? fallback : (int64_t)value;
}

static int64_t argmax(const float *row, int64_t width) {
    int64_t best = 0;
    for (int64_t i = 1; i < width; i++)
        if (row[i] > row[best]) best = i; /* the first of equal maxima, as numpy's argmax */
    return best;
}

static int32_t fail(lookup_state *s, int32_t status, const char *what) {
    const char *detail = s->host->host_error(s->host->host_data);
    snprintf(s->error, sizeof(s->error), "%s failed (%d): %s", what, status, detail ? detail : "no detail");
    return status;
}

/* Context position i: the KV cache's tokens, then pending. */
static int64_t at(const int64_t *cached, int64_t n_cached, int64_t pending, int64_t i) {
    return i < n_cached ? cached[i] : pending;
}

/* Fill draft[0..] with up to max tokens copied after the latest earlier occurrence of the context's last g
 * tokens (g from ngram down to 1); return how many. */
static int64_t find_draft(const lookup_state *s, const int64_t *cached, int64_t n_cached, int64_t *draft,
                          int64_t max) {
    int64_t length = n_cached + 1;
    for (int64_t g = s->ngram < length - 1 ? s->ngram : length - 1; g >= 1 && max > 0; g--) {
        for (int64_t start = length - g - 1; start >= 0; start--) {
            int64_t i = 0;
            while (i < g && at(cached, n_cached, s->pending, start + i) ==
                                at(cached, n_cached, s->pending, length - g + i))
                i++;
            if (i < g) continue;
            int64_t n = 0;
            for (int64_t j = start + g; j < length && n < max; j++)
                draft[n++] = at(cached, n_cached, s->pending, j);
            return n;
        }
    }
    return 0;
}

static int32_t lookup_first_token(lookup_state *s) {
    const decoctl_host *h = s->host;
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
    if (!s->started) return lookup_first_token(s);

    int64_t length = h->length(h->host_data, s->target);
    if (length < 0) return fail(s, (int32_t)length, "length");
    int64_t remaining = h->remaining(h->host_data);
    if (remaining < 0) return fail(s, (int32_t)remaining, "remaining");
    int64_t max_length = h->max_length(h->host_data);
    if (max_length < 0) return fail(s, (int32_t)max_length, "max_length");
    int64_t room = max_length - length - 1; /* positions left for drafts once pending is fed */
    int64_t max = s->k;
    if (max > remaining - 1) max = remaining - 1; /* accepted drafts plus one token must fit in remaining */
    if (max > room) max = room;
    if (max < 0) max = 0;

    const int64_t *cached;
    int64_t n_cached;
    int32_t status = h->tokens(h->host_data, s->target, &cached, &n_cached);
    if (status < 0) return fail(s, status, "tokens");
    int64_t *draft = s->feed + 1;
    int64_t n_draft = find_draft(s, cached, n_cached, draft, max);
    s->feed[0] = s->pending;

    decoctl_rows logits = DECOCTL_ROWS_INIT, processed = DECOCTL_ROWS_INIT;
    status = h->forward(h->host_data, s->target, s->feed, n_draft + 1, &logits);
    if (status < 0) return fail(s, status, "forward");
    s->forwards++;
    /* row i is conditioned on the output plus draft[0..i-1]: the processors see what greedy would have seen */
    status = h->process(h->host_data, logits.data, logits.n, logits.width, draft, n_draft, &processed);
    if (status < 0) return fail(s, status, "process");

    int64_t accepted = 0;
    while (accepted < n_draft && argmax(processed.data + accepted * processed.width, processed.width) ==
                                     draft[accepted])
        accepted++;
    int64_t next = argmax(processed.data + accepted * processed.width, processed.width);
    s->drafted += n_draft;
    s->accepted += accepted;

    /* drop the rejected drafts from the KV cache: keep pending and the accepted ones */
    if (accepted < n_draft) {
        status = h->rewind(h->host_data, s->target, length + 1 + accepted);
        if (status < 0) return fail(s, status, "rewind");
    }
    draft[accepted] = next; /* commit the accepted drafts and the target's own next token in one call */
    status = h->commit(h->host_data, draft, accepted + 1, NULL);
    if (status < 0) return fail(s, status, "commit");
    s->pending = next;
    return DECOCTL_OK;
}

static int32_t lookup_reset(void *state) {
    lookup_state *s = state;
    s->started = 0;
    s->steps = s->forwards = s->drafted = s->accepted = 0;
    s->error[0] = '\0';
    return DECOCTL_OK;
}

static int32_t lookup_create(const decoctl_host *host, const char *config_json, void **out_state) {
    lookup_state *s = calloc(1, sizeof(*s));
    if (!s) return DECOCTL_ERR_FAILED;
    *out_state = s;
    s->host = host;
    s->k = json_int(config_json, "k", DEFAULT_K);
    s->ngram = json_int(config_json, "ngram", DEFAULT_NGRAM);
    if (s->k < 1 || s->ngram < 1) {
        snprintf(s->error, sizeof(s->error), "k (%lld) and ngram (%lld) must be at least 1", (long long)s->k,
                 (long long)s->ngram);
        return DECOCTL_ERR_FAILED;
    }
    s->feed = malloc((size_t)(s->k + 2) * sizeof(int64_t));
    if (!s->feed) {
        snprintf(s->error, sizeof(s->error), "out of memory for k = %lld", (long long)s->k);
        return DECOCTL_ERR_FAILED;
    }
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
    snprintf(s->stats, sizeof(s->stats),
             "{\"k\": %lld, \"ngram\": %lld, \"steps\": %lld, \"forwards\": %lld, \"drafted\": %lld, "
             "\"accepted\": %lld}",
             (long long)s->k, (long long)s->ngram, (long long)s->steps, (long long)s->forwards,
             (long long)s->drafted, (long long)s->accepted);
    return s->stats;
}

static const decoctl_controller prompt_lookup = {
    .struct_size = sizeof(decoctl_controller),
    .name = "prompt_lookup",
    .summary = "greedy output, drafting k tokens per forward by n-gram copy from the context (C)",
    .roles = "target",
    .options_json = "["
                    "{\"name\": \"k\", \"type\": \"int\", \"default\": 8, \"minimum\": 1, \"maximum\": 64,"
                    " \"help\": \"tokens drafted per target forward\"},"
                    "{\"name\": \"ngram\", \"type\": \"int\", \"default\": 3, \"minimum\": 1, \"maximum\": 16,"
                    " \"help\": \"longest n-gram matched against the context\"}"
                    "]",
    .create = lookup_create,
    .step = lookup_step,
    .destroy = lookup_destroy,
    .last_error = lookup_last_error,
    .reset = lookup_reset,
    .stats_json = lookup_stats_json,
};

static const decoctl_controller *const controllers[] = {&prompt_lookup};

DECOCTL_EXPORT const decoctl_plugin decoctl_plugin_entry = DECOCTL_PLUGIN(controllers);
