#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The whole test suite from a fresh checkout: installs what is missing, then
#   1. a release build with gcc (warnings are errors) and every test;
#   2. a build with clang under AddressSanitizer + UndefinedBehaviorSanitizer, with the libFuzzer
#      target, and every test again (the fuzzer runs for a bounded 30 s).
# Build trees: build-release/ and build-asan/ under the repository root. Exit status: ctest's.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh --tests
jobs=$(nproc)

echo "== release build (gcc)"
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=gcc -DLKS_TEST_HOOKS=ON
cmake --build build-release -j"$jobs"
(cd build-release && ctest --output-on-failure -j"$jobs")

echo "== sanitizer build (clang, address + undefined, fuzz)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DLKS_SANITIZE=address,undefined -DLKS_FUZZ=ON -DLKS_TEST_HOOKS=ON
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$jobs")
