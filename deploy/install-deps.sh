#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs everything lockstep needs to build, run and test on Debian 12 or Ubuntu (DGX OS),
# as root (or with sudo). Idempotent: packages already present are left alone.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config git ca-certificates
  check libsubunit-dev          # unit tests (Check)
  libjansson-dev                # JSON: config.json, safetensors headers
  clang libclang-rt-14-dev      # libFuzzer target and sanitizer runtimes
  python3 python3-numpy         # tests/reference and tools/gen_model.py (run by /usr/bin/python3)
  openmpi-bin libopenmpi-dev    # mpirun, MPI bootstrap and CPU collectives
  libzmq3-dev                   # control plane (ZeroMQ)
  libmicrohttpd-dev             # the HTTP API
  curl wrk                      # the serving tests (health checks, load)
  libprotobuf-c-dev protobuf-c-compiler  # command messages (proto/lockstep.proto)
  procps                        # pgrep in the multi-process tests
  libpcre2-dev libutf8proc-dev  # tokenizer.json: Split regexes (PCRE2), normalizers (utf8proc)
)
# node and npm run the tokenizer and chat-template references (tests/tokenizer). A machine may
# already have them from elsewhere (NodeSource's nodejs bundles npm), so only missing commands
# bring in Debian's packages.
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)

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
