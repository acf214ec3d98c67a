// SPDX-License-Identifier: MIT
// JSON mode (response_format: {"type": "json_object"}) through the official `openai` npm client
// against a running `lockstep serve`.
// usage: node json_test.mjs BASE_URL OUT_JSON [sampled-count]
// Checks: `sampled-count` (default 100) chat and text completions sampled at temperature 1, with
// max_tokens from 2 up (short ones end by length, so the budget rule must close the object), all
// parse with JSON.parse as objects; bad response_format values, json_schema, thinking on and
// max_tokens 1 are 400s naming the field; text is unconstrained. Writes the token ids of a fixed
// set of greedy and seeded requests to OUT_JSON, for json_test.sh to compare between servers
// (speculation on and off, world 1 and 2). Prints "N passed, M failed" last.
import "openai/shims/web";
import OpenAI from "openai";
import { writeFileSync } from "node:fs";

const [base, outPath, nArg] = process.argv.slice(2);
const nSampled = Number(nArg || 100);
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "unused", maxRetries: 0, timeout: 300000 });
let passed = 0, failed = 0;
function check(ok, what) {
  if (ok) passed++; else { failed++; console.log("FAIL: " + what); }
}
const json = { type: "json_object" };
const model = (await client.models.list()).data[0].id;
const asks = ["Describe the list type as a JSON object.", "Give the arguments of open() in JSON.",
              "Hi", "Return a JSON object with the keys name and version.", "What does zip do?"];
function parsesAsObject(text) {
  try {
    const v = JSON.parse(text);
    return v !== null && typeof v === "object" && !Array.isArray(v);
  } catch { return false; }
}

// Sampled at temperature 1: every reply parses, whether it ended by EOS or by max_tokens.
let byLength = 0;
const jobs = [];
for (let i = 0; i < nSampled; i++) {
  const max_tokens = [2, 3, 4, 6, 9, 13, 20, 40, 80, 160][i % 10];
  const chat = i % 4 !== 3;
  jobs.push((async () => {
    const common = { model, max_tokens, temperature: 1, seed: 1000 + i, response_format: json };
    const r = chat
      ? await client.chat.completions.create({ ...common, messages: [{ role: "user", content: asks[i % asks.length] }] })
      : await client.completions.create({ ...common, prompt: "The configuration as JSON: " });
    const c = r.choices[0];
    const text = chat ? c.message.content : c.text;
    if (c.finish_reason === "length") byLength++;
    check(parsesAsObject(text), `sampled #${i} (${chat ? "chat" : "text"}, max_tokens ${max_tokens}, ` +
          `${c.finish_reason}) does not parse as an object: ${JSON.stringify(text)}`);
    if (chat) check(c.message.reasoning_content === null, `sampled #${i}: no reasoning in JSON mode`);
  })());
  if (jobs.length === 8) await Promise.all(jobs.splice(0));
}
await Promise.all(jobs);
check(byLength >= nSampled / 4, `${byLength} of ${nSampled} ended by max_tokens (the budget rule is exercised)`);
console.log(`sampled: ${nSampled} replies, ${byLength} ended by max_tokens`);

// Streamed: the chunks add up to a document that parses.
{
  const s = await client.chat.completions.create({ model, max_tokens: 24, temperature: 1, seed: 7, stream: true,
    response_format: json, messages: [{ role: "user", content: asks[0] }] });
  let text = "";
  for await (const ch of s) text += ch.choices[0]?.delta?.content ?? "";
  check(parsesAsObject(text), `streamed reply parses: ${JSON.stringify(text)}`);
}

// Refusals, naming the field.
async function status400(req, param, what) {
  try { await client.chat.completions.create({ model, max_tokens: 8, messages: [{ role: "user", content: "Hi" }], ...req }); check(false, `${what}: served`); }
  catch (e) { check(e.status === 400 && e.param === param && /response_format|max_tokens/.test(e.message), `${what}: ${e.status} ${e.param} ${e.message}`); }
}
await status400({ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object" } } } }, "response_format", "json_schema");
await status400({ response_format: { type: "yaml" } }, "response_format", "type yaml");
await status400({ response_format: "json_object" }, "response_format", "a string");
await status400({ response_format: {} }, "response_format", "no type");
await status400({ response_format: { type: 3 } }, "response_format", "type 3");
await status400({ response_format: json, chat_template_kwargs: { enable_thinking: true } }, "response_format", "thinking on");
await status400({ response_format: json, max_tokens: 1 }, "max_tokens", "max_tokens 1");
try { await client.completions.create({ model, prompt: "x", response_format: { type: "json_schema" } }); check(false, "completions json_schema served"); }
catch (e) { check(e.status === 400 && e.param === "response_format", `completions json_schema: ${e.status} ${e.param}`); }
// text is no constraint: the same reply as no response_format.
{
  const req = { model, max_tokens: 16, temperature: 0, messages: [{ role: "user", content: "Hi" }] };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create({ ...req, response_format: { type: "text" } });
  check(a.choices[0].message.content === b.choices[0].message.content, "response_format text changes nothing");
}

// Fixed requests whose token ids json_test.sh compares between servers: greedy and seeded
// sampling, chat and text, lengths that end by EOS and by max_tokens.
// Sent concurrently: a request's tokens do not depend on its batch.
const fixedJobs = [];
for (const [i, ask] of asks.entries()) {
  for (const [temperature, seed] of [[0, 0], [1, 11 + i], [0.7, 99 + i]]) {
    for (const max_tokens of [12, 64]) {
      fixedJobs.push(client.chat.completions.create({ model, max_tokens, temperature, seed, response_format: json,
        messages: [{ role: "user", content: ask }], return_token_ids: true }).then((r) => {
        const c = r.choices[0];
        check(parsesAsObject(c.message.content), `fixed ${i}/${temperature}/${max_tokens} parses: ${JSON.stringify(c.message.content)}`);
        return { ask: i, temperature, seed, max_tokens, ids: c.token_ids, text: c.message.content, finish: c.finish_reason };
      }));
    }
  }
}
const fixed = await Promise.all(fixedJobs);
{
  const r = await client.completions.create({ model, prompt: "JSON: ", max_tokens: 48, temperature: 1, seed: 5,
    response_format: json, return_token_ids: true });
  fixed.push({ text_completion: true, text: r.choices[0].text, finish: r.choices[0].finish_reason });
}
writeFileSync(outPath, JSON.stringify(fixed, null, 1));
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
