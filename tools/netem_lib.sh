# SPDX-License-Identifier: MIT
# Two simulated hosts on this machine for world-2 runs over a link with a real link's latency
# (issue 19): network namespaces lks-na and lks-nb joined by a veth pair (10.213.9.1 and
# 10.213.9.2), with `tc qdisc ... netem delay` on each end, MPI's TCP traffic and the control
# plane over it, and MPI's remote start pointed into the namespaces (as tests/deploy/
# two_host_test.sh does for the launcher). Sourced by tools/netem_bench.sh and
# tests/deploy/netem_test.sh; root only.
#
#   netem_up                 make the namespaces and the veth (a trap on EXIT undoes them)
#   netem_delay US           netem delay of US microseconds per direction (0: none); returns 1
#                            and sets NETEM_ERR when the kernel has no netem (sch_netem)
#   netem_mpirun ARGS...     mpirun -np 2, rank 0 in lks-na and rank 1 in lks-nb, over the veth
#                            (within NETEM_TIMEOUT seconds when set)
NETEM_A=10.213.9.1 NETEM_B=10.213.9.2
netem_work=$(mktemp -d)
netem_dir_existed=0 netem_was_mount=0
[ -d /run/netns ] && netem_dir_existed=1
mountpoint -q /run/netns 2>/dev/null && netem_was_mount=1

netem_del() {
  ip netns pids lks-na 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids lks-nb 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del lks-na 2>/dev/null; ip netns del lks-nb 2>/dev/null
}

# Undoes netem_up; `ip netns add` makes /run/netns a mount point when it is not one, and that
# mount is undone when no other namespace is left in it (as two_host_test.sh does).
netem_down() {
  local st=$?
  netem_del
  rm -rf "$netem_work"
  if [ $netem_was_mount = 0 ] && mountpoint -q /run/netns 2>/dev/null && [ -z "$(ls -A /run/netns)" ]; then
    umount /run/netns 2>/dev/null || umount -l /run/netns
  fi
  [ $netem_dir_existed = 0 ] && rmdir /run/netns 2>/dev/null
  exit $st
}

netem_up() {
  trap netem_down EXIT
  netem_del
  ip netns add lks-na && ip netns add lks-nb || { echo "netem: cannot create network namespaces (root?)" >&2; return 1; }
  ip link add lks-wa type veth peer name lks-wb || return 1
  ip link set lks-wa netns lks-na && ip link set lks-wb netns lks-nb
  ip -n lks-na addr add $NETEM_A/24 dev lks-wa && ip -n lks-nb addr add $NETEM_B/24 dev lks-wb
  for ns in lks-na lks-nb; do ip -n $ns link set lo up; done
  ip -n lks-na link set lks-wa up && ip -n lks-nb link set lks-wb up
  # The remote shell: "agent HOST COMMAND..." runs COMMAND through sh inside that host's namespace.
  cat > "$netem_work/rsh" <<AGENT
#!/usr/bin/env bash
while [[ \$1 == -* ]]; do shift; done
host=\$1; shift
case \$host in $NETEM_A) ns=lks-na ;; $NETEM_B) ns=lks-nb ;; *) echo "rsh: unknown host \$host" >&2; exit 255 ;; esac
exec ip netns exec \$ns sh -c "\$*"
AGENT
  chmod +x "$netem_work/rsh"
}

netem_delay() {
  local us=$1 ns dev
  NETEM_ERR=
  for ns in lks-na:lks-wa lks-nb:lks-wb; do
    dev=${ns#*:} ns=${ns%%:*}
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null
    [ "$us" = 0 ] && continue
    if ! NETEM_ERR=$(ip netns exec "$ns" tc qdisc add dev "$dev" root netem delay "${us}us" 2>&1); then
      NETEM_ERR="tc qdisc add dev $dev root netem delay ${us}us: ${NETEM_ERR:-failed}"
      [ -r /proc/config.gz ] && zcat /proc/config.gz | grep -q '^# CONFIG_NET_SCH_NETEM is not set' &&
        NETEM_ERR="$NETEM_ERR (this kernel, $(uname -r), is built without CONFIG_NET_SCH_NETEM and has no modules to load)"
      return 1
    fi
  done
  return 0
}

# The round trip over the link, in microseconds (median of 20 pings), or "?" without ping.
netem_rtt() {
  command -v ping > /dev/null || { echo "?"; return; }
  ip netns exec lks-na ping -q -c 20 -i 0.01 $NETEM_B 2>/dev/null |
    awk -F'/' '/rtt|round-trip/ {printf "%.0f", $5 * 1000}'
}

netem_mpirun() {
  ip netns exec lks-na timeout "${NETEM_TIMEOUT:-0}" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun -np 2 --host $NETEM_A,$NETEM_B --map-by node --mca plm_rsh_agent "$netem_work/rsh" \
    --mca oob_tcp_if_include 10.213.9.0/24 --mca btl_tcp_if_include 10.213.9.0/24 \
    --mca btl tcp,self -x LKS_CONTROL_HOST=$NETEM_A ${ASAN_OPTIONS:+-x ASAN_OPTIONS} "$@"
}
