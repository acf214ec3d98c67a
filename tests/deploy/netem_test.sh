#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# World 2 over a delayed link (issue 19, item 5), the smoke test: rank 0 and rank 1 in two
# network namespaces joined by a veth pair with `tc netem delay 100us` on each end, MPI and the
# control plane over it (tools/netem_lib.sh); `lockstep generate --spec mtp -k 3` with the
# adaptive policy gives the tokens of plain decoding at world 1, greedy and sampled. Where the
# kernel has no netem, the delay comes from DELAY_LINK (tools/delay_link.c, a userspace forwarder
# between TAP interfaces in the two namespaces), whose report is checked too; without either the
# test says so and runs over the bare veth. The measurement itself is tools/netem_bench.sh.
# Root only. usage: netem_test.sh LOCKSTEP MODEL_DIR [DELAY_LINK]
set -u
lockstep=$1 model=$2
NETEM_DELAY_LINK=${3:-}
. "$(dirname "$0")/../../tools/netem_lib.sh"
fails=0 passes=0
ok() { echo "ok: $1"; passes=$((passes + 1)); }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
gen=(generate --model "$model" --prompt-ids 3,14,15,92,65,35 -n 40 --ignore-eos --threads 1 --log-level warn)
netem_up || { echo "FAIL: cannot set up the namespaces"; exit 1; }
if netem_delay 100; then
  ok "a delay of 100 us per direction: $NETEM_VIA"
else
  echo "note: no delay (no netem, no delay_link), running over the bare veth: $NETEM_ERR"
fi
for sampling in "--temperature 0" "--temperature 0.8 --seed 11"; do
  # shellcheck disable=SC2086
  want=$(timeout 120 "$lockstep" "${gen[@]}" $sampling 2>&1 | head -1)
  # shellcheck disable=SC2086
  got=$(NETEM_TIMEOUT=300 netem_mpirun "$lockstep" "${gen[@]}" $sampling --spec mtp -k 3 2>"$netem_work/err" | head -1)
  n=$(echo "$got" | tr ',' '\n' | grep -c .)
  if [ "$n" = 40 ] && [ "$got" = "$want" ]; then
    ok "world 2 over the link, --spec mtp with the policy, $sampling: the 40 tokens of plain decoding at world 1"
  else
    bad "$sampling: world 2 over the link gave '$got', world 1 plain '$want'"
    tail -5 "$netem_work/err"
  fi
done
netem_delay 0    # stops delay_link, which reports what the frames really took
link=$(netem_link_report)
if [ -n "$link" ]; then
  echo "$link"
  # each direction carried frames, each delayed by at least the 100 us asked for
  bad_link=$(echo "$link" | awk '{for (i = 1; i <= NF; i++) if ($i == "min") m = $(i + 1); if ($5 + 0 < 1 || m + 0 < 100) print}')
  [ "$(echo "$link" | wc -l)" = 2 ] || bad_link="not two directions: $link"
  if [ -z "$bad_link" ]; then ok "delay_link forwarded both directions, each frame >= 100 us late"
  else bad "delay_link: $bad_link"; fi
fi
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
