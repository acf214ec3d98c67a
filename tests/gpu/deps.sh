#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The build and test dependencies of lockstep for a GPU machine that has CUDA and a compiler but
# neither these libraries nor a network (a lent test machine): bundled here as Debian 12 .deb
# files, unpacked there.
#
#   deps.sh bundle DIR    (on a Debian 12 machine with apt) download the packages into DIR
#   deps.sh install DIR   (as root, on the GPU machine) unpack them into / without replacing any
#                         file already there, link what Debian's alternatives would (mpirun, mpicc,
#                         the MPI headers), and refresh the loader's cache
#
# Only packages the machine lacks matter: an existing file is never overwritten (cp -n), so the
# machine's own libraries keep precedence and nothing it has can break. The .pc files unpacked
# lose their Requires.private lines (static linking only; their modules are not bundled).
set -euo pipefail

PKGS=(
  libjansson-dev libjansson4
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libutf8proc-dev libutf8proc2
  libzmq3-dev libzmq5 libsodium23 libpgm-5.3-0 libnorm1 libbsd0 libmd0
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2
  libmicrohttpd-dev libmicrohttpd12
  libgnutls30 libunistring2 libidn2-0 libtasn1-6 libnettle8 libhogweed6 libgmp10 libp11-kit0 libffi8
  libprotobuf-c-dev libprotobuf-c1 protobuf-c-compiler libprotoc32 libprotobuf32
  check libsubunit-dev libsubunit0
  openmpi-bin openmpi-common libopenmpi-dev libopenmpi3 libpmix2 libhwloc15
  libevent-core-2.1-7 libevent-pthreads-2.1-7 libevent-2.1-7 libfabric1 libucx0 libibverbs1
  librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200 libmunge2 libnuma1
  libpciaccess0 libltdl7
  pkgconf pkgconf-bin libpkgconf3
)

case "${1:-}" in
bundle)
  dir=${2:?usage: deps.sh bundle DIR}
  mkdir -p "$dir"
  (cd "$dir" && apt-get download "${PKGS[@]}")
  du -sh "$dir"
  ;;
install)
  dir=$(cd "${2:?usage: deps.sh install DIR}" && pwd)
  stage=$(mktemp -d)
  for f in "$dir"/*.deb; do dpkg-deb -x "$f" "$stage"; done
  # Debian 12 packages may still use /lib, /bin, /sbin; merged-/usr systems link those to /usr.
  for d in lib bin sbin; do
    if [ -d "$stage/$d" ] && [ ! -L "$stage/$d" ]; then
      mkdir -p "$stage/usr/$d"
      cp -a "$stage/$d/." "$stage/usr/$d/"
      rm -rf "${stage:?}/$d"
    fi
  done
  find "$stage" -name '*.pc' -exec sed -i '/^Requires.private:/d' {} +
  rm -rf "$stage/usr/share/doc" "$stage/usr/share/man"  # dangling links there stop cp
  R=${DEPS_ROOT:-}  # a test root instead of / (then no ldconfig)
  mkdir -p "$R/"
  cp -an "$stage/." "$R/" 2>/dev/null || echo "deps.sh: some files not copied (the machine's kept)"
  rm -rf "$stage"
  # What Debian's postinst scripts do through update-alternatives.
  for t in mpirun mpiexec mpicc; do
    [ -e "$R/usr/bin/$t" ] || [ ! -e "$R/usr/bin/$t.openmpi" ] || ln -s $t.openmpi "$R/usr/bin/$t"
  done
  inc=$R/usr/include/x86_64-linux-gnu/mpi
  [ -e "$inc" ] || [ ! -d "$R/usr/lib/x86_64-linux-gnu/openmpi/include" ] ||
    { mkdir -p "$(dirname "$inc")" && ln -s /usr/lib/x86_64-linux-gnu/openmpi/include "$inc"; }
  [ -e "$R/usr/bin/pkg-config" ] || [ ! -e "$R/usr/bin/pkgconf" ] || ln -s pkgconf "$R/usr/bin/pkg-config"
  [ -n "$R" ] || ldconfig
  echo "deps.sh: unpacked $(ls "$dir"/*.deb | wc -l) packages (files already present kept)"
  ;;
*)
  echo "usage: deps.sh bundle DIR | install DIR" >&2
  exit 2
  ;;
esac
