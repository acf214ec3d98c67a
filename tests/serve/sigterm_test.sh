#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# SIGTERM during a streaming request: the request completes, new requests get 503 meanwhile,
# and the process exits 0. A second SIGTERM during a drain stops at once.
# usage: sigterm_test.sh LOCKSTEP MODEL_DIR PORT
set -u
lockstep=$1 model=$2 port=$3
log=$(mktemp) stream=$(mktemp)
trap 'kill -9 $pid 2>/dev/null; rm -f "$log" "$stream"' EXIT
fails=0 passes=0
ok() { echo "ok: $1"; passes=$((passes + 1)); }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
start() {
  "$lockstep" serve --model "$model" --port "$port" --max-slots 4 > "$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && return; sleep 0.1; done
}
# Long enough to be running when the signals arrive, on any of the models the suite serves.
body='{"prompt": [5, 6, 7], "max_tokens": 3000, "ignore_eos": true, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}'

start
curl -sN --max-time 120 "http://127.0.0.1:$port/v1/completions" -d "$body" > "$stream" &
client=$!
sleep 0.3
kill -TERM $pid
sleep 0.2
h=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$port/health")
r=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$port/v1/completions" -d '{"prompt": [1], "max_tokens": 2}')
wait $client
wait $pid
st=$?
grep -q '"completion_tokens":3000' "$stream" && grep -q '\[DONE\]' "$stream" \
  && ok "the open stream completed all 3000 tokens after SIGTERM" || { bad "the stream did not complete"; tail -2 "$stream"; }
{ [ "$h" = 503 ] && [ "$r" = 503 ]; } && ok "while draining: /health $h, new request $r" \
  || bad "while draining: /health $h, new request $r (want 503, 503)"
[ "$st" = 0 ] && ok "exit status 0 after the drain" || bad "exit status $st"

start
curl -sN --max-time 120 "http://127.0.0.1:$port/v1/completions" -d "$body" > "$stream" &
client=$!
sleep 0.3
kill -TERM $pid; sleep 0.1; kill -TERM $pid
t0=$(date +%s%3N)
wait $pid
st=$?
ms=$(( $(date +%s%3N) - t0 ))
wait $client
[ "$st" != 0 ] && [ "$ms" -lt 2000 ] && ok "a second SIGTERM stops at once ($ms ms, status $st)" \
  || bad "second SIGTERM: status $st after $ms ms"
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
