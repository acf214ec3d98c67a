#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Rebuilds models/glm-pydoc-tools, reproducibly (fixed seeds, deterministic torch on two
# threads): a model of glm-pydoc-tiny's tokenizer and layer shapes (4 heads of 128, no q/k
# norms), initialised with a copying circuit written in (finetune_tools.py prime_copy) and
# trained on synthetic tool-call conversations (toolcall_data.py, rendered by render_chat.mjs),
# then measured through `lockstep serve` (evaluate_tools.py).  About 35 minutes on two cores.
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
[ -f "$WORK/groups_synth.pkl" ] || nice $PY "$ROOT/tools/train/finetune_tools.py" data \
  --work "$WORK" --synth --n-groups 800
# The first step draws from groups.pkl (the pools' values), every later one from
# groups_synth.pkl (seven conversations in eight with made-up values, which only copying
# gets); each step also takes 4 copying-practice sequences.
nice $PY "$ROOT/tools/train/finetune_tools.py" train --work "$WORK" --init primed \
  --synth-from 1 --steps 800 --lr 1.5e-3 --warmup 20 --min-lr-frac 0.1 --corpus-batch 0 \
  --copy-batch 4 --ckpt-every 25 --log-every 10 2>&1 | tee -a "$WORK/train.log"
$PY "$ROOT/tools/train/finetune_tools.py" export --work "$WORK" --out "$OUT"
cp "$WORK/train.log" "$OUT/train.log"
$PY "$ROOT/tools/train/check_render.py" "${CHAT_RENDER:-$(dirname "$LKS")/chat_render}"
$PY "$ROOT/tools/train/evaluate_tools.py" "$LKS" "$OUT" --out "$OUT/metrics.json"
$PY "$ROOT/tools/train/card_tools.py" "$OUT" "$WORK"
echo "finetune_tools.sh: done in $(( $(date +%s) - start )) s"
