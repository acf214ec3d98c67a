// SPDX-License-Identifier: MIT
// Time to first token per turn of a growing conversation, for the prefix cache's benchmark.
// usage: node tools/prefix_bench.mjs BASE_URL [TURNS] [WORDS_PER_TURN]
// Each turn resends the whole conversation (as chat clients do) plus a new user message of
// about WORDS_PER_TURN words, streams 8 tokens, and reports the time to the first streamed token
// and the prompt tokens the server says it took from its cache (usage.prompt_tokens_details).
const [base, turns = "5", words = "600"] = process.argv.slice(2);
const vocab = ["the", "function", "returns", "a", "list", "of", "objects", "module", "class",
  "attribute", "value", "string", "python", "built-in", "argument", "default", "method", "type"];
let seed = 7;
const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
const messages = [];
console.log("turn  prompt_tokens  cached_tokens  ttft_ms");
for (let t = 1; t <= Number(turns); t++) {
  let text = "";
  for (let i = 0; i < Number(words); i++) text += vocab[Math.floor(rand() * vocab.length)] + " ";
  messages.push({ role: "user", content: text });
  const t0 = performance.now();
  const res = await fetch(base + "/v1/chat/completions", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages, max_tokens: 8, temperature: 0, stream: true,
                           stream_options: { include_usage: true } }) });
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let ttft = null, buf = "", reply = "", usage = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage) usage = j.usage;
      const d = j.choices?.[0]?.delta?.content;
      if (d && ttft === null) ttft = performance.now() - t0;
      if (d) reply += d;
    }
  }
  messages.push({ role: "assistant", content: reply });
  console.log(`${String(t).padStart(4)}  ${String(usage?.prompt_tokens).padStart(13)}  ` +
              `${String(usage?.prompt_tokens_details?.cached_tokens).padStart(13)}  ${ttft?.toFixed(1)}`);
}
