#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# World 2 over a link with a real link's latency (issue 19, item 5): `lockstep bench --spec mtp`
# with rank 0 and rank 1 in two network namespaces joined by a veth pair, `tc netem` delaying
# each direction by each DELAY_US in turn (0: the bare veth), MPI and the control plane over it
# (tools/netem_lib.sh). bench prints plain decoding, the roofline for K = 1..K (the gate off)
# and the adaptive policy against plain. Root only; a measurement, not a test.
#
#   tools/netem_bench.sh LOCKSTEP MODEL_DIR "0 20 100" [bench flags...]
#
# When the kernel has no netem (CONFIG_NET_SCH_NETEM, module sch_netem), the delay comes from
# tools/delay_link.c (delay_link beside LOCKSTEP; a userspace forwarder between two TAP
# interfaces), whose report gives the delay each frame really had; without it the bench says so
# and measures over the bare veth only.
set -u
[ $# -ge 3 ] || { sed -n '3,14p' "$0"; exit 2; }
lockstep=$(realpath "$1") model=$(realpath "$2") delays=$3
shift 3
. "$(dirname "$0")/netem_lib.sh"
NETEM_DELAY_LINK=${NETEM_DELAY_LINK:-$(dirname "$lockstep")/delay_link}
netem_up || exit 1
for d in $delays; do
  bare=0
  if ! netem_delay "$d"; then
    bare=1
    echo "netem_bench: no ${d} us delay: $NETEM_ERR"
    echo "netem_bench: measuring over the bare veth instead"
    d=0
    netem_delay 0
  fi
  echo "== world 2, ${d} us per direction: $NETEM_VIA"
  netem_mpirun "$lockstep" bench --model "$model" --spec mtp --log-level warn "$@"
  netem_delay 0 && netem_link_report
  [ $bare = 1 ] && break
done
