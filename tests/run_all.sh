#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The whole test suite from a fresh checkout: installs what is missing, then
#   1. a release build with gcc (warnings are errors) and every test;
#   2. a build with clang under AddressSanitizer + UndefinedBehaviorSanitizer, with the libFuzzer
#      target, and every test again (the fuzzer runs for a bounded 30 s);
#   3. on an x86-64 host, an arm64 cross build (tests/arm64: gcc-aarch64-linux-gnu, Debian's
#      arm64 libraries) and the tests labelled arm64 under qemu-user (ctest -L arm64): the kernel
#      unit tests with the NEON and portable kernels against each other and for batch
#      invariance, the model against the reference, speculation, and world 2 under mpirun, the
#      model and world-2 checks again with LKS_SIMD=scalar. Emulation is slow, so this is a
#      subset (tests/CMakeLists.txt, "arm64", says which and why); LKS_ARM64=0 skips the stage.
#      On an arm64 host the first two stages are native arm64 builds and this one is skipped.
# Every stage always runs, whatever the others give; a failed configure or build fails its
# stage without running its tests. The last lines are one summary per stage and an overall one:
#   run_all: release: PASS|FAIL (...)
#   run_all: sanitizer: PASS|FAIL (...)
#   run_all: arm64: PASS|FAIL|SKIPPED (...)
#   run_all: overall: PASS|FAIL
# Build trees: build-release/, build-asan/, build-arm64/ (and the arm64 Open MPI in
# build-arm64-mpi/) under the repository root. Exit status: 0 when every stage passed or was
# skipped, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh --tests || { echo "run_all: installing the dependencies failed"; exit 1; }
jobs=${JOBS:-$(nproc)}

# stage NAME BUILD_DIR CTEST_ENV CMAKE_ARGS...: configure, build and test (ctest with
# $ctest_args); sets result[NAME].
declare -A result
ctest_args=""
stage() {
  local name=$1 dir=$2 envs=$3
  shift 3
  if ! cmake -S . -B "$dir" "$@"; then
    result[$name]="FAIL (configure failed)"
  elif ! cmake --build "$dir" -j"$jobs"; then
    result[$name]="FAIL (build failed)"
  else
    local log="$dir/run_all-ctest.log"
    (cd "$dir" && env $envs ctest --output-on-failure -j"$jobs" $ctest_args) 2>&1 | tee "$log"
    if [ "${PIPESTATUS[0]}" = 0 ]; then
      result[$name]="PASS ($(grep -o '[0-9]*% tests passed.*' "$log" | tail -n 1))"
    else
      result[$name]="FAIL ($(grep -o '[0-9]*% tests passed.*' "$log" | tail -n 1 || echo 'ctest failed'))"
    fi
  fi
}

echo "== release build (gcc)"
stage release build-release "" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=gcc \
  -DLKS_TEST_HOOKS=ON

echo "== sanitizer build (clang, address + undefined, fuzz)"
stage sanitizer build-asan "ASAN_OPTIONS=detect_leaks=1" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DLKS_SANITIZE=address,undefined -DLKS_FUZZ=ON -DLKS_TEST_HOOKS=ON

echo "== arm64 cross build (gcc-aarch64-linux-gnu), the arm64 tests under qemu-user"
if [ "$(dpkg --print-architecture 2>/dev/null)" != amd64 ]; then
  result[arm64]="SKIPPED (not an x86-64 host: the stages above ran natively)"
elif [ "${LKS_ARM64:-1}" = 0 ]; then
  result[arm64]="SKIPPED (LKS_ARM64=0)"
elif ! bash tests/arm64/mpi_prefix.sh "$PWD/build-arm64-mpi"; then
  result[arm64]="FAIL (could not unpack the arm64 Open MPI: tests/arm64/mpi_prefix.sh)"
else
  ctest_args="-L arm64"
  stage arm64 build-arm64 "" -DCMAKE_TOOLCHAIN_FILE=tests/arm64/aarch64-linux-gnu.cmake \
    -DLKS_ARM64_MPI_PREFIX="$PWD/build-arm64-mpi" -DCMAKE_BUILD_TYPE=Release -DLKS_TEST_HOOKS=ON
  ctest_args=""
fi

overall=PASS
echo
for s in release sanitizer arm64; do
  echo "run_all: $s: ${result[$s]}"
  [[ ${result[$s]} == PASS* || ${result[$s]} == SKIPPED* ]] || overall=FAIL
done
echo "run_all: overall: $overall"
[ $overall = PASS ]
