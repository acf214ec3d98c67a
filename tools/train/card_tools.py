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
    data_s = json.load(open(os.path.join(work, "data_synth.json")))
    st = torch.load(os.path.join(work, "ckpt.pt"))
    args, hist = st["args"], st["hist"]
    met = json.load(open(os.path.join(out, "metrics.json")))
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    cfg = st["cfg"]
    n_params = sum(t.numel() for t in st["model"].values())
    rows = []
    for r in hist:
        if r["step"] in (1, 2) or r["step"] % 50 == 0 or r["step"] == len(hist):
            rows.append("| %d | %.3f | %.3f | %.3f | %.2e |" % (r["step"], r["loss"], r["mtp"],
                                                              r["copy_loss"], r["lr"]))
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

A {n_params / 1e6:.1f} M-parameter `Glm4MoeForCausalLM` with its MTP layer, trained here from scratch on synthetic tool-call conversations, so that it answers a request that offers tools with a GLM-4.5/4.6 tool call that copies the arguments from the request, and a tool's result with an answer that quotes it. It exists to run clients' tool loops for real against `lockstep serve` (`tests/serve/toolmodel_test.mjs`). It is a toy: it knows four tools and the phrasings it was shown, and nothing else.

Every figure below was written by `tools/train/card_tools.py` from the run that produced the weights in this directory (`metrics.json`, `train.log`).

## Architecture, tokenizer, files

`glm-pydoc-tiny`'s tokenizer (`tokenizer.json`, `tokenizer_config.json` with GLM-4.6's chat template, `generation_config.json`, copied from it) and layer shapes ({cfg['num_hidden_layers']} layers of width {cfg['hidden_size']}, the first dense, the others {cfg['n_routed_experts']} routed experts (top {cfg['num_experts_per_tok']}) and a shared one; one MTP layer), but {cfg['num_attention_heads']} attention heads of {cfg['head_dim']} ({cfg['num_key_value_heads']} KV heads) without q/k norms (`config.json`). `model.safetensors` ({size} bytes) holds the weights, BF16 (`e_score_correction_bias` F32), the MTP layer included.

The training starts from a copying circuit written into the initial weights (`finetune_tools.py` `prime_copy`): layer 0 has a previous-token head and a head two tokens back, fixed by their q and k biases on the RoPE dims; layer 1 an induction head that reads the position whose two previous tokens are the last two (it continues a copy); layers 2 and 3 three heads whose values copy the token they attend to (where to attend is learned); `lm_head` reads the copied token. A token after a space and the same text without it share their embedding's first 64 dims, since an argument written after `<arg_value>` starts without the space it had in the request. Earlier runs that fine-tuned `glm-pydoc-tiny` learned the call format but copied no argument in a few hundred steps: content-based copying did not form by gradient descent on two cores.

## Data

`tools/train/toolcall_data.py`, from fixed-seed generators (seed {args['seed']}): {data['n_conversations']} conversations in {data['n_conversations'] // data['group_size']} groups of {data['group_size']} with the pools' values (the first step), and {data_s['n_conversations']} in {data_s['n_conversations'] // data_s['group_size']} groups (every later step) where seven conversations in eight have made-up values instead: city names, glossary terms of one to three words and tool results, of made-up words mixed with common ones, that no pool has and only copying writes. Four tools: `get_weather(city)`, `get_time(city)`, `add(a, b)` (integers), `lookup(term)` (a Python glossary term). Each conversation offers the tool it needs and one or two others in a shuffled order (the conversations of a group offer the same ones), an optional system message (3 in 10), and: a user request (one of 5-7 phrasings per tool) -> the assistant's tool call -> the tool's result (the observation turn) -> an answer that quotes the result. Cities, numbers, glossary terms, weather and definitions are drawn from training pools; held-out pools ({len(td.HELD_CITIES)} cities, {len(td.HELD_NUMBERS)} numbers, {len(td.HELD_TERMS)} terms, {len(td.HELD_SKIES)} kinds of weather, {len(td.HELD_DEFS)} definitions) appear in no training conversation and are what the evaluation and the test use. A held-out conversation:

```
{json.dumps(ex['messages'], ensure_ascii=False)}
```

The conversations are rendered by GLM-4.6's chat template (`tools/train/glm-4.6.jinja`) with `@huggingface/jinja` and tokenized with Hugging Face's JS tokenizers (`tools/train/render_chat.mjs`); `finetune_tools.py check` confirms that lockstep's own request handling (`build/chat_render`: `lks_oai_chat_prepare` / `lks_anth_prepare` and `lks_chat_render`, from OpenAI bodies with the arguments as JSON text and from Anthropic bodies) produces exactly these tokens up to each assistant turn. Conversations: {data['tokens_min']}-{data['tokens_max']} tokens (mean {data['tokens_mean']:.0f}), of which the assistant writes {data['assistant_tokens_mean']:.1f} on average: the loss covers only those (after each `<|assistant|>`, up to and including the `<|observation|>` or `<|endoftext|>` that ends the turn).


## Licence

The weights are trained on the synthetic conversations only, which `toolcall_data.py` (MIT, this repository) generates. The tokenizer is `glm-pydoc-tiny`'s, trained on the Python documentation (Copyright © 2001-2023 Python Software Foundation, PSF License Agreement, PSF-2.0; Debian's `/usr/share/doc/python3.11-doc/copyright`).

## Training recipe

- `bash tools/train/finetune_tools.sh` (PyTorch on the CPU, `torch.set_num_threads(2)`, deterministic algorithms), from the primed initialisation above (seed {args['seed']}; the other weights as `glm.py` initialises them).
- {len(hist)} steps, each one group of {data['group_size']} conversations; the group's shared prompt prefix (mean {data['shared_prefix_mean']:.0f} tokens: the tool list and the system message) is computed once per step and attended to by all {data['group_size']} continuations, which is the same loss and gradient as the {data['group_size']} whole sequences at a fraction of the compute.
- AdamW (beta 0.9 / 0.95, weight decay {args['wd']} on matrices), gradient clipping {args['clip']}; learning rate {args['lr']} after {args['warmup']} steps of warm-up, then a cosine down to {args['min_lr_frac']} of it (the table below).
- Loss: next-token cross-entropy + {args['mtp_weight']} x the MTP layer's cross-entropy on the token after next, on the assistant tokens; plus {args['copy_weight']} x the same on {args['copy_batch']} copying-practice sequences a step (a random sequence of {args['copy_len']} ordinary tokens after a random prefix of {args['copy_len'] // 2}, repeated; the loss on the repeat), which keeps the copying circuit general while the tool data narrows it. Expert balancing as in `glm-pydoc-tiny` (bias step {args['bias_u']}).
{("- " + note + chr(10)) if note else ""}- Training time: {st['elapsed'] / 60:.1f} minutes of training steps on two cores shared with other work, {st['elapsed'] / len(hist):.1f} s per step on average.

| step | tool-call loss (assistant tokens) | MTP loss | copying-practice loss | learning rate |
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
