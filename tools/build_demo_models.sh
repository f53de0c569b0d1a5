#!/usr/bin/env bash
# Everything after the target's pre-training, in order, resumable: run it again after an interruption and each
# step resumes or finishes at once (the training scripts resume from their checkpoints; an export is redone).
#
#   tools/build_demo_models.sh            # THREADS=2 by default; nothing else should run meanwhile
#
# 1. pycode-small (preset small, 2M tokens)      2. the target's greedy continuations (0.5M tokens)
# 3. the draft, distilled from the target        4. the EAGLE head, trained on the target's features
# 5. ONNX exports, verified against torch        6. metrics (tools/eval.py -> build/eval/report.json)
# 7. the bundle under plugins/models/decoctl_models/: weights stored as float16 (tools/half_storage.py),
#    pycode with tree inputs (decoctl models enable-tree) so lookahead and EAGLE's tree drafting run on it.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
TARGET_TOKENS=${TARGET_TOKENS:-20000000}
export OMP_NUM_THREADS=$THREADS
TOOLS=.venv-tools/bin/python
HOST=.venv/bin/python
BUNDLE=plugins/models/decoctl_models
EXPORT=build/export

seen() {  # tokens seen by the latest checkpoint of a run (build/train/NAME or tools/checkpoints/NAME)
    "$TOOLS" -c 'import sys; sys.path.insert(0, "tools"); import common; f = common.latest_checkpoint(sys.argv[1]); print(f[1]["tokens_seen"] if f else 0)' "$1"
}

step() { printf '\n== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

if [ "$(seen target)" -lt "$TARGET_TOKENS" ]; then
    echo "the target has seen $(seen target) of $TARGET_TOKENS tokens: finish it first, e.g." >&2
    echo "  OMP_NUM_THREADS=$THREADS $TOOLS tools/train.py --preset target --total-tokens $TARGET_TOKENS --threads $THREADS" >&2
    exit 1
fi

step "pycode-small"
"$TOOLS" tools/train.py --preset small --total-tokens 2000000 --threads "$THREADS"

step "target greedy continuations"
"$TOOLS" tools/distill_draft.py --make-greedy 500000 --threads "$THREADS"

step "draft, distilled"
"$TOOLS" tools/distill_draft.py --total-tokens 4500000 --greedy-mix 0.5 --threads "$THREADS"

step "EAGLE head"
# a lean head: on this 6-layer target a full-size head costs ~20% of a target step (docs/MODELS.md)
# the bundled head: 2 M tokens, then resumed to 13.5 M (docs/MODELS.md); one run to 13.5 M gives a similar head
"$TOOLS" tools/train_eagle.py --target target --total-tokens 13500000 --threads "$THREADS" --draft-vocab 2048 --head-intermediate 512

step "exports"
"$TOOLS" tools/export.py target --out "$EXPORT/pycode" --threads "$THREADS"
"$TOOLS" tools/export.py small --out "$EXPORT/pycode-small" --no-hidden-states --threads "$THREADS"
"$TOOLS" tools/export.py draft --out "$EXPORT/pycode-draft" --no-hidden-states --threads "$THREADS"
"$HOST" tools/export_eagle.py eagle --target-onnx "$EXPORT/pycode" --out "$EXPORT/pycode-eagle" --threads "$THREADS"
rm -rf "$EXPORT/pycode-tree"
.venv/bin/decoctl models enable-tree "$EXPORT/pycode" "$EXPORT/pycode-tree"

step "metrics"
"$TOOLS" tools/eval.py --target target --draft draft --threads "$THREADS" --out build/eval/report.json

step "bundle"
for pair in pycode:pycode-tree pycode-small:pycode-small pycode-draft:pycode-draft pycode-eagle:pycode-eagle; do
    name=${pair%%:*}
    rm -rf "${BUNDLE:?}/$name"
    "$HOST" tools/half_storage.py "$EXPORT/${pair##*:}" "$BUNDLE/$name"   # copies the export report too
done
du -sh "$BUNDLE"/pycode*
