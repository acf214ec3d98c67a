#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# JSON mode end to end (json_test.mjs, the openai npm client): `lockstep serve` plain at world 1,
# then with --spec mtp -k 3 and --spec ngram, then (WORLD2=1) under `mpirun -np 2` with --spec
# mtp: each server's greedy and seeded JSON-mode replies must equal the plain server's, token for
# token (speculation and the world change nothing), and every sampled reply must parse.
# usage: json_test.sh LOCKSTEP MODEL_DIR PORT [WORLD2]
set -u
lockstep=$1 model=$2 port=$3 world2=${4:-0}
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
log=$work/log
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT
rc=0

# run NAME NP SAMPLED [SERVE_ARGS...]: one server, json_test.mjs against it, then its shutdown.
run() {
  local name=$1 np=$2 sampled=$3
  shift 3
  if [ "$np" = 1 ]; then
    "$lockstep" serve --model "$model" --port "$port" --threads 1 --max-slots 8 "$@" > "$log" 2>&1 &
  else
    mpirun --oversubscribe -np "$np" "$lockstep" serve --model "$model" --port "$port" --threads 1 \
      --max-slots 8 "$@" > "$log" 2>&1 &
  fi
  pid=$!
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    kill -0 $pid 2>/dev/null || { echo "FAIL: the $name server exited"; cat "$log"; exit 1; }
    sleep 0.1
  done
  echo "== $name (world $np, $*)"
  node "$here/json_test.mjs" "http://127.0.0.1:$port" "$work/$name.json" "$sampled" || { rc=1; tail -20 "$log"; }
  kill -TERM $pid 2>/dev/null
  wait $pid 2>/dev/null
  pid=
}

run plain 1 ${SAMPLED:-100}
run mtp 1 8 --spec mtp -k 3 --spec-gate false
run ngram 1 8 --spec ngram -k 3 --spec-gate false
[ "$world2" = 1 ] && run mtp_w2 2 8 --spec mtp -k 3 --spec-gate false
for other in mtp ngram mtp_w2; do
  [ -f "$work/$other.json" ] || continue
  if cmp -s "$work/plain.json" "$work/$other.json"; then
    echo "$other: the same tokens as plain ($(grep -c '"ids"' "$work/plain.json") requests)"
  else
    echo "FAIL: $other differs from plain"; diff "$work/plain.json" "$work/$other.json" | head -20; rc=1
  fi
done
exit $rc
