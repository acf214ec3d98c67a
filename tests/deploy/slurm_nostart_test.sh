#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# slurm_test.sh when the cluster cannot start (a slurmctld that fails at once, put first on
# PATH): it must fail at once, naming the failed start and its cause, and claim nothing about a
# cluster or a job.
# usage: slurm_nostart_test.sh LOCKSTEP MODEL_DIR PORT
set -u
here=$(cd "$(dirname "$0")" && pwd)
stub=$(mktemp -d)
trap 'rm -rf "$stub"' EXIT
printf '#!/bin/sh\necho "slurmctld: refusing to start (test stub)" >&2\nexit 3\n' > "$stub/slurmctld"
chmod +x "$stub/slurmctld"
out=$(PATH="$stub:$PATH" timeout 120 bash "$here/slurm_test.sh" "$@" 2>&1)
st=$?
echo "$out" | sed 's/^/  | /'
fails=0
[ $st != 0 ] || { echo "FAIL: slurm_test.sh exited 0 without a cluster"; fails=1; }
grep -q "FAIL: the slurm cluster did not start" <<< "$out" && grep -q "refusing to start (test stub)" <<< "$out" \
  || { echo "FAIL: no failure naming the cluster start and its cause"; fails=1; }
grep -q "^ok: " <<< "$out" && { echo "FAIL: something passed without a cluster"; fails=1; }
[ $fails = 0 ] && echo "ok: a failed cluster start fails slurm_test.sh with its cause"
[ $fails = 0 ]
