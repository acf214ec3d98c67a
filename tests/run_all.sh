#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The whole test suite from a fresh checkout: installs what is missing, then
#   1. a release build with gcc (warnings are errors) and every test;
#   2. a build with clang under AddressSanitizer + UndefinedBehaviorSanitizer, with the libFuzzer
#      target, and every test again (the fuzzer runs for a bounded 30 s).
# Both stages always run, whatever the first one gives; a failed configure or build fails its
# stage without running its tests. The last lines are one summary per stage and an overall one:
#   run_all: release: PASS|FAIL (...)
#   run_all: sanitizer: PASS|FAIL (...)
#   run_all: overall: PASS|FAIL
# Build trees: build-release/ and build-asan/ under the repository root. Exit status: 0 when both
# stages passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh --tests || { echo "run_all: installing the dependencies failed"; exit 1; }
jobs=${JOBS:-$(nproc)}

# stage NAME BUILD_DIR CTEST_ENV CMAKE_ARGS...: configure, build and test; sets result[NAME].
declare -A result
stage() {
  local name=$1 dir=$2 envs=$3
  shift 3
  if ! cmake -S . -B "$dir" "$@"; then
    result[$name]="FAIL (configure failed)"
  elif ! cmake --build "$dir" -j"$jobs"; then
    result[$name]="FAIL (build failed)"
  else
    local log="$dir/run_all-ctest.log"
    (cd "$dir" && env $envs ctest --output-on-failure -j"$jobs") 2>&1 | tee "$log"
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

overall=PASS
echo
for s in release sanitizer; do
  echo "run_all: $s: ${result[$s]}"
  [[ ${result[$s]} == PASS* ]] || overall=FAIL
done
echo "run_all: overall: $overall"
[ $overall = PASS ]
