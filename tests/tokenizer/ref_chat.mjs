// SPDX-License-Identifier: MIT
// The reference side of the chat template comparison: renders each conversation of
// chat_cases.json with @huggingface/jinja and the given template, and writes the results as a
// JSON array of strings to OUT.
// Usage: node ref_chat.mjs TEMPLATE.jinja chat_cases.json OUT
import { Template } from "@huggingface/jinja";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";

const [tplFile, casesFile, out] = process.argv.slice(2);
const template = new Template(readFileSync(tplFile, "utf8"));
const cases = JSON.parse(readFileSync(casesFile, "utf8"));
const rendered = cases.map((c) => {
  const ctx = { messages: c.messages, add_generation_prompt: c.add_generation_prompt };
  if ("tools" in c) ctx.tools = c.tools;
  if ("enable_thinking" in c) ctx.enable_thinking = c.enable_thinking;
  return template.render(ctx);
});
mkdirSync(dirname(out), { recursive: true });  // run alone, before any tokref_* test made it
writeFileSync(out, JSON.stringify(rendered, null, 1) + "\n");
console.log(`reference: ${rendered.length} conversations rendered with ${tplFile}`);
