#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what lockstep needs on Debian 12 or Ubuntu 22.04/24.04 (DGX OS), as root or with sudo.
#   install-deps.sh          build and run (compiler, libraries, MPI, ZeroMQ, protobuf-c, HTTP)
#   install-deps.sh --tests  also everything the test suite uses (Check, sanitizers and libFuzzer,
#                            numpy, node, curl, wrk, slurm and munge, iproute2)
# Idempotent: packages already present are left alone.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config git ca-certificates
  libjansson-dev                # JSON: config.json, safetensors headers, the HTTP API
  openmpi-bin libopenmpi-dev    # mpirun, MPI bootstrap and CPU collectives
  libzmq3-dev                   # control plane (ZeroMQ)
  libprotobuf-c-dev protobuf-c-compiler  # command messages (proto/lockstep.proto)
  libmicrohttpd-dev             # the HTTP API
  libpcre2-dev libutf8proc-dev  # tokenizer.json: Split regexes (PCRE2), normalizers (utf8proc)
  python3 python3-numpy         # tools/gen_model.py (the generated default model; /usr/bin/python3)
  curl procps                   # health checks of the launchers
)
if [ "${1:-}" = --tests ]; then
  pkgs+=(
    check libsubunit-dev        # unit tests (Check)
    clang libclang-rt-dev       # libFuzzer targets and sanitizer runtimes
    wrk                         # the serving load test
    slurm-wlm munge             # the slurm launcher's test: a one-machine cluster
    iproute2                    # the two-host launcher's test: network namespaces
  )
  # node and npm run the tokenizer, chat-template and OpenAI-client tests. A machine may already
  # have them from elsewhere (NodeSource's nodejs bundles npm): only missing commands bring in
  # Debian's packages.
  command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
  command -v npm >/dev/null 2>&1 || pkgs+=(npm)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: everything is installed"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
