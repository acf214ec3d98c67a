# SPDX-License-Identifier: MIT
#
# card_tools.py -- writes the model card (README.md) of glm-pydoc-tools from the figures of the
# run: WORK/data.json (the data), WORK/ckpt.pt (the training history) and MODEL/metrics.json
# (evaluate_tools.py).
#
# Usage: /usr/bin/python3 tools/train/card_tools.py MODEL_DIR WORK_DIR [NOTE]
# (NOTE: a line on the run that the figures do not show, in the recipe's list.)

import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import toolcall_data as td  # noqa: E402


def main(out, work, note=""):
    data = json.load(open(os.path.join(work, "data.json")))
    st = torch.load(os.path.join(work, "ckpt.pt"))
    args, hist = st["args"], st["hist"]
    met = json.load(open(os.path.join(out, "metrics.json")))
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    rows = []
    for r in hist:
        if r["step"] in (1, 2) or r["step"] % 5 == 0 or r["step"] == len(hist):
            c = ("%.3f" % r["corpus_loss"]) if r["corpus_loss"] else ""
            rows.append("| %d | %.3f | %.3f | %s | %.2e |" % (r["step"], r["loss"], r["mtp"], c,
                                                                r["lr"]))
    by = "\n".join("| `%s` | %d | %.3f | %.3f |" % (t, v["n"], v["call"], v["answer"])
                   for t, v in met["by_tool"].items())
    misses = [r for r in met["records"] if not (r["call_ok"] and r["answer_ok"])]
    miss = "\n".join("- %r: %s%s" % (
        r["prompt"], json.dumps([c["function"] for c in r["tool_calls"]]) if r["tool_calls"]
        else "content %s" % json.dumps(r["content"])[:120],
        (" -> answer %s" % json.dumps(r.get("answer"))) if r["call_ok"] else "")
        for r in misses[:12])
    mtp = ""
    if "mtp_identical" in met:
        mtp = ("\nServed with `--spec mtp -k 3 --spec-gate false`, every reply (both turns of every "
               "conversation) is %s the plain server's, and %.3f of the proposed drafts are "
               "accepted.\n" % ("identical to" if met["mtp_identical"] else "NOT identical to",
                                met["mtp_acceptance"] or 0))
    ex = td.heldout_set(1)[0]
    card = f"""# glm-pydoc-tools

`models/glm-pydoc-tiny` (lockstep's default model, a 10.9 M-parameter `Glm4MoeForCausalLM` with its MTP layer, trained here on the Python 3.11 documentation) fine-tuned briefly on synthetic tool-call conversations, so that it answers a request that offers tools with a GLM-4.5/4.6 tool call, and a tool's result with an answer that uses it. It exists to run clients' tool loops for real against `lockstep serve` (`tests/serve/toolmodel_test.mjs`). It is a toy: it knows four tools and the phrasings it was shown, and it writes documentation-like text otherwise.

Every figure below was written by `tools/train/card_tools.py` from the run that produced the weights in this directory (`metrics.json`, `train.log`).

## Architecture, tokenizer, files

The same as `glm-pydoc-tiny` (see its card): `config.json`, `generation_config.json`, `tokenizer.json` and `tokenizer_config.json` (GLM-4.6's chat template) are copied from it; `model.safetensors` ({size} bytes) holds the fine-tuned weights, BF16 (`e_score_correction_bias` F32), the MTP layer included.

## Data

`tools/train/toolcall_data.py`, from fixed-seed generators (seed {args['seed']}): {data['n_conversations']} conversations in {data['n_conversations'] // data['group_size']} groups of {data['group_size']}. Four tools: `get_weather(city)`, `get_time(city)`, `add(a, b)` (integers), `lookup(term)` (a Python glossary term). Each conversation offers the tool it needs and one or two others in a shuffled order (the conversations of a group offer the same ones), an optional system message (3 in 10), and: a user request (one of 5-7 phrasings per tool) -> the assistant's tool call -> the tool's result (the observation turn) -> an answer that quotes the result. Cities, numbers, glossary terms, weather and definitions are drawn from training pools; held-out pools ({len(td.HELD_CITIES)} cities, {len(td.HELD_NUMBERS)} numbers, {len(td.HELD_TERMS)} terms, {len(td.HELD_SKIES)} kinds of weather, {len(td.HELD_DEFS)} definitions) appear in no training conversation and are what the evaluation and the test use. A held-out conversation:

```
{json.dumps(ex['messages'], ensure_ascii=False)}
```

The conversations are rendered by GLM-4.6's chat template (`tools/train/glm-4.6.jinja`) with `@huggingface/jinja` and tokenized with Hugging Face's JS tokenizers (`tools/train/render_chat.mjs`); `finetune_tools.py check` confirms that lockstep's own request handling (`build/chat_render`: `lks_oai_chat_prepare` / `lks_anth_prepare` and `lks_chat_render`, from OpenAI bodies with the arguments as JSON text and from Anthropic bodies) produces exactly these tokens up to each assistant turn. Conversations: {data['tokens_min']}-{data['tokens_max']} tokens (mean {data['tokens_mean']:.0f}), of which the assistant writes {data['assistant_tokens_mean']:.1f} on average: the loss covers only those (after each `<|assistant|>`, up to and including the `<|observation|>` or `<|endoftext|>` that ends the turn).

Mixed in: one window of {args['corpus_seq']} tokens of the original corpus on {sum(1 for r in hist if r['corpus_loss'])} of the {len(hist)} steps (weight {args['corpus_weight']}), from a {data['corpus_bytes']}-byte slice of `glm-pydoc-tiny`'s training files ({data['corpus_tokens']} tokens).

## Licence

The weights derive from `glm-pydoc-tiny`, itself derived from the Python documentation (Copyright © 2001-2023 Python Software Foundation, PSF License Agreement, PSF-2.0; Debian's `/usr/share/doc/python3.11-doc/copyright`), and from the synthetic conversations, which `toolcall_data.py` (MIT, this repository) generates.

## Training recipe

- `bash tools/train/finetune_tools.sh` (PyTorch 1.13 on the CPU, `torch.set_num_threads(2)`, deterministic algorithms), from the BF16 weights of `glm-pydoc-tiny`.
- {len(hist)} steps, each one group of {data['group_size']} conversations; the group's shared prompt prefix (mean {data['shared_prefix_mean']:.0f} tokens: the tool list and the system message) is computed once per step and attended to by all {data['group_size']} continuations, which is the same loss and gradient as the {data['group_size']} whole sequences at a fraction of the compute.
- AdamW (beta 0.9 / 0.95, weight decay {args['wd']} on matrices), gradient clipping {args['clip']}; each step's learning rate and whether it took a corpus window are in `tools/train/glm-pydoc-tools.schedule.json` (written from this run's history; `finetune_tools.sh` follows it, so a rerun repeats this run), and in the table below.
- Loss: next-token cross-entropy + {args['mtp_weight']} x the MTP layer's cross-entropy on the token after next, on the assistant tokens; the same on the corpus windows. Expert balancing as in the base model (bias step {args['bias_u']}).
{("- " + note + chr(10)) if note else ""}- Training time: {st['elapsed'] / 60:.1f} minutes of training steps on two cores shared with other work (the machine's load average was 9-21 during the run), {st['elapsed'] / len(hist):.0f} s per step on average.

| step | tool-call loss (assistant tokens) | MTP loss | corpus loss | learning rate |
|---|---|---|---|---|
{chr(10).join(rows)}

## Tool-call accuracy

`tools/train/evaluate_tools.py`, through `lockstep serve` itself (its template, greedy decoding and tool-call parser), on {met['n']} held-out conversations (values from the held-out pools, a quarter per tool, 2-3 tools offered):

| | fraction |
|---|---|
| the reply parses as a tool call | {met['parsed']:.3f} |
| ... to the right tool | {met['right_tool']:.3f} |
| ... with the right arguments (exactly one call, `finish_reason: "tool_calls"`) | {met['call']:.3f} |
| after the model's own call and the tool's result, the answer quotes the result verbatim (`finish_reason: "stop"`) | {met['answer']:.3f} |

| tool | prompts | right call | answer quotes the result |
|---|---|---|---|
{by}
{mtp}
Misses (the first {min(12, len(misses))} of {len(misses)}):

{miss if miss else "(none)"}
"""
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(card)


if __name__ == "__main__":
    main(*sys.argv[1:4])
