// SPDX-License-Identifier: MIT
// The official `openai` npm client against a running `lockstep serve`.
// usage: node openai_test.mjs BASE_URL LOCKSTEP MODEL_DIR ADMIN_TOKEN
// Checks: models; completions and chat completions, plain and streamed; greedy results equal
// `lockstep generate` on the same prompt ids; 16 concurrent requests; 30+ bad requests each
// answered 4xx with an OpenAI error body while good requests between them succeed; the admin
// endpoints' 401 / 403 / 200. Prints "N passed, M failed" last.
// Node's own fetch, not the node-fetch the 4.x client uses by default on Node: with node-fetch,
// Debian 12's Node 18 (18.20.4+dfsg) ends the first streamed completion with "Premature close"
// although the response is well formed (chunked, ended by its zero-length chunk). The 4.x client
// supports Node 18 and documents this shim for using the global fetch.
import "openai/shims/web";
import OpenAI from "openai";
import { execFileSync } from "node:child_process";
import net from "node:net";

const [base, lockstep, modelDir, adminToken] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "unused", maxRetries: 0, timeout: 120000 });
let passed = 0, failed = 0;
function check(ok, what) {
  if (ok) passed++; else { failed++; console.log("FAIL: " + what); }
}

const models = await client.models.list();
const modelId = models.data[0].id;
check(models.data.length === 1 && modelId.length > 0, `models: ${modelId}`);

// Greedy completions on token-id prompts equal lockstep generate.
const prompts = [[5, 6, 7, 8, 9], [100, 200, 300], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [42]];
async function complete(p, n) {
  const r = await client.completions.create({ model: modelId, prompt: p, max_tokens: n, temperature: 0, return_token_ids: true });
  return r;
}
const expected = [];
for (const p of prompts) {
  const out = execFileSync(lockstep, ["generate", "--model", modelDir, "--prompt-ids", p.join(","), "-n", "12", "--log-level", "error"]).toString().trim();
  const want = out.length ? out.split(",").map(Number) : [];
  expected.push(want);
  // Both sides stop at an eos id and include it, so the whole sequences are compared; an empty
  // `generate` output is a failure of its own, not a prefix of everything.
  check(want.length > 0 && want.every(Number.isInteger), `lockstep generate on [${p}] gave tokens: '${out}'`);
  const r = await complete(p, 12);
  const got = r.choices[0].token_ids;
  check(JSON.stringify(got) === JSON.stringify(want),
        `completion of [${p}]: ${JSON.stringify(got)} equals generate ${JSON.stringify(want)}`);
  check(r.usage.prompt_tokens === p.length && r.usage.completion_tokens === got.length, "usage counts");
}

// Streaming gives the same text as a plain request.
const plain = await client.completions.create({ model: modelId, prompt: "The quick brown fox", max_tokens: 16, temperature: 0 });
let streamed = "", chunks = 0, finish = null, usage = null;
const stream = await client.completions.create({ model: modelId, prompt: "The quick brown fox", max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true } });
for await (const c of stream) {
  if (c.choices.length) { streamed += c.choices[0].text; chunks++; finish = c.choices[0].finish_reason ?? finish; }
  if (c.usage) usage = c.usage;
}
check(streamed === plain.choices[0].text, "streamed completion text equals the plain one");
check(finish === plain.choices[0].finish_reason && usage && usage.completion_tokens === plain.usage.completion_tokens,
      `stream ends with finish_reason ${finish} and usage`);

// Chat, plain and streamed.
const msgs = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello there" }];
const chat = await client.chat.completions.create({ model: modelId, messages: msgs, max_tokens: 12, temperature: 0 });
check(chat.choices[0].message.role === "assistant" && typeof chat.choices[0].message.content === "string", "chat completion");
let chatStreamed = "", sawRole = false;
for await (const c of await client.chat.completions.create({ model: modelId, messages: msgs, max_tokens: 12, temperature: 0, stream: true })) {
  const d = c.choices[0]?.delta ?? {};
  if (d.role === "assistant") sawRole = true;
  chatStreamed += d.content ?? "";
}
check(sawRole && chatStreamed === chat.choices[0].message.content, "streamed chat equals the plain chat");

// Sampling with a seed is reproducible.
const s1 = await client.completions.create({ model: modelId, prompt: [5, 6, 7], max_tokens: 10, temperature: 0.9, top_p: 0.9, seed: 7, return_token_ids: true });
const s2 = await client.completions.create({ model: modelId, prompt: [5, 6, 7], max_tokens: 10, temperature: 0.9, top_p: 0.9, seed: 7, return_token_ids: true });
check(JSON.stringify(s1.choices[0].token_ids) === JSON.stringify(s2.choices[0].token_ids), "seeded sampling is reproducible");

// 16 concurrent requests, half streamed: each equals its sequential result.
const jobs = [];
for (let i = 0; i < 16; i++) {
  const p = prompts[i % prompts.length];
  if (i % 2) {
    jobs.push((async () => {
      let ids = null;
      const r = await client.completions.create({ model: modelId, prompt: p, max_tokens: 12, temperature: 0, return_token_ids: true });
      ids = r.choices[0].token_ids;
      return { i, ids };
    })());
  } else {
    jobs.push((async () => {
      let text = "";
      for await (const c of await client.completions.create({ model: modelId, prompt: p, max_tokens: 12, temperature: 0, stream: true }))
        text += c.choices[0]?.text ?? "";
      return { i, text };
    })());
  }
}
const results = await Promise.all(jobs);
const seqText = [];
for (const p of prompts) seqText.push((await client.completions.create({ model: modelId, prompt: p, max_tokens: 12, temperature: 0 })).choices[0].text);
let concOk = 0;
for (const r of results) {
  const k = r.i % prompts.length;
  if (r.ids) concOk += expected[k].length > 0 && JSON.stringify(r.ids) === JSON.stringify(expected[k]);
  else concOk += r.text === seqText[k];
}
check(concOk === 16, `16 concurrent requests equal their sequential results (${concOk}/16)`);

// Bad requests: each a 4xx with an error body; a good request after each still works.
async function raw(path, body, headers = {}, method = "POST") {
  const r = await fetch(base + path, { method, headers: { "Content-Type": "application/json", ...headers }, body });
  let j = null;
  try { j = await r.json(); } catch { j = null; }
  return { status: r.status, j };
}
const big = "x".repeat(10 * 1024 * 1024);
const bads = [
  ["/v1/completions", "{not json"],
  ["/v1/completions", "[1,2,3]"],
  ["/v1/completions", '{"prompt": 5}'],
  ["/v1/completions", '{"prompt": []}'],
  ["/v1/completions", '{"prompt": [1, -2]}'],
  ["/v1/completions", '{"prompt": [1, 99999999]}'],
  ["/v1/completions", '{"prompt": "hi", "max_tokens": "ten"}'],
  ["/v1/completions", '{"prompt": "hi", "max_tokens": 0}'],
  ["/v1/completions", '{"prompt": "hi", "max_tokens": 100000000}'],
  ["/v1/completions", '{"prompt": "hi", "temperature": -1}'],
  ["/v1/completions", '{"prompt": "hi", "temperature": NaN}'],
  ["/v1/completions", '{"prompt": "hi", "temperature": "hot"}'],
  ["/v1/completions", '{"prompt": "hi", "top_p": 0}'],
  ["/v1/completions", '{"prompt": "hi", "top_p": 1.5}'],
  ["/v1/completions", '{"prompt": "hi", "top_k": -5}'],
  ["/v1/completions", '{"prompt": "hi", "stream": "yes"}'],
  ["/v1/completions", '{"prompt": "hi", "stop": 3}'],
  ["/v1/completions", '{"prompt": "hi", "stop": ["a","b","c","d","e"]}'],
  ["/v1/completions", '{"prompt": "hi", "n": 17}'],
  ["/v1/completions", '{"prompt": "hi", "model": "gpt-4"}'],
  ["/v1/completions", '{"prompt": "hi", "logprobs": 6}'],
  ["/v1/completions", '{"prompt": "hi", "prompt": "twice"}'],
  ["/v1/completions", '{"prompt": "hi", "max_tokens": 5'],
  ["/v1/completions", Buffer.from([0x7b, 0x22, 0x70, 0x72, 0x6f, 0x6d, 0x70, 0x74, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d])],
  ["/v1/completions", JSON.stringify({ prompt: big })],
  ["/v1/chat/completions", '{"messages": []}'],
  ["/v1/chat/completions", '{"messages": "hello"}'],
  ["/v1/chat/completions", '{"messages": [{"role": "wizard", "content": "hi"}]}'],
  ["/v1/chat/completions", '{"messages": [{"content": "hi"}]}'],
  ["/v1/chat/completions", '{"messages": [{"role": "user", "content": 5}]}'],
  ["/v1/chat/completions", '{"messages": [42]}'],
  ["/v1/chat/completions", '{}'],
  ["/tokenize", '{"prompt": 5}'],
  ["/detokenize", '{"tokens": ["a"]}'],
  ["/v1/nowhere", '{}'],
];
let badOk = 0;
for (const [path, body] of bads) {
  const r = await raw(path, body);
  const good = r.status >= 400 && r.status < 500 && r.j && r.j.error && typeof r.j.error.message === "string" && "type" in r.j.error && "param" in r.j.error && "code" in r.j.error;
  if (!good) console.log(`FAIL: ${path} ${String(body).slice(0, 60)} -> ${r.status} ${JSON.stringify(r.j)}`);
  badOk += good;
  const ok = await client.completions.create({ model: modelId, prompt: [5, 6, 7], max_tokens: 2, temperature: 0 });
  if (ok.usage.completion_tokens !== 2) badOk -= 1000;
}
check(badOk === bads.length, `${badOk} of ${bads.length} bad requests answered 4xx with an error body, good requests served between them`);
// A client that stops halfway through its body and goes away: the server drops the connection
// and keeps serving.
await new Promise((resolve) => {
  const u = new URL(base);
  const sock = net.connect(Number(u.port), u.hostname, () => {
    sock.write("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"prompt\": \"half");
    setTimeout(() => { sock.destroy(); resolve(); }, 200);
  });
  sock.on("error", resolve);
});
const afterHalf = await client.completions.create({ model: modelId, prompt: [5, 6, 7], max_tokens: 2, temperature: 0 });
check(afterHalf.usage.completion_tokens === 2, "a request cut off halfway does not disturb the server");
const wrongMethod = await raw("/v1/completions", undefined, {}, "GET");
check(wrongMethod.status === 405, "GET /v1/completions is 405");

// Admin: 401 without a token, 403 with a wrong one, 200 with the right one.
const a0 = await raw("/admin/levers", '{"num_drafts": 2}');
const a1 = await raw("/admin/levers", '{"num_drafts": 2}', { Authorization: "Bearer wrong-token" });
const a2 = await raw("/admin/levers", '{"num_drafts": 2, "speculation": true, "ladder": "4:2"}', { Authorization: "Bearer " + adminToken });
check(a0.status === 401 && a1.status === 403, `admin without token ${a0.status}, wrong token ${a1.status}`);
check(a2.status === 200 && a2.j.num_drafts === 2 && a2.j.speculation === true, `admin with the token: ${JSON.stringify(a2.j)}`);
const a3 = await fetch(base + "/admin/levers", { headers: { Authorization: "Bearer " + adminToken } });
check((await a3.json()).ladder === "4:2", "the levers read back");
// A request after the change still works (the change is applied on every rank at one step).
const after = await client.completions.create({ model: modelId, prompt: [5, 6, 7], max_tokens: 3, temperature: 0 });
check(after.usage.completion_tokens === 3, "requests work after the levers changed");

const health = await fetch(base + "/health");
check(health.status === 200, "health is 200");
const metrics = await (await fetch(base + "/metrics")).text();
check(/lockstep_generated_tokens_total \d+/.test(metrics) && /lockstep_time_to_first_token_seconds_bucket/.test(metrics),
      "metrics: tokens, time to first token");
// Liveness: one lockstep_rank_up line for each rank of the job (serve_test.sh runs 2), each
// exactly 1 on a healthy server; a missing rank, an extra one or a 0 fails (kill_test.sh checks
// that a killed rank reads 0).
const world = 2;  // serve_test.sh: mpirun -np 2
const up = [...metrics.matchAll(/^lockstep_rank_up\{rank="(\d+)"\} (\S+)$/gm)].map((m) => [Number(m[1]), m[2]]);
check(up.length === world && up.every(([r, v], i) => r === i && v === "1"),
      `metrics: per-rank liveness, ${world} ranks up: ${JSON.stringify(up)}`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
