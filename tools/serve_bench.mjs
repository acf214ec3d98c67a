// SPDX-License-Identifier: MIT
// Throughput and latency of a running `lockstep serve` at several concurrencies: each of C
// clients sends streamed completions back to back for SECONDS; reported per concurrency:
// generated tokens/s (all clients), requests/s, and the median and p90 time to first token and
// inter-token latency. Node 20, no dependencies (fetch with a streamed body).
// usage: node tools/serve_bench.mjs URL [SECONDS=20] [CONCURRENCIES=1,4,16] [MAX_TOKENS=64]
const [url, secs = "20", concs = "1,4,16", maxTok = "64"] = process.argv.slice(2);
const prompts = ["The quick brown fox", "In the beginning", "def main():", "The Python tutorial",
                 "Installing packages", "Errors and exceptions", "A class is", "import os"];

async function one(i) {
  const t0 = performance.now();
  const r = await fetch(url + "/v1/completions", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: prompts[i % prompts.length], max_tokens: Number(maxTok),
                           temperature: 0, stream: true, stream_options: { include_usage: true } }),
  });
  if (!r.ok) throw new Error(`HTTP ${r.status}`);
  let ttft = null, last = null, tokens = 0, buf = "";
  const gaps = [];
  const dec = new TextDecoder();
  for await (const part of r.body) {
    buf += dec.decode(part, { stream: true });
    let k;
    while ((k = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, k); buf = buf.slice(k + 2);
      if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
      const j = JSON.parse(ev.slice(6));
      const now = performance.now();
      if (j.usage) tokens = j.usage.completion_tokens;
      if (j.choices && j.choices.length && j.choices[0].text !== undefined && j.choices[0].finish_reason === null) {
        if (ttft === null) ttft = now - t0; else gaps.push(now - last);
        last = now;
      }
    }
  }
  return { ttft, gaps, tokens };
}

const q = (a, p) => a.length ? a.slice().sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(p * a.length))] : NaN;
for (const c of concs.split(",").map(Number)) {
  const end = performance.now() + Number(secs) * 1000;
  const ttfts = [], gaps = [];
  let tokens = 0, reqs = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: c }, async (_, w) => {
    for (let i = w; performance.now() < end; i += c) {
      const r = await one(i);
      reqs++; tokens += r.tokens;
      if (r.ttft !== null) ttfts.push(r.ttft);
      gaps.push(...r.gaps);
    }
  }));
  const dt = (performance.now() - t0) / 1000;
  console.log(`concurrency ${String(c).padStart(2)}: ${(tokens / dt).toFixed(1)} generated tokens/s, ` +
              `${(reqs / dt).toFixed(2)} requests/s; time to first token median ${q(ttfts, 0.5).toFixed(1)} ms ` +
              `p90 ${q(ttfts, 0.9).toFixed(1)} ms; inter-token median ${q(gaps, 0.5).toFixed(2)} ms p90 ${q(gaps, 0.9).toFixed(2)} ms`);
}
