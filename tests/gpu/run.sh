#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The GPU checks of the cuda backend and the NCCL collectives (issue 8), in one script for a
# machine with an NVIDIA GPU; a build machine without one compiles all of it but runs none.
#
# usage: bash tests/gpu/run.sh [BUILD_DIR]      (default: build-gpu in the source tree)
#   STEPS="ops shard gen bench model spec"   the steps to run after the build, in this order
#                  (default: all), e.g. STEPS=ops for a quick check; each step is a few minutes
#                  at most
#   JOBS=N         build parallelism (default: nproc)
#   BENCH=0        skip the benchmark (its model is about 4 GB, generated once into BUILD_DIR)
#   BENCH_GEN=...  generator options of the benchmark model (default below)
#   CUDA_ARCHS=..  the architectures to build (default: the first GPU's, e.g. 90 on an H100/H200)
#   DEPS=DIR       .deb files to unpack first when the machine lacks the build dependencies
#                  (tests/gpu/deps.sh bundle DIR makes them on Debian 12)
#   OUT=DIR        where the table (gpu-summary.txt) and a tarball of the logs are copied at the end
#   STEP_TIMEOUT   seconds any one check may run (default 240)
#
# 1. configure and build with CUDA (fails if the cuda backend is not built);
# 2. every CUDA op against the CPU op on fresh random inputs (test_cuda_ops);
# 3. the model tests (test_model_ref, every model_* case of ctest) with --backend cuda, against
#    the numpy reference, per row within LAMBDA times the row's measured float32 rounding error
#    (test_model_ref.c): LAMBDA as on the CPU for F32 weights (every product in f32 on the GPU
#    too), and 2^16 times that for BF16 weights, whose products over more than 8 rows round the
#    activations to BF16 (unit roundoff 2^-8 against f32's 2^-24; not yet measured on a GPU);
# 4. the speculative tests (ctest -L spec) with LKS_BACKEND=cuda: greedy output with and without
#    speculation identical, world 2 equal to world 1, both equal to the reference;
# 5. shards on the GPU: world 2 (two ranks on one GPU, MPI collectives staging device buffers;
#    with two GPUs or more also NCCL) equal to world 1 (test_shard, f32 models);
# 6. `lockstep generate`: 48 greedy tokens on the GPU against the CPU, and world 2 against world 1
#    on the GPU: identical. With an 8-token prompt (no more than LKS__CU_GEMV_ROWS, 8) every
#    product on the GPU is in f32, as on the CPU, so the logits differ by float32 rounding order
#    only (about 1e-6 of the largest logit on this model); a token can flip only where the top two
#    logits are that close, which 48 decisions on a random model essentially never meet. A
#    difference is reported with its first differing position;
# 7. benchmark: measured device-to-device copy bandwidth and BF16 matmul rate, then
#    `lockstep bench --backend cuda` on a generated BF16 model of several GB: decode tokens/s,
#    achieved bytes/s as a fraction of the copy bandwidth (FAIL below 0.7), prefill tokens/s as a
#    fraction of the matmul rate (reported).
# A table of every check is printed last; exit status 0 when none failed.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
B=${1:-$SRC/build-gpu}
LOGS=$B/gpu-logs
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
NAMES=() RESULTS=() NOTES=()
FAILED=0
T=${STEP_TIMEOUT:-240}
T0=$(date +%s)

row() {  # name result note
  NAMES+=("$1") RESULTS+=("$2") NOTES+=("$3")
  [ "$2" = FAIL ] && FAILED=1
  printf '== %-44s %-5s %s\n' "$1" "$2" "$3"
  # Row by row where the caller wants them too, so that a run cut short still reports.
  [ -z "${OUT:-}" ] || { mkdir -p "$OUT" && printf '%-44s %-5s %s\n' "$1" "$2" "$3" >>"$OUT/gpu-rows.txt"; }
}

# check NAME COMMAND...: PASS when the command exits 0; its output in $LOGS/NAME.log.
check() {
  local name=$1 log
  shift
  log=$LOGS/$(printf '%s' "$name" | tr -c 'A-Za-z0-9_.-' '_' | head -c 80).log
  if timeout -k 10 "$T" "$@" >"$log" 2>&1; then
    row "$name" PASS "$(tail -n 1 "$log" | cut -c1-70)"
  else
    row "$name" FAIL "exit $?, see $log"
  fi
}

table() {
  echo
  echo "---------------------------------------------------------------------------------------------"
  printf '%-44s %-5s %s\n' "check" "" "detail"
  echo "---------------------------------------------------------------------------------------------"
  for i in "${!NAMES[@]}"; do printf '%-44s %-5s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}" "${NOTES[$i]}"; done
  echo "---------------------------------------------------------------------------------------------"
  [ $FAILED = 0 ] && echo "all GPU checks passed" || echo "SOME GPU CHECKS FAILED"
  echo "($(($(date +%s) - T0)) s)"
}

# The table and the logs where the caller wants them (OUT), also when a step fails.
finish() {
  table | tee "$LOGS/summary.txt"
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp "$LOGS/summary.txt" "$OUT/gpu-summary.txt"
    tar -C "$B" -czf "$OUT/gpu-logs.tgz" gpu-logs 2>/dev/null
  fi
}

mkdir -p "$B" "$LOGS"
if ! NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "${NGPU:-0}" -eq 0 ]; then
  echo "tests/gpu/run.sh: no NVIDIA GPU here (nvidia-smi -L lists none)"
  exit 2
fi
GPUNAME=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1)
row "gpu" INFO "$NGPU x $GPUNAME"
COMM=mpi
[ "$NGPU" -ge 2 ] && COMM=nccl

# 0. what the build needs: libraries (DEPS), a python3 with numpy, CUDA and NCCL
if [ -n "${DEPS:-}" ]; then
  missing=0
  for c in pkg-config mpirun protoc-c; do command -v $c >/dev/null || missing=1; done
  for m in jansson libzmq libmicrohttpd libprotobuf-c libpcre2-8 libutf8proc check; do
    pkg-config --exists $m 2>/dev/null || missing=1
  done
  if [ $missing = 1 ]; then
    bash "$SRC/tests/gpu/deps.sh" install "$DEPS" >"$LOGS/deps.log" 2>&1 &&
      row "dependencies" INFO "unpacked from $DEPS" ||
      row "dependencies" FAIL "see $LOGS/deps.log"
  fi
fi
PY=
for p in /usr/bin/python3 "$(command -v python3)"; do
  [ -x "$p" ] && "$p" -c 'import numpy' 2>/dev/null && { PY=$p; break; }
done
[ -n "$PY" ] || { row "python3 with numpy" FAIL "none found"; finish; exit 1; }
CUDA_ARCHS=${CUDA_ARCHS:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)}
CM=(-DCMAKE_BUILD_TYPE=Release -DLKS_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS")
command -v nvcc >/dev/null || [ ! -x /usr/local/cuda/bin/nvcc ] || export PATH=/usr/local/cuda/bin:$PATH
CUDA_LIB=$(dirname "$(command -v nvcc)")/../lib64
if ! ls "$CUDA_LIB"/libnccl.so* >/dev/null 2>&1; then
  # NCCL from the machine's Python packages (nvidia-nccl-*), where the toolkit has none.
  ND=$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null ||
       python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  NL=$(ls "$ND"/lib/libnccl.so* 2>/dev/null | head -n 1)
  NI=$ND/include
  [ -f "$NI/nccl.h" ] || NI=$SRC/tests/gpu/nccl-include
  if [ -n "$NL" ]; then
    CM+=(-DLKS_NCCL_LIBRARY="$NL" -DLKS_NCCL_INCLUDE="$NI")
    export LD_LIBRARY_PATH=$(dirname "$NL")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    row "nccl" INFO "$NL"
  fi
fi

# 1. build
if cmake -S "$SRC" -B "$B" "${CM[@]}" >"$LOGS/configure.log" 2>&1 &&
   grep -q "the cuda backend is built" "$LOGS/configure.log" &&
   cmake --build "$B" -j"${JOBS:-$(nproc)}" >"$LOGS/build.log" 2>&1; then
  row "build with CUDA" PASS "$(grep -o 'CUDA [0-9.]* ([0-9;]*)' "$LOGS/configure.log" | head -n 1), $(($(date +%s) - T0)) s"
else
  row "build with CUDA" FAIL "see configure.log and build.log"
  tail -n 30 "$LOGS/configure.log" "$LOGS/build.log"
  finish
  exit 1
fi
LKS=$B/lockstep
STEPS=" ${STEPS:-ops shard gen bench model spec} "
want() { [[ "$STEPS" == *" $1 "* ]]; }

# 2. every op against the CPU
SEED=${SEED:-$(date +%s)}
want ops && check "ops vs cpu (test_cuda_ops, seed $SEED)" "$B/tests/test_cuda_ops" "$SEED"
want ops && row "ops: batch = each row alone (bitwise)" INFO "$(grep -c 'alone (bitwise).*ok$' "$LOGS"/ops*.log) ok, $(grep -c 'alone (bitwise).*FAIL$' "$LOGS"/ops*.log) failed"
want ops && row "ops: largest error vs cpu" INFO "$(grep -v bitwise "$LOGS"/ops*.log | sed -n 's/.*rel err \([0-9.e+-]*\) .*/\1/p' | sort -g | tail -n 1)"

# 5. world 2 against world 1 on the GPU
want shard && ctest --test-dir "$B" -R '^gen_f32_(base|grouped_topk)$' >"$LOGS/shard_fixtures.log" 2>&1
want shard && for m in f32_base f32_grouped_topk; do
  check "shard $m w1 (cuda)" env LKS_TEST_BACKEND=cuda \
    mpirun --oversubscribe -np 1 "$B/tests/test_shard" "$B/testmodels/$m"
  check "shard $m w2, mpi on one GPU" env LKS_TEST_BACKEND=cuda LKS_TEST_COMM=mpi \
    mpirun --oversubscribe -np 2 "$B/tests/test_shard" "$B/testmodels/$m"
  if [ "$NGPU" -ge 2 ]; then
    check "shard $m w2, nccl" env LKS_TEST_BACKEND=cuda LKS_TEST_COMM=nccl \
      mpirun --oversubscribe -np 2 "$B/tests/test_shard" "$B/testmodels/$m"
  fi
done

# 6. generate: GPU against CPU, and world 2 against world 1 on the GPU
if want gen; then
gen() { timeout -k 5 "$T" "$@" --model "$B/models/default" --prompt-ids 1,2,3,4,5,6,7,8 -n 48 --ignore-eos; }
gen "$LKS" generate --backend cpu >"$LOGS/gen_cpu.txt" 2>"$LOGS/gen_cpu.log"
LKS_CUDA_GRAPHS=1 gen "$LKS" generate --backend cuda >"$LOGS/gen_cuda.txt" 2>"$LOGS/gen_cuda.log"
LKS_CUDA_GRAPHS=0 gen "$LKS" generate --backend cuda >"$LOGS/gen_cuda_nographs.txt" 2>"$LOGS/gen_cuda_nographs.log"
gen mpirun --oversubscribe -np 2 "$LKS" generate --backend cuda --comm $COMM \
  >"$LOGS/gen_cuda_w2.txt" 2>"$LOGS/gen_cuda_w2.log"
# same_tokens NAME A B: PASS when both files hold the same 48 comma-separated ids, else FAIL
# with the first position where they differ.
same_tokens() {
  local n
  n=$(tr ',' '\n' <"$2" | grep -c .)
  if [ "$n" != 48 ]; then
    row "$1" FAIL "$n tokens in $2 (want 48), see its .log"
  elif cmp -s "$2" "$3"; then
    row "$1" PASS "48 greedy tokens identical"
  else
    local at
    at=$(paste -d' ' <(tr ',' '\n' <"$2") <(tr ',' '\n' <"$3") | awk '$1 != $2 {print NR - 1; exit}')
    row "$1" FAIL "first difference at generated token $at: $2 vs $3"
  fi
}
same_tokens "generate: cuda tokens = cpu tokens" "$LOGS/gen_cuda.txt" "$LOGS/gen_cpu.txt"
same_tokens "generate: cuda, no CUDA graphs = cpu tokens" "$LOGS/gen_cuda_nographs.txt" "$LOGS/gen_cpu.txt"
row "generate: CUDA graphs recorded" INFO "$(grep -c 'recorded as a CUDA graph' "$LOGS/gen_cuda.log") first recording(s) logged, $(grep -c 'could not be recorded\|did not replay' "$LOGS/gen_cuda.log") failure(s)"
same_tokens "generate: cuda w2 ($COMM) = cuda w1" "$LOGS/gen_cuda_w2.txt" "$LOGS/gen_cuda.txt"
fi

# 7. benchmark
if want bench && [ "${BENCH:-1}" != 0 ]; then
  "$B/tests/test_cuda_ops" --rates >"$LOGS/rates.log" 2>&1
  BW=$(sed -n 's/^d2d copy bandwidth: \([0-9.]*\) GB\/s.*/\1/p' "$LOGS/rates.log")
  TF=$(sed -n 's/^bf16 matmul rate: \([0-9.]*\) TFLOP\/s.*/\1/p' "$LOGS/rates.log")
  TB=$(sed -n 's/^backend matmul rate: \([0-9.]*\) TFLOP\/s.*/\1/p' "$LOGS/rates.log")
  row "d2d copy bandwidth" INFO "${BW:-?} GB/s (read + written)"
  row "bf16 matmul rate (cuBLAS, tensor cores)" INFO "${TF:-?} TFLOP/s"
  row "backend matmul rate (exact f32 kernel)" INFO "${TB:-?} TFLOP/s"
  row "backend decode matmul" INFO "$(sed -n 's/^backend decode matmul: //p' "$LOGS/rates.log")"
  row "backend small matmul" INFO "$(sed -n 's/^backend small matmul (1 x 64 x 64): //p' "$LOGS/rates.log")"
  BM=$B/bench-model
  BENCH_GEN=${BENCH_GEN:---preset air-1g --hidden 2048 --heads 32 --kv-heads 4 --head-dim 64 --layers 12 --moe-inter 704 --inter 5472 --vocab 32768 --dtype bf16 --shards 4 --seed 3}
  if [ ! -f "$BM/config.json" ]; then
    # shellcheck disable=SC2086
    timeout "$T" $PY "$SRC/tools/gen_model.py" --out "$BM" $BENCH_GEN >"$LOGS/bench_gen.log" 2>&1 ||
      row "bench model" FAIL "see $LOGS/bench_gen.log"
  fi
  row "bench model" INFO "$(du -sh "$BM" 2>/dev/null | cut -f1) BF16 at $BM"
  for G in 0 1; do
  BL=$LOGS/bench_graphs$G.log
  if timeout -k 10 "$T" env LKS_CUDA_GRAPHS=$G "$LKS" bench --model "$BM" --backend cuda --prefill-len 512 \
      --decode-len 128 --repeats ${BENCH_REPEATS:-3} --max-seq-len 1024 >"$BL" 2>&1; then
    GN=$([ $G = 1 ] && echo "with CUDA graphs" || echo "no CUDA graphs")
    DEC=$(sed -n 's/^decode: .* = \([0-9.]*\) tokens\/s.*/\1/p' "$BL")
    PRE=$(sed -n 's/^prefill: .* = \([0-9.]*\) tokens\/s.*/\1/p' "$BL")
    ACH=$(sed -n 's/^achieved: \([0-9.]*\) GB\/s.*/\1/p' "$BL")
    WMB=$(sed -n 's/^bytes read per decoded token on rank 0: .*(weights \([0-9.]*\) MB.*/\1/p' "$BL")
    FRAC=$($PY -c "print('%.2f' % (float('$ACH') / float('$BW')))" 2>/dev/null || echo "?")
    # BF16: 2 bytes and 2 FLOPs per active parameter, so FLOPs per token = weight bytes per token.
    PF=$($PY -c "print('%.2f' % (float('$PRE') * float('$WMB') * 1e6 / (float('$TF') * 1e12)))" 2>/dev/null || echo "?")
    RES=FAIL
    [ "$FRAC" != "?" ] && $PY -c "import sys; sys.exit(0 if float('$FRAC') >= 0.7 else 1)" && RES=PASS
    row "decode ($GN)" "$RES" "${DEC:-?} tokens/s, ${ACH:-?} GB/s = $FRAC of copy bw (bound >= 0.7)"
    PB=$($PY -c "print('%.2f' % (float('$PRE') * float('$WMB') * 1e6 / (float('$TB') * 1e12)))" 2>/dev/null || echo "?")
    row "prefill 512 tokens ($GN)" INFO "${PRE:-?} tokens/s = $PF of the bf16 rate, $PB of the backend's"
    [ $G = 1 ] && row "bench: CUDA graphs recorded" INFO "$(grep -c 'recorded as a CUDA graph' "$BL") first recording(s) logged, $(grep -c 'could not be recorded\|did not replay' "$BL") failure(s)"
  else
    row "bench --backend cuda, LKS_CUDA_GRAPHS=$G" FAIL "see $BL"
  fi
  done
fi

# 3. the model tests on the GPU
if want model; then
ctest --test-dir "$B" -R '^(gen|ref)_' -j 8 >"$LOGS/model_fixtures.log" 2>&1 ||
  row "model fixtures (CPU reference)" FAIL "see $LOGS/model_fixtures.log"
ctest --test-dir "$B" --show-only=json-v1 -R '^(model_|trained_model_)' 2>/dev/null |
  $PY -c 'import json,sys
for t in json.load(sys.stdin)["tests"]:
    if t["name"].startswith(("model_", "trained_model_")):
        print(t["name"] + "\t" + "\t".join(t["command"]))' >"$LOGS/model_cases.tsv"
while IFS=$'\t' read -r name cmd; do
  IFS=$'\t' read -r -a argv <<<"$cmd"
  # argv: test_model_ref MODEL EXPECTED LAMBDA PROMPT_LEN; BF16 weights: LAMBDA * 2^16 (above).
  if [[ $name == *bf16* || $name == trained_model_* ]]; then
    argv[3]=$($PY -c "print(float('${argv[3]}') * 65536)")
  fi
  check "$name (cuda, bound ${argv[3]} x f32 error)" "${argv[@]}" cuda
done <"$LOGS/model_cases.tsv"
fi

# 4. speculative decoding on the GPU (test_spec reads LKS_BACKEND / LKS_COMM as settings)
want spec && check "spec tests (cuda, comm $COMM)" env LKS_BACKEND=cuda LKS_COMM=$COMM \
  ctest --test-dir "$B" -L spec -E serve --output-on-failure


finish
exit $FAILED
