// SPDX-License-Identifier: MIT
// "No request takes the server down" (issue 13): each item against a running server started by
// harden_test.sh (--spec mtp -k 3 --max-seq-len 256 --max-slots 4 --idle-timeout 1
// --request-timeout 2 --max-conns-per-client 64, a 300-character admin token). Plain node (no
// npm packages): raw HTTP, so that clients can stall, disconnect and open sockets at will.
// usage: node harden_test.mjs BASE_URL ADMIN_TOKEN
// Prints "N passed, M failed" last.
import http from "node:http";
import net from "node:net";

const [base, adminToken] = process.argv.slice(2);
const url = new URL(base);
const host = url.hostname, port = Number(url.port);
let passed = 0, failed = 0;
function check(ok, what) {
  if (ok) { passed++; console.log("ok: " + what); } else { failed++; console.log("FAIL: " + what); }
}
// HARDEN_ONLY=1,5 runs those items only (to show one failing on an older build).
const only = process.env.HARDEN_ONLY ? process.env.HARDEN_ONLY.split(",") : null;
const want = (item) => !only || only.includes(item);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One request: resolves {status, body, json, ms}; body is the raw text.
function request(method, path, body, { headers = {}, timeout = 120000, agent = false } = {}) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const data = body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body);
    const req = http.request({ host, port, method, path, agent, headers: { "Content-Type": "application/json", ...headers } }, (res) => {
      const parts = [];
      res.on("data", (c) => parts.push(c));
      res.on("end", () => {
        const text = Buffer.concat(parts).toString("utf8");
        let json = null;
        try { json = JSON.parse(text); } catch { }
        resolve({ status: res.statusCode, body: text, json, ms: Date.now() - t0, headers: res.headers });
      });
      res.on("error", (e) => resolve({ status: -1, body: String(e), json: null, ms: Date.now() - t0 }));
    });
    req.setTimeout(timeout, () => req.destroy(new Error("timeout")));
    req.on("error", (e) => resolve({ status: -1, body: String(e), json: null, ms: Date.now() - t0 }));
    if (data !== undefined) req.write(data);
    req.end();
  });
}
const post = (path, body, opts) => request("POST", path, body, opts);
const get = (path, opts) => request("GET", path, undefined, opts);
const admin = { Authorization: "Bearer " + adminToken };

// A streamed request: the concatenated text of its events, whether it ended with [DONE], and
// whether every event parsed.
async function stream(path, body) {
  const r = await post(path, { ...body, stream: true });
  let text = "", done = false, wellFormed = r.status === 200, finish = null;
  for (const line of r.body.split("\n")) {
    if (!line.startsWith("data: ")) continue;
    const d = line.slice(6);
    if (d === "[DONE]") { done = true; continue; }
    try {
      const j = JSON.parse(d);
      if (j.error) { wellFormed = false; continue; }
      const c = j.choices?.[0];
      if (c) { text += c.text ?? c.delta?.content ?? ""; finish = c.finish_reason ?? finish; }
    } catch { wellFormed = false; }
  }
  return { status: r.status, text, done, wellFormed, finish, seed: r.headers?.["x-lockstep-seed"] };
}

async function metrics() {
  const r = await get("/metrics");
  const m = {};
  for (const line of r.body.split("\n")) {
    const k = line.match(/^([a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$/);
    if (k) m[k[1]] = Number(k[2]);
  }
  return m;
}
async function idle(ms = 5000) {  // slots and queue back to 0 within ms
  const end = Date.now() + ms;
  let m;
  do { m = await metrics(); if (m.lockstep_slots_in_use === 0 && m.lockstep_queue_depth === 0) return m; await sleep(50); } while (Date.now() < end);
  return m;
}
// The prefix cache keeps the blocks of finished requests: idle means after it let go of them.
// The clear runs at the scheduler's next step: wait until no block is cached any more.
async function clearCache() {
  await post("/admin/prefix-cache/clear", {}, { headers: admin });
  for (let i = 0; i < 100; i++) {
    const c = await metrics();
    if (c['lockstep_kv_blocks{state="cached"}'] === 0) return;
    await sleep(50);
  }
}
await clearCache();
const m0 = await idle();
const blocks0 = m0.lockstep_kv_blocks_free;
const alive = async () => (await get("/health")).status === 200;

// 1. Speculation to the end of the context: a chat without max_tokens runs to the end of the
// 256-position context; 8 prompt ids + the rest; concurrent ones. The server must stay up.
if (want("1")) {
  const chat = await post("/v1/chat/completions", { messages: [{ role: "user", content: "Hello" }], temperature: 0, ignore_eos: true });
  const ids = [1, 2, 3, 4, 5, 6, 7, 8];
  const full = await post("/v1/completions", { prompt: ids, max_tokens: 248, temperature: 0, ignore_eos: true });
  const many = await Promise.all([0, 1, 2, 3, 4, 5].map((i) => post("/v1/completions", { prompt: ids.slice(0, 3 + i), max_tokens: 253 - i, temperature: i % 2 ? 0.8 : 0, seed: i, ignore_eos: true })));
  check(chat.status === 200 && chat.json?.usage?.prompt_tokens + chat.json?.usage?.completion_tokens === 256,
        `spec: chat without max_tokens fills the context (${chat.status} ${chat.json?.usage?.completion_tokens})`);
  check(full.status === 200 && full.json?.usage?.completion_tokens === 248, `spec: 8 prompt ids + max_tokens 248 = the context (${full.status})`);
  check(many.every((r) => r.status === 200 && r.json?.usage?.total_tokens === 256), "spec: 6 concurrent sequences to the last position");
  check(await alive(), "spec: the server is alive after sequences to the end of the context");
}

// 2. max_tokens out of range: 400 naming the field, never a dead server or a silent wrap.
if (want("2")) {
  const vals = ["2147483647", "2147483648", "4294967297", "9223372036854775807", "9223372036854775808",
                "99999999999999999999999", "-1", "0", "1.5", "1e30", "\"16\"", "true", "[]"];
  for (const v of vals) {
    for (const field of ["max_tokens", "max_completion_tokens"]) {
      const r = await post("/v1/completions", `{"prompt": [5, 6, 7], "${field}": ${v}}`);
      check(r.status === 400 && r.json?.error?.param === field || (r.status === 400 && r.json?.error?.param === "max_tokens"),
            `${field} ${v}: 400 naming the field (${r.status} ${r.json?.error?.param})`);
    }
  }
  const ok = await post("/v1/completions", { prompt: [5, 6, 7], max_tokens: 253, temperature: 0 });
  check(ok.status === 200, "max_tokens equal to the room left is accepted");
  const over = await post("/v1/completions", { prompt: [5, 6, 7], max_tokens: 254 });
  check(over.status === 400 && over.json?.error?.param === "max_tokens" && /253/.test(over.json?.error?.message),
        `max_tokens one past the room: 400 saying what fits (${over.json?.error?.message})`);
  check(await alive(), "max_tokens: the server is alive");
}

// 3. Levers flipped while streams run; the ladder validated.
if (want("3")) {
  const streams = [];
  for (let i = 0; i < 6; i++)
    streams.push(stream("/v1/completions", { prompt: [5, 6, 7, 8 + i], max_tokens: 120, temperature: 0, ignore_eos: true }));
  const plain = await post("/v1/completions", { prompt: [5, 6, 7, 8], max_tokens: 120, temperature: 0, ignore_eos: true });
  let flips = 0, flipOk = true;
  const ladders = ["", "1:3,2:2,4:1", "2:16,8:1", "1:0"];
  const flipper = (async () => {
    for (let i = 0; i < 60; i++) {
      const r = await post("/admin/levers", { speculation: i % 3 !== 0, num_drafts: [0, 1, 3, 16][i % 4], ladder: ladders[i % 4] }, { headers: admin });
      flipOk &&= r.status === 200;
      flips++;
      await sleep(10);
    }
  })();
  const res = await Promise.all(streams);
  await flipper;
  check(flipOk && flips === 60, `levers: 60 flips answered 200 (${flips})`);
  check(res.every((s) => s.status === 200 && s.done && s.wellFormed), "levers: 6 streams complete while the levers flip");
  check(res[0].text === plain.json?.choices[0].text, "levers: greedy output unchanged by the flips");
  for (const bad of ["garbage!!", "4:3,", "x".repeat(200), "0:3", "4:17", 5]) {
    const r = await post("/admin/levers", { ladder: bad }, { headers: admin });
    check(r.status === 400 && r.json?.error?.param === "ladder", `ladder ${JSON.stringify(bad).slice(0, 20)}: 400 (${r.status})`);
  }
  const set = await post("/admin/levers", { speculation: true, num_drafts: 3, ladder: "2:3,8:1" }, { headers: admin });
  const got = await get("/admin/levers", { headers: admin });
  check(set.status === 200 && got.json?.ladder === "2:3,8:1" && got.json?.num_drafts === 3, "ladder applied and reported");
  await post("/admin/levers", { speculation: true, num_drafts: 3, ladder: "" }, { headers: admin });
  check(await alive(), "levers: the server is alive");
}

// 4. A plain response slower than the idle timeout (1 s) comes back whole: 8 sampled requests of
// 240 tokens through 4 slots take seconds.
if (want("4")) {
  const t0 = Date.now();
  const rs = await Promise.all([0, 1, 2, 3, 4, 5, 6, 7].map((i) => post("/v1/completions", { prompt: [9, 10, 11 + i], max_tokens: 240, temperature: 1, seed: i, ignore_eos: true })));
  const ms = Date.now() - t0;
  check(rs.every((r) => r.status === 200 && r.json?.usage?.completion_tokens === 240) && rs.length === 8,
        `plain responses taking ${ms} ms (idle timeout 1 s) come back whole: ${rs.map((r) => r.status).join(",")}`);
  // Whether this run exercised the case depends on the machine's speed: said, not judged.
  console.log(ms > 1000 ? `  (the slowest took longer than the idle timeout: ${ms} ms)`
                        : `  (inconclusive: all answered within ${ms} ms, under the idle timeout)`);
}

// 5. Streamed text with stop strings equals the plain text for the same seed, over text with
// multi-byte characters (temperature 50 draws them).
if (want("5")) {
  let same = 0, nonAscii = 0;
  const n = 30;
  for (let seed = 1; seed <= n; seed++) {
    const body = { prompt: "日本語 ünïcödé", max_tokens: 60, temperature: 50, seed, stop: ["ZZZZZZZZ", "\u00e9\u00e9\u00e9"] };
    const p = await post("/v1/completions", body);
    const s = await stream("/v1/completions", body);
    const pt = p.json?.choices?.[0]?.text;
    if (s.done && s.wellFormed && pt === s.text) same++;
    else console.log(`  seed ${seed}: plain ${JSON.stringify(pt)} stream ${JSON.stringify(s.text)}`);
    nonAscii += [...(pt ?? "")].filter((c) => c.charCodeAt(0) > 127).length;
  }
  check(same === n, `stream = plain for ${same}/${n} seeds with stop strings (${nonAscii} non-ASCII characters)`);
  const cs = await stream("/v1/chat/completions", { messages: [{ role: "user", content: "Grüße 日本" }], max_tokens: 40, temperature: 50, seed: 3, stop: ["ZZZZ"] });
  const cp = await post("/v1/chat/completions", { messages: [{ role: "user", content: "Grüße 日本" }], max_tokens: 40, temperature: 50, seed: 3, stop: ["ZZZZ"] });
  check(cs.done && cs.text === cp.json?.choices[0].message.content, "chat: stream = plain with a stop string");
}

// 6. Unseeded sampling: concurrent requests differ; each reports its seed, which replays it.
if (want("6")) {
  const body = { prompt: [5, 6, 7], max_tokens: 24, temperature: 1.0 };
  const rs = await Promise.all([0, 1, 2, 3].map(() => post("/v1/completions", body)));
  const texts = new Set(rs.map((r) => r.json?.choices[0].text));
  check(texts.size >= 3, `unseeded: 4 concurrent requests give ${texts.size} different texts`);
  const seeds = rs.map((r) => r.json?.seed);
  check(seeds.every((s) => Number.isSafeInteger(s)) && new Set(seeds).size === 4, `unseeded: each reports its seed (${seeds.join(", ")})`);
  const again = await post("/v1/completions", { ...body, seed: seeds[0] });
  check(again.json?.choices[0].text === rs[0].json?.choices[0].text && again.json?.seed === seeds[0], "unseeded: the reported seed replays the text");
  const s = await stream("/v1/completions", body);
  check(s.done && /^[0-9]+$/.test(s.seed ?? ""), `stream reports its seed in X-Lockstep-Seed (${s.seed})`);
}

// 8. Disconnects: plain, streamed and queued requests whose clients leave free their slots. A
// fast server (the adaptive policy decodes plainly at a few thousand tokens/s here) may finish
// some of them within the 300 ms before the clients leave: those count as done, the others are
// cancelled.
if (want("8")) {
  // From an idle server: a request of an earlier check still finishing would count as one of
  // these done (seen under a loaded ctest -j2: 4 "done", 4 running and 5 queued of 10).
  const m0 = await idle(5000);
  const before = m0.lockstep_requests_cancelled_total;
  const socks = [];
  for (let i = 0; i < 10; i++) {
    const body = JSON.stringify({ prompt: [5, 6, 7 + i], max_tokens: 240, ignore_eos: true, stream: i % 2 === 1 });
    const s = net.connect(port, host, () => s.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`));
    s.on("error", () => { });
    s.got = "";
    s.on("data", (d) => { s.got += d.toString(); });
    s.done = () => (i % 2 === 1 ? /data: \[DONE\]/ : /"finish_reason"/).test(s.got);
    socks.push(s);
  }
  await sleep(300);
  const busy = await metrics();
  const doneBusy = busy.lockstep_requests_finished_total - m0.lockstep_requests_finished_total;
  const done = socks.filter((s) => s.done()).length;
  for (const s of socks) s.destroy();
  const t0 = Date.now();
  const m = await idle(3000);
  check(busy.lockstep_slots_in_use === Math.min(4, 10 - doneBusy) && busy.lockstep_queue_depth === Math.max(0, 6 - doneBusy),
        `disconnects: 4 running, 6 queued, less the ${doneBusy} done (${busy.lockstep_slots_in_use}, ${busy.lockstep_queue_depth})`);
  check(m.lockstep_slots_in_use === 0 && m.lockstep_queue_depth === 0 && Date.now() - t0 < 1500,
        `disconnects: slots and queue free ${Date.now() - t0} ms after the clients left`);
  // Every queued one is cancelled; a running one may finish in the moment before its
  // disconnect is seen.
  const cancelled = m.lockstep_requests_cancelled_total - before;
  check(cancelled + done <= 10 && cancelled + done >= 10 - busy.lockstep_slots_in_use &&
        cancelled >= busy.lockstep_queue_depth,
        `disconnects: the ${10 - done} requests not done when their clients left are cancelled (${cancelled}; running ones may finish first)`);
}

// 9. 600 idle sockets from one client (127.0.0.2), 40 from another (127.0.0.3): /health and
// /v1 still answer within 1 s; the first client gets --max-conns-per-client (64) at most.
if (want("9")) {
  const idleSocks = [];
  const open = (local) => new Promise((res) => {
    const s = net.connect({ port, host, localAddress: local }, () => res(s));
    s.on("error", () => res(s));
    idleSocks.push(s);
  });
  for (let i = 0; i < 600; i++) await open("127.0.0.2");
  for (let i = 0; i < 40; i++) await open("127.0.0.3");
  await sleep(300);
  const h = await get("/health", { timeout: 1000 });
  const mo = await get("/v1/models", { timeout: 1000 });
  const c = await post("/v1/completions", { prompt: [5, 6, 7], max_tokens: 4, temperature: 0 }, { timeout: 5000 });
  const open2 = idleSocks.slice(0, 600).filter((s) => !s.destroyed && s.readyState === "open").length;
  check(h.status === 200 && h.ms < 1000, `640 idle sockets: /health 200 in ${h.ms} ms`);
  check(mo.status === 200 && c.status === 200, "640 idle sockets: /v1 answers");
  check(open2 <= 64, `one client holds at most 64 connections (${open2} of 600 still open)`);
  // Idle ones are closed after the idle timeout (1 s): a while later none is open.
  await sleep(2500);
  const left = idleSocks.filter((s) => !s.destroyed && s.readyState === "open").length;
  check(left === 0, `idle sockets closed after the idle timeout (${left} left)`);
  for (const s of idleSocks) s.destroy();
  // A client that trickles its headers is cut off after --request-timeout (2 s).
  const slow = net.connect(port, host);
  let closedAt = 0;
  const t0 = Date.now();
  slow.on("close", () => { closedAt = Date.now() - t0; });
  slow.on("error", () => { });
  slow.write("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
  const trickle = setInterval(() => { if (!slow.destroyed) slow.write("X-Slow: 1\r\n"); }, 400);
  await sleep(4000);
  clearInterval(trickle);
  check(closedAt > 0 && closedAt < 3500, `a client trickling its headers is disconnected after ${closedAt} ms`);
  slow.destroy();
}

// 12. Smaller: the 300-character admin token works; a message cut inside a UTF-8 character is
// still JSON; the roles listed include developer; tool-call history is accepted.
if (want("12")) {
  const lv = await get("/admin/levers", { headers: admin });
  check(lv.status === 200 && adminToken.length === 300, "a 300-character admin token is accepted");
  const wrong = await get("/admin/levers", { headers: { Authorization: "Bearer " + adminToken.slice(0, 255) } });
  check(wrong.status === 403, "its first 255 characters are not");
  const r = await post("/v1/completions", { model: "x" + "é".repeat(400), prompt: [5] });  // cut at an odd byte
  check(r.status === 404 && typeof r.json?.error?.message === "string" && r.json?.error?.param === "model",
        `a message cut inside a UTF-8 character is JSON (${r.body.slice(0, 60)})`);
  const role = await post("/v1/chat/completions", { messages: [{ role: "bogus", content: "x" }] });
  check(role.status === 400 && /developer/.test(role.json?.error?.message), "the roles listed include developer");
  const tools = await post("/v1/chat/completions", {
    max_tokens: 4, temperature: 0,
    messages: [{ role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Paris\"}" } }] },
      { role: "tool", tool_call_id: "call_1", content: "18 C" }],
    tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }],
  });
  check(tools.status === 200, `OpenAI-style tool-call history is accepted (${tools.status} ${tools.json?.error?.message ?? ""})`);
}

// 13. /metrics is one moment: 160 short requests, 8 at a time, while /metrics is read in a loop;
// no snapshot shows a request both finished (or cancelled) and in a slot or the queue, that is
// finished + cancelled + slots in use + queue depth never exceeds the requests sent. (Until
// 2026-12-05 a step counted the requests it finished at its start and moved the gauges at its
// end: 103 of 338 snapshots were over at world 1, 833 of 1507 at world 2, and item 8 failed
// now and then.)
if (want("13")) {
  const m0 = await idle(5000);
  const f0 = m0.lockstep_requests_finished_total, c0 = m0.lockstep_requests_cancelled_total;
  let sent = 0, over = 0, snaps = 0, worst = "", stop = false;
  const poll = (async () => {
    while (!stop) {
      const m = await metrics();
      const n = sent;  // sent by the time the snapshot came back: every request it can count
      const f = m.lockstep_requests_finished_total - f0, c = m.lockstep_requests_cancelled_total - c0;
      const u = m.lockstep_slots_in_use, q = m.lockstep_queue_depth;
      snaps++;
      if (f + c + u + q > n) { over++; worst = ` (${f} + ${c} + ${u} + ${q} > ${n})`; }
    }
  })();
  let ok = 0;
  for (let i = 0; i < 160; i += 8) {
    const batch = [];
    for (let j = i; j < i + 8; j++) {
      sent++;
      batch.push(post("/v1/completions", { prompt: [5, 6, 7 + (j % 50)], max_tokens: 1 + (j % 7), ignore_eos: true, temperature: 0 }));
    }
    ok += (await Promise.all(batch)).filter((r) => r.status === 200).length;
  }
  stop = true;
  await poll;
  check(ok === 160 && snaps > 20 && over === 0,
        `/metrics: ${over} of ${snaps} snapshots show a request both finished and running or queued${worst}; ${ok}/160 answered`);
}

await idle();
await clearCache();
const mEnd = await idle();
check(mEnd.lockstep_slots_in_use === 0 && mEnd.lockstep_kv_blocks_free === blocks0,
      `slots and KV blocks back to idle (${mEnd.lockstep_slots_in_use}, ${mEnd.lockstep_kv_blocks_free}/${blocks0})`);
check(await alive(), "the server is alive at the end");
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
