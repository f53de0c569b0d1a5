/*
 * Purpose-built controllers for the bridge's tests: each one probes a primitive or breaks one rule.
 *
 * Built several times with one -D flag each to break the entry itself:
 *   -DNO_ENTRY          exports no decoctl_plugin_entry
 *   -DWRONG_MAJOR       claims ABI major 99
 *   -DSMALL_ENTRY       entry struct_size too small
 *   -DSMALL_CONTROLLER  a controller whose struct_size is too small
 *   -DNULL_STEP         a controller whose required step is NULL
 * Without a flag it exports every controller below, all of them well-formed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoctl.h"

typedef struct probe {
    const decoctl_host *host;
    decoctl_role *target;
    int64_t steps;
    const float *kept_logits; /* stale_rows: a logits row and a hidden-state row kept past their lifetime */
    const float *kept_hidden;
    int64_t kept_logits_width;
    int64_t kept_hidden_width;
    char error[512];
    char stats[1024];
} probe;

static int32_t fail(probe *p, int32_t status, const char *what) {
    const char *detail = p->host->host_error(p->host->host_data);
    snprintf(p->error, sizeof(p->error), "%s returned %d: %s", what, status, detail ? detail : "no detail");
    return status;
}

static int32_t probe_create(const decoctl_host *host, const char *config_json, void **out_state) {
    (void)config_json;
    probe *p = calloc(1, sizeof(*p));
    if (!p) return DECOCTL_ERR_FAILED;
    p->host = host;
    *out_state = p;
    int32_t status = host->role(host->host_data, "target", &p->target);
    return status < 0 ? fail(p, status, "role") : DECOCTL_OK;
}

static void probe_destroy(void *state) { free(state); }

static const char *probe_last_error(void *state) {
    probe *p = state;
    return p && p->error[0] ? p->error : NULL;
}

static const char *probe_stats(void *state) {
    probe *p = state;
    return p->stats[0] ? p->stats : NULL;
}

static int64_t argmax(const float *row, int64_t width) {
    int64_t best = 0;
    for (int64_t i = 1; i < width; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

/* One greedy step: commit the argmax and feed it back. */
static int32_t greedy_once(probe *p) {
    const decoctl_host *h = p->host;
    decoctl_rows rows = DECOCTL_ROWS_INIT;
    int32_t status = h->logits(h->host_data, p->target, &rows);
    if (status < 0) return fail(p, status, "logits");
    int64_t token = argmax(rows.data + (rows.n - 1) * rows.width, rows.width);
    status = h->commit(h->host_data, &token, 1, NULL);
    if (status < 0) return fail(p, status, "commit");
    if (h->done(h->host_data)) return DECOCTL_OK;
    status = h->forward(h->host_data, p->target, &token, 1, NULL);
    return status < 0 ? fail(p, status, "forward") : DECOCTL_OK;
}

/* probe: greedy, recording what every query primitive answers (as stats_json). */
static int32_t probe_step(void *state) {
    probe *p = state;
    const decoctl_host *h = p->host;
    decoctl_rows logits = DECOCTL_ROWS_INIT, hidden = DECOCTL_ROWS_INIT;
    const int64_t *tokens;
    int64_t n_tokens;
    double u1, u2;
    int32_t status;
    if ((status = h->logits(h->host_data, p->target, &logits)) < 0) return fail(p, status, "logits");
    if ((status = h->hidden_states(h->host_data, p->target, NULL, &hidden)) < 0) return fail(p, status, "hidden");
    if ((status = h->tokens(h->host_data, p->target, &tokens, &n_tokens)) < 0) return fail(p, status, "tokens");
    if ((status = h->uniform(h->host_data, &u1)) < 0 || (status = h->uniform(h->host_data, &u2)) < 0)
        return fail(p, status, "uniform");
    if ((status = h->log_message(h->host_data, DECOCTL_LOG_WARNING, "hello from C")) < 0)
        return fail(p, status, "log_message");
    snprintf(p->stats, sizeof(p->stats),
             "{\"abi_major\": %u, \"host_struct_size\": %u, \"length\": %lld, \"n_tokens\": %lld, "
             "\"first_token\": %lld, \"last_token\": %lld, \"tokens_ptr\": %llu, \"logits_ptr\": %llu, "
             "\"logits_n\": %lld, \"vocab\": %lld, \"hidden_ptr\": %llu, \"hidden_width\": %lld, "
             "\"has_hidden\": %d, \"has_tree\": %d, \"max_length\": %lld, \"remaining\": %lld, \"done\": %d, "
             "\"eos_1\": %d, \"eos_5\": %d, \"uniform\": [%.17g, %.17g]}",
             h->abi_major, h->struct_size, (long long)h->length(h->host_data, p->target), (long long)n_tokens,
             (long long)tokens[0], (long long)tokens[n_tokens - 1], (unsigned long long)(uintptr_t)tokens,
             (unsigned long long)(uintptr_t)logits.data, (long long)logits.n, (long long)logits.width,
             (unsigned long long)(uintptr_t)hidden.data, (long long)hidden.width,
             h->has_capability(h->host_data, p->target, "hidden_states"),
             h->has_capability(h->host_data, p->target, "tree"), (long long)h->max_length(h->host_data),
             (long long)h->remaining(h->host_data), h->done(h->host_data), h->is_eos(h->host_data, 1),
             h->is_eos(h->host_data, 5), u1, u2);
    return greedy_once(p);
}

/* process_probe: greedy through process() over all rows of a two-token forward with a drafted token. */
static int32_t process_probe_step(void *state) {
    probe *p = state;
    const decoctl_host *h = p->host;
    decoctl_rows rows = DECOCTL_ROWS_INIT, processed = DECOCTL_ROWS_INIT;
    int32_t status = h->logits(h->host_data, p->target, &rows);
    if (status < 0) return fail(p, status, "logits");
    status = h->process(h->host_data, rows.data + (rows.n - 1) * rows.width, 1, rows.width, NULL, 0, &processed);
    if (status < 0) return fail(p, status, "process");
    int64_t token = argmax(processed.data, processed.width);
    snprintf(p->stats, sizeof(p->stats), "{\"same_pointer\": %d}",
             processed.data == rows.data + (rows.n - 1) * rows.width);
    status = h->commit(h->host_data, &token, 1, NULL);
    if (status < 0) return fail(p, status, "commit");
    if (h->done(h->host_data)) return DECOCTL_OK;
    status = h->forward(h->host_data, p->target, &token, 1, NULL);
    return status < 0 ? fail(p, status, "forward") : DECOCTL_OK;
}

/* fails: commits three tokens, then returns an error status with a message. */
static int32_t fails_step(void *state) {
    probe *p = state;
    if (++p->steps <= 3) return greedy_once(p);
    snprintf(p->error, sizeof(p->error), "deliberate failure at step %lld", (long long)p->steps);
    return DECOCTL_ERR_FAILED;
}

/* stalls: returns DECOCTL_OK without committing anything. */
static int32_t stalls_step(void *state) {
    (void)state;
    return DECOCTL_OK;
}

/* bad_commit: commits a token id far outside the vocabulary. */
static int32_t bad_commit_step(void *state) {
    probe *p = state;
    int64_t tokens[2] = {3, (int64_t)1 << 40};
    int32_t status = p->host->commit(p->host->host_data, tokens, 2, NULL);
    return status < 0 ? fail(p, status, "commit") : DECOCTL_OK;
}

/* overflow: after two greedy steps, feeds more tokens than the KV cache holds (the tests' models hold 256). */
static int32_t overflow_step(void *state) {
    probe *p = state;
    if (++p->steps <= 2) return greedy_once(p);
    int64_t n = 4096;
    int64_t *tokens = calloc((size_t)n, sizeof(int64_t));
    int32_t status = p->host->forward(p->host->host_data, p->target, tokens, n, NULL);
    free(tokens);
    return status < 0 ? fail(p, status, "forward") : DECOCTL_OK;
}

/* ignores_error: rewinds past the end, ignores the error status and reports success. */
static int32_t ignores_error_step(void *state) {
    probe *p = state;
    p->host->rewind(p->host->host_data, p->target, 1 << 30);
    return greedy_once(p);
}

/* tree: a tree forward, which a model without tree inputs refuses with DECOCTL_ERR_CAPABILITY. */
static int32_t tree_step(void *state) {
    probe *p = state;
    int64_t tokens[3] = {5, 6, 7};
    int32_t parents[3] = {-1, 0, 0};
    int32_t status = p->host->forward_tree(p->host->host_data, p->target, tokens, parents, 3, NULL);
    return status < 0 ? fail(p, status, "forward_tree") : greedy_once(p);
}

/* features_probe (roles target,eagle; ABI 1.1): before its first greedy step, feeds the eagle role the prompt's
 * pairs (token i+1 with the target's hidden state at i) with forward_features, then a three-node tree that
 * extends nothing ({-1, 0, -1}, each node with the last prompt hidden state), and records what came back. */
static int32_t features_probe_step(void *state) {
    probe *p = state;
    const decoctl_host *h = p->host;
    if (p->steps++ > 0) return greedy_once(p);
    decoctl_role *head;
    decoctl_rows hidden = DECOCTL_ROWS_INIT, chain = DECOCTL_ROWS_INIT, tree = DECOCTL_ROWS_INIT;
    const int64_t *tokens;
    int64_t n;
    int32_t status;
    int has = DECOCTL_HAS(h, decoctl_host, forward_features);
    if (!has) return fail(p, DECOCTL_ERR_CAPABILITY, "DECOCTL_HAS(forward_features)");
    if ((status = h->role(h->host_data, "eagle", &head)) < 0) return fail(p, status, "role(\"eagle\")");
    if ((status = h->hidden_states(h->host_data, p->target, NULL, &hidden)) < 0) return fail(p, status, "hidden");
    if ((status = h->tokens(h->host_data, p->target, &tokens, &n)) < 0) return fail(p, status, "tokens");
    status = h->forward_features(h->host_data, head, tokens + 1, NULL, n - 1, hidden.data, hidden.width, &chain);
    if (status < 0) return fail(p, status, "forward_features");
    int64_t chain_n = chain.n, chain_argmax = argmax(chain.data + (chain.n - 1) * chain.width, chain.width);
    float chain_last = chain.data[(chain.n - 1) * chain.width];
    int64_t nodes[3] = {5, 6, 7};
    int32_t parents[3] = {-1, 0, -1};
    float *features = malloc(sizeof(float) * 3 * (size_t)hidden.width);
    if (!features) return DECOCTL_ERR_FAILED;
    for (int i = 0; i < 3; i++)
        memcpy(features + i * hidden.width, hidden.data + (hidden.n - 1) * hidden.width, sizeof(float) * hidden.width);
    status = h->forward_features(h->host_data, head, nodes, parents, 3, features, hidden.width, &tree);
    free(features);
    if (status < 0) return fail(p, status, "forward_features(tree)");
    snprintf(p->stats, sizeof(p->stats),
             "{\"abi_minor\": %u, \"has_forward_features\": %d, \"has_features\": %d, \"chain_n\": %lld, "
             "\"chain_argmax\": %lld, \"chain_last_first\": %.9g, \"tree_n\": %lld, "
             "\"tree_argmax\": [%lld, %lld, %lld], \"head_length\": %lld}",
             h->abi_minor, has, h->has_capability(h->host_data, head, "features"), (long long)chain_n,
             (long long)chain_argmax, chain_last, (long long)tree.n, (long long)argmax(tree.data, tree.width),
             (long long)argmax(tree.data + tree.width, tree.width),
             (long long)argmax(tree.data + 2 * tree.width, tree.width),
             (long long)h->length(h->host_data, head));
    return greedy_once(p);
}

/* features_wrong_width: forward_features with one float too many per row. */
static int32_t features_wrong_width_step(void *state) {
    probe *p = state;
    const decoctl_host *h = p->host;
    decoctl_role *head;
    decoctl_rows hidden = DECOCTL_ROWS_INIT;
    int64_t token = 5;
    int32_t status;
    if ((status = h->role(h->host_data, "eagle", &head)) < 0) return fail(p, status, "role");
    if ((status = h->hidden_states(h->host_data, p->target, NULL, &hidden)) < 0) return fail(p, status, "hidden");
    status = h->forward_features(h->host_data, head, &token, NULL, 1, hidden.data, hidden.width + 1, NULL);
    return status < 0 ? fail(p, status, "forward_features") : greedy_once(p);
}

/* features_on_target: forward_features on the target, whose model takes no features. */
static int32_t features_on_target_step(void *state) {
    probe *p = state;
    const decoctl_host *h = p->host;
    decoctl_rows hidden = DECOCTL_ROWS_INIT;
    int64_t token = 5;
    int32_t status;
    if ((status = h->hidden_states(h->host_data, p->target, NULL, &hidden)) < 0) return fail(p, status, "hidden");
    status = h->forward_features(h->host_data, p->target, &token, NULL, 1, hidden.data, hidden.width, NULL);
    return status < 0 ? fail(p, status, "forward_features") : greedy_once(p);
}

/* stale_rows: keeps pointers to the last logits row and hidden-state row of its first step and reads them in its
 * second, after the forward that ended their lifetime (the bug debug mode makes visible): stats count the NaNs. */
static int32_t stale_rows_step(void *state) {
    probe *p = state;
    const decoctl_host *h = p->host;
    decoctl_rows logits = DECOCTL_ROWS_INIT, hidden = DECOCTL_ROWS_INIT;
    int32_t status;
    if ((status = h->logits(h->host_data, p->target, &logits)) < 0) return fail(p, status, "logits");
    if (p->steps++ == 0) {
        if ((status = h->hidden_states(h->host_data, p->target, NULL, &hidden)) < 0) return fail(p, status, "hidden");
        p->kept_logits = logits.data + (logits.n - 1) * logits.width;
        p->kept_logits_width = logits.width;
        p->kept_hidden = hidden.data + (hidden.n - 1) * hidden.width;
        p->kept_hidden_width = hidden.width;
        return greedy_once(p); /* its forward ends the kept rows' lifetime */
    }
    if (p->steps == 2) {
        int64_t nan_logits = 0, nan_hidden = 0;
        for (int64_t i = 0; i < p->kept_logits_width; i++) nan_logits += isnan(p->kept_logits[i]) != 0;
        for (int64_t i = 0; i < p->kept_hidden_width; i++) nan_hidden += isnan(p->kept_hidden[i]) != 0;
        int64_t nan_current = 0;
        for (int64_t i = 0; i < logits.n * logits.width; i++) nan_current += isnan(logits.data[i]) != 0;
        snprintf(p->stats, sizeof(p->stats),
                 "{\"logits_width\": %lld, \"nan_logits\": %lld, \"hidden_width\": %lld, \"nan_hidden\": %lld, "
                 "\"nan_current\": %lld}",
                 (long long)p->kept_logits_width, (long long)nan_logits, (long long)p->kept_hidden_width,
                 (long long)nan_hidden, (long long)nan_current);
    }
    return greedy_once(p);
}

/* positive_step: commits one token per step, then returns 1, which is no status (0 ok, < 0 error). */
static int32_t positive_step_step(void *state) {
    int32_t status = greedy_once(state);
    return status < 0 ? status : 1;
}

/* positive_create: creates its state, then returns 7. */
static int32_t positive_create_create(const decoctl_host *host, const char *config_json, void **out_state) {
    int32_t status = probe_create(host, config_json, out_state);
    return status < 0 ? status : 7;
}

/* positive_reset: a working greedy whose reset returns 3. */
static int32_t positive_reset_reset(void *state) {
    ((probe *)state)->steps = 0;
    return 3;
}

/* small_rows: hands the host a decoctl_rows whose struct_size is too small. */
static int32_t small_rows_step(void *state) {
    probe *p = state;
    decoctl_rows rows = DECOCTL_ROWS_INIT;
    rows.struct_size = 4;
    int32_t status = p->host->logits(p->host->host_data, p->target, &rows);
    return status < 0 ? fail(p, status, "logits") : DECOCTL_OK;
}

/* unknown_role: asks for a role the generation does not have. */
static int32_t unknown_role_step(void *state) {
    probe *p = state;
    decoctl_role *draft;
    int32_t status = p->host->role(p->host->host_data, "draft", &draft);
    return status < 0 ? fail(p, status, "role(\"draft\")") : DECOCTL_OK;
}

/* create_fails: create returns an error without a state; last_error(NULL) explains. */
static int32_t create_fails_create(const decoctl_host *host, const char *config_json, void **out_state) {
    (void)host;
    (void)config_json;
    *out_state = NULL;
    return DECOCTL_ERR_FAILED;
}

static const char *create_fails_last_error(void *state) {
    return state ? NULL : "create_fails refuses every configuration";
}

/* echo_config: fails create with the config_json it got as the message. */
static int32_t echo_config_create(const decoctl_host *host, const char *config_json, void **out_state) {
    probe *p = calloc(1, sizeof(*p));
    if (!p) return DECOCTL_ERR_FAILED;
    p->host = host;
    *out_state = p;
    snprintf(p->error, sizeof(p->error), "config: %s", config_json);
    return DECOCTL_ERR_FAILED;
}

/* calls_host_in_destroy: breaks the thread rule by calling the host from destroy. */
static void calls_host_in_destroy_destroy(void *state) {
    probe *p = state;
    p->host->done(p->host->host_data);
    free(p);
}

#define CONTROLLER(id, step_fn, ...)                                                                        \
    static const decoctl_controller id = {                                                                   \
        .struct_size = sizeof(decoctl_controller),                                                           \
        .name = #id,                                                                                          \
        .summary = "test controller " #id,                                                                   \
        .roles = "target",                                                                                    \
        .options_json = NULL,                                                                                 \
        .create = probe_create,                                                                               \
        .step = step_fn,                                                                                      \
        .destroy = probe_destroy,                                                                             \
        .last_error = probe_last_error,                                                                       \
        .reset = NULL,                                                                                        \
        .stats_json = probe_stats,                                                                            \
        __VA_ARGS__};

CONTROLLER(probe_all, probe_step)
CONTROLLER(process_probe, process_probe_step)
CONTROLLER(fails, fails_step)
CONTROLLER(stalls, stalls_step)
CONTROLLER(bad_commit, bad_commit_step)
CONTROLLER(overflow, overflow_step)
CONTROLLER(ignores_error, ignores_error_step)
CONTROLLER(tree, tree_step)
CONTROLLER(small_rows, small_rows_step)
CONTROLLER(unknown_role, unknown_role_step)
CONTROLLER(create_fails, probe_step, .create = create_fails_create, .last_error = create_fails_last_error)
CONTROLLER(echo_config, probe_step, .create = echo_config_create,
           .options_json = "[{\"name\": \"width\", \"type\": \"int\", \"default\": 4}]")
CONTROLLER(calls_host_in_destroy, probe_step, .destroy = calls_host_in_destroy_destroy)
CONTROLLER(features_probe, features_probe_step, .roles = "target,eagle")
CONTROLLER(features_wrong_width, features_wrong_width_step, .roles = "target,eagle")
CONTROLLER(features_on_target, features_on_target_step)
CONTROLLER(stale_rows, stale_rows_step)
CONTROLLER(positive_step, positive_step_step)
CONTROLLER(positive_create, probe_step, .create = positive_create_create)
CONTROLLER(positive_reset, probe_step, .reset = positive_reset_reset)

#if defined(SMALL_CONTROLLER)
static decoctl_controller small_controller = {.struct_size = 8, .name = "small"};
#define FIRST &small_controller,
#elif defined(NULL_STEP)
static const decoctl_controller null_step = {.struct_size = sizeof(decoctl_controller), .name = "null_step",
                                             .create = probe_create, .destroy = probe_destroy,
                                             .last_error = probe_last_error};
#define FIRST &null_step,
#elif defined(BAD_OPTION_DEFAULT)
static const decoctl_controller bad_default = {
    .struct_size = sizeof(decoctl_controller), .name = "bad_default", .create = probe_create, .step = probe_step,
    .destroy = probe_destroy, .last_error = probe_last_error,
    .options_json = "[{\"name\": \"width\", \"type\": \"int\", \"default\": 100, \"maximum\": 10}]"};
#define FIRST &bad_default,
#else
#define FIRST
#endif

static const decoctl_controller *const controllers[] = {
    FIRST &probe_all, &process_probe, &fails, &stalls, &bad_commit, &overflow, &ignores_error, &tree,
    &small_rows, &unknown_role, &create_fails, &echo_config, &calls_host_in_destroy, &features_probe,
    &features_wrong_width, &features_on_target, &stale_rows, &positive_step, &positive_create, &positive_reset,
};

#if defined(NO_ENTRY)
DECOCTL_EXPORT const decoctl_plugin some_other_symbol = DECOCTL_PLUGIN(controllers);
#elif defined(WRONG_MAJOR)
DECOCTL_EXPORT const decoctl_plugin decoctl_plugin_entry = {sizeof(decoctl_plugin), 99, 0, 16, controllers};
#elif defined(SMALL_ENTRY)
DECOCTL_EXPORT const decoctl_plugin decoctl_plugin_entry = {8, DECOCTL_ABI_MAJOR, DECOCTL_ABI_MINOR, 16, controllers};
#else
DECOCTL_EXPORT const decoctl_plugin decoctl_plugin_entry = DECOCTL_PLUGIN(controllers);
#endif
