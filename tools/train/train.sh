#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Rebuilds the default lockstep model from scratch, reproducibly (fixed seeds, deterministic
# torch on two threads): corpus and tokenizer, training, export, measurements, test data.
#
#   bash tools/train/train.sh [WORK_DIR [OUT_DIR]]
#
# WORK_DIR (default /tmp/lockstep-train) keeps the token streams, the log and the resumable
# checkpoint; rerunning resumes training where it stopped.  OUT_DIR defaults to
# models/glm-pydoc-tiny.  About 60-75 minutes on two cores.  Needs Debian's python3-torch,
# python3-regex, python3.11-doc (the corpus) and libopenblas0-pthread (without it torch falls
# back to the reference BLAS and is ten times slower).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${1:-/tmp/lockstep-train}
OUT=${2:-$ROOT/models/glm-pydoc-tiny}
PY=/usr/bin/python3

pkgs=(python3-torch python3-numpy python3-regex python3.11-doc libopenblas0-pthread)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

export OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 PYTHONHASHSEED=0
mkdir -p "$WORK"
T=(--work "$WORK" --threads 2)
start=$(date +%s)
[ -f "$WORK/val.npy" ] || $PY "$ROOT/tools/train/train.py" prep "${T[@]}"
$PY "$ROOT/tools/train/train.py" train "${T[@]}"
$PY "$ROOT/tools/train/train.py" export "${T[@]}" --out "$OUT"
$PY "$ROOT/tools/train/evaluate.py" --work "$WORK" --model "$OUT"
# The acceptance again, by lockstep's own speculative decoder (LOCKSTEP, default build/lockstep).
LKS=${LOCKSTEP:-$ROOT/build/lockstep}
if [ -x "$LKS" ]; then
  $PY "$ROOT/tools/train/spec_check.py" "$LKS" "$WORK" "$OUT"
  $PY "$ROOT/tools/train/card.py" "$OUT" "$WORK"
else
  echo "train.sh: no lockstep at $LKS (build it, or set LOCKSTEP): its acceptance is not measured"
fi
echo "train.sh: done in $(( $(date +%s) - start )) s"
