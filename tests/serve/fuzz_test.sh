#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The request fuzzer (fuzz_requests.mjs) against `lockstep serve` at world WORLD for SECONDS;
# then the server must still be up and shut down with status 0.
# usage: fuzz_test.sh LOCKSTEP MODEL_DIR PORT WORLD SECONDS CHECK_RSS [SERVE_ARGS...]
# The seed is random unless LKS_FUZZ_SEED is set; it is printed either way.
set -u
lockstep=$1 model=$2 port=$3 world=$4 secs=$5 check_rss=$6
shift 6
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
token=fuzz-admin-token-$$
log=$(mktemp)
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
launch=()
[ "$world" -gt 1 ] && launch=(mpirun --oversubscribe -np "$world")
"${launch[@]}" "$lockstep" serve --model "$model" --port "$port" --threads 1 --admin-token "$token" \
  --max-slots 4 --max-queue 16 --max-seq-len 512 --max-body 1000000 "$@" > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
  kill -0 $pid 2>/dev/null || { echo "FAIL: the server exited"; cat "$log"; exit 1; }
  sleep 0.1
done
# The script's own time: the warm-up (one context's worth of tokens per slot), SECONDS of fuzzing,
# the requests still running then, and the wait for idle. Under ASan at world 2 on a loaded
# 2-core machine the warm-up alone took 38 s, so it gets SECONDS + 200 (ctest allows 300).
timeout -k 5 $((secs + 200)) node "$here/fuzz_requests.mjs" "http://127.0.0.1:$port" "$token" "$secs" \
  "${LKS_FUZZ_SEED:-random}" "$check_rss"
rc=$?
curl -s -X POST -H "Authorization: Bearer $token" "http://127.0.0.1:$port/admin/shutdown" > /dev/null
for _ in $(seq 1 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
wait $pid
status=$?
[ "$status" = 0 ] || { echo "FAIL: server exit status $status"; rc=1; }
[ "$rc" = 0 ] || { echo "--- server log (tail)"; grep -v "refused\|closed its connection" "$log" | tail -15; }
exit $rc
