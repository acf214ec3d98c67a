# SPDX-License-Identifier: MIT
# Two simulated hosts on this machine for world-2 runs over a link with a real link's latency
# (issue 19): network namespaces lks-na and lks-nb joined by a veth pair (10.213.9.1 and
# 10.213.9.2), with `tc qdisc ... netem delay` on each end, MPI's TCP traffic and the control
# plane over it, and MPI's remote start pointed into the namespaces (as tests/deploy/
# two_host_test.sh does for the launcher). Sourced by tools/netem_bench.sh and
# tests/deploy/netem_test.sh; root only.
#
#   netem_up                 make the namespaces and the veth (a trap on EXIT undoes them)
#   netem_delay US           a delay of US microseconds per direction (0: none, the bare veth):
#                            `tc netem` on the veth, or, when the kernel has no netem (sch_netem)
#                            and NETEM_DELAY_LINK names tools/delay_link.c's binary, that
#                            userspace forwarder between two TAP interfaces in place of the veth
#                            (NETEM_VIA says which); returns 1 and sets NETEM_ERR when neither
#   netem_link_report        what delay_link measured (frames, least, median and p99 delay per
#                            direction), once it is stopped; nothing for netem or the veth
#   netem_mpirun ARGS...     mpirun -np 2, rank 0 in lks-na and rank 1 in lks-nb, over the veth
#                            (within NETEM_TIMEOUT seconds when set)
NETEM_A=10.213.9.1 NETEM_B=10.213.9.2
netem_work=$(mktemp -d)
netem_dir_existed=0 netem_was_mount=0
[ -d /run/netns ] && netem_dir_existed=1
mountpoint -q /run/netns 2>/dev/null && netem_was_mount=1

netem_del() {
  netem_link_stop
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

# The link's two ends, lks-wa in lks-na and lks-wb in lks-nb, addressed and up.
netem_addr() {
  ip -n lks-na addr add $NETEM_A/24 dev lks-wa && ip -n lks-nb addr add $NETEM_B/24 dev lks-wb &&
    ip -n lks-na link set lks-wa up && ip -n lks-nb link set lks-wb up
}

netem_veth() {
  ip link add lks-wa type veth peer name lks-wb || return 1
  ip link set lks-wa netns lks-na && ip link set lks-wb netns lks-nb && netem_addr
}

# Stops delay_link (it reports to $netem_work/link.log); its TAP interfaces go with it.
netem_link_pid=
netem_link_stop() {
  [ -n "$netem_link_pid" ] || return 0
  kill -TERM "$netem_link_pid" 2>/dev/null
  wait "$netem_link_pid" 2>/dev/null
  netem_link_pid=
}

# delay_link stopped and the veth back, undelayed.
netem_link_veth() {
  netem_link_stop
  ip -n lks-na link del lks-wa 2>/dev/null
  ip -n lks-nb link del lks-wb 2>/dev/null
  netem_veth
}

netem_link_report() {
  [ -s "$netem_work/link.log" ] && grep 'frames' "$netem_work/link.log"
  rm -f "$netem_work/link.log"
}

# The veth replaced by delay_link's TAP pair with US microseconds per direction.
netem_link() {
  local us=$1 i
  netem_link_stop
  ip -n lks-na link del lks-wa 2>/dev/null
  ip -n lks-nb link del lks-wb 2>/dev/null
  rm -f "$netem_work/link.out"
  "$NETEM_DELAY_LINK" lks-na lks-wa lks-nb lks-wb "$us" > "$netem_work/link.out" 2> "$netem_work/link.log" &
  netem_link_pid=$!
  for i in $(seq 1 100); do
    grep -q ready "$netem_work/link.out" 2>/dev/null && break
    kill -0 $netem_link_pid 2>/dev/null || break
    sleep 0.05
  done
  grep -q ready "$netem_work/link.out" 2>/dev/null && netem_addr && return 0
  NETEM_ERR="delay_link did not start: $(cat "$netem_work/link.log")"
  netem_link_veth
  return 1
}

netem_up() {
  trap netem_down EXIT
  netem_del
  ip netns add lks-na && ip netns add lks-nb || { echo "netem: cannot create network namespaces (root?)" >&2; return 1; }
  for ns in lks-na lks-nb; do ip -n $ns link set lo up; done
  netem_veth || return 1
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
  NETEM_ERR= NETEM_VIA="the bare veth"
  if [ -n "$netem_link_pid" ]; then   # back from delay_link to the veth
    netem_link_veth || return 1
  fi
  ip netns exec lks-na tc qdisc del dev lks-wa root 2>/dev/null
  ip netns exec lks-nb tc qdisc del dev lks-wb root 2>/dev/null
  [ "$us" = 0 ] && return 0
  NETEM_VIA="tc netem on the veth"
  for ns in lks-na:lks-wa lks-nb:lks-wb; do
    dev=${ns#*:} ns=${ns%%:*}
    if ! NETEM_ERR=$(ip netns exec "$ns" tc qdisc add dev "$dev" root netem delay "${us}us" 2>&1); then
      NETEM_ERR="tc qdisc add dev $dev root netem delay ${us}us: ${NETEM_ERR:-failed}"
      [ -r /proc/config.gz ] && zcat /proc/config.gz | grep -q '^# CONFIG_NET_SCH_NETEM is not set' &&
        NETEM_ERR="$NETEM_ERR (this kernel, $(uname -r), is built without CONFIG_NET_SCH_NETEM and has no modules to load)"
      ip netns exec lks-na tc qdisc del dev lks-wa root 2>/dev/null
      if [ -n "${NETEM_DELAY_LINK:-}" ] && [ -x "$NETEM_DELAY_LINK" ]; then
        NETEM_VIA="delay_link (userspace TAP forwarder; no netem: $NETEM_ERR)"
        NETEM_ERR=
        netem_link "$us" && return 0
        NETEM_VIA="the bare veth"
        return 1
      fi
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

# Through delay_link the ranks yield the core while they wait in a collective: the forwarder
# needs a core to pass each frame on, and two ranks spinning on a 2-core host starved it (two
# machines' links need no core of the ranks'). Measured on the air-deep model, plain decoding
# over 20 us, the runs in turn: 144 and 130 ms a step spinning, 130 and 100 ms yielding.
netem_mpirun() {
  local yield=0
  case "${NETEM_VIA:-}" in delay_link*) yield=1 ;; esac
  ip netns exec lks-na timeout "${NETEM_TIMEOUT:-0}" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun -np 2 --host $NETEM_A,$NETEM_B --map-by node --mca plm_rsh_agent "$netem_work/rsh" \
    --mca oob_tcp_if_include 10.213.9.0/24 --mca btl_tcp_if_include 10.213.9.0/24 \
    --mca btl tcp,self --mca mpi_yield_when_idle $yield -x LKS_CONTROL_HOST=$NETEM_A \
    ${ASAN_OPTIONS:+-x ASAN_OPTIONS} "$@"
}
