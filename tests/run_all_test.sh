#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/run_all.sh runs every stage whatever the others give, prints one summary line per stage
# and an overall one, and exits non-zero when any failed. Run on a copy of the script in a
# scratch tree whose deploy/install-deps.sh, cmake and ctest are stubs: each stub ctest passes or
# fails as told by STUB_FAIL (the build directories whose tests fail).
# usage: run_all_test.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tree/tests" "$work/tree/deploy" "$work/bin"
cp "$here/run_all.sh" "$work/tree/tests/"
printf '#!/bin/sh\nexit 0\n' > "$work/tree/deploy/install-deps.sh"
mkdir -p "$work/tree/tests/arm64"
printf '#!/bin/sh\nexit 0\n' > "$work/tree/tests/arm64/mpi_prefix.sh"
# The arm64 stage runs on x86-64 hosts: dpkg says amd64 here whatever the machine.
printf '#!/bin/sh\necho amd64\n' > "$work/bin/dpkg"
cat > "$work/bin/cmake" <<'STUB'
#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = -B ] && mkdir -p "$2"; shift; done
STUB
cat > "$work/bin/ctest" <<'STUB'
#!/bin/sh
d=$(basename "$PWD")
echo "$d" >> "$STUB_LOG"
case " $STUB_FAIL " in
*" $d "*) echo "50% tests passed, 1 tests failed out of 2"; exit 8 ;;
*) echo "100% tests passed, 0 tests failed out of 2"; exit 0 ;;
esac
STUB
chmod +x "$work/bin/"*
fails=0 passes=0
ok() { echo "ok: $1"; passes=$((passes + 1)); }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }

# case FAILING_DIRS WANT_RELEASE WANT_SANITIZER WANT_ARM64 WANT_OVERALL WANT_STATUS
case_() {
  local out st
  : > "$work/ctest.log"
  out=$(STUB_FAIL="$1" STUB_LOG="$work/ctest.log" PATH="$work/bin:$PATH" bash "$work/tree/tests/run_all.sh" 2>&1)
  st=$?
  local what="failing: '${1:-none}'"
  [ "$(tr '\n' ' ' < "$work/ctest.log")" = "build-release build-asan build-arm64 " ] && ok "$what: all stages ran" \
    || bad "$what: stages run: $(tr '\n' ' ' < "$work/ctest.log")"
  local summary
  summary=$(grep '^run_all: ' <<< "$out" | tail -n 4 | cut -d' ' -f2-3 | tr '\n' ' ')
  [ "$summary" = "release: $2 sanitizer: $3 arm64: $4 overall: $5 " ] && ok "$what: summary $summary" \
    || { bad "$what: summary '$summary'"; tail -n 6 <<< "$out"; }
  { [ "$6" = 0 ] && [ $st = 0 ]; } || { [ "$6" != 0 ] && [ $st != 0 ]; } && ok "$what: exit status $st" \
    || bad "$what: exit status $st"
}
case_ "" PASS PASS PASS PASS 0
case_ "build-release" FAIL PASS PASS FAIL 1
case_ "build-asan" PASS FAIL PASS FAIL 1
case_ "build-arm64" PASS PASS FAIL FAIL 1
case_ "build-release build-asan" FAIL FAIL PASS FAIL 1
# LKS_ARM64=0: the arm64 stage is skipped, and a skipped stage does not fail the run.
: > "$work/ctest.log"
out=$(LKS_ARM64=0 STUB_FAIL="" STUB_LOG="$work/ctest.log" PATH="$work/bin:$PATH" bash "$work/tree/tests/run_all.sh" 2>&1)
st=$?
[ "$(tr '\n' ' ' < "$work/ctest.log")" = "build-release build-asan " ] && ok "LKS_ARM64=0: no arm64 tests" \
  || bad "LKS_ARM64=0: stages run: $(tr '\n' ' ' < "$work/ctest.log")"
grep -q '^run_all: arm64: SKIPPED' <<< "$out" && [ $st = 0 ] && ok "LKS_ARM64=0: skipped, exit status 0" \
  || bad "LKS_ARM64=0: exit status $st, $(grep '^run_all: arm64' <<< "$out")"
echo "$passes passed, $fails failed"
[ "$fails" = 0 ]
