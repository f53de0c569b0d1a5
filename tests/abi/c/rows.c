/*
 * Test controllers for the rows and outputs of ABI 1.3 (fork, reorder, release, step_rows, the row_* functions,
 * new_output, commit_to, output_done, score, rank_outputs, process_outputs) and the descriptor's rows_for.
 *
 *   parallel_greedy  option "rows" (default 2): rows_for asks for that many rows; create forks row 0 into the
 *                    others, rewinds each fork by one token and feeds it again (row_rewind, row_forward), opens
 *                    one output per fork; each step commits every live row's greedy token to its output
 *                    (process_outputs over all rows at once) and feeds them all in one step_rows. Every output
 *                    must equal greedy. Checks each row's row_length and row_tokens after every step.
 *   beam             option "beams" (default 2): the whole beam search in one step, remaining() tokens long, no
 *                    EOS handling: scores are sums of log-softmax; the top "beams" of beams x vocabulary
 *                    candidates (the first of equal scores) continue through reorder and one step_rows; at the end
 *                    beam i is committed to an output of its own (row_tokens after the prompt), scored, the
 *                    outputs ranked by score and the forks released. The test runs the same search in Python.
 *   rows_misuse      option "case": one misuse of the row and output functions, whose status it returns; case
 *                    10 reads a step_rows output after its lifetime and says what it read in its error
 *
 * Built with -DAS_ABI_1_2 the descriptors' struct_size ends before rows_for and the entry says 1.2, as a library
 * built against the 1.2 header: the host must not read rows_for then (every role holds one row).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoctl.h"

#ifdef AS_ABI_1_2
#define DESCRIPTOR_SIZE offsetof(decoctl_controller, rows_for)
#else
#define DESCRIPTOR_SIZE sizeof(decoctl_controller)
#endif

#define MAX_ROWS 16

typedef struct rows_state {
    const decoctl_host *host; /* host-owned, valid until destroy */
    decoctl_role *target;     /* host-owned handle, valid until destroy */
    int64_t option;           /* rows, beams or case */
    int32_t rows[MAX_ROWS];   /* the row of each output, in output order */
    int32_t outputs[MAX_ROWS];
    int32_t n_rows;
    int64_t vocab;
    const float *pending;     /* the live rows' last logits: `first`, then step_rows' host-owned output */
    float *first;             /* plugin-owned: each row's logits after create, rows x vocabulary */
    char error[512];
} rows_state;

static const char *static_error = NULL; /* rows_for's message, read by last_error(NULL) */

static int64_t option(const char *config_json, const char *name, int64_t fallback) {
    char key[64];
    snprintf(key, sizeof(key), "\"%s\":", name);
    const char *at = strstr(config_json, key);
    return at ? strtoll(at + strlen(key), NULL, 10) : fallback;
}

static int32_t fail(rows_state *s, int32_t status, const char *what) {
    const char *detail = s->host->host_error(s->host->host_data);
    snprintf(s->error, sizeof(s->error), "%s returned %d: %s", what, status, detail ? detail : "no detail");
    return status;
}

static int32_t wrong(rows_state *s, const char *what, long long got, long long expected) {
    snprintf(s->error, sizeof(s->error), "%s is %lld, expected %lld", what, got, expected);
    return DECOCTL_ERR_FAILED;
}

#define CHECK(call, what)                            \
    do {                                             \
        int32_t status_ = (call);                    \
        if (status_ < 0) return fail(s, status_, what); \
    } while (0)

static int64_t argmax(const float *row, int64_t width) {
    int64_t best = 0;
    for (int64_t i = 1; i < width; i++)
        if (row[i] > row[best]) best = i; /* the first of equal maxima, as numpy's argmax */
    return best;
}

static int32_t rows_create(const decoctl_host *host, const char *config_json, void **out_state) {
    rows_state *s = calloc(1, sizeof(*s));
    if (!s) return DECOCTL_ERR_FAILED;
    *out_state = s;
    s->host = host;
    if (!DECOCTL_HAS(host, decoctl_host, process_outputs) || host->abi_minor < 3) {
        snprintf(s->error, sizeof(s->error), "the host speaks ABI 1.%u, without rows", host->abi_minor);
        return DECOCTL_ERR_CAPABILITY;
    }
    s->option = option(config_json, "rows", option(config_json, "beams", option(config_json, "case", 0)));
    CHECK(host->role(host->host_data, "target", &s->target), "role");
    return DECOCTL_OK;
}

static void rows_destroy(void *state) {
    rows_state *s = state;
    if (s) free(s->first);
    free(s);
}

static const char *rows_last_error(void *state) {
    rows_state *s = state;
    if (!s) return static_error;
    return s->error[0] ? s->error : NULL;
}

/* Row r must hold what row 0 held at create (length, tokens) plus `extra` more tokens, the last one `last`. */
static int32_t check_row(rows_state *s, int32_t row, int64_t length, int64_t last) {
    const decoctl_host *h = s->host;
    const int64_t *tokens;
    int64_t n;
    int64_t got = h->row_length(h->host_data, s->target, row);
    if (got < 0) return fail(s, (int32_t)got, "row_length");
    if (got != length) return wrong(s, "row_length", got, length);
    CHECK(h->row_tokens(h->host_data, s->target, row, &tokens, &n), "row_tokens");
    if (n != length) return wrong(s, "row_tokens' count", n, length);
    if (last >= 0 && tokens[n - 1] != last) return wrong(s, "a row's last token", tokens[n - 1], last);
    return DECOCTL_OK;
}

/* ---- parallel_greedy --------------------------------------------------------------------------------------- */

static int32_t parallel_create(const decoctl_host *host, const char *config_json, void **out_state) {
    int32_t status = rows_create(host, config_json, out_state);
    if (status < 0) return status;
    rows_state *s = *out_state;
    const decoctl_host *h = host;
    int64_t length = h->length(h->host_data, s->target);
    const int64_t *tokens;
    int64_t n, last;
    decoctl_rows logits = DECOCTL_ROWS_INIT;
    CHECK(h->tokens(h->host_data, s->target, &tokens, &n), "tokens");
    last = tokens[n - 1];
    if (s->option < 1 || s->option > MAX_ROWS) return wrong(s, "rows", s->option, 2);
    s->n_rows = (int32_t)s->option;
    s->rows[0] = 0;
    s->outputs[0] = 0;
    CHECK(h->row_logits(h->host_data, s->target, 0, &logits), "row_logits(0)");
    int64_t vocab = s->vocab = logits.width;
    s->first = malloc(sizeof(float) * (size_t)(vocab * s->n_rows));
    if (!s->first) return DECOCTL_ERR_FAILED;
    memcpy(s->first, logits.data + (logits.n - 1) * vocab, sizeof(float) * (size_t)vocab);
    for (int32_t i = 1; i < s->n_rows; i++) {
        decoctl_rows fed = DECOCTL_ROWS_INIT;
        CHECK(h->fork(h->host_data, s->target, 0, &s->rows[i]), "fork");
        if ((status = check_row(s, s->rows[i], length, last)) < 0) return status;
        /* the fork's last token again, recomputed on its own KV copy: its logits then are the fork's own */
        CHECK(h->row_rewind(h->host_data, s->target, s->rows[i], length - 1), "row_rewind");
        if ((status = check_row(s, s->rows[i], length - 1, -1)) < 0) return status;
        CHECK(h->row_forward(h->host_data, s->target, s->rows[i], &last, 1, &fed), "row_forward");
        if (fed.n != 1 || fed.width != vocab) return wrong(s, "row_forward's rows", fed.n, 1);
        memcpy(s->first + i * vocab, fed.data, sizeof(float) * (size_t)vocab);
        CHECK(h->new_output(h->host_data, &s->outputs[i]), "new_output");
        if (s->outputs[i] != i) return wrong(s, "new_output's index", s->outputs[i], i);
    }
    s->pending = s->first;
    return DECOCTL_OK;
}

static int32_t parallel_step(void *state) {
    rows_state *s = state;
    const decoctl_host *h = s->host;
    decoctl_rows processed = DECOCTL_ROWS_INIT, stepped = DECOCTL_ROWS_INIT;
    int32_t live = s->n_rows, going = 0, rows[MAX_ROWS], outputs[MAX_ROWS];
    int64_t tokens[MAX_ROWS], vocab = s->vocab;
    CHECK(h->process_outputs(h->host_data, s->pending, live, vocab, s->outputs, &processed), "process_outputs");
    for (int32_t i = 0; i < live; i++) {
        int64_t token = argmax(processed.data + i * vocab, vocab), taken;
        CHECK(h->commit_to(h->host_data, s->outputs[i], &token, 1, &taken), "commit_to");
        int32_t done = h->output_done(h->host_data, s->outputs[i]);
        if (done < 0) return fail(s, done, "output_done");
        if (!done) {
            rows[going] = s->rows[i];
            outputs[going] = s->outputs[i];
            tokens[going++] = token;
        }
    }
    if (going == 0) return DECOCTL_OK;
    int64_t before[MAX_ROWS];
    for (int32_t i = 0; i < going; i++) before[i] = h->row_length(h->host_data, s->target, rows[i]);
    CHECK(h->step_rows(h->host_data, s->target, rows, tokens, going, &stepped), "step_rows");
    if (stepped.n != going || stepped.width != vocab) return wrong(s, "step_rows' rows", stepped.n, going);
    for (int32_t i = 0; i < going; i++) {
        int32_t status = check_row(s, rows[i], before[i] + 1, tokens[i]);
        if (status < 0) return status;
        s->rows[i] = rows[i];
        s->outputs[i] = outputs[i];
    }
    s->n_rows = going;
    s->pending = stepped.data; /* valid until the role's next change: the next step reads it first */
    return DECOCTL_OK;
}

static int32_t parallel_rows_for(const char *config_json) { return (int32_t)option(config_json, "rows", 2); }

/* ---- beam -------------------------------------------------------------------------------------------------- */

typedef struct candidate {
    double score;
    int64_t index; /* beam * vocab + token */
} candidate;

/* Keep the best `k` candidates in best[0..k-1], best first; of equal scores the lower index first. */
static void offer(candidate *best, int32_t k, double score, int64_t index) {
    if (score <= best[k - 1].score) return; /* a later index never displaces an equal score */
    int32_t at = k - 1;
    while (at > 0 && score > best[at - 1].score) {
        best[at] = best[at - 1];
        at--;
    }
    best[at].score = score;
    best[at].index = index;
}

static int32_t beam_step(void *state) {
    rows_state *s = state;
    const decoctl_host *h = s->host;
    int32_t beams = (int32_t)s->option, rows[MAX_ROWS], parents[MAX_ROWS], order[MAX_ROWS];
    double scores[MAX_ROWS];
    candidate best[MAX_ROWS];
    int64_t chosen[MAX_ROWS];
    decoctl_rows logits = DECOCTL_ROWS_INIT;
    if (beams < 1 || beams > MAX_ROWS) return wrong(s, "beams", beams, 2);
    int64_t prompt = h->length(h->host_data, s->target), steps = h->remaining(h->host_data);
    CHECK(h->logits(h->host_data, s->target, &logits), "logits");
    int64_t vocab = logits.width;
    const float *current = logits.data + (logits.n - 1) * vocab; /* beam 0's row; the forks' rows are equal */
    int64_t stride = 0; /* every beam reads row 0 until the first step_rows */
    rows[0] = 0;
    scores[0] = 0.0;
    for (int32_t b = 1; b < beams; b++) {
        CHECK(h->fork(h->host_data, s->target, 0, &rows[b]), "fork");
        if (rows[b] != b) return wrong(s, "a fork's row id", rows[b], b);
        scores[b] = -INFINITY;
    }
    for (int64_t t = 0; t < steps; t++) {
        for (int32_t k = 0; k < beams; k++) best[k] = (candidate){-INFINITY, -1};
        for (int32_t b = 0; b < beams; b++) {
            if (scores[b] == -INFINITY) continue;
            const float *row = current + b * stride;
            double top = row[0], sum = 0.0;
            for (int64_t v = 1; v < vocab; v++)
                if (row[v] > top) top = row[v];
            for (int64_t v = 0; v < vocab; v++) sum += exp((double)row[v] - top);
            double norm = top + log(sum);
            for (int64_t v = 0; v < vocab; v++) offer(best, beams, scores[b] + ((double)row[v] - norm), b * vocab + v);
        }
        for (int32_t k = 0; k < beams; k++) {
            parents[k] = (int32_t)(best[k].index / vocab);
            chosen[k] = best[k].index % vocab;
            scores[k] = best[k].score;
        }
        /* row k continues beam parents[k], then takes its token: one Run for every beam */
        CHECK(h->reorder(h->host_data, s->target, parents, beams), "reorder");
        CHECK(h->step_rows(h->host_data, s->target, rows, chosen, beams, &logits), "step_rows");
        current = logits.data;
        stride = vocab;
    }
    for (int32_t b = 0; b < beams; b++) {
        const int64_t *tokens;
        int64_t n, taken;
        int32_t status = check_row(s, b, prompt + steps, chosen[b]);
        if (status < 0) return status;
        if (b > 0) CHECK(h->new_output(h->host_data, &s->outputs[b]), "new_output");
        CHECK(h->row_tokens(h->host_data, s->target, b, &tokens, &n), "row_tokens");
        CHECK(h->commit_to(h->host_data, s->outputs[b], tokens + prompt, n - prompt, &taken), "commit_to");
        CHECK(h->score(h->host_data, s->outputs[b], scores[b]), "score");
        order[b] = b;
    }
    /* best first: the beams are already in score order; rank them backwards and back to test the renumbering */
    for (int32_t b = 0; b < beams; b++) order[b] = beams - 1 - b;
    CHECK(h->rank_outputs(h->host_data, order, beams), "rank_outputs");
    CHECK(h->rank_outputs(h->host_data, order, beams), "rank_outputs");
    for (int32_t b = 1; b < beams; b++) CHECK(h->release(h->host_data, s->target, b), "release");
    for (int32_t b = 0; b < beams; b++) {
        int32_t done = h->output_done(h->host_data, b);
        if (done != 1) return wrong(s, "output_done after the whole search", done, 1);
    }
    return DECOCTL_OK;
}

static int32_t beam_rows_for(const char *config_json) { return (int32_t)option(config_json, "beams", 2); }

/* ---- rows_misuse ------------------------------------------------------------------------------------------- */

static int32_t misuse_step(void *state) {
    rows_state *s = state;
    const decoctl_host *h = s->host;
    int32_t row, none = 5, output;
    int64_t token = 1;
    switch (s->option) {
    case 0: /* a second row, with rows_for 1 */
        return h->fork(h->host_data, s->target, 0, &row);
    case 1: /* row 0 is the role itself */
        return h->release(h->host_data, s->target, 0);
    case 2: /* nothing to step */
        return h->step_rows(h->host_data, s->target, &none, &token, 0, NULL);
    case 3: /* a parent that is not live */
        return h->reorder(h->host_data, s->target, &none, 1);
    case 4: /* a row that is not live */
        return (int32_t)h->row_length(h->host_data, s->target, none);
    case 5: /* an output that does not exist */
        return h->commit_to(h->host_data, 3, &token, 1, NULL);
    case 6: /* one row named twice in a step */
        CHECK(h->fork(h->host_data, s->target, 0, &row), "fork");
        {
            int32_t twice[2] = {row, row};
            int64_t tokens[2] = {1, 2};
            return h->step_rows(h->host_data, s->target, twice, tokens, 2, NULL);
        }
    case 7: /* new_output, then a row_logits of a fresh fork (no logits yet) */
        CHECK(h->new_output(h->host_data, &output), "new_output");
        CHECK(h->fork(h->host_data, s->target, 0, &row), "fork");
        {
            decoctl_rows logits = DECOCTL_ROWS_INIT;
            return h->row_logits(h->host_data, s->target, row, &logits);
        }
    case 10: /* read a step_rows output after its lifetime (a row_rewind): NaN in debug mode */
    {
        decoctl_rows out = DECOCTL_ROWS_INIT;
        int32_t both[2] = {0, 0};
        int64_t tokens[2] = {1, 1};
        CHECK(h->fork(h->host_data, s->target, 0, &both[1]), "fork");
        CHECK(h->step_rows(h->host_data, s->target, both, tokens, 2, &out), "step_rows");
        const float *kept = out.data;
        int64_t length = h->row_length(h->host_data, s->target, both[1]);
        CHECK(h->row_rewind(h->host_data, s->target, both[1], length - 1), "row_rewind");
        snprintf(s->error, sizeof(s->error), "a stale step_rows output reads %s", isnan(kept[0]) ? "NaN" : "a number");
        return DECOCTL_ERR_FAILED;
    }
    case 11: /* process_outputs for an output that does not exist (no processor configured) */
    {
        decoctl_rows logits = DECOCTL_ROWS_INIT, processed = DECOCTL_ROWS_INIT;
        int32_t missing = 4;
        CHECK(h->logits(h->host_data, s->target, &logits), "logits");
        return h->process_outputs(h->host_data, logits.data, 1, logits.width, &missing, &processed);
    }
    default:
        return wrong(s, "case", s->option, 0);
    }
}

static int32_t misuse_rows_for(const char *config_json) {
    int64_t which = option(config_json, "case", 0);
    if (which == 8) {
        static_error = "case 8: rows_for refuses these options";
        return DECOCTL_ERR_FAILED;
    }
    if (which == 9) return 0; /* no row count: a broken contract */
    return which == 0 ? 1 : 2;
}

static const decoctl_controller parallel_greedy = {
    .struct_size = DESCRIPTOR_SIZE,
    .name = "parallel_greedy",
    .summary = "greedy on several forked rows, one output each",
    .options_json = "[{\"name\": \"rows\", \"type\": \"int\", \"default\": 2, \"minimum\": 1, \"maximum\": 16}]",
    .create = parallel_create,
    .step = parallel_step,
    .destroy = rows_destroy,
    .last_error = rows_last_error,
    .rows_for = parallel_rows_for,
};

static const decoctl_controller beam = {
    .struct_size = DESCRIPTOR_SIZE,
    .name = "beam",
    .summary = "a fixed-length beam search in one step",
    .options_json = "[{\"name\": \"beams\", \"type\": \"int\", \"default\": 2, \"minimum\": 1, \"maximum\": 16}]",
    .create = rows_create,
    .step = beam_step,
    .destroy = rows_destroy,
    .last_error = rows_last_error,
    .rows_for = beam_rows_for,
};

static const decoctl_controller rows_misuse = {
    .struct_size = DESCRIPTOR_SIZE,
    .name = "rows_misuse",
    .options_json = "[{\"name\": \"case\", \"type\": \"int\", \"default\": 0}]",
    .create = rows_create,
    .step = misuse_step,
    .destroy = rows_destroy,
    .last_error = rows_last_error,
    .rows_for = misuse_rows_for,
};

static const decoctl_controller *const controllers[] = {&parallel_greedy, &beam, &rows_misuse};

#ifdef AS_ABI_1_2
DECOCTL_EXPORT const decoctl_plugin decoctl_plugin_entry = {sizeof(decoctl_plugin), DECOCTL_ABI_MAJOR, 2, 3,
                                                            controllers};
#else
DECOCTL_EXPORT const decoctl_plugin decoctl_plugin_entry = DECOCTL_PLUGIN(controllers);
#endif
