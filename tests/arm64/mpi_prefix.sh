#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Unpacks Debian's arm64 Open MPI into a directory of its own, for the arm64 cross build
# (tests/arm64/aarch64-linux-gnu.cmake) and its tests under qemu-user.
#
# Why not `apt-get install libopenmpi-dev:arm64` like the other arm64 libraries: Open MPI's arm64
# packages cannot be installed next to the host's. libpmix2:arm64 needs libmunge2:arm64 and
# libpmix-dev:arm64 needs libevent-dev:arm64, neither of which is Multi-Arch: same, and openmpi-bin
# is Multi-Arch: foreign; apt resolves that by removing the host's Open MPI, munge and slurm, which
# the x86-64 build and tests need. So the packages are downloaded (`apt-get download`, the arm64
# architecture must be enabled: deploy/install-deps.sh --tests does it) and unpacked with
# `dpkg-deb -x`, which installs nothing. glibc and the other arm64 libraries come from the
# multiarch packages (/lib/aarch64-linux-gnu); qemu finds the files here first (QEMU_LD_PREFIX).
#
# usage: mpi_prefix.sh DIR   (idempotent: an up-to-date DIR is left alone)
set -euo pipefail
dir=${1:?usage: mpi_prefix.sh DIR}
# libopenmpi-dev (mpi.h, libmpi.so) and what its libraries and components load at run time.
pkgs=(libopenmpi-dev libopenmpi3 openmpi-bin libpmix2 libmunge2 libhwloc15 libevent-core-2.1-7
  libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
  libnuma1 libltdl7 libxnvctrl0 libpciaccess0)
stamp="$dir/.lockstep-mpi-prefix"
want="${pkgs[*]}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
dpkg --print-foreign-architectures | grep -qx arm64 || {
  echo "mpi_prefix: the arm64 architecture is not enabled (bash deploy/install-deps.sh --tests)" >&2
  exit 1
}
rm -rf "$dir"
mkdir -p "$dir/.debs"
# apt's download user (_apt) must be able to write there.
chmod 777 "$dir/.debs"
(cd "$dir/.debs" && apt-get download -qq "${pkgs[@]/%/:arm64}")
for d in "$dir"/.debs/*.deb; do dpkg-deb -x "$d" "$dir"; done
rm -rf "$dir/.debs"

# Every library libmpi and its components need must be here or among the multiarch packages.
lib=$dir/usr/lib/aarch64-linux-gnu
missing=0
for so in "$lib"/libmpi.so.40 "$lib"/libopen-rte.so.40 "$lib"/libopen-pal.so.40 "$lib"/libpmix.so.2 \
  "$lib"/libhwloc.so.15 "$lib"/libevent_core-2.1.so.7 "$lib"/libevent_pthreads-2.1.so.7; do
  for need in $(aarch64-linux-gnu-readelf -d "$so" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
    found=0
    for d in "$lib" "$lib/openmpi/lib" /lib/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu; do
      [ -e "$d/$need" ] && found=1 && break
    done
    [ $found = 1 ] || { echo "mpi_prefix: $(basename "$so") needs $need, found nowhere" >&2; missing=1; }
  done
done
[ $missing = 0 ] || exit 1
echo "$want" > "$stamp"
echo "mpi_prefix: arm64 Open MPI unpacked into $dir"
