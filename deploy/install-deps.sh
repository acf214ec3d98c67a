#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what lockstep needs on Debian 12 or Ubuntu 22.04/24.04 (DGX OS), as root or with sudo.
#   install-deps.sh          build and run (compiler, libraries, MPI, ZeroMQ, protobuf-c, HTTP)
#   install-deps.sh --tests  also everything the test suite uses (Check, sanitizers and libFuzzer,
#                            numpy, node, curl, wrk, slurm and munge, iproute2), and on an x86-64
#                            host the arm64 cross build's (tests/arm64): the arm64 architecture,
#                            gcc-aarch64-linux-gnu, qemu-user and the libraries as :arm64 packages.
# On arm64 (a GB10's Grace CPU, DGX OS = Ubuntu 24.04) the same packages build natively.
# Idempotent: packages already present are left alone.
#
# Debian 12 and Ubuntu differ in: the sanitizer runtimes (Debian 12's llvm-defaults has
# libclang-rt-dev; where a release lacks it, libclang-rt-N-dev of the installed clang is taken)
# and where arm64 packages come from on an x86-64 host (Debian: the same mirror; Ubuntu: the
# ports archive, added below for arm64 only). Run here: Debian 12 x86-64 only; the Ubuntu branches
# and arm64 hosts have not been run.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
host_arch=$(dpkg --print-architecture)

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
    clang                       # libFuzzer targets and sanitizer runtimes (with libclang-rt, below)
    wrk                         # the serving load test
    slurm-wlm munge             # the slurm launcher's test: a one-machine cluster
    iproute2                    # the two-host launcher's test: network namespaces
  )
  # node and npm run the tokenizer, chat-template and OpenAI-client tests. A machine may already
  # have them from elsewhere (NodeSource's nodejs bundles npm): only missing commands bring in
  # Debian's packages.
  command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
  command -v npm >/dev/null 2>&1 || pkgs+=(npm)
  # The sanitizer and libFuzzer runtimes: libclang-rt-dev where the release has it (Debian 12,
  # Ubuntu 24.04), else the versioned package of the default clang.
  if apt-cache show libclang-rt-dev >/dev/null 2>&1 || ! command -v apt-cache >/dev/null; then
    pkgs+=(libclang-rt-dev)
  else
    v=$(apt-cache depends clang 2>/dev/null | sed -n 's/.*Depends: clang-\([0-9][0-9]*\)$/\1/p' | head -n 1)
    pkgs+=("libclang-rt-${v:-14}-dev")
  fi
  # tests/arm64: the arm64 cross build and its tests under qemu-user, on x86-64 hosts only (an
  # arm64 host builds and tests natively in the first two stages). Open MPI for arm64 is not
  # installed but unpacked by tests/arm64/mpi_prefix.sh (it says why), from this architecture's
  # package lists.
  if [ "$host_arch" = amd64 ]; then
    arm64_pkgs=(gcc-aarch64-linux-gnu qemu-user)
    # libudev1: the unpacked Open MPI's libhwloc links against it (Multi-Arch: same, so it
    # installs next to the host's; a bare Debian 12 lacked it and the cross build's MPI check
    # failed to link).
    for p in libjansson-dev libzmq3-dev libprotobuf-c-dev libmicrohttpd-dev libpcre2-dev \
      libutf8proc-dev check libsubunit-dev libudev1; do
      arm64_pkgs+=("$p:arm64")
    done
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
      echo "install-deps: adding the arm64 architecture (tests/arm64)"
      if grep -qi '^ID=ubuntu' /etc/os-release 2>/dev/null; then
        # Ubuntu serves arm64 from the ports archive: the existing sources are kept for amd64
        # and the same suites are added from ports for arm64. (Not run here.)
        codename=$(. /etc/os-release && echo "${VERSION_CODENAME}")
        for f in /etc/apt/sources.list.d/*.sources; do
          [ -e "$f" ] && ! grep -q '^Architectures:' "$f" && $SUDO sed -i '/^Types:/a Architectures: amd64' "$f"
        done
        [ -f /etc/apt/sources.list ] && $SUDO sed -i -E 's/^deb (http|https|mirror)/deb [arch=amd64] \1/' /etc/apt/sources.list
        printf '%s\n' "Types: deb" "URIs: http://ports.ubuntu.com/ubuntu-ports" \
          "Suites: $codename $codename-updates $codename-security" \
          "Components: main restricted universe multiverse" "Architectures: arm64" \
          | $SUDO tee /etc/apt/sources.list.d/lockstep-arm64-ports.sources >/dev/null
      fi
      $SUDO dpkg --add-architecture arm64
      $SUDO apt-get update -qq
    fi
    pkgs+=("${arm64_pkgs[@]}")
  fi
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: everything is installed"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
