// SPDX-License-Identifier: MIT
// Issue 18, end to end with a model that writes tool calls: the openai and @anthropic-ai/sdk
// clients run their tool loops for real against `lockstep serve --model models/glm-pydoc-tools`
// (toolmodel_test.sh starts it twice: plain, and with --spec mtp).  For each held-out prompt
// (values no training conversation contains, tools/train/toolcall_data.py):
// - openai: the greedy reply is one tool call to the right tool with the right arguments
//   (message.tool_calls, finish_reason "tool_calls"), the same when streamed (delta.tool_calls);
//   the client runs the tool and sends back the assistant message and a role "tool" message with
//   its tool_call_id; the final answer contains the tool's result (finish_reason "stop"), the
//   same when streamed;
// - @anthropic-ai/sdk: a tool_use block with the right name and input (stop_reason "tool_use"),
//   then a tool_result, and a text answer containing the result (stop_reason "end_turn");
// - every reply of the server with --spec mtp is identical to the plain server's.
// Nothing here accepts "any output": a broken parser, template or model fails it.
// usage: node toolmodel_test.mjs PLAIN_URL MTP_URL API_KEY
import "openai/shims/web";
import "@anthropic-ai/sdk/shims/web";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { isDeepStrictEqual } from "node:util";

const [plainUrl, mtpUrl, key] = process.argv.slice(2);
let passed = 0, failed = 0;
// Tool calls the clients received from each server (its lockstep_tool_calls_total must agree).
const received = {};
function check(ok, what) {
  if (ok) passed++; else { failed++; console.log("FAIL: " + what); }
}

const schema = {
  get_weather: { description: "Get the current weather in a city",
                 parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
  add: { description: "Add two integers",
         parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } }, required: ["a", "b"] } },
  lookup: { description: "Look up a term in the Python glossary",
            parameters: { type: "object", properties: { term: { type: "string" } }, required: ["term"] } },
};
const names = ["lookup", "get_weather", "add"];
const oaiTools = names.map((n) => ({ type: "function", function: { name: n, description: schema[n].description,
                                                                   parameters: schema[n].parameters } }));
const antTools = names.map((n) => ({ name: n, description: schema[n].description, input_schema: schema[n].parameters }));
// The tools, run by the client. Held-out results too: none occurs in the training set.
const impl = {
  get_weather: ({ city }) => ({ Reykjavik: "freezing fog, -3 degrees", Montevideo: "hazy sunshine, 24 degrees" })[city] ?? "unknown city",
  add: ({ a, b }) => String(a + b),
  lookup: ({ term }) => ({ "walrus operator": "an operator that assigns inside an expression",
                           wheel: "a prebuilt archive that pip installs directly" })[term] ?? "no such term",
};
const cases = [
  { prompt: "What is the weather in Reykjavik?", name: "get_weather", args: { city: "Reykjavik" } },
  { prompt: "What is 423 plus 756?", name: "add", args: { a: 423, b: 756 } },
  { prompt: "What does walrus operator mean?", name: "lookup", args: { term: "walrus operator" } },
];

async function openaiLoop(oai, model, c, url) {
  const tr = {};
  const user = { role: "user", content: c.prompt };
  const req = { model, messages: [user], tools: oaiTools, temperature: 0, max_tokens: 64 };
  const r1 = await oai.chat.completions.create(req);
  const m1 = r1.choices[0].message;
  tr.first = { content: m1.content, tool_calls: m1.tool_calls, finish: r1.choices[0].finish_reason };
  const calls = m1.tool_calls ?? [];
  received[url] += calls.length;
  check(r1.choices[0].finish_reason === "tool_calls", `${c.prompt}: finish_reason ${r1.choices[0].finish_reason} (content ${JSON.stringify(m1.content)})`);
  check(calls.length === 1, `${c.prompt}: one tool call, got ${JSON.stringify(calls)}`);
  check(!(m1.content ?? "").includes("<"), `${c.prompt}: no markup in content ${JSON.stringify(m1.content)}`);
  const call = calls[0];
  let args = null;
  try { args = JSON.parse(call?.function?.arguments); } catch { /* checked below */ }
  check(call?.type === "function" && typeof call?.id === "string" && call.id.length > 0, `${c.prompt}: call id and type`);
  check(call?.function?.name === c.name, `${c.prompt}: tool ${call?.function?.name}, want ${c.name}`);
  check(isDeepStrictEqual(args, c.args), `${c.prompt}: arguments ${call?.function?.arguments}, want ${JSON.stringify(c.args)}`);
  // Streamed: the same call from delta.tool_calls.
  let content = "", scalls = [], finish = null;
  for await (const ch of await oai.chat.completions.create({ ...req, stream: true })) {
    const d = ch.choices[0]?.delta ?? {};
    content += d.content ?? "";
    for (const t of d.tool_calls ?? []) {
      scalls[t.index] ??= { id: t.id, type: t.type, function: { name: "", arguments: "" } };
      scalls[t.index].function.name += t.function?.name ?? "";
      scalls[t.index].function.arguments += t.function?.arguments ?? "";
    }
    finish = ch.choices[0]?.finish_reason ?? finish;
  }
  // The same call but for its id, which is each reply's own (and must be there).
  const noId = (cs) => JSON.stringify(cs.map(({ id, ...rest }) => rest));
  received[url] += scalls.length;
  check(finish === "tool_calls" && noId(scalls) === noId(calls) && content === (m1.content ?? "") &&
        scalls.every((t) => typeof t.id === "string" && t.id.length > 0),
        `${c.prompt}: streamed ${JSON.stringify(scalls)} ${finish} equals the plain reply ${JSON.stringify(calls)}`);
  if (!call || !impl[call.function.name] || !args) return tr;
  // The client runs the tool and sends its result back.
  const result = impl[call.function.name](args);
  const convo = [user, m1, { role: "tool", tool_call_id: call.id, content: result }];
  const r2 = await oai.chat.completions.create({ ...req, messages: convo });
  const m2 = r2.choices[0].message;
  tr.final = { content: m2.content, tool_calls: m2.tool_calls, finish: r2.choices[0].finish_reason };
  received[url] += m2.tool_calls?.length ?? 0;
  check(r2.choices[0].finish_reason === "stop" && !m2.tool_calls?.length, `${c.prompt}: final finish_reason ${r2.choices[0].finish_reason}`);
  check((m2.content ?? "").includes(result), `${c.prompt}: the final answer ${JSON.stringify(m2.content)} contains the result ${JSON.stringify(result)}`);
  let text = "";
  for await (const ch of await oai.chat.completions.create({ ...req, messages: convo, stream: true })) {
    text += ch.choices[0]?.delta?.content ?? "";
    received[url] += ch.choices[0]?.delta?.tool_calls?.length ?? 0;
  }
  check(text === m2.content, `${c.prompt}: streamed final answer ${JSON.stringify(text)} equals the plain one`);
  return tr;
}

async function anthropicLoop(ant, model, c, url) {
  const tr = {};
  const user = { role: "user", content: c.prompt };
  const req = { model, max_tokens: 64, temperature: 0, tools: antTools };
  const a1 = await ant.messages.create({ ...req, messages: [user] });
  tr.first = { content: a1.content, stop: a1.stop_reason };
  const uses = a1.content.filter((b) => b.type === "tool_use");
  received[url] += uses.length;
  check(a1.stop_reason === "tool_use" && uses.length === 1, `${c.prompt}: anthropic stop_reason ${a1.stop_reason}, ${JSON.stringify(a1.content)}`);
  const use = uses[0];
  check(use?.name === c.name && isDeepStrictEqual(use?.input, c.args) && typeof use?.id === "string",
        `${c.prompt}: tool_use ${JSON.stringify(use)}, want ${c.name} ${JSON.stringify(c.args)}`);
  if (!use || !impl[use.name]) return tr;
  const result = impl[use.name](use.input);
  const a2 = await ant.messages.create({ ...req, messages: [user, { role: "assistant", content: a1.content },
    { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: result }] }] });
  tr.final = { content: a2.content, stop: a2.stop_reason };
  received[url] += a2.content.filter((b) => b.type === "tool_use").length;
  const text = a2.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  check(a2.stop_reason === "end_turn" && text.includes(result),
        `${c.prompt}: anthropic final ${a2.stop_reason} ${JSON.stringify(text)} contains ${JSON.stringify(result)}`);
  return tr;
}

async function run(url) {
  const oai = new OpenAI({ baseURL: url + "/v1", apiKey: key, maxRetries: 0, timeout: 300000 });
  const ant = new Anthropic({ baseURL: url, apiKey: key, maxRetries: 0, timeout: 300000 });
  const model = (await oai.models.list()).data[0].id;
  const out = [];
  received[url] = 0;
  for (const c of cases)
    out.push({ openai: await openaiLoop(oai, model, c, url), anthropic: await anthropicLoop(ant, model, c, url) });
  return out;
}

const plain = await run(plainUrl);
const spec = await run(mtpUrl);
// Ids differ between replies; everything else must be equal.
const noIds = (x) => JSON.parse(JSON.stringify(x, (k, v) => (k === "id" ? undefined : v)));
check(isDeepStrictEqual(noIds(plain), noIds(spec)), `--spec mtp replies equal the plain ones:\n${JSON.stringify(plain)}\n${JSON.stringify(spec)}`);
const metrics = await (await fetch(mtpUrl + "/metrics")).text();
const accepted = [...metrics.matchAll(/^lockstep_spec_drafts_accepted_total\S* (\d+)/gm)].reduce((s, m) => s + Number(m[1]), 0);
check(accepted > 0, `the mtp server accepted drafts (${accepted})`);
// The serving metrics count what the clients received: tool calls and requests per API
// (each case: 4 chat completions and 2 messages; models.list is neither).
const metric = (re) => Number((metrics.match(re) ?? [])[1]);
const toolCalls = metric(/^lockstep_tool_calls_total (\d+)/m);
check(received[mtpUrl] === 3 * cases.length && toolCalls === received[mtpUrl],
      `lockstep_tool_calls_total ${toolCalls}, the client received ${received[mtpUrl]}`);
const perApi = (api) => metric(new RegExp(`^lockstep_api_requests_total\\{api="${api}"\\} (\\d+)`, "m"));
check(perApi("chat_completions") === 4 * cases.length && perApi("messages") === 2 * cases.length,
      `requests per API: chat_completions ${perApi("chat_completions")}, messages ${perApi("messages")}`);
console.log(`toolmodel: ${passed} checks passed, ${failed} failed; mtp drafts accepted: ${accepted}`);
process.exit(failed ? 1 : 0);
