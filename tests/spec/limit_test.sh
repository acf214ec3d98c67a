#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Speculation up to the end of the context in `generate` and `bench` (issue 13, item 1): with
# --max-seq-len 64, 8 prompt ids and 56 new tokens under --spec mtp -k 3 (drafts that would run
# past position 64 must be capped), at world 1 and 2: status 0, all 56 tokens, the same tokens
# as without speculation (greedy and sampled); one token more is refused before anything runs;
# bench prefills 8 and decodes 56 with speculation.
# usage: limit_test.sh LOCKSTEP MODEL_DIR
set -u
lockstep=$1 model=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fails=0 passes=0
ok() { echo "ok: $1"; passes=$((passes + 1)); }
bad() { echo "FAIL: $1"; sed 's/^/    | /' "$out" | tail -8; fails=$((fails + 1)); }
gen=(generate --model "$model" --max-seq-len 64 --prompt-ids 1,2,3,4,5,6,7,8 --ignore-eos --log-level warn)
for sampling in "--temperature 0" "--temperature 0.9 --seed 5"; do
  # shellcheck disable=SC2086
  timeout 60 "$lockstep" "${gen[@]}" -n 56 $sampling > "$out" 2>&1
  want=$(head -1 "$out")
  for np in 1 2; do
    launch=()
    [ $np -gt 1 ] && launch=(mpirun --oversubscribe -np $np)
    # shellcheck disable=SC2086
    timeout 120 "${launch[@]}" "$lockstep" "${gen[@]}" -n 56 $sampling --spec mtp -k 3 > "$out" 2>&1
    rc=$?
    got=$(head -1 "$out")
    n=$(echo "$got" | tr ',' '\n' | grep -c .)
    [ $rc = 0 ] && [ "$n" = 56 ] && [ "$got" = "$want" ] \
      && ok "world $np, $sampling: speculation to position 64 gives the 56 tokens of plain decoding" \
      || bad "world $np, $sampling: status $rc, $n tokens, equal: $([ "$got" = "$want" ] && echo yes || echo no)"
  done
done
timeout 60 "$lockstep" "${gen[@]}" -n 57 --spec mtp -k 3 > "$out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "exceed --max-seq-len 64" "$out" && ok "one token past the context is refused up front" \
  || bad "one token past the context (status $rc)"
for np in 1 2; do
  launch=()
  [ $np -gt 1 ] && launch=(mpirun --oversubscribe -np $np)
  timeout 180 "${launch[@]}" "$lockstep" bench --model "$model" --max-seq-len 64 --prefill-len 8 \
    --decode-len 56 --repeats 1 --spec mtp -k 3 --log-level warn > "$out" 2>&1
  rc=$?
  [ $rc = 0 ] && grep -q "spec mtp\|--spec mtp" "$out" && ok "world $np: bench decodes to position 64 with speculation" \
    || bad "world $np: bench to the end of the context (status $rc)"
done
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
