#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Load: wrk drives 32 connections of completions for SECONDS (60 by default) against
# `lockstep serve`; no response may be a 5xx, and the server's resident memory may grow less than
# 10% from the first 10 s to the last 10 s.
# (Every answer must be 2xx: a stricter form of 'no 5xx'.)
# usage: load_test.sh LOCKSTEP MODEL_DIR PORT [SECONDS] [CHECK_RSS]
# CHECK_RSS 0 (sanitizer builds, whose allocators keep caches that grow) reports the memory
# figure without judging it.
set -u
lockstep=$1 model=$2 port=$3 secs=${4:-60} check_rss=${5:-1}
log=$(mktemp) lua=$(mktemp --suffix=.lua) rss=$(mktemp) out=$(mktemp)
trap 'kill $pid 2>/dev/null; rm -f "$log" "$lua" "$rss" "$out"' EXIT
"$lockstep" serve --model "$model" --port "$port" --max-slots 8 --max-queue 64 > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.1; done
cat > "$lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0.7, "seed": 1}'
LUA
( for _ in $(seq 1 "$secs"); do awk '/VmRSS/ {print $2}' /proc/$pid/status; sleep 1; done > "$rss" ) &
sampler=$!
wrk -t 2 -c 32 -d "${secs}s" --timeout 30s -s "$lua" "http://127.0.0.1:$port/v1/completions" > "$out" 2>&1
wait $sampler
cat "$out"
# wrk counts the answers that are not 2xx/3xx; there must be none (no 5xx, and no 429 either:
# 32 connections fit in 8 slots and a queue of 64).
non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out")
non2xx=${non2xx:-0}
total=$(awk '/requests in/ {print $1}' "$out")
first=$(head -10 "$rss" | awk '{s += $1} END {print int(s / NR)}')
last=$(tail -10 "$rss" | awk '{s += $1} END {print int(s / NR)}')
growth=$(awk -v a="$first" -v b="$last" 'BEGIN {printf "%.1f", 100 * (b - a) / a}')
echo "requests: $total, not 2xx: $non2xx; resident memory ${first} kB (first 10 s) -> ${last} kB (last 10 s): ${growth}%"
curl -sf "http://127.0.0.1:$port/health" > /dev/null && alive=1 || alive=0
kill -TERM $pid; wait $pid
rss_ok=1
[ "$check_rss" = 1 ] && ! awk -v g="$growth" 'BEGIN {exit !(g < 10)}' && rss_ok=0
[ "$check_rss" = 1 ] || echo "(memory growth not judged in a sanitizer build)"
if [ "$non2xx" = 0 ] && [ "${total:-0}" -gt 0 ] && [ "$alive" = 1 ] && [ "$rss_ok" = 1 ]; then
  echo "1 passed, 0 failed"; exit 0
fi
echo "0 passed, 1 failed"; exit 1
