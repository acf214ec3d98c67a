#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The tool loops of the openai and @anthropic-ai/sdk clients against a model that writes tool
# calls (toolmodel_test.mjs): `lockstep serve --api-key KEY` on MODEL_DIR at PORT, and the same
# with --spec mtp -k 3 (the gate off, so drafts are really proposed) at PORT+1; both stopped by
# their PIDs.
# usage: toolmodel_test.sh LOCKSTEP MODEL_DIR PORT
set -u
lockstep=$1 model=$2 port=$3
here=$(cd "$(dirname "$0")" && pwd)
key=test-api-key-$$
log1=$(mktemp) log2=$(mktemp)
"$lockstep" serve --model "$model" --port "$port" --threads 1 --api-key "$key" --max-slots 2 > "$log1" 2>&1 &
pid1=$!
"$lockstep" serve --model "$model" --port $((port + 1)) --threads 1 --api-key "$key" --max-slots 2 \
  --spec mtp -k 3 --spec-gate false > "$log2" 2>&1 &
pid2=$!
trap 'kill $pid1 $pid2 2>/dev/null; rm -f "$log1" "$log2"' EXIT
for p in $port $((port + 1)); do
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$p/health" > /dev/null && break
    if ! kill -0 $pid1 2>/dev/null || ! kill -0 $pid2 2>/dev/null; then
      echo "FAIL: a server exited"; cat "$log1" "$log2"; exit 1
    fi
    sleep 0.1
  done
done
node "$here/toolmodel_test.mjs" "http://127.0.0.1:$port" "http://127.0.0.1:$((port + 1))" "$key"
rc=$?
[ $rc = 0 ] || { tail -20 "$log1"; tail -20 "$log2"; }
exit $rc
