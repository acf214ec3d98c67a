#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Rebuilds models/glm-pydoc-tools, reproducibly (fixed seeds, deterministic torch on two
# threads): the default model (models/glm-pydoc-tiny) fine-tuned on synthetic tool-call
# conversations (toolcall_data.py, rendered by render_chat.mjs), then measured through
# `lockstep serve` (evaluate_tools.py).
#
#   bash tools/train/finetune_tools.sh [WORK_DIR [OUT_DIR]]
#
# WORK_DIR (default /tmp/lockstep-tools) keeps the data, the log and the resumable checkpoint;
# rerunning resumes training where it stopped.  OUT_DIR defaults to models/glm-pydoc-tools.
# Needs what train.sh needs, node and npm (the pinned packages of tests/tokenizer), and a built
# lockstep (LOCKSTEP, default build/lockstep; chat_render beside it) for the checks.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${1:-/tmp/lockstep-tools}
OUT=${2:-$ROOT/models/glm-pydoc-tools}
PY=/usr/bin/python3
LKS=${LOCKSTEP:-$ROOT/build/lockstep}

export OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 PYTHONHASHSEED=0
bash "$ROOT/tests/tokenizer/npm_ci.sh"
mkdir -p "$WORK"
start=$(date +%s)
[ -f "$WORK/groups.pkl" ] || nice $PY "$ROOT/tools/train/finetune_tools.py" data --work "$WORK"
[ -f "$WORK/groups_synth.pkl" ] || nice $PY "$ROOT/tools/train/finetune_tools.py" data --work "$WORK" --synth
# The schedule the shipped weights were trained with (their run changed its learning rate and
# corpus mix while it ran; see the model card): each step's learning rate and corpus window.
nice $PY "$ROOT/tools/train/finetune_tools.py" train --work "$WORK" \
  --schedule "$ROOT/tools/train/glm-pydoc-tools.schedule.json" 2>&1 | tee -a "$WORK/train.log"
$PY "$ROOT/tools/train/finetune_tools.py" export --work "$WORK" --out "$OUT"
cp "$WORK/train.log" "$OUT/train.log"
$PY "$ROOT/tools/train/check_render.py" "${CHAT_RENDER:-$(dirname "$LKS")/chat_render}"
$PY "$ROOT/tools/train/evaluate_tools.py" "$LKS" "$OUT" --out "$OUT/metrics.json"
$PY "$ROOT/tools/train/card_tools.py" "$OUT" "$WORK"
echo "finetune_tools.sh: done in $(( $(date +%s) - start )) s"
