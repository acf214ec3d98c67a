// SPDX-License-Identifier: MIT
// The reference side of the tokenizer comparison: encodes the corpus with Hugging Face's JS
// tokenizers (@huggingface/tokenizers) and writes, into OUT_DIR,
//   corpus.bin      the corpus bytes: per item a little-endian u32 length, then the bytes;
//   expected.jsonl  per item {"ids": [...], "ids_special": [...], "text": "...", "roundtrip": b}:
//                   the ids without and with add_special_tokens, decode(ids) (no clean-up of
//                   spaces), and whether decode(encode(x)) must be x itself (valid UTF-8 that the
//                   normalizer, if any, leaves unchanged).
// The reference sees each item through a WHATWG UTF-8 decoder (invalid bytes -> U+FFFD, a BOM
// kept), which is also what lockstep does to invalid input.
// Usage: node ref_tokenize.mjs TOKENIZER_DIR_OR_FILE OUT_DIR REPO_ROOT
import { Tokenizer } from "@huggingface/tokenizers";
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { corpus } from "./corpus.mjs";

const [src, out, root] = process.argv.slice(2);
const file = statSync(src).isDirectory() ? join(src, "tokenizer.json") : src;
const confFile = join(dirname(file), "tokenizer_config.json");
const json = JSON.parse(readFileSync(file, "utf8"));
const config = existsSync(confFile) ? JSON.parse(readFileSync(confFile, "utf8")) : {};
const tok = new Tokenizer(json, config);
const specials = (json.added_tokens ?? []).map((a) => a.content);
const items = corpus(specials, root);

const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const bin = [];
const lines = [];
for (const b of items) {
  const len = Buffer.alloc(4);
  len.writeUInt32LE(b.length);
  bin.push(len, b);
  const s = decoder.decode(b);
  const ids = tok.encode(s, { add_special_tokens: false }).ids;
  const ids_special = tok.encode(s, { add_special_tokens: true }).ids;
  const text = ids.length ? tok.decode(ids, { clean_up_tokenization_spaces: false }) : "";
  // decode(encode(x)) must give x back when x is valid UTF-8 and the normalizer leaves it alone.
  const valid = Buffer.from(s, "utf8").equals(b);
  const roundtrip = valid && (tok.normalizer ? tok.normalizer(s) === s : true);
  lines.push(JSON.stringify({ ids, ids_special, text, roundtrip }));
}
mkdirSync(out, { recursive: true });
writeFileSync(join(out, "corpus.bin"), Buffer.concat(bin));
writeFileSync(join(out, "expected.jsonl"), lines.join("\n") + "\n");
console.log(`reference: ${items.length} corpus items encoded with ${file}`);
