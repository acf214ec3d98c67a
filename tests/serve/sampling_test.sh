#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Logit processing and reporting of the OpenAI API (logprobs, top_logprobs, n, presence /
# frequency / repetition penalties, logit_bias), against three servers of the same model: plain
# decoding at world 1, `--spec mtp -k 3` at world 2 and `--spec ngram -k 2` at world 1 (the gate
# off, so that every step that can speculate does). sampling_test.mjs (the openai npm client and
# raw requests) checks the answers and that the three servers' tokens are identical, and writes
# the cases that logits_ref.py then checks against the numpy reference of the model.
# usage: sampling_test.sh LOCKSTEP MODEL_DIR PORT PYTHON
set -u
lockstep=$1 model=$2 port=$3 python=$4
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$work"' EXIT
common=(serve --model "$model" --threads 1 --max-slots 8 --spec-gate false)
"$lockstep" "${common[@]}" --port "$port" > "$work/plain.log" 2>&1 &
pids+=($!)
# A longer heartbeat: on a loaded machine (the sanitizer stage beside other jobs) a rank can be
# starved for the default 3 s before the first request arrives; what is tested here is not that.
mpirun --oversubscribe -np 2 "$lockstep" "${common[@]}" --port $((port + 1)) --spec mtp -k 3 \
  --heartbeat 3 > "$work/mtp.log" 2>&1 &
pids+=($!)
"$lockstep" "${common[@]}" --port $((port + 2)) --spec ngram -k 2 > "$work/ngram.log" 2>&1 &
pids+=($!)
for p in "$port" $((port + 1)) $((port + 2)); do
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$p/health" > /dev/null && break
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$p/health" > /dev/null || { echo "FAIL: the server on $p did not start"; cat "$work"/*.log; exit 1; }
done
rc=0
node "$here/sampling_test.mjs" "http://127.0.0.1:$port" "http://127.0.0.1:$((port + 1))" \
  "http://127.0.0.1:$((port + 2))" "$work/cases.json" || rc=1
if [ -s "$work/cases.json" ]; then
  "$python" "$here/logits_ref.py" "$model" "$work/cases.json" || rc=1
else
  echo "FAIL: no cases for the reference"; rc=1
fi
# Speculation ran: the mtp server accepted drafts (else spec = plain would prove nothing).
acc=$(curl -s "http://127.0.0.1:$((port + 1))/metrics" | awk '/^lockstep_spec_drafts_accepted_total/ {s += $2} END {print s + 0}')
echo "mtp drafts accepted: $acc"
[ "$acc" -gt 0 ] || { echo "FAIL: the mtp server accepted no drafts"; rc=1; }
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
pids=()
[ $rc = 0 ] || tail -n 5 "$work"/*.log
exit $rc
