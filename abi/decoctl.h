/*
 * decoctl.h: the decoctl C ABI, version 1.4 (DECOCTL_ABI_MAJOR.DECOCTL_ABI_MINOR below).
 *
 * A shared library exports ONE data symbol, `decoctl_plugin_entry` (a decoctl_plugin), listing the controllers
 * it provides. For each generation the host calls a controller's create() with a host table (decoctl_host): the
 * host's primitives as function pointers plus an opaque host_data. The controller drives the whole decode loop
 * through that table from step(); it never links against the host. abi/ABI.md explains the rules with a complete
 * example; examples/c_controller/ has three controllers and a Makefile.
 *
 * Rules that hold for every declaration below:
 * - Every struct that crosses the boundary starts with `uint32_t struct_size` (sizeof as its writer compiled it)
 *   and only ever grows at the end. A reader checks struct_size before touching a field added later.
 * - Fixed-width integers; token ids are int64_t; strings are NUL-terminated UTF-8; no enums, no bitfields,
 *   no varargs.
 * - Status codes are int32_t: DECOCTL_OK (0) or a negative DECOCTL_ERR_*. Functions that return a count or a
 *   flag return it directly when >= 0 and a negative status on error. A positive value is no status: a plugin's
 *   create, step or reset that returns one breaks the contract, and the host raises ControllerError ("an invalid
 *   status") naming the controller, the function and the value.
 * - Ownership is stated next to every pointer: "host-owned" memory is never freed or written by the plugin;
 *   "plugin-owned" memory is never freed or written by the host. In debug mode (DECOCTL_DEBUG=1) the host fills
 *   the logits and hidden-state rows of a role with NaN once their lifetime ends (the next forward,
 *   forward_tree, forward_features, keep or rewind on that role; ABI 1.3: a row's own at the next call that
 *   changes that row, step_rows' output at the next call that changes any row of the role), so a pointer kept
 *   too long reads NaN.
 * - Threads. [controller-thread]: the host serializes every call on one controller instance (create, step,
 *   reset, stats_json, last_error, destroy); different instances may run at the same time on different
 *   threads, so a plugin keeps its mutable data in its state, not in globals. Host functions may only be
 *   called from inside create/step/reset of the instance that received the table, on the calling thread;
 *   anything else gets DECOCTL_ERR_ARGUMENT.
 * - Errors raised inside a host function (a Python exception in the host) come back as a negative status; the
 *   host keeps the exception and raises it in Python when the controller's create/step/reset returns, whatever
 *   that returns. A controller cannot swallow a host error: it should return the status it got.
 */
#ifndef DECOCTL_H
#define DECOCTL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* DECOCTL_CDEF_BEGIN: the cffi bridge (abi/build_bridge.py) reads the declarations up to DECOCTL_CDEF_END. */

#define DECOCTL_ABI_MAJOR 1 /* a library whose major differs from the host's is refused at load */
#define DECOCTL_ABI_MINOR 4 /* minors only add fields at the ends of structs: check struct_size */

/* Status codes. */
#define DECOCTL_OK 0
#define DECOCTL_ERR_FAILED (-1)     /* the plugin's own failure: the host reads last_error(state) */
#define DECOCTL_ERR_HOST (-2)       /* a host function failed (an exception in the host; re-raised there) */
#define DECOCTL_ERR_CAPABILITY (-3) /* the model or host lacks what was asked (tree forward, hidden states) */
#define DECOCTL_ERR_SEQUENCE (-4)   /* arguments do not fit the sequence: past max_length, bad ids, bad rewind */
#define DECOCTL_ERR_ARGUMENT (-5)   /* a bad argument: unknown role, NULL pointer, struct_size too small */

/* Levels for decoctl_host.log_message (the values of Python's logging levels). */
#define DECOCTL_LOG_DEBUG 10
#define DECOCTL_LOG_INFO 20
#define DECOCTL_LOG_WARNING 30
#define DECOCTL_LOG_ERROR 40

/* A role's sequence (its tokens and KV cache), as handed out by decoctl_host.role. Opaque: never dereferenced by
 * the plugin. Valid until the instance is destroyed (one generation). */
typedef struct decoctl_role decoctl_role;

/* Rows of float32 values: `n` rows of `width` values each, C-contiguous (row i starts at data + i * width).
 * The PLUGIN allocates this struct (usually on its stack, set up with DECOCTL_ROWS_INIT) and the host fills it;
 * `data` then points into host-owned memory whose lifetime the filling function states. */
typedef struct decoctl_rows {
    uint32_t struct_size; /* set by the plugin: sizeof(decoctl_rows); the host writes no field beyond it */
    const float *data;    /* host-owned (see the function that filled it); never NULL after success */
    int64_t n;            /* rows */
    int64_t width;        /* values per row: the vocabulary for logits, the hidden size for hidden states */
} decoctl_rows;

/* The host table, passed to create(). Host-owned; valid until destroy(state) returns, so the plugin may keep
 * the pointer in its state. Every function pointer a host's table holds is non-NULL; a plugin calls a function
 * added after 1.0 only when struct_size covers it (DECOCTL_HAS), since an older host's table ends before it.
 * Every function takes `host_data` (copy it from this table) first and is [controller-thread]. */
typedef struct decoctl_host {
    uint32_t struct_size; /* sizeof(decoctl_host) as the host compiled it */
    uint32_t abi_major;   /* the host's DECOCTL_ABI_MAJOR */
    uint32_t abi_minor;   /* the host's DECOCTL_ABI_MINOR */
    void *host_data;      /* host-owned, opaque: pass it back as the first argument of every function below */

    /* ---- per role ---------------------------------------------------------------------------------------- */

    /* Look a role up by name ("target", "draft", ...). name: caller-owned, read during the call only.
     * *out_role: a host-owned handle, valid until destroy. Unknown role: DECOCTL_ERR_ARGUMENT. */
    int32_t (*role)(void *host_data, const char *name, decoctl_role **out_role);

    /* Feed n >= 1 tokens after the role's current length and run the model once. tokens: caller-owned, read
     * during the call only. out_rows (may be NULL): n rows of logits, row i predicting the token after
     * tokens[i]; host-owned, zero-copy, valid until the next forward, forward_tree, forward_features, keep or
     * rewind on this role.
     * Past the sequence's max_length, or an id outside the vocabulary: DECOCTL_ERR_SEQUENCE. A model that
     * returns the last position's logits only refuses n > 1 with DECOCTL_ERR_CAPABILITY. A model that takes
     * features (has_capability "features": a draft head) refuses it with DECOCTL_ERR_SEQUENCE: use
     * forward_features. */
    int32_t (*forward)(void *host_data, decoctl_role *role, const int64_t *tokens, int64_t n, decoctl_rows *out_rows);

    /* Feed n tokens forming a tree (parents[i]: index of token i's parent, or -1 for a root hanging off the
     * cached tokens; parents[i] < i) and verify them in one pass: row i equals a plain forward of the cached
     * tokens plus the root-to-i path. out_rows as for forward. tokens, parents: caller-owned, read during the
     * call only. A model without position_ids and attention_bias inputs: DECOCTL_ERR_CAPABILITY (decoctl
     * models enable-tree adds them); length 0: DECOCTL_ERR_SEQUENCE. Until keep or rewind, forward refuses
     * to continue a tree that branches (DECOCTL_ERR_SEQUENCE), and (ABI >= 1.1 hosts) a forward_tree (or
     * forward_features with parents) right after one EXTENDS that tree: its parents may also index the tokens
     * the tree calls before it fed, which keep their indices 0..m-1 (the new tokens are m..m+n-1). */
    int32_t (*forward_tree)(void *host_data, decoctl_role *role, const int64_t *tokens, const int32_t *parents,
                            int64_t n, decoctl_rows *out_rows);

    /* After forward_tree (with its extensions) or forward, keep the n tokens at indices (a root-to-node path of
     * that tree; indices 0..n-1 after a plain forward) and drop the rest: their KV rows move into place and the
     * length becomes the tree's start plus n. indices: caller-owned, read during the call only. Not a path, or
     * no forward right before: DECOCTL_ERR_SEQUENCE. */
    int32_t (*keep)(void *host_data, decoctl_role *role, const int64_t *indices, int64_t n);

    /* The logits of the role's last forward (n rows, as forward returned them). out_rows: non-NULL; host-owned,
     * zero-copy, valid until the next forward, forward_tree, forward_features, keep or rewind on this role. No
     * forward yet (or a rewind since): DECOCTL_ERR_SEQUENCE. */
    int32_t (*logits)(void *host_data, decoctl_role *role, decoctl_rows *out_rows);

    /* Hidden states of the last forward, one row per fed token. kind: "final" (the lm_head's input) or "aux"
     * (the concatenated auxiliary taps); NULL means "final"; caller-owned, read during the call only.
     * out_rows: non-NULL; host-owned, zero-copy, valid until the next forward, forward_tree, forward_features,
     * keep or rewind on this role. A model without that output: DECOCTL_ERR_CAPABILITY. */
    int32_t (*hidden_states)(void *host_data, decoctl_role *role, const char *kind, decoctl_rows *out_rows);

    /* Truncate the role's tokens and KV cache to length (0 <= length <= current length; else
     * DECOCTL_ERR_SEQUENCE). O(1): nothing is copied. Invalidates the role's logits and hidden states. */
    int32_t (*rewind)(void *host_data, decoctl_role *role, int64_t length);

    /* The number of tokens in the role's KV cache (>= 0), or a negative status. */
    int64_t (*length)(void *host_data, decoctl_role *role);

    /* The tokens in the role's KV cache: *out_tokens points at *out_n int64 ids (*out_tokens may be NULL when
     * *out_n is 0). Host-owned, zero-copy, read-only, valid until the next forward, forward_tree,
     * forward_features, keep or rewind on this role. */
    int32_t (*tokens)(void *host_data, decoctl_role *role, const int64_t **out_tokens, int64_t *out_n);

    /* 1 if the role's model has the named capability ("hidden_states", "aux_hidden_states", "tree",
     * "logits_all_positions", "position_ids", "features"), 0 if not, or a negative status. name: caller-owned,
     * read during the call. */
    int32_t (*has_capability)(void *host_data, decoctl_role *role, const char *name);

    /* ---- per generation ---------------------------------------------------------------------------------- */

    /* Append n >= 0 accepted tokens to the output, applying EOS, max_new_tokens and stop strings, and stream
     * them. tokens: caller-owned, read during the call only. *out_taken (out_taken may be NULL): how many were
     * taken, fewer than n once the generation is done. An id outside the vocabulary: DECOCTL_ERR_SEQUENCE and
     * nothing is committed. */
    int32_t (*commit)(void *host_data, const int64_t *tokens, int64_t n, int64_t *out_taken);

    /* 1 once the generation is finished (EOS, max_new_tokens, a stop string, a full KV cache), else 0. */
    int32_t (*done)(void *host_data);

    /* 1 if token is one of the model's end-of-sequence ids, else 0. */
    int32_t (*is_eos)(void *host_data, int64_t token);

    /* The longest the target sequence may grow in this generation (prompt plus new tokens). */
    int64_t (*max_length)(void *host_data);

    /* How many more tokens commit() will take (0 once done). */
    int64_t (*remaining)(void *host_data);

    /* Run the generation's logits-processor chain over n rows of width values (width must be the vocabulary).
     * Row i is conditioned on the committed output followed by drafted[0..i-1]: pass the drafted tokens that
     * precede the rows (n_drafted >= n - 1), or drafted NULL and n_drafted 0 for a single row. rows, drafted:
     * caller-owned (host-owned logits are fine), read during the call only, never written. out_rows: non-NULL;
     * out_rows->data is `rows` itself when no processor is configured (no copy), else host-owned memory valid
     * until the next process call on this host_data. */
    int32_t (*process)(void *host_data, const float *rows, int64_t n, int64_t width, const int64_t *drafted,
                       int64_t n_drafted, decoctl_rows *out_rows);

    /* One uniform draw in [0, 1) from the generation's seeded random generator (same seed, same draws).
     * out_value: non-NULL. */
    int32_t (*uniform)(void *host_data, double *out_value);

    /* Log message (caller-owned, read during the call) at level (DECOCTL_LOG_*) through the host's logger. */
    int32_t (*log_message)(void *host_data, int32_t level, const char *message);

    /* The message of the host error behind the last negative status a host function returned during the
     * current create/step/reset, or NULL if none. Host-owned, valid until that create/step/reset returns. */
    const char *(*host_error)(void *host_data);

    /* ---- added in ABI 1.1: check DECOCTL_HAS(host, decoctl_host, forward_features) before calling ---------- */

    /* forward (parents NULL) or forward_tree (parents non-NULL, same rules) on a role whose model takes
     * another model's features (has_capability "features": an EAGLE draft head's target_hidden_states input),
     * with one row of features per token. features: n rows of width floats, C-contiguous; caller-owned (the
     * target's host-owned hidden states are fine), read during the call only. width must be the model's
     * feature width, usually the target's hidden size: otherwise DECOCTL_ERR_SEQUENCE (host_error names the
     * width). tokens, parents, out_rows as for forward_tree. A role whose model takes no features:
     * DECOCTL_ERR_CAPABILITY. */
    int32_t (*forward_features)(void *host_data, decoctl_role *role, const int64_t *tokens, const int32_t *parents,
                                int64_t n, const float *features, int64_t width, decoctl_rows *out_rows);

    /* ---- added in ABI 1.2: check DECOCTL_HAS(host, decoctl_host, argmax) before calling ------------------ */

    /* The argmax of each row after the generation's logits-processor chain (the first of equal maxima), for
     * greedy decoding and greedy verification: what process() then an argmax per row gives, but the chain may
     * skip trailing processors that provably keep a row's unique maximum (top_k, top_p, temperature, ...).
     * rows, n, width, drafted, n_drafted as for process(). out_tokens: caller-owned, room for n ids. */
    int32_t (*argmax)(void *host_data, const float *rows, int64_t n, int64_t width, const int64_t *drafted,
                      int64_t n_drafted, int64_t *out_tokens);

    /* ---- added in ABI 1.3: rows and outputs; check DECOCTL_HAS(host, decoctl_host, process_outputs) --------
     *
     * Rows. A role may hold several rows (sequences with their own tokens and KV cache) in one batched KV buffer:
     * as many as the controller's rows_for (decoctl_controller) asks for, else one. A row is an int32_t id: row 0
     * is the role's own sequence, the one every function above works on (row_forward with row 0 is forward, and
     * so on); fork hands out the lowest free id, which names the same row until it is released.
     * Lifetimes: a row's logits (row_forward's out_rows, row_logits) and tokens (row_tokens) are host-owned,
     * zero-copy, read-only and valid until the next call that changes that row (forward, forward_tree,
     * forward_features, keep or rewind on row 0; row_forward or row_rewind on it; a reorder that rewrites it;
     * its release) or the next step_rows on the role, whichever rows that step feeds (they share one output
     * buffer). A role's rows may be of different lengths.
     * Errors: a row id that is not live, or a row that still holds the whole token tree of a forward_tree (keep
     * or rewind it first): DECOCTL_ERR_SEQUENCE. Rows need an onnxruntime-genai layout model (a shared KV
     * buffer): with an Optimum-layout model a rows_for above 1 is refused (CapabilityError) when the generation
     * starts, and a role of one row refuses fork with DECOCTL_ERR_SEQUENCE. */

    /* A new row holding row `row`'s tokens and KV cache (copied, not recomputed); *out_row (non-NULL) gets its
     * id. Every row live (the role holds rows_for rows): DECOCTL_ERR_SEQUENCE. The source row is unchanged. */
    int32_t (*fork)(void *host_data, decoctl_role *role, int32_t row, int32_t *out_row);

    /* For beam search: rows 0..n-1 continue rows parents[0..n-1] as they are before the call (row i takes row
     * parents[i]'s tokens and KV cache; a parent may be named several times, a row need not be its own parent).
     * parents: caller-owned, read during the call only; rows 0..n-1 and every parent must be live
     * (DECOCTL_ERR_SEQUENCE). The logits of rows 0..n-1 are dropped (row_logits refuses until their next
     * forward or step_rows). n >= 0; n = 0 does nothing. */
    int32_t (*reorder)(void *host_data, decoctl_role *role, const int32_t *parents, int64_t n);

    /* Free row `row` (not row 0: rewind it instead; DECOCTL_ERR_SEQUENCE); its id may be handed out by the next
     * fork. Its logits and tokens pointers end. */
    int32_t (*release)(void *host_data, decoctl_role *role, int32_t row);

    /* Feed tokens[i] to row rows[i], for i in 0..n-1, in ONE run of the model (rows of different lengths
     * together); every row named must be live, named once, below the role's max_length and settled (no tree
     * pending): else DECOCTL_ERR_SEQUENCE, as for an id outside the vocabulary. rows, tokens: caller-owned, read
     * during the call only, both non-NULL, n >= 1 (else DECOCTL_ERR_ARGUMENT). out_rows (may be NULL): n rows of
     * logits, row i predicting the token after tokens[i]; host-owned, zero-copy, valid until the next call that
     * changes any row of this role (forward, forward_tree, forward_features, keep, rewind, step_rows,
     * row_forward, row_rewind, reorder, release; not fork). Row rows[i]'s row_logits is then that same row
     * (with its own lifetime, see Lifetimes above). A model that takes features (has_capability "features"):
     * DECOCTL_ERR_CAPABILITY (forward each row with forward_features instead). */
    int32_t (*step_rows)(void *host_data, decoctl_role *role, const int32_t *rows, const int64_t *tokens, int64_t n,
                         decoctl_rows *out_rows);

    /* forward on row `row` (row 0: forward itself), one row at a time (multi-token forwards are not batched).
     * tokens: caller-owned, read during the call only. out_rows (may be NULL) as for forward; host-owned, valid
     * until the next call that changes this row or the next step_rows on the role. Errors as for forward. */
    int32_t (*row_forward)(void *host_data, decoctl_role *role, int32_t row, const int64_t *tokens, int64_t n,
                           decoctl_rows *out_rows);

    /* logits of row `row` (row 0: logits): the rows of its last row_forward, or its row of the last step_rows
     * that fed it. out_rows: non-NULL; host-owned, zero-copy, valid until the next call that changes this row or
     * the next step_rows on the role. No forward or step since its creation, a rewind or a reorder:
     * DECOCTL_ERR_SEQUENCE. */
    int32_t (*row_logits)(void *host_data, decoctl_role *role, int32_t row, decoctl_rows *out_rows);

    /* rewind on row `row` (row 0: rewind): truncate its tokens and KV cache to length (0 <= length <= its
     * length, else DECOCTL_ERR_SEQUENCE). O(1). Its logits end. */
    int32_t (*row_rewind)(void *host_data, decoctl_role *role, int32_t row, int64_t length);

    /* The number of tokens in row `row`'s KV cache (>= 0; row 0: length), or a negative status. */
    int64_t (*row_length)(void *host_data, decoctl_role *role, int32_t row);

    /* tokens of row `row` (row 0: tokens): *out_tokens points at *out_n int64 ids (NULL when *out_n is 0);
     * out_tokens, out_n non-NULL. Host-owned, zero-copy, read-only, valid until the next call that changes this
     * row or the next step_rows on the role. */
    int32_t (*row_tokens)(void *host_data, decoctl_role *role, int32_t row, const int64_t **out_tokens,
                          int64_t *out_n);

    /* Outputs. A generation may produce several completions of its prompt (beams, parallel samples): output 0
     * is the one commit() appends to and that streams; new_output adds another. Each output applies EOS,
     * max_new_tokens and stop strings on its own. With several outputs, done() is 1 once every output is done;
     * remaining() is output 0's. Outputs are int32_t indices; one that does not exist: DECOCTL_ERR_SEQUENCE. */

    /* Start another (empty) completion; *out_output (non-NULL) gets its index (1, 2, ...). A host that holds
     * one output: DECOCTL_ERR_CAPABILITY; a logits-processor chain that keeps state per sequence with a processor
     * that cannot clone itself for another output: DECOCTL_ERR_ARGUMENT, host_error naming the processors. */
    int32_t (*new_output)(void *host_data, int32_t *out_output);

    /* commit to output `output` (0: commit itself): append n >= 0 tokens, applying that output's EOS,
     * max_new_tokens and stop strings. tokens: caller-owned, read during the call only. *out_taken (out_taken
     * may be NULL): how many were taken, fewer than n once that output is done. An id outside the vocabulary:
     * DECOCTL_ERR_SEQUENCE and nothing is committed. */
    int32_t (*commit_to)(void *host_data, int32_t output, const int64_t *tokens, int64_t n, int64_t *out_taken);

    /* 1 once output `output` is finished (EOS, its max_new_tokens, a stop string), else 0, or a negative status. */
    int32_t (*output_done)(void *host_data, int32_t output);

    /* Record output `output`'s score (a beam's length-normalised log-probability, a sample's mean
     * log-probability): the generation's result lists every completion with its score. */
    int32_t (*score)(void *host_data, int32_t output, double value);

    /* Keep only the outputs order[0..n-1] names, in that order (best first): the result lists them so, and
     * output i is order[i] from now on (commit_to, output_done, score use the new indices). order:
     * caller-owned, read during the call only; n >= 1, each output named once (else DECOCTL_ERR_SEQUENCE).
     * Output 0 has already streamed what was committed to it; rank once the outputs are done. */
    int32_t (*rank_outputs)(void *host_data, const int32_t *order, int64_t n);

    /* process() with one output per row: row i (of n rows of width values, width the vocabulary) is
     * conditioned on output outputs[i]'s committed tokens (the processors see each completion's own prefix, as
     * beams and parallel samples need). rows, outputs: caller-owned (host-owned logits are fine), read during
     * the call only; n >= 1. out_rows: non-NULL; out_rows->data is `rows` itself when no processor is
     * configured (no copy), else host-owned memory valid until the next process or process_outputs call. */
    int32_t (*process_outputs)(void *host_data, const float *rows, int64_t n, int64_t width, const int32_t *outputs,
                               decoctl_rows *out_rows);

    /* ---- added in ABI 1.4: check DECOCTL_HAS(host, decoctl_host, source_tokens) before calling ------------- */

    /* The generation's source: the prompt's tokens as an encoder-decoder target's encoder read them (T5, BART,
     * Marian: the prompt is the encoder's input, and the target's own tokens, tokens(), start from the decoder's
     * start token instead). A drafter that copies from the prompt (prompt lookup over a summary, an edit, a
     * translation of names) reads it here. *out_tokens points at *out_n int64 ids; a decoder-only target has no
     * source: *out_n is 0 and *out_tokens NULL (its prompt is the start of the target's tokens()). out_tokens,
     * out_n: non-NULL (else DECOCTL_ERR_ARGUMENT). Host-owned, zero-copy, read-only; the source does not change
     * during a generation: valid until this instance's reset or destroy. */
    int32_t (*source_tokens)(void *host_data, const int64_t **out_tokens, int64_t *out_n);
} decoctl_host;

/* One controller a library provides. Plugin-owned, static: valid for as long as the library is loaded. */
typedef struct decoctl_controller {
    uint32_t struct_size; /* sizeof(decoctl_controller) */
    const char *name;     /* non-NULL: the name after the colon in `libmine.so:name`; unique in the library */
    const char *summary;  /* may be NULL: one line for `decoctl plugins` */
    const char *roles;    /* may be NULL (= "target"): the roles it drives, comma separated, "target" first */
    /* may be NULL (= no options): the option schema as a JSON array of objects with "name", "type" ("int",
     * "float", "str" or "bool") and optional "default", "help", "minimum", "maximum", "choices",
     * "exclusive_minimum" and "exclusive_maximum" (true: the bound itself is refused, as in "temperature > 0").
     * The host checks the user's options against it and passes the result to create() as config_json. */
    const char *options_json;

    /* Create an instance for one generation, after the prompt is in the target's KV cache (the target's
     * logits hold the prompt's last row). host: host-owned, valid until destroy(*out_state) returns.
     * config_json: a JSON object of the options, every declared option present (defaults filled in);
     * host-owned, valid during the call only. On success set *out_state (plugin-owned; may be NULL if the
     * controller keeps no state) and return DECOCTL_OK. On failure return a negative status; *out_state may
     * be left NULL or set to a state that last_error can read, which the host then destroys.
     * [controller-thread]; required (non-NULL). */
    int32_t (*create)(const decoctl_host *host, const char *config_json, void **out_state);

    /* Make progress: commit at least one token, or finish the generation. Called until the host's done()
     * is 1. [controller-thread]; required. */
    int32_t (*step)(void *state);

    /* Free the state. Called once per successful create (also after an error), never during a call on the
     * same instance; host functions may not be called from it. [controller-thread]; required. */
    void (*destroy)(void *state);

    /* The message of the last failure of this instance, or NULL. Plugin-owned, valid until the next call on
     * this instance. state may be NULL (create failed without a state): return a static message or NULL.
     * [controller-thread]; required. */
    const char *(*last_error)(void *state);

    /* May be NULL. Start a new generation on the same host table, as if just created: the host calls it
     * instead of destroy + create when it reuses an instance. [controller-thread]. */
    int32_t (*reset)(void *state);

    /* May be NULL. The instance's counters as a JSON object (shown in the generation's stats). Plugin-owned,
     * valid until the next call on this instance. Called after the last step, before destroy.
     * [controller-thread]. */
    const char *(*stats_json)(void *state);

    /* ---- added in ABI 1.3: a host reads it only when struct_size covers it (an older library's does not) ---- */

    /* May be NULL (= 1). How many rows (decoctl_host.fork) each role the controller drives holds for these
     * options: the host sizes the roles' batched KV buffers with it before a generation's prefill. config_json:
     * the options as create() gets them (every declared option, defaults filled in); host-owned, valid during
     * the call only. Return a count >= 1, or a negative status and make last_error(NULL) say why: the host then
     * raises AbiError with that message (and for a 0, which breaks the contract). A pure function of
     * config_json: no state, no host functions (there is no table).
     * [thread-safe]: called outside any instance, possibly from several threads at once. */
    int32_t (*rows_for)(const char *config_json);
} decoctl_controller;

/* The type of the one exported symbol, `decoctl_plugin_entry`. Plugin-owned, static. The first three fields
 * keep their place in every ABI version, so any host can read them and refuse a major it does not speak. */
typedef struct decoctl_plugin {
    uint32_t struct_size;      /* sizeof(decoctl_plugin) */
    uint32_t abi_major;        /* DECOCTL_ABI_MAJOR as the library was built */
    uint32_t abi_minor;        /* DECOCTL_ABI_MINOR as the library was built */
    uint32_t controller_count; /* entries in controllers */
    /* controller_count pointers (an array of pointers, so that decoctl_controller can grow), none NULL */
    const decoctl_controller *const *controllers;
} decoctl_plugin;

/* DECOCTL_CDEF_END */

/* The name the host looks up with dlsym. */
#define DECOCTL_ENTRY_SYMBOL "decoctl_plugin_entry"

/* Mark the entry symbol exported even when the library is built with -fvisibility=hidden. */
#if defined(_WIN32)
#define DECOCTL_EXPORT __declspec(dllexport)
#else
#define DECOCTL_EXPORT __attribute__((visibility("default")))
#endif

/* Initialise a decoctl_rows before handing it to the host: decoctl_rows rows = DECOCTL_ROWS_INIT; */
#define DECOCTL_ROWS_INIT {sizeof(decoctl_rows), NULL, 0, 0}

/* 1 if a struct written by the other side (struct_size first) is large enough to hold field, else 0:
 * if (DECOCTL_HAS(host, decoctl_host, host_error)) ... */
#define DECOCTL_HAS(ptr, type, field) \
    ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type *)0)->field))

/* Fill an entry: DECOCTL_EXPORT const decoctl_plugin decoctl_plugin_entry = DECOCTL_PLUGIN(controllers); where
 * controllers is a static array of `const decoctl_controller *`. */
#define DECOCTL_PLUGIN(controllers)                                                                        \
    {sizeof(decoctl_plugin), DECOCTL_ABI_MAJOR, DECOCTL_ABI_MINOR,                                          \
     (uint32_t)(sizeof(controllers) / sizeof((controllers)[0])), (controllers)}

#ifdef __cplusplus
}
#endif

#endif /* DECOCTL_H */
