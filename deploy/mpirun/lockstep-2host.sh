#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Serves one model from two machines joined by a direct link (two NVIDIA GB10 / DGX Spark with
# their ConnectX ports cabled together), rank 0 on the first host.
#
#   deploy/mpirun/lockstep-2host.sh HOST_A HOST_B MODEL_DIR [lockstep serve flags...]
#
# Before it starts anything it checks, through the remote shell, that both hosts run the same
# lockstep build (the binary's checksum and build id) and have the same model files (checksums
# of config.json, the index and every safetensors header, plus each file's size; FULL=1 hashes
# every byte), and refuses with a message naming the difference. Then it starts
# `mpirun -np 2 --host A,B lockstep serve`, waits for /health and prints the URL.
#
# Environment:
#   LOCKSTEP   the binary, at the same path on both hosts (default: lockstep on PATH)
#   PORT       HTTP port (8080);  BIND  listen address on host A (0.0.0.0)
#   NET        the link: an interface name (enp1s0f1np1) or a CIDR (10.10.0.0/24); MPI's TCP
#              traffic and NCCL's bootstrap stay on it
#   HCA        the RDMA device for NCCL and UCX (e.g. rocep1s0f1 or mlx5_0; default: unset)
#   ADDR_A     host A's address on the link, which the workers use for the control plane
#              (default: HOST_A)
#   LKS_RSH    the remote shell (default: ssh -o BatchMode=yes); the tests point it into network
#              namespaces
set -euo pipefail
[ $# -ge 3 ] || { sed -n '3,22p' "$0"; exit 2; }
host_a=$1 host_b=$2 model=$3
shift 3
LOCKSTEP=${LOCKSTEP:-lockstep}
PORT=${PORT:-8080}
BIND=${BIND:-0.0.0.0}
ADDR_A=${ADDR_A:-$host_a}
read -r -a rsh <<< "${LKS_RSH:-ssh -o BatchMode=yes}"

# What identifies a host's build and model: one "name value" line each.
probe='
set -e
bin=$(command -v "'"$LOCKSTEP"'")
echo "build $("$bin" version | tr " " _)"
echo "binary $(sha256sum "$bin" | cut -d" " -f1)"
cd "'"$model"'"
for f in config.json generation_config.json tokenizer.json model.safetensors.index.json; do
  [ -f "$f" ] && echo "file:$f $(sha256sum "$f" | cut -d" " -f1)"
done
for f in *.safetensors; do
  if [ "'"${FULL:-0}"'" = 1 ]; then sum=$(sha256sum "$f" | cut -d" " -f1)
  else n=$(od -An -tu8 -N8 "$f" | tr -d " "); sum=$(head -c $((8 + n)) "$f" | sha256sum | cut -d" " -f1); fi
  echo "file:$f $(stat -c %s "$f"):$sum"
done
'
declare -A seen
fail=0
for h in "$host_a" "$host_b"; do
  # The probe goes in on standard input, as ssh passes it through.
  out=$("${rsh[@]}" "$h" "bash -s" <<< "$probe" 2>&1) || {
    echo "lockstep-2host: cannot check $h: $out" >&2; exit 1; }
  seen[$h]=$out
done
while read -r name value; do
  other=$(grep -E "^$name " <<< "${seen[$host_b]}" | cut -d' ' -f2- || true)
  if [ "$other" != "$value" ]; then
    case $name in
      build|binary) echo "lockstep-2host: $host_a and $host_b run different lockstep builds ($name: '$value' vs '${other:-missing}'); install the same build on both" >&2 ;;
      file:*) echo "lockstep-2host: model file ${name#file:} differs between $host_a and $host_b ('$value' vs '${other:-missing}')" >&2 ;;
    esac
    fail=1
  fi
done <<< "${seen[$host_a]}"
for name in $(cut -d' ' -f1 <<< "${seen[$host_b]}"); do
  grep -qE "^$name " <<< "${seen[$host_a]}" || { echo "lockstep-2host: ${name#file:} is on $host_b only" >&2; fail=1; }
done
[ $fail = 0 ] || exit 1
echo "lockstep-2host: $host_a and $host_b have the same build and model files"

# The link: MPI's out-of-band and TCP traffic, NCCL's sockets, UCX and NCCL's RDMA device.
env=(-x LKS_CONTROL_HOST="$ADDR_A")
mca=()
if [ -n "${NET:-}" ]; then
  mca+=(--mca oob_tcp_if_include "$NET" --mca btl_tcp_if_include "$NET")
  [[ $NET == */* ]] || env+=(-x NCCL_SOCKET_IFNAME="$NET")
fi
if [ -n "${HCA:-}" ]; then
  env+=(-x NCCL_IB_HCA="$HCA" -x UCX_NET_DEVICES="$HCA:1")
fi
agent=()
[ -n "${LKS_RSH:-}" ] && agent=(--mca plm_rsh_agent "$LKS_RSH")
mpirun -np 2 --host "$host_a,$host_b" --map-by node "${agent[@]}" "${mca[@]}" "${env[@]}" \
  "$LOCKSTEP" serve --model "$model" --port "$PORT" --bind "$BIND" "$@" &
job=$!
trap 'kill -TERM $job 2>/dev/null; wait $job' INT TERM
for _ in $(seq 1 1200); do
  if "${rsh[@]}" "$host_a" "curl -sf http://127.0.0.1:$PORT/health" > /dev/null 2>&1; then
    echo "lockstep-2host: serving on http://$host_a:$PORT"
    break
  fi
  kill -0 $job 2>/dev/null || { echo "lockstep-2host: the job ended before it was healthy" >&2; wait $job; exit 1; }
  sleep 0.5
done
wait $job
