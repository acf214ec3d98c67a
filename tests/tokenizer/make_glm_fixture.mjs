// SPDX-License-Identifier: MIT
// Writes glm-fixture/tokenizer.json: a small byte-level BPE shaped like GLM-4.5's (MODEL.md
// section 5): the GLM pre-tokenizer pattern, no normalizer, ByteLevel decoder, 256 byte tokens,
// MERGES merges trained here on the test corpus, and GLM's added tokens after them. It stands in
// for the project's own tokenizer until tools/train produces models/<name>/tokenizer.json.
// Deterministic: run it again and the file is byte-identical.
// Usage: node make_glm_fixture.mjs [MERGES]
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { corpus } from "./corpus.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const MERGES = Number(process.argv[2] ?? 600);
const PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// The same pattern for training in JavaScript, which lacks (?i:...) groups before Node 23.
const jsPattern = new RegExp(
  PATTERN.replace("(?i:'s|'t|'re|'ve|'m|'ll|'d)", "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"),
  "gu",
);
const SPECIALS = [
  "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
  "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
  "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>",
  "<|end_of_transcription|>", "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "/nothink",
  "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
  "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<|begin_of_box|>", "<|end_of_box|>",
  "<|image|>", "<|video|>",
];

// GPT-2's byte <-> unicode map, in its order: printable bytes first.
const bs = [];
for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
for (let b = 0xae; b <= 0xff; b++) bs.push(b);
const cs = bs.slice();
for (let b = 0, n = 0; b < 256; b++) if (!bs.includes(b)) bs.push(b), cs.push(256 + n++);
const byteChar = new Map(bs.map((b, i) => [b, String.fromCharCode(cs[i])]));

// Words: pre-tokenized corpus pieces as byte-level symbol lists, with counts.
const counts = new Map();
const decoder = new TextDecoder("utf-8", { fatal: false });
// Trained on the fixed part of the corpus only (no repository sources), so it is reproducible.
for (const item of corpus([], join(here, "no-sources"))) {
  for (const piece of decoder.decode(item).match(jsPattern) ?? []) {
    const sym = Array.from(Buffer.from(piece, "utf8"), (b) => byteChar.get(b)).join("\u0001");
    counts.set(sym, (counts.get(sym) ?? 0) + 1);
  }
}
let words = [...counts.entries()].map(([k, c]) => ({ s: k.split("\u0001"), c }));

const vocab = {};
bs.forEach((b, i) => (vocab[byteChar.get(b)] = i));
let next = 256;
const merges = [];
while (merges.length < MERGES) {
  const pairs = new Map();
  for (const w of words)
    for (let i = 0; i + 1 < w.s.length; i++) {
      const k = w.s[i] + " " + w.s[i + 1];
      pairs.set(k, (pairs.get(k) ?? 0) + w.c);
    }
  let best = null;
  for (const [k, c] of pairs) if (!best || c > best[1] || (c === best[1] && k < best[0])) best = [k, c];
  if (!best || best[1] < 2) break;
  const [a, b] = best[0].split(" ");
  merges.push(best[0]);
  if (vocab[a + b] === undefined) vocab[a + b] = next++;
  words = words.map((w) => {
    const s = [];
    for (let i = 0; i < w.s.length; i++) {
      if (i + 1 < w.s.length && w.s[i] === a && w.s[i + 1] === b) s.push(a + b), i++;
      else s.push(w.s[i]);
    }
    return { s, c: w.c };
  });
}
const added = SPECIALS.map((content, i) => ({
  id: next + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
}));
const tokenizer = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: added,
  normalizer: null,
  pre_tokenizer: {
    type: "Sequence",
    pretokenizers: [
      { type: "Split", pattern: { Regex: PATTERN }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    ],
  },
  post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges,
  },
};
const out = join(here, "glm-fixture");
mkdirSync(out, { recursive: true });
writeFileSync(join(out, "tokenizer.json"), JSON.stringify(tokenizer, null, 1) + "\n");
writeFileSync(
  join(out, "tokenizer_config.json"),
  JSON.stringify({ tokenizer_class: "PreTrainedTokenizerFast", clean_up_tokenization_spaces: false,
                   eos_token: "<|endoftext|>", pad_token: "<|endoftext|>", model_max_length: 128000 }, null, 1) + "\n",
);
console.log(`glm-fixture: ${next} vocabulary ids (${merges.length} merges), ${added.length} added tokens`);
