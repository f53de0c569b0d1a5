#!/usr/bin/env bash
# What decoctl serve --deterministic costs (docs/BENCHMARKS.md, "Serving", "Deterministic serving").
#
#     tools/bench_deterministic.sh                  # the demo model, 2 rounds
#     MODEL=gemma3-270m-int8 ROUNDS=3 tools/bench_deterministic.sh
#
# Three servers on the same model, the default, --deterministic (prompts whole, as decoctl generate feeds them) and
# --deterministic --prefill-chunk 64 (as decoctl generate --prefill-chunk 64 feeds them), resident together on core 0
# (one intra-op thread each, 16 rows), loaded in turn from core 1 by decoctl bench-serve, the order reversed every
# round: streamed greedy completions of the code prompts at 1, 4 and 16 clients, then the edit prompts with greedy and
# prompt lookup at 1 and 16 (a speculating row never joins the batched Run under --deterministic). Tables on stdout,
# JSON in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${MODEL:-pycode}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-build/bench/deterministic}
DECOCTL=${DECOCTL:-.venv/bin/decoctl}
PORT=${PORT:-8100}
URLS=(
    "default=http://127.0.0.1:$PORT"
    "deterministic=http://127.0.0.1:$((PORT + 1))"
    "deterministic-chunk64=http://127.0.0.1:$((PORT + 2))"
)
mkdir -p "$OUT"

pids=()
serve() {
    taskset -c 0 "$DECOCTL" serve -m "$MODEL" --threads 1 --max-rows 16 "$@" &
    pids+=($!)
}
serve --port "$PORT"
serve --port "$((PORT + 1))" --deterministic
serve --port "$((PORT + 2))" --deterministic --prefill-chunk 64
trap 'kill -INT "${pids[@]}"; wait' EXIT
for port in "$PORT" "$((PORT + 1))" "$((PORT + 2))"; do
    for _ in $(seq 1 120); do
        curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
        sleep 1
    done
done

lscpu | grep "Model name"
"$DECOCTL" --version
for round in $(seq 1 "$ROUNDS"); do
    urls=()
    for i in 0 1 2; do
        ((round % 2)) && j=$i || j=$((2 - i))
        urls+=(--url "${URLS[$j]}")
    done
    echo "round $round: code prompts, greedy"
    taskset -c 1 "$DECOCTL" bench-serve "${urls[@]}" --prompts examples/code_prompts.jsonl --concurrency 1,4,16 \
        --requests 48 --max-tokens 64 --json "$OUT/code-$round.json"
    echo "round $round: edit prompts, greedy and prompt lookup"
    taskset -c 1 "$DECOCTL" bench-serve "${urls[@]}" --prompts examples/edit_prompts.jsonl \
        --controllers greedy,speculative:drafter=prompt-lookup --concurrency 1,16 --requests 32 \
        --json "$OUT/edit-$round.json"
done
