# SPDX-License-Identifier: MIT
#
# check_render.py -- the tool-call fine-tuning's training text is what `lockstep serve` feeds
# the model: the conversations of finetune_tools.py's data (the same generator, seed and
# grouping), rendered for training by render_chat.mjs (@huggingface/jinja, GLM-4.6's template;
# Hugging Face's JS tokenizers), against the prompts lockstep's own request handling builds
# (chat_render: lks_oai_chat_prepare / lks_anth_prepare and lks_chat_render, then lockstep's
# tokenizer) from the same conversation as an OpenAI body (tool-call arguments as JSON text, as
# clients send them back) and as an Anthropic body, cut before each assistant turn: the token ids
# must be equal.  Exit 0 when every prompt is equal.  Run by ctest (toolmodel_render).
#
# Usage: /usr/bin/python3 tools/train/check_render.py CHAT_RENDER [--base MODEL_DIR] [--check N]

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import toolcall_data as td  # noqa: E402


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def special_ids(model_dir):
    tj = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))
    return {a["content"]: a["id"] for a in tj["added_tokens"]}


def render(model_dir, convs):
    """[{messages, tools}] -> [ids] by render_chat.mjs (the template without a generation
    prompt)."""
    inp = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in convs)
    r = subprocess.run(["node", os.path.join(HERE, "render_chat.mjs"), model_dir],
                       input=inp.encode(), capture_output=True, check=True)
    return [json.loads(l)["ids"] for l in r.stdout.decode().splitlines() if l.strip()]


def anthropic_body(conv):
    """The same conversation as a /v1/messages request body."""
    body = {"model": "m", "max_tokens": 16, "messages": [],
            "tools": [{"name": t["function"]["name"], "description": t["function"]["description"],
                       "input_schema": t["function"]["parameters"]} for t in conv["tools"]]}
    for m in conv["messages"]:
        if m["role"] == "system":
            body["system"] = m["content"]
        elif m["role"] == "user":
            body["messages"].append({"role": "user", "content": m["content"]})
        elif m["role"] == "tool":
            body["messages"].append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}]})
        elif m.get("tool_calls"):
            body["messages"].append({"role": "assistant", "content": [
                {"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                 "input": c["function"]["arguments"]} for c in m["tool_calls"]]})
        else:
            body["messages"].append({"role": "assistant", "content": [
                {"type": "text", "text": m["content"]}]})
    return body


def check(a):
    """The training text is what the server feeds: every conversation of the first --check
    groups, and each of its prefixes that ends before an assistant turn, rendered by lockstep's
    own request handling (chat_render: the OpenAI body with the arguments as JSON text, as
    clients send them back, and the Anthropic body) equals the training tokens up to that turn's
    <|assistant|>."""
    sp = special_ids(a.base)
    groups = td.training_groups(a.n_groups, a.batch, a.seed)[:a.check]
    convs = [c for grp in groups for c in grp]
    rows = render(a.base, convs)
    reqs, want = [], []
    for c, r in zip(convs, rows):
        cut = [i + 1 for i, t in enumerate(r) if t == sp["<|assistant|>"]] + [len(r)]
        msgs = c["messages"]
        turns = [k for k, m in enumerate(msgs) if m["role"] == "assistant"] + [len(msgs)]
        for k, end in zip(turns, cut):
            sub = {"messages": msgs[:k], "tools": c["tools"]}
            oai = json.loads(json.dumps(sub))
            for m in oai["messages"]:
                for tc in m.get("tool_calls") or []:
                    tc["function"]["arguments"] = json.dumps(tc["function"]["arguments"])
            exp = r[:end] if end < len(r) else r + [sp["<|assistant|>"]]
            reqs += [{"api": "openai", "body": dict(oai, model="m")},
                     {"api": "anthropic", "body": anthropic_body(sub)}]
            want += [exp, exp]
    inp = "".join(json.dumps(q) + "\n" for q in reqs)
    out = subprocess.run([a.chat_render, a.base], input=inp.encode(), capture_output=True)
    got = [json.loads(l) for l in out.stdout.decode().splitlines()]
    bad = [(q["api"], i) for i, (q, g, w) in enumerate(zip(reqs, got, want)) if g.get("ids") != w]
    log("check: %d prompts (%d conversations, OpenAI and Anthropic bodies) rendered by %s: %d "
        "differ from the training tokens" % (len(reqs), len(convs), a.chat_render, len(bad)))
    for api, i in bad[:5]:
        log("  differs: %s %s" % (api, json.dumps(reqs[i]["body"])[:300]))
        log("    got  %s" % (got[i].get("error") or got[i]["ids"][-40:]))
        log("    want %s" % want[i][-40:])
    if bad or len(got) != len(reqs):
        sys.exit(1)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("chat_render", help="the chat_render binary (build/chat_render)")
    p.add_argument("--base", default=os.path.join(ROOT, "models", "glm-pydoc-tiny"))
    p.add_argument("--check", type=int, default=25, help="groups to check")
    # finetune_tools.py's data: the same defaults
    p.add_argument("--seed", type=int, default=4321)
    p.add_argument("--n-groups", type=int, default=500)
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args(argv)
    a.chat_render = os.path.abspath(a.chat_render)
    check(a)


if __name__ == "__main__":
    main(sys.argv[1:])
