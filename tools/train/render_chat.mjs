// SPDX-License-Identifier: MIT
// Renders conversations with GLM-4.6's chat template (tools/train/glm-4.6.jinja) by
// @huggingface/jinja 0.5.11 and encodes them with Hugging Face's JS tokenizers 0.2.0 (the pinned
// packages of tests/tokenizer; lockstep's renderer and tokenizer are tested byte- and
// id-identical to both), for finetune_tools.py.
// Each input line: {"messages": [...], "tools": [...]?}, as text/chat.c takes them (what the
// server passes on after reading a request: tool-call arguments as objects). Each output line:
// {"ids": [...], "text": "..."}, rendered without a generation prompt.
// Usage: node render_chat.mjs MODEL_DIR < in.jsonl > out.jsonl   (run bash tests/tokenizer/npm_ci.sh first)
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const req = createRequire(join(here, "../../tests/tokenizer/package.json"));
const { Template } = req("@huggingface/jinja");
const { Tokenizer } = req("@huggingface/tokenizers");
const dir = process.argv[2];
const tok = new Tokenizer(JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
                          JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")));
const template = new Template(readFileSync(join(here, "glm-4.6.jinja"), "utf8"));
const out = [];
for (const line of readFileSync(0, "utf8").split("\n")) {
  if (!line.trim()) continue;
  const c = JSON.parse(line);
  const ctx = { messages: c.messages, add_generation_prompt: false };
  if (c.tools) ctx.tools = c.tools;
  const text = template.render(ctx);
  out.push(JSON.stringify({ ids: tok.encode(text, { add_special_tokens: false }).ids, text }));
}
process.stdout.write(out.join("\n") + "\n");
