#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# deploy/mpirun/lockstep-2host.sh against two hosts simulated on this machine: network
# namespaces lks-ha and lks-hb joined by a veth pair (10.213.7.1 and 10.213.7.2, test hosts of
# this run only), with MPI's remote start (the launcher's LKS_RSH) pointed into them. The
# coordinator and the worker talk over the veth, not loopback. The launcher must refuse a host
# whose lockstep build differs and one whose model files differ (simulated by bind-mounting other
# files over the path in that host's mount namespace), then serve a completion.
# Root only. usage: two_host_test.sh LOCKSTEP MODEL_DIR PORT
set -u
lockstep=$1 model=$2 port=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
A=10.213.7.1 B=10.213.7.2
work=$(mktemp -d)
fails=0 passes=0
ok() { echo "ok: $1"; passes=$((passes + 1)); }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
del_namespaces() {
  ip netns pids lks-ha 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids lks-hb 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del lks-ha 2>/dev/null; ip netns del lks-hb 2>/dev/null
}
# `ip netns add` makes /run/netns a mount point (a shared bind mount of itself) when it is not
# one, and `ip netns del` leaves that mount behind: undo it when this test made it and no other
# namespace is left in it, then check that /run/netns is as the test found it (the exit status
# turns non-zero when it is not).
netns_dir_existed=0 netns_was_mount=0
[ -d /run/netns ] && netns_dir_existed=1
mountpoint -q /run/netns 2>/dev/null && netns_was_mount=1
cleanup() {
  local st=$?
  del_namespaces
  rm -rf "$work"
  if [ $netns_was_mount = 0 ] && mountpoint -q /run/netns 2>/dev/null && [ -z "$(ls -A /run/netns)" ]; then
    umount /run/netns 2>/dev/null || umount -l /run/netns
  fi
  [ $netns_dir_existed = 0 ] && rmdir /run/netns 2>/dev/null
  local now_mount=0
  mountpoint -q /run/netns 2>/dev/null && now_mount=1
  if [ $now_mount != $netns_was_mount ]; then
    echo "FAIL: /run/netns is left a mount point: $now_mount, before the test: $netns_was_mount"
    grep ' /run/netns' /proc/self/mountinfo
    st=1
  fi
  exit $st
}
trap cleanup EXIT
del_namespaces
ip netns add lks-ha && ip netns add lks-hb || { echo "FAIL: cannot create network namespaces"; exit 1; }
ip link add lks-va type veth peer name lks-vb
ip link set lks-va netns lks-ha && ip link set lks-vb netns lks-hb
ip -n lks-ha addr add $A/24 dev lks-va && ip -n lks-hb addr add $B/24 dev lks-vb
for ns in lks-ha lks-hb; do ip -n $ns link set lo up; done
ip -n lks-ha link set lks-va up && ip -n lks-hb link set lks-vb up
ip netns exec lks-ha bash -c "echo > /dev/tcp/$B/9" 2>&1 | grep -q "refused" && ok "two test hosts: $A and $B over a veth pair" \
  || { bad "the test hosts cannot reach each other"; exit 1; }

# The remote shell: "agent HOST COMMAND..." runs COMMAND (as ssh would, through sh) inside that
# host's namespace; LKS_TEST_OVERLAY_<A|B>="SRC:DST ..." bind-mounts SRC over DST there first.
cat > "$work/rsh" <<AGENT
#!/usr/bin/env bash
while [[ \$1 == -* ]]; do shift; done
host=\$1; shift
case \$host in $A) ns=lks-ha; key=A ;; $B) ns=lks-hb; key=B ;; *) echo "rsh: unknown host \$host" >&2; exit 255 ;; esac
var=LKS_TEST_OVERLAY_\$key
mounts=""
for pair in \${!var:-}; do mounts+="mount --bind \${pair%%:*} \${pair#*:} && "; done
exec ip netns exec \$ns unshare -m --propagation private sh -c "\$mounts \$*"
AGENT
chmod +x "$work/rsh"
export LKS_RSH="$work/rsh" LOCKSTEP="$lockstep" NET=10.213.7.0/24 ADDR_A=$A PORT=$port
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
launch() { ip netns exec lks-ha "$root/deploy/mpirun/lockstep-2host.sh" $A $B "$model" "$@"; }

cp "$lockstep" "$work/other-lockstep" && printf 'x' >> "$work/other-lockstep"
out=$(LKS_TEST_OVERLAY_B="$work/other-lockstep:$lockstep" launch 2>&1)
[ $? != 0 ] && grep -q "different lockstep builds" <<< "$out" && ok "refused: $(grep different <<< "$out" | head -1 | cut -c1-110)" \
  || bad "a different build was not refused: $out"
sed 's/"rms_norm_eps"/"rms_norm_eps" /' "$model/config.json" > "$work/config.json"
out=$(LKS_TEST_OVERLAY_B="$work/config.json:$model/config.json" launch 2>&1)
[ $? != 0 ] && grep -q "model file config.json differs" <<< "$out" && ok "refused: $(grep differs <<< "$out" | head -1 | cut -c1-110)" \
  || bad "different model files were not refused: $out"

launch --admin-token two-host-token --threads 1 > "$work/log" 2>&1 &
job=$!
for _ in $(seq 1 600); do grep -q "serving on" "$work/log" && break; kill -0 $job 2>/dev/null || break; sleep 0.2; done
grep -q "serving on http://$A:$port" "$work/log" && ok "serving on http://$A:$port" || { bad "not serving"; tail -20 "$work/log"; }
grep -q "control plane: 1 worker(s) connected" "$work/log" && grep -q "rank 1 " "$work/log" && ok "the worker joined from the other host" || bad "no worker"
r=$(ip netns exec lks-hb curl -s "http://$A:$port/v1/completions" -d '{"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0}')
grep -q '"completion_tokens":8' <<< "$r" && ok "a completion, requested from the other host over the link" || bad "completion: $r"
ip netns exec lks-ha ss -tnp 2>/dev/null | grep lockstep | grep -q "$A:.*$B:" && ok "coordinator and worker are connected over $A <-> $B" \
  || bad "no lockstep connection over the veth"
ip netns exec lks-ha curl -s -X POST -H "Authorization: Bearer two-host-token" "http://$A:$port/admin/shutdown" > /dev/null
wait $job
st=$?
[ $st = 0 ] && ok "shut down cleanly" || { bad "exit status $st"; tail -5 "$work/log"; }
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
