#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# deploy/slurm/lockstep.sbatch on a real one-machine slurm cluster (Debian's slurm-wlm and
# munge): two tasks on the default model; wait for /health; a completion; scancel; the job must
# end (state CANCELLED after draining, batch exit 0) and no lockstep process may be left.
# usage: slurm_test.sh LOCKSTEP MODEL_DIR PORT
set -u
lockstep=$1 model=$2 port=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dir=$(mktemp -d)
fails=0 passes=0
ok() { echo "ok: $1"; passes=$((passes + 1)); }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
cleanup() {
  [ -n "${job:-}" ] && scancel "$job" 2>/dev/null
  bash "$here/slurm_cluster.sh" stop "$dir"
  pkill -9 -f "lockstep serve --model $model --port $port" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
# The start's output is checked before it is used: `eval "$(slurm_cluster.sh start)"` evaluates
# an empty string (status 0) when the start fails, and the test went on against no cluster or
# against whatever SLURM_CONF the machine has.
conf=$(bash "$here/slurm_cluster.sh" start "$dir" 2>"$dir/cluster.err")
st=$?
if [ $st != 0 ]; then
  echo "FAIL: the slurm cluster did not start (slurm_cluster.sh start exited $st):"
  sed 's/^/  /' "$dir/cluster.err"
  echo "0 passed, 1 failed"
  exit 1
fi
if ! [[ $conf =~ ^export\ SLURM_CONF=[^[:space:]]+$ ]]; then
  echo "FAIL: slurm_cluster.sh start printed '$conf', not 'export SLURM_CONF=...':"
  sed 's/^/  /' "$dir/cluster.err"
  echo "0 passed, 1 failed"
  exit 1
fi
eval "$conf"
ok "a one-node slurm cluster is up ($(sinfo -h -o '%P %D %t'))"
job=$(sbatch --parsable --ntasks=2 --output="$dir/job.out" \
  --export=ALL,MODEL="$model",LOCKSTEP="$lockstep",PORT="$port",LOCKSTEP_ARGS="--threads 1" \
  "$root/deploy/slurm/lockstep.sbatch")
[ -n "$job" ] && ok "submitted job $job" || { bad "sbatch failed"; echo "0 passed, 1 failed"; exit 1; }
up=0
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null && { up=1; break; }
  squeue -h -j "$job" 2>/dev/null | grep -q . || break  # the job ended early
  sleep 0.2
done
[ $up = 1 ] && ok "/health answers 200" || { bad "/health never answered"; cat "$dir/job.out"; }
out=$(curl -s "http://127.0.0.1:$port/v1/completions" -d '{"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0}')
echo "$out" | grep -q '"completion_tokens":8' && ok "a completion through the slurm job" || bad "completion: $out"
# A long streaming request is still running when the job is cancelled: it must finish.
curl -sN --max-time 60 "http://127.0.0.1:$port/v1/completions" \
  -d '{"prompt": [5, 6, 7], "max_tokens": 300, "ignore_eos": true, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}' > "$dir/stream" &
client=$!
sleep 0.3
scancel "$job"
wait $client
grep -q '"completion_tokens":300' "$dir/stream" && ok "the request running at scancel completed (drain)" \
  || { bad "the running request did not complete"; tail -2 "$dir/stream"; }
for _ in $(seq 1 300); do squeue -h -j "$job" 2>/dev/null | grep -q . || break; sleep 0.2; done
state=$(scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
code=$(scontrol show job "$job" 2>/dev/null | grep -o ' ExitCode=[0-9:]*' | cut -d= -f2)
[ "$state" = CANCELLED ] && ok "the job ended: state $state, exit code $code" || bad "job state '$state' exit code '$code'"
grep -q "the ranks exited with status 0" "$dir/job.out" && ok "every rank exited 0 after draining" \
  || { bad "the ranks did not exit 0"; tail -5 "$dir/job.out"; }
sleep 0.5
pgrep -f "lockstep serve --model $model --port $port" > /dev/null && bad "lockstep processes are left" \
  || ok "no lockstep process is left"
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
