#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `lockstep serve --api-key KEY` on a model, exercised by the openai and @anthropic-ai/sdk npm
# clients (clients_test.mjs), then stopped by its PID.
# usage: clients_test.sh LOCKSTEP MODEL_DIR PORT
set -u
lockstep=$1 model=$2 port=$3
here=$(cd "$(dirname "$0")" && pwd)
key=test-api-key-$$
log=$(mktemp)
"$lockstep" serve --model "$model" --port "$port" --threads 1 --api-key "$key" --max-slots 4 > "$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
  kill -0 $pid 2>/dev/null || { echo "FAIL: the server exited"; cat "$log"; exit 1; }
  sleep 0.1
done
node "$here/clients_test.mjs" "http://127.0.0.1:$port" "$key"
rc=$?
[ $rc = 0 ] || tail -20 "$log"
exit $rc
