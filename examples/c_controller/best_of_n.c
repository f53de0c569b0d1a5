/*
 * best_of_n.c: best-of-n greedy over the n most likely first tokens, with the rows and outputs of ABI 1.3.
 *
 * After the prompt, the target's row 0 is forked into n rows (their KV cache copied, not recomputed) and each row
 * gets a completion of its own (new_output). Row i starts with the i-th most likely first token of the prompt's
 * last logits row after the generation's logits chain (process; of equal values the lower id first), then
 * continues greedily: every step commits each unfinished row's token to its output (commit_to) and feeds those
 * tokens to all unfinished rows in ONE run of the model (step_rows), the chain applied per row on that row's own
 * completion (process_outputs). A row stops when its output does (output_done: EOS, max_new_tokens, a stop
 * string) and is released. Each completion is scored by the mean log-probability of its tokens under the
 * processed distribution they were picked from (score); once all are done the completions are ranked best
 * first (rank_outputs; of equal scores the more likely first token first).
 *
 * Option (config_json): {"n": 3}; the descriptor's rows_for asks for n rows.
 *   make && decoctl generate -c ./build/libbest_of_n.so -o n=3 "def parse(line):"
 *
 * Written against decoctl.h alone. Ownership: the host table, role handle, logits and processed rows are
 * host-owned (read, never written or freed); each host-owned row is read at once, before the next call that
 * could end its lifetime. The state is plugin-owned, freed in destroy.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoctl.h"

#define DEFAULT_N 3
#define MAX_N 64 /* the schema's maximum: the state's arrays are this long */

typedef struct best_of_n_state {
    const decoctl_host *host; /* host-owned, valid until destroy */
    decoctl_role *target;     /* host-owned handle, valid until destroy */
    int32_t n;                /* completions (rows) */
    int32_t live;             /* unfinished completions: their candidate indices are going[0..live-1] */
    int32_t going[MAX_N];
    /* per candidate k (0..n-1, the k-th most likely first token): */
    int32_t rows[MAX_N];    /* its row of the target */
    int32_t outputs[MAX_N]; /* its output (completion) */
    int64_t next[MAX_N];    /* the token it commits next */
    double next_logprob[MAX_N];
    double logprob[MAX_N]; /* sum of the log-probabilities of its committed tokens */
    int64_t taken[MAX_N];  /* tokens committed to it */
    int64_t vocab;
    int64_t steps, batched_rows; /* counters for stats_json */
    char error[512];
    char stats[128];
} best_of_n_state;

/* last_error(NULL): why rows_for failed on this thread (rows_for may run on several threads at once) or why
 * create could not allocate its state. Points at a string literal, never freed. */
static _Thread_local const char *no_state_error = NULL;

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

/* n from the options, or -1 when it is out of range (the host checks the schema first; this is a safety net). */
static int32_t option_n(const char *config_json) {
    int64_t n = json_int(config_json, "n", DEFAULT_N);
    return n >= 1 && n <= MAX_N ? (int32_t)n : -1;
}

static int32_t fail(best_of_n_state *s, int32_t status, const char *what) {
    const char *detail = s->host->host_error(s->host->host_data);
    snprintf(s->error, sizeof(s->error), "%s failed (%d): %s", what, status, detail ? detail : "no detail");
    return status; /* a host error is raised again in Python anyway: pass the status on */
}

#define CHECK(call, what)                                 \
    do {                                                  \
        int32_t status_ = (call);                         \
        if (status_ < 0) return fail(s, status_, what);   \
    } while (0)

static int64_t argmax(const float *row, int64_t width) {
    int64_t best = 0;
    for (int64_t i = 1; i < width; i++)
        if (row[i] > row[best]) best = i; /* the first of equal maxima, as numpy's argmax */
    return best;
}

/* log softmax(row)[token], in double. */
static double logprob(const float *row, int64_t width, int64_t token) {
    double top = row[argmax(row, width)], sum = 0.0;
    for (int64_t i = 0; i < width; i++) sum += exp((double)row[i] - top);
    return (double)row[token] - top - log(sum);
}

/* The n largest entries of row, largest first, in best[0..n-1]; of equal values the lower id first. */
static void top_n(const float *row, int64_t width, int32_t n, int64_t *best) {
    int32_t filled = 0;
    for (int64_t t = 0; t < width; t++) {
        if (filled == n && !(row[t] > row[best[n - 1]])) continue; /* a later id never displaces an equal value */
        int32_t at = filled < n ? filled++ : n - 1;
        while (at > 0 && row[t] > row[best[at - 1]]) {
            best[at] = best[at - 1];
            at--;
        }
        best[at] = t;
    }
}

static double mean_logprob(const best_of_n_state *s, int32_t k) {
    return s->taken[k] ? s->logprob[k] / (double)s->taken[k] : 0.0;
}

static int32_t best_of_n_create(const decoctl_host *host, const char *config_json, void **out_state) {
    best_of_n_state *s = calloc(1, sizeof(*s));
    if (!s) {
        no_state_error = "best_of_n: out of memory for the controller's state";
        return DECOCTL_ERR_FAILED;
    }
    *out_state = s; /* set before any failure, so that last_error and destroy see it */
    s->host = host;
    const decoctl_host *h = host;
    if (!DECOCTL_HAS(h, decoctl_host, process_outputs)) {
        snprintf(s->error, sizeof(s->error), "best_of_n needs rows and outputs (ABI 1.3); the host speaks ABI %u.%u",
                 h->abi_major, h->abi_minor);
        return DECOCTL_ERR_CAPABILITY;
    }
    if ((s->n = option_n(config_json)) < 0) {
        snprintf(s->error, sizeof(s->error), "option n must be from 1 to %d", MAX_N);
        return DECOCTL_ERR_FAILED;
    }
    CHECK(h->role(h->host_data, "target", &s->target), "role(\"target\")");

    /* the prompt's last row through the logits chain: conditioned on output 0, empty like every output now */
    decoctl_rows logits = DECOCTL_ROWS_INIT, processed = DECOCTL_ROWS_INIT;
    CHECK(h->logits(h->host_data, s->target, &logits), "logits");
    s->vocab = logits.width;
    if (s->n > s->vocab) {
        snprintf(s->error, sizeof(s->error), "n=%d is more than the vocabulary (%lld tokens)", s->n,
                 (long long)s->vocab);
        return DECOCTL_ERR_FAILED;
    }
    const float *last = logits.data + (logits.n - 1) * logits.width; /* host-owned, until the target changes */
    CHECK(h->process(h->host_data, last, 1, s->vocab, NULL, 0, &processed), "process");
    /* processed.data: host-owned until the next process call; read it all now */
    top_n(processed.data, s->vocab, s->n, s->next);
    for (int32_t k = 0; k < s->n; k++) {
        if (isinf(processed.data[s->next[k]]) && processed.data[s->next[k]] < 0) {
            snprintf(s->error, sizeof(s->error),
                     "the logits chain leaves only %d possible first tokens, fewer than n=%d: lower n", k, s->n);
            return DECOCTL_ERR_FAILED;
        }
        s->next_logprob[k] = logprob(processed.data, s->vocab, s->next[k]);
    }

    /* row 0 and output 0 are the first candidate's; the others fork row 0 (the prompt, KV copied) */
    s->rows[0] = 0;
    s->outputs[0] = 0;
    for (int32_t k = 1; k < s->n; k++) {
        CHECK(h->fork(h->host_data, s->target, 0, &s->rows[k]), "fork");
        CHECK(h->new_output(h->host_data, &s->outputs[k]), "new_output");
    }
    for (int32_t k = 0; k < s->n; k++) s->going[k] = k;
    s->live = s->n;
    return DECOCTL_OK;
}

/* All outputs are done: rank them by mean log-probability, best first (stable: of equal scores the candidate
 * with the more likely first token first). */
static int32_t rank(best_of_n_state *s) {
    const decoctl_host *h = s->host;
    int32_t order[MAX_N];
    for (int32_t k = 0; k < s->n; k++) {
        int32_t at = k;
        while (at > 0 && mean_logprob(s, k) > mean_logprob(s, order[at - 1])) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = k;
    }
    for (int32_t i = 0; i < s->n; i++) order[i] = s->outputs[order[i]];
    CHECK(h->rank_outputs(h->host_data, order, s->n), "rank_outputs");
    return DECOCTL_OK;
}

/* One step: commit each unfinished candidate's next token to its output, retire the finished ones, then feed the
 * others' tokens in one step_rows and pick their next tokens. */
static int32_t best_of_n_step(void *state) {
    best_of_n_state *s = state;
    const decoctl_host *h = s->host;
    int32_t feed_rows[MAX_N], feed_outputs[MAX_N], still = 0;
    int64_t feed_tokens[MAX_N];
    for (int32_t i = 0; i < s->live; i++) {
        int32_t k = s->going[i];
        int64_t taken = 0;
        CHECK(h->commit_to(h->host_data, s->outputs[k], &s->next[k], 1, &taken), "commit_to");
        if (taken == 1) {
            s->logprob[k] += s->next_logprob[k];
            s->taken[k]++;
        }
        int32_t done = h->output_done(h->host_data, s->outputs[k]);
        if (done < 0) return fail(s, done, "output_done");
        if (done) {
            CHECK(h->score(h->host_data, s->outputs[k], mean_logprob(s, k)), "score");
            if (s->rows[k] != 0) CHECK(h->release(h->host_data, s->target, s->rows[k]), "release");
            continue;
        }
        s->going[still] = k; /* still <= i: compacting in place */
        feed_rows[still] = s->rows[k];
        feed_outputs[still] = s->outputs[k];
        feed_tokens[still++] = s->next[k];
    }
    s->live = still;
    if (still == 0) return rank(s);

    decoctl_rows logits = DECOCTL_ROWS_INIT, processed = DECOCTL_ROWS_INIT;
    CHECK(h->step_rows(h->host_data, s->target, feed_rows, feed_tokens, still, &logits), "step_rows");
    if (logits.n != still || logits.width != s->vocab) {
        snprintf(s->error, sizeof(s->error), "step_rows gave %lld rows of %lld, expected %d of %lld",
                 (long long)logits.n, (long long)logits.width, still, (long long)s->vocab);
        return DECOCTL_ERR_FAILED;
    }
    s->steps++;
    s->batched_rows += still;
    /* row i conditioned on its own completion; logits (host-owned) are read now, processed before the next call */
    CHECK(h->process_outputs(h->host_data, logits.data, still, s->vocab, feed_outputs, &processed), "process_outputs");
    for (int32_t i = 0; i < still; i++) {
        const float *row = processed.data + i * s->vocab;
        int32_t k = s->going[i];
        s->next[k] = argmax(row, s->vocab);
        s->next_logprob[k] = logprob(row, s->vocab, s->next[k]);
    }
    return DECOCTL_OK;
}

static void best_of_n_destroy(void *state) { free(state); }

static const char *best_of_n_last_error(void *state) {
    best_of_n_state *s = state;
    if (!s) return no_state_error;
    return s->error[0] ? s->error : NULL;
}

static const char *best_of_n_stats_json(void *state) {
    best_of_n_state *s = state;
    if (!s) return NULL;
    snprintf(s->stats, sizeof(s->stats), "{\"n\": %d, \"batched_steps\": %lld, \"batched_rows\": %lld}", s->n,
             (long long)s->steps, (long long)s->batched_rows);
    return s->stats;
}

/* [thread-safe]: a pure function of config_json (no_state_error is per thread and points at a literal). */
static int32_t best_of_n_rows_for(const char *config_json) {
    int32_t n = option_n(config_json);
    if (n < 0) {
        no_state_error = "best_of_n: option n must be from 1 to 64";
        return DECOCTL_ERR_FAILED;
    }
    return n;
}

static const decoctl_controller best_of_n = {
    .struct_size = sizeof(decoctl_controller),
    .name = "best_of_n",
    .summary = "greedy from each of the n most likely first tokens on forked rows, ranked by mean log-probability (C)",
    .roles = "target",
    .options_json = "[{\"name\": \"n\", \"type\": \"int\", \"default\": 3, \"minimum\": 1, \"maximum\": 64,"
                    " \"help\": \"completions: one per most likely first token\"}]",
    .create = best_of_n_create,
    .step = best_of_n_step,
    .destroy = best_of_n_destroy,
    .last_error = best_of_n_last_error,
    .reset = NULL,
    .stats_json = best_of_n_stats_json,
    .rows_for = best_of_n_rows_for,
};

static const decoctl_controller *const controllers[] = {&best_of_n};

DECOCTL_EXPORT const decoctl_plugin decoctl_plugin_entry = DECOCTL_PLUGIN(controllers);
