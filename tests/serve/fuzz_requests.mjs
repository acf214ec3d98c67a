// SPDX-License-Identifier: MIT
// A request fuzzer against a live `lockstep serve` (fuzz_test.sh starts it). For SECONDS, 8
// concurrent clients send random legal and illegal requests: valid completions and chats
// (plain and streamed, random sampling fields, stop lists, seeds), the same with one field
// mutated to an extreme or wrong value (huge, negative, fractional numbers, wrong types, bad
// UTF-8, random stop lists), broken bodies (truncated, not JSON, not an object, invalid bytes),
// unknown paths and methods, clients that disconnect at a random point (mid-headers, mid-body,
// mid-response), and lever flips through /admin/levers. Then it checks that the server is alive,
// /health is 200, every response was well-formed (a 4xx with an error body, naming the mutated
// field where there was one; or a complete 2xx: a JSON body with choices and usage, or a stream
// that ends with [DONE]), slots, queue and KV blocks are back at their idle values, and resident
// memory grew less than 10% (CHECK_RSS=1). Seeded (the seed is printed); prints the number of
// requests and their mix.
// usage: node fuzz_requests.mjs BASE_URL ADMIN_TOKEN SECONDS SEED CHECK_RSS
import http from "node:http";
import net from "node:net";

const [base, adminToken, secsArg, seedArg, checkRssArg] = process.argv.slice(2);
const url = new URL(base);
const host = url.hostname, port = Number(url.port);
const secs = Number(secsArg ?? 15), checkRss = checkRssArg !== "0";
const seed = seedArg && seedArg !== "random" ? Number(seedArg) : Math.floor(Math.random() * 2 ** 31);
console.log(`fuzz: seed ${seed}, ${secs} s (rerun with this seed to replay the same choices)`);

// mulberry32: a small seeded generator.
let st = seed >>> 0;
function rnd() {
  st = (st + 0x6d2b79f5) >>> 0;
  let t = st;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const mix = {}, statuses = {}, problems = [];
const note = (kind) => { mix[kind] = (mix[kind] ?? 0) + 1; };
function problem(what) { if (problems.length < 30) problems.push(what); }

function request(method, path, body, headers = {}, timeout = 60000) {
  return new Promise((resolve) => {
    const req = http.request({ host, port, method, path, agent: false, headers: { "Content-Type": "application/json", ...headers } }, (res) => {
      const parts = [];
      res.on("data", (c) => parts.push(c));
      res.on("end", () => resolve({ status: res.statusCode, body: Buffer.concat(parts).toString("utf8"), headers: res.headers }));
      res.on("error", (e) => resolve({ status: -1, body: String(e) }));
    });
    req.setTimeout(timeout, () => req.destroy(new Error("client timeout")));
    req.on("error", (e) => resolve({ status: -1, body: String(e) }));
    if (body !== undefined) req.write(body);
    req.end();
  });
}

// ---- what to send ----
const words = ["def", " foo", "(x)", ":", "\n", " return", " 日本", "é", "🎉", " the", " ", "\"", "\\", "</s>", "<|user|>", "ZZ"];
const text = (n) => Array.from({ length: n }, () => pick(words)).join("");
const extremes = [0, -1, 1, 2, 1.5, -0.0, 1e-9, 1e9, 2147483647, 2147483648, 4294967297, 9007199254740993,
  "9223372036854775807", "9223372036854775808", "99999999999999999999999", "-99999999999999999999", "1e400",
  "NaN", "\"5\"", "null", "true", "[]", "{}", "\"\"", "\"\\ud800\""];
const raw = (v) => (typeof v === "string" ? v : JSON.stringify(v));

function validBody(chat) {
  const o = {};
  if (chat) {
    const roles = ["system", "developer", "user", "assistant"];
    const n = 1 + ri(3);
    o.messages = Array.from({ length: n }, (_, i) => ({ role: i === n - 1 ? "user" : pick(roles), content: text(1 + ri(8)) }));
    if (rnd() < 0.15) {
      o.messages.push({ role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: JSON.stringify({ a: ri(9) }) } }] });
      o.messages.push({ role: "tool", tool_call_id: "c1", content: text(3) });
    }
  } else {
    o.prompt = rnd() < 0.5 ? text(1 + ri(12)) : Array.from({ length: 1 + ri(20) }, () => ri(4000));
  }
  if (rnd() < 0.8) o.max_tokens = 1 + ri(rnd() < 0.1 ? 120 : 24);
  if (rnd() < 0.5) o.temperature = pick([0, 0, 0.7, 1, 2, 50]);
  if (rnd() < 0.3) o.top_p = pick([0.1, 0.5, 0.9, 1]);
  if (rnd() < 0.3) o.top_k = pick([-1, 0, 1, 5, 50]);
  if (rnd() < 0.5) o.seed = ri(1000);
  if (rnd() < 0.3) o.stop = rnd() < 0.5 ? text(1 + ri(3)) : Array.from({ length: 1 + ri(4) }, () => text(1 + ri(3)));
  if (rnd() < 0.4) o.stream = true;
  if (o.stream && rnd() < 0.5) o.stream_options = { include_usage: rnd() < 0.5 };
  if (rnd() < 0.2) o.ignore_eos = true;
  if (rnd() < 0.2) o.return_token_ids = true;
  if (rnd() < 0.1) o.unknown_field = { x: [1, 2, 3] };
  // JSON mode (it needs room for "{}").
  if (rnd() < 0.2 && !(o.max_tokens < 2)) o.response_format = { type: pick(["json_object", "json_object", "text"]) };
  // Logit processing and reporting (issue 18).
  if (rnd() < 0.2) o.presence_penalty = pick([-2, -0.5, 0, 0.7, 2]);
  if (rnd() < 0.2) o.frequency_penalty = pick([-2, -1, 0, 0.3, 2]);
  if (rnd() < 0.1) o.repetition_penalty = pick([0.5, 1, 1.2, 3]);
  if (rnd() < 0.2) o.logit_bias = Object.fromEntries(Array.from({ length: ri(6) }, () => [String(ri(4000)), pick([-100, -5, 0, 2.5, 100])]));
  if (rnd() < 0.1) {
    if (chat) { o.logprobs = true; if (rnd() < 0.7) o.top_logprobs = pick([0, 1, 3, 20]); }
    else o.logprobs = ri(6);
  }
  if (rnd() < 0.1) { o.n = 1 + ri(2); if (rnd() < 0.3) o.best_of = o.n; }
  return o;
}
// The fields a mutation may hit, with the params an error about it may name.
const fields = {
  prompt: ["prompt"], messages: ["messages"], max_tokens: ["max_tokens"], max_completion_tokens: ["max_completion_tokens", "max_tokens"],
  temperature: ["temperature"], top_p: ["top_p"], top_k: ["top_k"], seed: ["seed"], n: ["n"], stop: ["stop"],
  stream: ["stream"], stream_options: ["stream_options", "include_usage"], ignore_eos: ["ignore_eos"], logprobs: ["logprobs"],
  model: ["model"], tools: ["tools", "messages"], response_format: ["response_format"],
  presence_penalty: ["presence_penalty"], frequency_penalty: ["frequency_penalty"], repetition_penalty: ["repetition_penalty"],
  logit_bias: ["logit_bias"], top_logprobs: ["top_logprobs", "logprobs"], best_of: ["best_of", "n"],
};
fields.logprobs = ["logprobs", "top_logprobs"];
fields.n = ["n", "best_of"];
function mutated(chat) {
  const o = validBody(chat);
  let f = pick(Object.keys(fields));
  if (f === "prompt" && chat) f = "messages";
  if (f === "messages" && !chat) f = "prompt";
  if (f === "tools" && !chat) f = "temperature";
  let v;
  const r = rnd();
  if (f === "stop" && r < 0.5) v = JSON.stringify(Array.from({ length: ri(7) }, () => pick(["", "x".repeat(300), text(2), 5, null])));
  else if (f === "messages" && r < 0.5) v = JSON.stringify(pick([[], [{}], [{ role: "bogus", content: "x" }], [{ role: "user", content: 5 }], [{ role: "assistant", tool_calls: [{ function: { name: "f", arguments: "[1]" } }] }], "x"]));
  else if (f === "prompt" && r < 0.5) v = JSON.stringify(pick([[], [-1], [1e9], [1.5], ["a", "b"], [[1]], ""]));
  else if (f === "logit_bias" && r < 0.6)
    v = JSON.stringify(pick([{ "4096": 1 }, { "-3": 1 }, { "x": 1 }, { "05": 1 }, { "1e3": 1 }, { "5": 101 }, { "5": "1" }, { "5": null },
                             Object.fromEntries(Array.from({ length: 1025 }, (_, i) => [String(i), 1])), [1], "x"]));
  else v = raw(pick(extremes));
  const json = JSON.stringify({ ...o, [f]: "@@V@@" }).replace("\"@@V@@\"", v);
  return { json, field: f, stream: !!o.stream };
}

// ---- checking answers ----
function wellFormed(r, { stream, field } = {}) {
  statuses[r.status] = (statuses[r.status] ?? 0) + 1;
  if (r.status === -1) return `no answer: ${r.body}`;
  if (r.status >= 500) return `status ${r.status}: ${r.body.slice(0, 200)}`;
  if (r.status >= 400) {
    let j = null;
    try { j = JSON.parse(r.body); } catch { }
    if (!j?.error || typeof j.error.message !== "string" || !j.error.message || typeof j.error.type !== "string")
      return `status ${r.status} without an error body: ${r.body.slice(0, 200)}`;
    if (r.status === 400 && field && !(fields[field] ?? [field]).includes(j.error.param))
      return `400 for a mutated '${field}' names '${j.error.param}': ${j.error.message.slice(0, 160)}`;
    return null;
  }
  if ((r.headers?.["content-type"] ?? "").startsWith("text/event-stream")) {  // a stream, asked for or not
    const lines = r.body.split("\n").filter((l) => l.startsWith("data: "));
    if (lines[lines.length - 1] !== "data: [DONE]") return `a stream without [DONE]: ${r.body.slice(-200)}`;
    for (const l of lines.slice(0, -1)) {
      let j = null;
      try { j = JSON.parse(l.slice(6)); } catch { return `a stream event that is not JSON: ${l.slice(0, 200)}`; }
      if (j.error) return `a stream error event: ${l.slice(0, 200)}`;
    }
    return null;
  }
  if ((r.headers?.["content-type"] ?? "").startsWith("text/plain")) return r.body.length ? null : "an empty text body";
  let j = null;
  try { j = JSON.parse(r.body); } catch { return `status ${r.status} with a body that is not JSON: ${r.body.slice(0, 200)}`; }
  if (j.object?.includes("completion") && (!Array.isArray(j.choices) || !j.usage || !j.choices[0]?.finish_reason))
    return `an incomplete completion: ${r.body.slice(0, 200)}`;
  return null;
}

// ---- the clients ----
const paths = ["/v1/completions", "/v1/chat/completions"];
async function one() {
  const r = rnd();
  if (r < 0.30) {  // a valid generation
    const chat = rnd() < 0.5, o = validBody(chat);
    note(`valid ${chat ? "chat" : "completion"}${o.stream ? " stream" : ""}`);
    const res = await request("POST", paths[chat ? 1 : 0], JSON.stringify(o));
    const bad = wellFormed(res, { stream: o.stream });
    if (bad) problem(`valid ${JSON.stringify(o).slice(0, 300)} -> ${bad}`);
    else if (res.status !== 200 && res.status !== 429 && !(res.status === 400 && /exceed the context/.test(res.body)))
      problem(`valid ${JSON.stringify(o).slice(0, 300)} -> ${res.status} ${res.body.slice(0, 200)}`);
  } else if (r < 0.60) {  // one field mutated
    const chat = rnd() < 0.5, m = mutated(chat);
    note(`mutated ${m.field}`);
    const res = await request("POST", paths[chat ? 1 : 0], m.json);
    const bad = wellFormed(res, { stream: m.stream, field: m.field });
    if (bad) problem(`mutated ${m.json.slice(0, 300)} -> ${bad}`);
  } else if (r < 0.70) {  // a broken body
    const kinds = [
      () => Buffer.from('{"prompt": [5, 6], "max_tokens": 4'),
      () => Buffer.from("not json at all"),
      () => Buffer.from("[1, 2, 3]"),
      () => Buffer.concat([Buffer.from('{"prompt": "'), Buffer.from([0xff, 0xfe, 0xc3, 0x28, 0xe2, 0x82]), Buffer.from('", "max_tokens": 4}')]),
      () => Buffer.from('{"prompt": "a", "prompt": "b"}'),
      () => Buffer.from(`{"prompt": "${"x".repeat(2_000_000)}"}`),
      () => Buffer.from(""),
      () => Buffer.from('{"messages": [{"role": "user", "content": "\\ud800"}]}'),
    ];
    const k = ri(kinds.length);
    note(`broken body ${k}`);
    const res = await request("POST", pick(paths), kinds[k]());
    const bad = wellFormed(res, {});
    if (bad) problem(`broken body ${k} -> ${bad}`);
    else if (res.status < 400) problem(`broken body ${k} -> ${res.status}`);
  } else if (r < 0.76) {  // other endpoints, methods
    const [m, p, b] = pick([["GET", "/v1/completions"], ["DELETE", "/health"], ["GET", "/nope"], ["POST", "/tokenize", '{"prompt": "é日本"}'],
      ["POST", "/detokenize", JSON.stringify({ tokens: [1, 2, ri(5000) - 10] })], ["GET", "/v1/models"], ["GET", "/metrics"],
      ["POST", "/admin/drain", "{}"], ["GET", "/admin/levers"], ["POST", "/v1/completions/x", "{}"]]);
    note(`endpoint ${m} ${p}`);
    const res = await request(m, p, b, rnd() < 0.3 ? { Authorization: "Bearer wrong-token" } : {});
    const bad = wellFormed(res, {});
    if (bad) problem(`${m} ${p} -> ${bad}`);
  } else if (r < 0.90) {  // a client that leaves at a random point
    const chat = rnd() < 0.5, o = validBody(chat);
    o.max_tokens = 10 + ri(100);
    o.ignore_eos = true;
    const body = JSON.stringify(o);
    const msg = `POST ${paths[chat ? 1 : 0]} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
    const cut = pick(["headers", "body", "response"]);
    note(`disconnect ${cut}${o.stream ? " stream" : ""}`);
    await new Promise((resolve) => {
      const s = net.connect(port, host, () => {
        const at = cut === "headers" ? ri(40) : cut === "body" ? msg.indexOf("\r\n\r\n") + 4 + ri(Math.max(1, body.length - 1)) : msg.length;
        s.write(msg.slice(0, at));
        setTimeout(() => { s.destroy(); resolve(); }, ri(cut === "response" ? 400 : 100));
      });
      s.on("error", () => resolve());
      s.on("data", () => { });
    });
  } else {  // lever flips, valid and not
    const lv = pick([{ speculation: rnd() < 0.5, num_drafts: ri(17) }, { ladder: pick(["", "1:3,4:1", "2:16", "garbage", "0:1", "4:3,2:1"]) },
      { num_drafts: pick([-1, 17, 1.5, "3"]) }, { speculation: "yes" }, {}]);
    note("levers");
    const res = await request("POST", "/admin/levers", JSON.stringify(lv), { Authorization: "Bearer " + adminToken });
    const bad = wellFormed(res, {});
    if (bad) problem(`levers ${JSON.stringify(lv)} -> ${bad}`);
  }
}

async function metrics() {
  const r = await request("GET", "/metrics");
  const m = {};
  for (const line of (r.body ?? "").split("\n")) {
    const k = line.match(/^([a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$/);
    if (k) m[k[1]] = Number(k[2]);
  }
  return m;
}

// Warm-up: touch every page that use legitimately brings in (every embedding row, every KV
// position of every slot), so that resident memory measures growth, not first use.
const model = JSON.parse((await request("GET", "/v1/models")).body || "{}").data?.[0];
const ctx = model?.max_model_len ?? 512;
{
  const span = Math.min(ctx - 13, 1000), vocab = 1 << 20;
  const jobs = [];
  for (let start = 0; start < 4096 && start < vocab; start += span)
    jobs.push(request("POST", "/v1/completions", JSON.stringify({ prompt: Array.from({ length: span }, (_, i) => (start + i) % 4096),
      max_tokens: ctx - span, temperature: 0, ignore_eos: true })));
  await Promise.all(jobs);
}
// The prefix cache keeps the blocks of finished requests: idle means after it let go of them.
// The clear runs at the scheduler's next step: wait until no block is cached any more.
async function clearCache() {
  await request("POST", "/admin/prefix-cache/clear", "{}", { Authorization: "Bearer " + adminToken });
  for (let i = 0; i < 100; i++) {
    const c = await metrics();
    if (c['lockstep_kv_blocks{state="cached"}'] === 0) return;
    await sleep(50);
  }
}
await clearCache();
// The idle values: a finished request's slot is freed at the scheduler's next step.
let m0 = await metrics();
for (let i = 0; i < 100 && (m0.lockstep_slots_in_use !== 0 || m0.lockstep_queue_depth !== 0); i++) {
  await sleep(50);
  m0 = await metrics();
}
const blocks0 = m0.lockstep_kv_blocks_free;
let rss0 = 0;
const t0 = Date.now(), end = t0 + secs * 1000;
let sent = 0;
await Promise.all(Array.from({ length: 8 }, async () => {
  while (Date.now() < end) {
    await one();
    sent++;
    // Resident memory after a warm-up half of the run (allocator arenas, buffers, the KV
    // cache touched, the larger bodies of n > 1 and logprobs), compared with the end. A third of
    // 15 s was too early once those came in: with seed 923020333 memory grew 54.6 -> 61.3 MB
    // from 5 s to 15 s, and 66.3 -> 66.9 MB from 15 s to 46 s (it levels off; a leak would not).
    if (!rss0 && Date.now() - t0 > secs * 500) rss0 = (await metrics()).process_resident_memory_bytes;
  }
}));
// Back to the levers the server started with.
await request("POST", "/admin/levers", JSON.stringify({ speculation: true, num_drafts: 3, ladder: "" }), { Authorization: "Bearer " + adminToken });

let m, waited = 0;
for (; waited < 10000; waited += 100) {
  await clearCache();
  m = await metrics();
  if (m.lockstep_slots_in_use === 0 && m.lockstep_queue_depth === 0 && m.lockstep_kv_blocks_free === blocks0) break;
  await sleep(100);
}
const health = await request("GET", "/health");
console.log(`fuzz: ${sent} requests in ${((Date.now() - t0) / 1000).toFixed(1)} s; statuses ${JSON.stringify(statuses)}`);
console.log("fuzz: mix " + Object.entries(mix).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k}: ${v}`).join(", "));
let failed = 0;
const check = (ok, what) => { console.log((ok ? "ok: " : "FAIL: ") + what); if (!ok) failed++; };
check(problems.length === 0, `every response well-formed (${problems.length} not)`);
for (const p of problems) console.log("  " + p);
check(health.status === 200, `/health ${health.status}`);
check(m.lockstep_slots_in_use === 0 && m.lockstep_queue_depth === 0, `slots in use ${m.lockstep_slots_in_use}, queue ${m.lockstep_queue_depth} (idle after ${waited} ms)`);
check(m.lockstep_kv_blocks_free === blocks0, `KV blocks free ${m.lockstep_kv_blocks_free} (at start ${blocks0})`);
const rss1 = m.process_resident_memory_bytes, growth = rss0 ? (100 * (rss1 - rss0)) / rss0 : 0;
if (checkRss) check(rss0 > 0 && growth < 10, `resident memory ${(rss0 / 1e6).toFixed(1)} MB -> ${(rss1 / 1e6).toFixed(1)} MB (${growth.toFixed(1)}%)`);
else console.log(`resident memory ${(rss0 / 1e6).toFixed(1)} MB -> ${(rss1 / 1e6).toFixed(1)} MB (${growth.toFixed(1)}%; not judged in a sanitizer build)`);
console.log(`${failed ? 0 : 1} passed, ${failed ? 1 : 0} failed (seed ${seed})`);
process.exit(failed ? 1 : 0);
