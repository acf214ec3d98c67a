# SPDX-License-Identifier: MIT
# The `lockstep` command line as a user runs it, on a generated model:
#   generate prints the reference's greedy continuation; inspect reports a good model and lists
#   the problems of a broken one; bad flags are refused with a message; bench runs.
# Invoked as: cmake -DLOCKSTEP=... -DPYTHON=... -DSRC=... -DWORK=... -P cli_test.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

include(${CMAKE_CURRENT_LIST_DIR}/expect.cmake)

set(model ${WORK}/model)
run(${PYTHON} ${SRC}/tools/gen_model.py --out ${model} --dtype f32 --seed 21 --shards 2)
expect("rc EQUAL 0" "generate a model")
run(${PYTHON} ${SRC}/tests/reference/glm_ref.py --model ${model} --out ${WORK}/ref.safetensors
    --prompt-len 9 --gen 15 --chain 1 --seed 5)
expect("rc EQUAL 0" "reference run")
# The reference's tokens: prompt (9) then the greedy continuation (16).
run(${PYTHON} ${SRC}/tests/cli/ref_tokens.py ${WORK}/ref.safetensors 9)
expect("rc EQUAL 0" "read the reference tokens")
string(REPLACE "\n" ";" lines "${out}")
list(GET lines 0 prompt)
list(GET lines 1 want)

run(${LOCKSTEP} generate --model ${model} --prompt-ids ${prompt} -n 16 --ignore-eos)
string(STRIP "${out}" got)
expect("rc EQUAL 0" "generate runs")
expect("got STREQUAL want" "generate prints the reference's greedy tokens (${want})")

run(${LOCKSTEP} generate --model ${model} --prompt-ids ${prompt} -n 16 --ignore-eos
    --temperature 0.8 --top-k 20 --top-p 0.9 --seed 3)
set(first "${out}")
run(${LOCKSTEP} generate --model ${model} --prompt-ids ${prompt} -n 16 --ignore-eos
    --temperature 0.8 --top-k 20 --top-p 0.9 --seed 3)
expect("rc EQUAL 0 AND out STREQUAL first" "sampling is reproducible from its seed")

run(${LOCKSTEP} generate --model ${model} --prompt-ids ${prompt} -n 16 --ignore-eos --kv-dtype bf16)
string(STRIP "${out}" got)
expect("rc EQUAL 0 AND got STREQUAL want" "generate with a BF16 KV cache prints the reference's greedy tokens")
run(${LOCKSTEP} generate --model ${model} --prompt-ids ${prompt} -n 16 --ignore-eos --mmap false)
string(STRIP "${out}" got)
expect("rc EQUAL 0 AND got STREQUAL want" "generate with the weights copied into memory (--mmap false) prints the reference's greedy tokens")
run(${LOCKSTEP} generate --model ${model} --prompt-ids ${prompt} -n 2 --kv-dtype f16)
expect("NOT rc EQUAL 0 AND err MATCHES \"--kv-dtype f16: expected f32 or bf16\"" "refuse an unknown --kv-dtype")

run(${LOCKSTEP} inspect ${model})
expect("rc EQUAL 0 AND out MATCHES \"status: ok\" AND out MATCHES \"bytes read per decoded token\""
       "inspect a good model")
string(REGEX MATCH "[0-9.]+ [KMG]?i?B of KV cache per context position" kv_f32 "${out}")
run(${LOCKSTEP} inspect ${model} --kv-dtype bf16)
string(REGEX MATCH "[0-9.]+ [KMG]?i?B of KV cache per context position" kv_bf16 "${out}")
expect("NOT kv_f32 STREQUAL kv_bf16" "inspect --kv-dtype bf16 counts half the KV bytes (${kv_f32} vs ${kv_bf16})")

run(${LOCKSTEP} inspect ${model} --world 2)
expect("rc EQUAL 0 AND out MATCHES \"rank 1: loads and holds\"" "inspect --world 2 shows each rank's bytes")

run(${LOCKSTEP} generate --model ${model} --prompt-ids 1,x,3)
expect("rc EQUAL 2 AND err MATCHES \"not a comma-separated list\"" "refuse a bad --prompt-ids")
run(${LOCKSTEP} generate --model ${model} --prompt-ids 1,99999)
expect("rc EQUAL 2 AND err MATCHES \"outside the vocabulary\"" "refuse an id outside the vocabulary")
run(${LOCKSTEP} generate --model ${model} --prompt-ids 1 --threads -3)
expect("rc EQUAL 2 AND err MATCHES \"--threads = -3 is outside\"" "refuse a bad --threads")
run(${LOCKSTEP} generate --model ${model} --prompt-ids 1 --no-such-flag)
expect("rc EQUAL 2 AND err MATCHES \"unknown option\"" "refuse an unknown flag")
run(${LOCKSTEP} generate --model ${WORK}/nowhere --prompt-ids 1)
expect("rc EQUAL 1 AND err MATCHES \"config.json\"" "refuse a missing model")

run(${LOCKSTEP} bench --model ${model} --prefill-len 16 --decode-len 8 --repeats 1)
expect("rc EQUAL 0 AND out MATCHES \"decode:\" AND out MATCHES \"of measured bandwidth\"" "bench runs")

# A broken model: one shard gone, and a config size that disagrees with the tensors.
file(REMOVE ${model}/model-00002-of-00002.safetensors)
run(${LOCKSTEP} inspect ${model})
expect("rc EQUAL 1 AND out MATCHES \"named in the index but absent\"" "inspect names the absent shard")
run(${PYTHON} ${SRC}/tools/gen_model.py --out ${model} --dtype f32 --seed 21 --shards 2)
file(READ ${model}/config.json cfg)
string(REPLACE "\"moe_intermediate_size\": 64" "\"moe_intermediate_size\": 65" cfg "${cfg}")
file(WRITE ${model}/config.json "${cfg}")
run(${LOCKSTEP} inspect ${model})
expect("rc EQUAL 1 AND out MATCHES \"implies \\\\[65, 128\\\\]\"" "inspect lists shape problems")
