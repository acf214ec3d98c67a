# SPDX-License-Identifier: MIT
# Text in, text out on the command line: tokenize/detokenize the GLM-shaped fixture tokenizer, and
# `generate --prompt` / `--chat` on a generated model whose vocabulary is that tokenizer's, checked
# against `generate --prompt-ids` on the ids of the same text (the text printed must be the
# detokenized ids); the stop ids of generation_config.json end a text generation without being
# printed; mistakes are refused with a message.
# Invoked as: cmake -DLOCKSTEP=... -DPYTHON=... -DSRC=... -DWORK=... -P cli_text.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

include(${CMAKE_CURRENT_LIST_DIR}/../cli/expect.cmake)

set(fixture ${SRC}/tests/tokenizer/glm-fixture)
set(model ${WORK}/model)
# The model's vocabulary is exactly the tokenizer's ids, so every generated id has text.
file(READ ${fixture}/tokenizer.json tj)
string(JSON n_added LENGTH "${tj}" added_tokens)
math(EXPR last "${n_added} - 1")
string(JSON last_id GET "${tj}" added_tokens ${last} id)
math(EXPR vocab "${last_id} + 1")
run(${PYTHON} ${SRC}/tools/gen_model.py --out ${model} --dtype f32 --seed 31 --vocab ${vocab} --layers 2)
expect("rc EQUAL 0" "generate a model with the fixture's ${vocab} ids")
file(COPY ${fixture}/tokenizer.json ${fixture}/tokenizer_config.json DESTINATION ${model})

# tokenize / detokenize
set(text "Hello world, 你好 👋")
run(${LOCKSTEP} tokenize ${fixture} "${text}" --log-level warn)
string(STRIP "${out}" ids)
expect("rc EQUAL 0 AND ids MATCHES \"^[0-9]+(,[0-9]+)+$\"" "tokenize prints ids (${ids})")
run(${LOCKSTEP} detokenize ${fixture} ${ids} --log-level warn)
expect("rc EQUAL 0 AND out STREQUAL \"${text}\n\"" "detokenize gives the text back")
run(${LOCKSTEP} tokenize ${fixture}/tokenizer.json "[gMASK]<sop>" --log-level warn)
string(STRIP "${out}" special)
string(JSON gmask GET "${tj}" added_tokens 2 id)
string(JSON sop GET "${tj}" added_tokens 4 id)
expect("rc EQUAL 0 AND special STREQUAL \"${gmask},${sop}\"" "special tokens are single ids")

# --prompt: the text printed is the detokenized continuation of the same ids.
run(${LOCKSTEP} generate --model ${model} --prompt-ids ${ids} -n 12 --ignore-eos --log-level warn)
string(STRIP "${out}" gen_ids)
expect("rc EQUAL 0" "generate from the ids")
run(${LOCKSTEP} detokenize ${model} ${gen_ids} --log-level warn)
set(want "${out}")
run(${LOCKSTEP} generate --model ${model} --prompt "${text}" -n 12 --ignore-eos --log-level warn)
expect("rc EQUAL 0 AND out STREQUAL want" "generate --prompt prints the continuation as text")

# --chat: GLM's template around the message.
run(${LOCKSTEP} tokenize ${model} "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi/nothink<|assistant|>\n<think></think>" --log-level warn)
string(STRIP "${out}" chat_ids)
run(${LOCKSTEP} generate --model ${model} --prompt-ids ${chat_ids} -n 10 --ignore-eos --log-level warn)
string(STRIP "${out}" gen_ids)
run(${LOCKSTEP} detokenize ${model} ${gen_ids} --log-level warn)
set(want "${out}")
run(${LOCKSTEP} generate --model ${model} --chat "Hi" --system "Be brief." --no-think -n 10 --ignore-eos --log-level warn)
expect("rc EQUAL 0 AND out STREQUAL want" "generate --chat --system --no-think")

# Stop ids from generation_config.json: make the first generated id a stop id.
string(REPLACE "," ";" gen_list "${gen_ids}")
list(GET gen_list 0 first)
list(GET gen_list 1 second)
if(NOT first EQUAL second)
  file(WRITE ${model}/generation_config.json "{\"eos_token_id\": [${second}]}")
  run(${LOCKSTEP} generate --model ${model} --prompt-ids ${chat_ids} -n 10 --log-level warn)
  expect("rc EQUAL 0 AND out STREQUAL \"${first},${second}\n\"" "generate stops at the stop id")
  run(${LOCKSTEP} detokenize ${model} ${first} --log-level warn)
  set(want "${out}")
  run(${LOCKSTEP} generate --model ${model} --chat "Hi" --system "Be brief." --no-think -n 10 --log-level warn)
  expect("rc EQUAL 0 AND out STREQUAL want" "a text generation stops there without printing the stop token")
endif()

# Mistakes.
run(${LOCKSTEP} generate --model ${model} --prompt "x" --prompt-ids 1 --log-level warn)
expect("rc EQUAL 2 AND err MATCHES \"exactly one of\"" "refuse two prompts")
run(${LOCKSTEP} generate --model ${model} --prompt "x" --no-think --log-level warn)
expect("rc EQUAL 2 AND err MATCHES \"go with --chat\"" "refuse --no-think without --chat")
file(REMOVE ${model}/tokenizer.json)
run(${LOCKSTEP} generate --model ${model} --prompt "x" --log-level warn)
expect("rc EQUAL 1 AND err MATCHES \"need the model's tokenizer\" AND err MATCHES \"tokenizer.json\"" "a model without tokenizer.json")
run(${LOCKSTEP} tokenize ${WORK} "x" --log-level warn)
expect("rc EQUAL 1 AND err MATCHES \"tokenizer.json\"" "tokenize without tokenizer.json")
run(${LOCKSTEP} detokenize ${fixture} 1,x --log-level warn)
expect("rc EQUAL 2 AND err MATCHES \"comma-separated\"" "detokenize refuses bad ids")
