#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The control plane admits only the job's ranks, and finds rank 0 when host names do not resolve:
#   - `mpirun -np 2 lockstep serve`: a foreign ZeroMQ peer (zmq_intruder: DEALER and PULL without
#     credentials, with a wrong secret, raw TCP junk) on rank 0's ports for 6 s receives nothing,
#     is refused in the log, and requests meanwhile give the same tokens as before; the job then
#     shuts down with status 0;
#   - a host name that does not resolve (LKS_TEST_HOSTNAME with -DLKS_TEST_HOOKS=ON, else a
#     network-less UTS namespace via `unshare -u` as root, else skipped): world 2 generates the
#     world 1 tokens, and the log names the failed look-up;
#   - --control-host naming a host that does not resolve: refused, naming it.
# usage: control_plane_test.sh LOCKSTEP ZMQ_INTRUDER MODEL_DIR PORT
set -u
lockstep=$1 intruder=$2 model=$3 port=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
log=$(mktemp) out=$(mktemp)
trap 'kill $pid 2>/dev/null; rm -f "$log" "$out"' EXIT
fails=0 passes=0
ok() { echo "ok: $1"; passes=$((passes + 1)); }
bad() { echo "FAIL: $1"; sed 's/^/    | /' "$out" | tail -8; fails=$((fails + 1)); }
token=control-test-token-$$
complete() { curl -s --max-time 30 "http://127.0.0.1:$port/v1/completions" \
  -d '{"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0, "return_token_ids": true}' | grep -o '"token_ids":\[[^]]*\]'; }

mpirun --oversubscribe -np 2 "$lockstep" serve --model "$model" --port "$port" --threads 1 \
  --admin-token "$token" > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.1; done
want=$(complete)
read -r addr cport bport < <(sed -nE 's/.*control plane: listening on ([0-9.]+) \(commands ([0-9]+), heartbeats ([0-9]+).*/\1 \2 \3/p' "$log")
"$intruder" "$addr" "$cport" "$bport" 6 > "$out" 2>&1 &
ipid=$!
sleep 1
same=1
for _ in 1 2 3 4 5; do [ "$(complete)" = "$want" ] || same=0; sleep 0.5; done
wait $ipid
irc=$?
cat "$log" >> "$out"
[ -n "$want" ] && [ "$same" = 1 ] && ok "requests give the same tokens while a foreign peer is connected ($want)" \
  || bad "requests while a foreign peer is connected"
[ "$irc" = 0 ] && ok "the foreign peer received nothing ($(head -1 "$out"))" || bad "the foreign peer received commands"
grep -q "control plane: refused a peer" "$log" && ok "the foreign peer was refused in the log" || bad "no refusal logged"
curl -sf "http://127.0.0.1:$port/health" > /dev/null && ok "/health 200 after it" || bad "/health after the foreign peer"
curl -s -X POST -H "Authorization: Bearer $token" "http://127.0.0.1:$port/admin/shutdown" > /dev/null
for _ in $(seq 1 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
wait $pid
st=$?
[ "$st" = 0 ] && ok "the job shut down with status 0" || { cp "$log" "$out"; bad "the job exited $st"; }

gen=(generate --model "$model" --prompt-ids 5,6,7,8 -n 8 --ignore-eos)
timeout 60 "$lockstep" "${gen[@]}" --log-level error > "$out" 2>&1
want=$(head -1 "$out")
if [ "${LKS_TEST_HOOKS:-OFF}" = ON ]; then
  timeout 60 mpirun --oversubscribe -np 2 -x LKS_TEST_HOSTNAME=no-such-host.invalid "$lockstep" "${gen[@]}" > "$out" 2> "$log"
  rc=$?
  how="LKS_TEST_HOSTNAME"
elif [ "$(id -u)" = 0 ] && unshare -u true 2>/dev/null; then
  timeout 60 unshare -u sh -c 'hostname no-such-host-lks-test && exec "$@"' sh \
    mpirun --oversubscribe -np 2 --mca btl self,tcp "$lockstep" "${gen[@]}" > "$out" 2> "$log"
  rc=$?
  how="unshare -u"
else
  rc=skip
fi
if [ "$rc" = skip ]; then
  echo "skipped: an unresolvable host name (needs -DLKS_TEST_HOOKS=ON or root)"
else
  [ "$rc" = 0 ] && grep -qx "$want" "$out" && ok "an unresolvable host name ($how): world 2 generates the world 1 tokens" \
    || { cat "$log" >> "$out"; bad "an unresolvable host name ($how): status $rc"; }
  if [ "$how" = LKS_TEST_HOSTNAME ]; then
    grep -q "host name 'no-such-host.invalid' does not resolve" "$log" && ok "the failed look-up is named in the log" \
      || bad "the failed look-up is not named"
  fi
fi
timeout 60 mpirun --oversubscribe -np 2 "$lockstep" "${gen[@]}" --control-host no-such-host.invalid --collective-timeout 10 > "$out" 2>&1
rc=$?
[ "$rc" != 0 ] && grep -q "control-host 'no-such-host.invalid' does not resolve" "$out" \
  && ok "--control-host that does not resolve is refused, naming it" || bad "--control-host that does not resolve (status $rc)"
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
