#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A worker killed while a stream is open (the test hook kills rank 1 with SIGKILL at step 30):
# the stream ends with an error event (no [DONE]), a plain request in flight gets a 500 (not a 200
# with an error body), new requests and /health are refused while
# the server is still there, and the job exits non-zero.
# usage: kill_test.sh LOCKSTEP MODEL_DIR PORT
# Needs the fault-injection hook: a build with -DLKS_TEST_HOOKS=ON (env LKS_TEST_HOOKS=ON, set by
# ctest); without it the test is skipped (status 77).
set -u
[ "${LKS_TEST_HOOKS:-OFF}" = ON ] || { echo "SKIP: this build has no test hooks (-DLKS_TEST_HOOKS=ON)"; exit 77; }
lockstep=$1 model=$2 port=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
log=$(mktemp) stream=$(mktemp)
trap 'kill $pid 2>/dev/null; rm -f "$log" "$stream"' EXIT
fails=0 passes=0
ok() { echo "ok: $1"; passes=$((passes + 1)); }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
mpirun --oversubscribe -np 2 -x LKS_FAULT=die@30:1 "$lockstep" serve --model "$model" --port "$port" \
  --threads 1 > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
  sleep 0.1
done
t0=$(date +%s%3N)
# A plain (non-streamed) request in flight too: it must get a 5xx, not a 200 with an error body.
plain=$(mktemp)
curl -s --max-time 60 -o "$plain" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
  -d '{"prompt": [8, 9], "max_tokens": 2000, "ignore_eos": true, "temperature": 0}' > "$plain.code" &
cpid=$!
curl -sN --max-time 60 "http://127.0.0.1:$port/v1/completions" \
  -d '{"prompt": [5, 6, 7], "max_tokens": 2000, "ignore_eos": true, "temperature": 0, "stream": true}' > "$stream"
wait $cpid
code=$(cat "$plain.code")
[ "$code" = 500 ] && grep -q '"error"' "$plain" && ok "the plain request in flight got 500 with an error body" \
  || bad "the plain request in flight got $code: $(head -c 200 "$plain")"
rm -f "$plain" "$plain.code"
# Right after the stream ends: the server is either still up and refusing (503), or gone.
h=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$port/health")
m=$(curl -s --max-time 5 "http://127.0.0.1:$port/metrics")
r=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$port/v1/completions" -d '{"prompt": [1], "max_tokens": 2}')
grep -q '^data: {"error"' "$stream" && ! grep -q '\[DONE\]' "$stream" \
  && ok "the open stream ended with an error event: $(grep '^data: {"error"' "$stream" | cut -c1-140)" \
  || { bad "the stream did not end with an error event"; tail -3 "$stream"; }
{ [ "$h" = 503 ] || [ "$h" = 000 ]; } && { [ "$r" = 503 ] || [ "$r" = 000 ]; } \
  && ok "after the failure /health is $h and a new request $r (503, or 000: the job is gone)" \
  || bad "after the failure /health $h, new request $r"
# Liveness in /metrics while the server is still there: the killed rank 1 reads 0.
if [ -n "$m" ]; then
  grep -qx 'lockstep_rank_up{rank="1"} 0' <<< "$m" && grep -qx 'lockstep_rank_up{rank="0"} 1' <<< "$m" && ok "/metrics after the failure: $(grep '^lockstep_rank_up' <<< "$m" | tr '\n' ' ')" \
    || bad "/metrics after the failure does not show rank 1 down: $(grep '^lockstep_rank_up' <<< "$m" | tr '\n' ' ')"
else
  echo "note: the server was gone before /metrics could be read; rank liveness not checked"
fi
for _ in $(seq 1 200); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
wait $pid
st=$?
elapsed=$(( $(date +%s%3N) - t0 ))
[ "$st" != 0 ] && ok "the job exited with status $st within $elapsed ms" || bad "the job exited 0"
grep -q "rank 1 .*disconnected" "$log" && ok "the coordinator named rank 1" || { bad "rank 1 not named"; tail -5 "$log"; }
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
