#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `mpirun -np 2 lockstep serve` on a model, exercised by the official openai npm client
# (openai_test.mjs), then shut down through /admin/shutdown: the job must exit 0, and every rank
# must have logged the levers change at the same step.
# usage: serve_test.sh LOCKSTEP MODEL_DIR PORT [SERVE_ARGS...] (e.g. --spec mtp -k 2: the results
# must still equal plain `lockstep generate`)
set -u
lockstep=$1 model=$2 port=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
token=test-admin-token-$$
log=$(mktemp)
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
mpirun --oversubscribe -np 2 "$lockstep" serve --model "$model" --port "$port" --threads 1 \
  --admin-token "$token" --max-slots 8 "$@" > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
  kill -0 $pid 2>/dev/null || { echo "FAIL: the server exited"; cat "$log"; exit 1; }
  sleep 0.1
done
node "$here/openai_test.mjs" "http://127.0.0.1:$port" "$lockstep" "$model" "$token"
rc=$?
curl -s -X POST -H "Authorization: Bearer $token" "http://127.0.0.1:$port/admin/shutdown" > /dev/null
for _ in $(seq 1 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
wait $pid
exit_status=$?
levers=$(grep -c "levers at step" "$log")
echo "server exit status $exit_status; levers change logged by $levers rank(s)"
if [ "$exit_status" != 0 ] || [ "$levers" != 2 ]; then
  echo "FAIL: shutdown status or levers on every rank"; tail -20 "$log"; rc=1
fi
exit $rc
