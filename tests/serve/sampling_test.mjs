// SPDX-License-Identifier: MIT
// Logit processing and reporting through the official `openai` npm client (and raw requests for
// what the client would refuse to send), against three servers of one model: plain, --spec mtp
// (world 2) and --spec ngram. Checks:
// - logprobs of /v1/completions (the legacy shape) and of chat (the content shape), plain and
//   streamed (the chunks' reports concatenate to the plain ones); the values are written to
//   CASES_OUT for logits_ref.py, which compares them with the numpy reference;
// - n = 4 with a seed: four choices, indexed 0..3, reproducible, distinct, the same with
//   speculation; greedy n = 3: three identical choices; a streamed n = 3 chat gives each index the
//   text of the plain one; usage sums the choices;
// - logit_bias (+100 forces a token, -100 forbids one), frequency / presence / repetition
//   penalties (written to CASES_OUT: logits_ref.py recomputes the greedy tokens from the
//   reference logits), with and without speculation, greedy and seeded sampling: token for token
//   the same on the three servers;
// - bad values of every new field: 400 naming it.
// usage: node sampling_test.mjs PLAIN_URL MTP_URL NGRAM_URL CASES_OUT
import "openai/shims/web";
import OpenAI from "openai";
import { writeFileSync } from "node:fs";

const [plainUrl, mtpUrl, ngramUrl, casesOut] = process.argv.slice(2);
const mk = (u) => new OpenAI({ baseURL: u + "/v1", apiKey: "unused", maxRetries: 0, timeout: 300000 });
const servers = [["plain", mk(plainUrl)], ["mtp", mk(mtpUrl)], ["ngram", mk(ngramUrl)]];
const plain = servers[0][1];
let passed = 0, failed = 0;
function check(ok, what) {
  if (ok) passed++; else { failed++; console.log("FAIL: " + what); }
}
const eq = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const cases = [];
const model = (await plain.models.list()).data[0].id;
const prompts = [[5, 6, 7, 8, 9], [100, 200, 300], [42, 17, 1000, 3]];

// ---- logprobs, /v1/completions ----
function legacyCase(name, prompt, ch) {
  const lp = ch.logprobs;
  cases.push({ kind: "logprobs", name, prompt, tokens: ch.token_ids, logprobs: lp.token_logprobs,
               top: lp.top_logprobs.map((d) => Object.values(d).sort((a, b) => b - a)), k: 5 });
}
for (const [i, p] of prompts.entries()) {
  const body = { model, prompt: p, max_tokens: 8, logprobs: 5, return_token_ids: true, ignore_eos: true };
  const variants = [["greedy", { temperature: 0 }], ["sampled", { temperature: 1, seed: 11 + i }],
                    ["penalised", { temperature: 0, frequency_penalty: 1, logit_bias: { "7": 5 } }]];
  for (const [vname, extra] of variants) {
    const runs = [];
    for (const [sname, c] of servers) {
      const r = await c.completions.create({ ...body, ...extra });
      const ch = r.choices[0], lp = ch.logprobs;
      const ok = lp && lp.tokens.length === 8 && lp.token_logprobs.length === 8 && lp.top_logprobs.length === 8 &&
        lp.text_offset.length === 8 && lp.top_logprobs.every((d) => Object.keys(d).length >= 1 && Object.keys(d).length <= 5) &&
        lp.token_logprobs.every((x) => x <= 0);
      check(ok, `${sname} ${vname} completion logprobs of [${p}] have the legacy shape: ${JSON.stringify(lp).slice(0, 200)}`);
      if (!ok) continue;
      legacyCase(`${sname} ${vname} [${p}]`, p, ch);
      runs.push(ch);
    }
    // Speculation reports the same numbers (each token from its own verify row).
    for (const ch of runs.slice(1)) {
      check(eq(ch.token_ids, runs[0].token_ids), `${vname} [${p}]: tokens with speculation equal plain`);
      check(ch.logprobs.token_logprobs.every((x, j) => Math.abs(x - runs[0].logprobs.token_logprobs[j]) < 1e-4),
            `${vname} [${p}]: logprobs with speculation equal plain`);
    }
    // Greedy: the chosen token is the best alternative.
    if (vname === "greedy" && runs.length) {
      const lp = runs[0].logprobs;
      check(lp.token_logprobs.every((x, j) => Math.abs(x - Math.max(...Object.values(lp.top_logprobs[j]))) < 1e-6),
            `greedy [${p}]: each token's logprob is the largest`);
    }
  }
}
// Streamed: the chunks' reports concatenate to the plain ones.
{
  const body = { model, prompt: prompts[0], max_tokens: 10, logprobs: 2, temperature: 0.8, seed: 5, ignore_eos: true };
  const whole = await plain.completions.create(body);
  const s = await plain.completions.create({ ...body, stream: true });
  let toks = [], lps = [], offs = [];
  for await (const c of s)
    for (const ch of c.choices)
      if (ch.logprobs) { toks.push(...ch.logprobs.tokens); lps.push(...ch.logprobs.token_logprobs); offs.push(...ch.logprobs.text_offset); }
  check(eq(toks, whole.choices[0].logprobs.tokens) && eq(lps, whole.choices[0].logprobs.token_logprobs) &&
        eq(offs, whole.choices[0].logprobs.text_offset), "streamed completion logprobs equal the plain ones");
}

// ---- logprobs, chat ----
{
  const body = { model, messages: [{ role: "user", content: "Write about lists." }], max_tokens: 10, temperature: 0,
                 logprobs: true, top_logprobs: 3, ignore_eos: true };
  const r = await plain.chat.completions.create(body);
  const content = r.choices[0].logprobs?.content;
  check(Array.isArray(content) && content.length === r.usage.completion_tokens,
        `chat logprobs.content has one entry per token: ${content?.length} for ${r.usage.completion_tokens}`);
  check(content.every((e) => typeof e.token === "string" && Array.isArray(e.bytes) && e.logprob <= 0 &&
                             e.top_logprobs.length === 3 && e.top_logprobs.every((t) => typeof t.token === "string" && Array.isArray(t.bytes)) &&
                             e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob && e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob &&
                             Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-6),
        "chat logprobs entries: token, bytes, logprob, top_logprobs sorted, greedy token first");
  const enc = new TextEncoder();
  check(content.every((e) => e.token.includes("\ufffd") || e.token.startsWith("token_id:") || eq([...enc.encode(e.token)], e.bytes)),
        "chat logprobs: bytes are the token's UTF-8");
  const s = await plain.chat.completions.create({ ...body, stream: true });
  const got = [];
  for await (const c of s) for (const ch of c.choices) if (ch.logprobs?.content) got.push(...ch.logprobs.content);
  check(eq(got, content), "streamed chat logprobs equal the plain ones");
  const none = await plain.chat.completions.create({ ...body, logprobs: false, top_logprobs: undefined });
  check(none.choices[0].logprobs === null, "chat without logprobs: null");
  const zero = await plain.chat.completions.create({ ...body, top_logprobs: 0 });
  check(zero.choices[0].logprobs.content.every((e) => e.top_logprobs.length === 0), "top_logprobs 0: no alternatives");
  check(zero.choices[0].logprobs.content.every((e, j) => e.logprob === content[j].logprob), "top_logprobs 0: the same logprobs");
}

// ---- n ----
const nbody = { model, prompt: prompts[1], max_tokens: 12, temperature: 1, seed: 123, n: 4, return_token_ids: true, ignore_eos: true };
const first = await plain.completions.create(nbody);
const ids = (r) => [...r.choices].sort((a, b) => a.index - b.index).map((c) => c.token_ids);
check(eq(first.choices.map((c) => c.index).sort(), [0, 1, 2, 3]), "n = 4: choices indexed 0..3");
check(new Set(ids(first).map((x) => JSON.stringify(x))).size === 4, `n = 4 with a seed: four distinct samples`);
check(first.usage.completion_tokens === ids(first).reduce((a, x) => a + x.length, 0) && first.usage.prompt_tokens === prompts[1].length,
      "n = 4: usage sums the choices, the prompt once");
check(eq(ids(await plain.completions.create(nbody)), ids(first)), "n = 4 with a seed: the same four again");
for (const [sname, c] of servers.slice(1))
  check(eq(ids(await c.completions.create(nbody)), ids(first)), `n = 4 with a seed: the same four with ${sname}`);
const one = await plain.completions.create({ ...nbody, n: 1 });
check(eq(one.choices[0].token_ids, ids(first)[0]), "choice 0 of n = 4 is the n = 1 sample of the seed");
const greedyN = await plain.completions.create({ ...nbody, temperature: 0, n: 3 });
check(greedyN.choices.length === 3 && ids(greedyN).every((x) => eq(x, ids(greedyN)[0])), "greedy n = 3: three identical choices");
{
  const body = { model, messages: [{ role: "user", content: "Say something." }], max_tokens: 10, temperature: 1, seed: 9, n: 3 };
  const whole = await plain.chat.completions.create(body);
  check(whole.choices.length === 3 && eq(whole.choices.map((c) => c.index), [0, 1, 2]), "chat n = 3: three choices");
  const s = await plain.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  const text = ["", "", ""], fin = [null, null, null];
  let usage = null;
  for await (const c of s) {
    for (const ch of c.choices) { text[ch.index] += ch.delta?.content ?? ""; fin[ch.index] = ch.finish_reason ?? fin[ch.index]; }
    if (c.usage) usage = c.usage;
  }
  check(eq(text, whole.choices.map((c) => c.message.content)) && fin.every((f) => f),
        `chat n = 3 streamed: each index's text equals the plain choice's: ${JSON.stringify(text)} vs ${JSON.stringify(whole.choices.map((c) => c.message.content))}`);
  check(usage && usage.completion_tokens === whole.usage.completion_tokens, "chat n = 3 streamed: usage sums the choices");
}

// ---- logit_bias and penalties ----
const gbody = { model, prompt: prompts[0], max_tokens: 16, temperature: 0, return_token_ids: true, ignore_eos: true };
const base = (await plain.completions.create(gbody)).choices[0].token_ids;
const forced = (await plain.completions.create({ ...gbody, logit_bias: { "123": 100 } })).choices[0].token_ids;
check(forced.every((t) => t === 123), `logit_bias +100 on 123: ${forced}`);
const banned = (await plain.completions.create({ ...gbody, logit_bias: { [String(base[0])]: -100 } })).choices[0].token_ids;
check(banned.length && !banned.includes(base[0]), `logit_bias -100 on ${base[0]}: never emitted (${banned})`);
const pcases = [
  ["frequency", { frequency_penalty: 1.5 }],
  ["presence", { presence_penalty: 2 }],
  ["frequency and presence", { frequency_penalty: 0.7, presence_penalty: 0.6 }],
  ["negative frequency", { frequency_penalty: -1.2 }],
  ["repetition", { repetition_penalty: 1.8 }],
  ["all, and a bias", { frequency_penalty: 0.5, presence_penalty: -0.5, repetition_penalty: 1.3, logit_bias: { "7": 3, "9": -2 } }],
];
let changed = 0;
for (const p of prompts)
  for (const [name, extra] of pcases) {
    const runs = [];
    for (const [sname, c] of servers) runs.push((await c.completions.create({ ...gbody, prompt: p, ...extra })).choices[0].token_ids);
    check(runs.every((x) => eq(x, runs[0])), `${name} [${p}]: the same tokens plain, with mtp, with ngram`);
    const plainRun = (await plain.completions.create({ ...gbody, prompt: p })).choices[0].token_ids;
    changed += !eq(plainRun, runs[0]);
    cases.push({ kind: "greedy", name: `${name} [${p}]`, prompt: p, tokens: runs[0], presence: extra.presence_penalty ?? 0,
                 frequency: extra.frequency_penalty ?? 0, repetition: extra.repetition_penalty ?? 1, bias: extra.logit_bias ?? {} });
  }
check(changed >= 3, `the penalties change the greedy output (${changed} of ${pcases.length * prompts.length} cases)`);
// Longer runs where speculation meets penalised tokens often: repetitive prompts, penalties
// that encourage repetition (which the drafters then propose) and ones that discourage it.
let specRuns = 0, specSame = 0;
for (const p of [[5, 6, 5, 6, 5, 6], [9, 9, 9, 9], [300, 301, 302, 300, 301, 302], prompts[0]])
  for (const extra of [{ frequency_penalty: -1.5 }, { presence_penalty: -1 }, { frequency_penalty: 1, presence_penalty: 0.3 },
                       { repetition_penalty: 0.7 }, { repetition_penalty: 1.5, frequency_penalty: -0.5 }])
    for (const t of [{ temperature: 0 }, { temperature: 0.8, seed: 21 }]) {
      const runs = [];
      for (const [, c] of servers) runs.push((await c.completions.create({ ...gbody, prompt: p, max_tokens: 24, ...extra, ...t })).choices[0].token_ids);
      specRuns++;
      specSame += runs.every((x) => eq(x, runs[0]));
      if (!runs.every((x) => eq(x, runs[0]))) console.log(`  differs: [${p}] ${JSON.stringify({ ...extra, ...t })}: ${runs.map((x) => JSON.stringify(x)).join(" / ")}`);
    }
check(specRuns === specSame, `penalised runs identical plain, with mtp, with ngram: ${specSame} of ${specRuns}`);
// Seeded sampling with penalties: the same with speculation, chat and completions.
for (const extra of [{ frequency_penalty: 1, presence_penalty: 0.5 }, { repetition_penalty: 1.4, logit_bias: { "5": 4 } }]) {
  const body = { ...gbody, temperature: 0.9, seed: 77, n: 2, ...extra };
  const runs = [];
  for (const [, c] of servers) runs.push(ids(await c.completions.create(body)));
  check(runs.every((x) => eq(x, runs[0])), `seeded sampling with ${JSON.stringify(extra)}: the same plain, with mtp, with ngram`);
  const chat = { model, messages: [{ role: "user", content: "Tell me about tuples." }], max_tokens: 12, temperature: 0.9, seed: 3, ...extra };
  const texts = [];
  for (const [, c] of servers) texts.push((await c.chat.completions.create(chat)).choices[0].message.content);
  check(texts.every((x) => x === texts[0]), `seeded chat with ${JSON.stringify(extra)}: the same text plain, with mtp, with ngram`);
}
// The Anthropic API, which has none of these fields, still answers.
{
  const r = await fetch(plainUrl + "/v1/messages", { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "x", max_tokens: 5, messages: [{ role: "user", content: "hi" }] }) });
  check(r.status === 200 && (await r.json()).type === "message", "the Messages API still answers");
}

// ---- bad values: 400 naming the field ----
const big = {};
for (let i = 0; i < 1100; i++) big[String(i)] = 1;
const bads = [
  ["presence_penalty", { presence_penalty: 2.5 }], ["presence_penalty", { presence_penalty: "1" }],
  ["frequency_penalty", { frequency_penalty: -3 }], ["frequency_penalty", { frequency_penalty: [1] }],
  ["repetition_penalty", { repetition_penalty: 0 }], ["repetition_penalty", { repetition_penalty: -1 }],
  ["repetition_penalty", { repetition_penalty: "x" }],
  ["logit_bias", { logit_bias: [1, 2] }], ["logit_bias", { logit_bias: { "5": 101 } }],
  ["logit_bias", { logit_bias: { "5": "1" } }], ["logit_bias", { logit_bias: { "abc": 1 } }],
  ["logit_bias", { logit_bias: { "-1": 1 } }], ["logit_bias", { logit_bias: { "1.5": 1 } }],
  ["logit_bias", { logit_bias: { "07": 1 } }], ["logit_bias", { logit_bias: { " 7": 1 } }],
  ["logit_bias", { logit_bias: { "99999999": 1 } }], ["logit_bias", { logit_bias: { "99999999999999999999": 1 } }],
  ["logit_bias", { logit_bias: { "4096": 1 } }], ["logit_bias", { logit_bias: big }], ["logit_bias", { logit_bias: "x" }],
  ["n", { n: 0 }], ["n", { n: 17 }], ["n", { n: 2.5 }], ["n", { n: "2" }],
  ["best_of", { n: 2, best_of: 3 }], ["best_of", { best_of: 2 }], ["best_of", { best_of: "1" }],
];
const completionBads = [["logprobs", { logprobs: 6 }], ["logprobs", { logprobs: -1 }], ["logprobs", { logprobs: true }],
                        ["logprobs", { logprobs: 1.5 }]];
const chatBads = [["logprobs", { logprobs: 1 }], ["logprobs", { logprobs: "yes" }], ["top_logprobs", { logprobs: true, top_logprobs: 21 }],
                  ["top_logprobs", { logprobs: true, top_logprobs: -1 }], ["top_logprobs", { top_logprobs: 2 }],
                  ["top_logprobs", { logprobs: true, top_logprobs: 1.5 }]];
async function raw(path, body) {
  const r = await fetch(plainUrl + path, { method: "POST", headers: { "content-type": "application/json" }, body });
  let j = null;
  try { j = await r.json(); } catch { }
  return { status: r.status, j };
}
for (const [path, list, bodyOf] of [
  ["/v1/completions", [...bads, ...completionBads], (x) => ({ prompt: [5, 6], max_tokens: 2, ...x })],
  ["/v1/chat/completions", [...bads, ...chatBads], (x) => ({ messages: [{ role: "user", content: "hi" }], max_tokens: 2, ...x })]]) {
  for (const [field, x] of list) {
    const r = await raw(path, JSON.stringify(bodyOf(x)));
    check(r.status === 400 && r.j?.error?.param === field,
          `${path} ${JSON.stringify(x).slice(0, 80)}: ${r.status} naming ${r.j?.error?.param} (want 400 naming ${field})`);
  }
}
// A NaN-like value is not JSON; a huge one is out of range.
for (const v of ["NaN", "Infinity", "1e400"]) {
  const r = await raw("/v1/completions", `{"prompt": [5], "presence_penalty": ${v}}`);
  check(r.status === 400, `presence_penalty ${v}: ${r.status}`);
}
const good = await plain.completions.create({ model, prompt: [5, 6], max_tokens: 2, n: 2, best_of: 2, logit_bias: {}, presence_penalty: 0 });
check(good.choices.length === 2, "best_of equal to n, an empty logit_bias and zero penalties are served");

writeFileSync(casesOut, JSON.stringify(cases));
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
