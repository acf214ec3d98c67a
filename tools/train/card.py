# SPDX-License-Identifier: MIT
# card.py -- writes the model card (MODEL_DIR/README.md) from the figures of evaluate.py.

import math
import os


def _f(x, n=3):
    return ("%%.%df" % n) % x


def write(model_dir, cfg, m, hist):
    name = os.path.basename(os.path.normpath(model_dir))
    a = m["args"]
    d = m["data"]
    v = m["val"]
    acc = m["acceptance"]
    sz = m["files_bytes"]
    total = sum(sz.values())
    H, L, E = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["n_routed_experts"]
    # parameter counts from the shapes
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    V, I, Im = cfg["vocab_size"], cfg["intermediate_size"], cfg["moe_intermediate_size"]
    attn = H * nh * hd + 2 * H * nkv * hd + (nh + 2 * nkv) * hd + nh * hd * H + 2 * hd + 2 * H
    dense = 3 * H * I
    expert = 3 * H * Im
    moe = E * expert + expert * cfg["n_shared_experts"] + E * H + E
    n_dense = cfg["first_k_dense_replace"]
    main_p = 2 * V * H + H + n_dense * (attn + dense) + (L - n_dense) * (attn + moe)
    mtp_p = attn + moe + 2 * H * H + 3 * H
    k = cfg["num_experts_per_tok"]
    active = main_p - (L - n_dense) * (E - k) * expert
    mins = m["train_seconds"] / 60
    lines = []
    w = lines.append
    w("# %s" % name)
    w("")
    w("A small `Glm4MoeForCausalLM` (model_type `glm4_moe`) with its MTP layer, trained from "
      "scratch on the CPU by `tools/train/train.sh` on the reStructuredText sources of the "
      "Python 3.11 documentation. It is lockstep's default model: every piece of the GLM-4.5 "
      "architecture that the runtime implements is exercised by real, trained weights. It is a "
      "toy: it writes text that looks like Python documentation, not text that is true.")
    w("")
    w("Every figure below was written by `tools/train/evaluate.py` from the run that produced "
      "the weights in this directory (`metrics.json` holds them all).")
    w("")
    w("## Architecture and sizes")
    w("")
    w("| | |")
    w("|---|---|")
    w("| hidden size | %d |" % H)
    w("| layers | %d (first %d dense, then MoE) + 1 MTP layer |" % (L, n_dense))
    w("| attention | %d heads / %d KV heads, head_dim %d, qk-norm, q/k/v bias, partial half-split RoPE "
      "(%g of head_dim, theta %g) |" % (nh, nkv, hd, cfg["partial_rotary_factor"], cfg["rope_theta"]))
    w("| dense FFN | SwiGLU, intermediate %d |" % I)
    w("| MoE | %d routed experts of %d, top-%d, sigmoid routing with e_score_correction_bias, "
      "norm_topk_prob, routed_scaling_factor %g, %d shared expert |" % (
          E, Im, k, cfg["routed_scaling_factor"], cfg["n_shared_experts"]))
    w("| MTP | enorm, hnorm, eh_proj [e; h], one MoE decoder layer, shared_head.norm; main "
      "embed_tokens and lm_head |")
    w("| vocabulary | %d (byte-level BPE, %d merges, %d special tokens) |" % (
        V, d["merges"], V - 256 - d["merges"]))
    w("| context trained | %d tokens |" % a["seq"])
    w("| parameters | %.2f M main model + %.2f M MTP layer = %.2f M; %.2f M active per token |"
      % (main_p / 1e6, mtp_p / 1e6, (main_p + mtp_p) / 1e6, active / 1e6))
    w("| files | %.1f MB in all (model.safetensors BF16, e_score_correction_bias F32) |"
      % (total / 1e6))
    w("")
    w("Heads (%d), KV heads (%d) and experts (%d) divide by 4: world sizes 1, 2 and 4 can shard it."
      % (nh, nkv, E))
    w("")
    w("## Corpus and licence")
    w("")
    w("Debian 12's `python3.11-doc` package, `/usr/share/doc/python3.11/html/_sources/**/*.txt`: "
      "%d reStructuredText files, %.1f MB. Held out by file with a fixed seed (%d): %d files, "
      "%d bytes, %d tokens; training: %d files, %d bytes, %d tokens (%.2f bytes per token)." % (
          d["files_total"], (d["train_bytes"] + d["val_bytes"]) / 1e6, a["seed"],
          len(m["val_files"]), d["val_bytes"], d["val_tokens"], d["files_total"] - len(m["val_files"]),
          d["train_bytes"], d["train_tokens"], d["train_bytes"] / d["train_tokens"]))
    w("")
    w("The Python documentation is Copyright © 2001-2023 Python Software Foundation and is "
      "distributed under the PSF License Agreement (PSF-2.0; Debian's "
      "`/usr/share/doc/python3.11-doc/copyright`); the weights are a work derived from it. "
      "The held-out files are listed in `metrics.json` (`val_files`).")
    w("")
    w("## Tokenizer")
    w("")
    w("`tools/train/bpe.py`: byte-level BPE (GPT-2 byte-to-unicode mapping) with the GLM-4 split "
      "pattern of MODEL.md section 5, trained on the training files only; a standard Hugging Face "
      "`tokenizer.json` (BPE model with vocab and merges, pre-tokenizer Sequence[Split(pattern, "
      "Isolated), ByteLevel(add_prefix_space false, use_regex false)], ByteLevel decoder) with "
      "GLM's special tokens as added tokens after the BPE vocabulary. `tokenizer_config.json` "
      "carries GLM-4.6's chat template; `generation_config.json` stops at `<|endoftext|>`, "
      "`<|user|>` and `<|observation|>`.")
    w("")
    w("Checked when this model was made: Hugging Face's JS tokenizers (`@huggingface/tokenizers` "
      "0.2.0, the package of `tests/tokenizer`) encode ten held-out files to the same ids as "
      "`bpe.py`'s encoder, and so does lockstep's `tokenize`.")
    w("")
    w("## Training recipe")
    w("")
    w("- `bash tools/train/train.sh` (PyTorch %s on the CPU, `torch.set_num_threads(2)`, "
      "deterministic algorithms, seed %d)." % (a.get("torch", "1.13"), a["seed"]))
    w("- %d steps of %d sequences x %d tokens (%.2f M tokens, %.2f epochs of the training split)."
      % (a["steps"], a["batch"], a["seq"], a["steps"] * a["batch"] * a["seq"] / 1e6,
         a["steps"] * a["batch"] * a["seq"] / d["train_tokens"]))
    w("- AdamW (beta 0.9 / 0.95, weight decay %g on matrices), peak learning rate %g, %d warm-up "
      "steps, cosine to %g of the peak, gradient clipping %g." % (
          a["wd"], a["lr"], a["warmup"], a["min_lr_frac"], a["clip"]))
    w("- Loss: next-token cross-entropy + %g x the MTP layer's cross-entropy on the token after "
      "next; the MTP layer takes the main model's final-normed hidden at i and token i+1."
      % a["mtp_weight"])
    w("- Expert balance without an auxiliary loss (DeepSeek-V3): after each step, every MoE "
      "layer's `e_score_correction_bias += %g * sign(mean_load - load)`; the bias only selects."
      % a["bias_u"])
    w("- Training time: %.1f minutes of training steps on two cores (shared with other work), "
      "%.1f s per step on average; evaluation %.1f minutes." % (
          mins, m["train_seconds"] / max(1, m["steps"]), m["eval_seconds"] / 60))
    w("")
    w("## Results on the held-out files")
    w("")
    w("| | loss (nats/token) | perplexity |")
    w("|---|---|---|")
    w("| main model, next token | %s | %s |" % (_f(v["loss"]), _f(v["ppl"], 2)))
    w("| MTP layer, token after next | %s | %s |" % (_f(v["mtp_loss"]), _f(v["mtp_ppl"], 2)))
    w("")
    w("Over all %d held-out tokens: %.3f bits per byte." % (v["tokens"], v["bits_per_byte"]))
    w("")
    curve = [(r["step"], r["loss"], r.get("val_loss"), r.get("val_mtp")) for r in hist
             if "val_loss" in r]
    if curve:
        w("Training curve (held-out loss on the first %d windows during training; the full log "
          "is `train.log`):" % a["eval_windows"])
        w("")
        w("| step | train loss | held-out loss | held-out MTP loss |")
        w("|---|---|---|---|")
        for s_, tl, vl_, vm_ in curve:
            w("| %d | %.3f | %.3f | %.3f |" % (s_, tl, vl_, vm_))
        w("")
    st = m["acceptance_setup"]
    w("### MTP greedy acceptance")
    w("")
    w("%d held-out prompts of %d tokens; the target generates %d tokens greedily; at each verify "
      "point the MTP layer drafts k tokens greedily (the first from the target's final-normed "
      "hidden, chained drafts carrying `shared_head.norm(z)`), accepted while they equal the "
      "target's greedy tokens, as a speculative decoder runs. Acceptance per draft position is "
      "accepted / attempted (position j is attempted only when drafts 1..j-1 were accepted)."
      % (st["prompts"], st["prompt_len"], st["generated"]))
    w("")
    w("| drafts | position 1 | position 2 | position 3 | tokens per verify step |")
    w("|---|---|---|---|---|")
    for kk in ("1", "2", "3"):
        pp = acc[kk]["per_position"] + [None] * (3 - len(acc[kk]["per_position"]))
        w("| %s | %s | %s | %s | %.2f |" % (kk, *[("%.3f" % x) if x is not None else "" for x in pp],
                                           acc[kk]["tokens_per_step"]))
    aa = acc["all_anchors"]["per_position"]
    w("")
    w("Counted at every position of the greedy continuations instead of only at verify points: "
      "%.3f / %.3f / %.3f. Teacher-forced on all held-out text, the first draft equals the "
      "target's next greedy token %.3f of the time." % (aa[0], aa[1], aa[2],
                                                         v["mtp_teacher_forced_agreement"]))
    w("")
    ls = m.get("acceptance_lockstep")
    if ls:
        w("Measured again by lockstep's own speculative decoder on the same prompts "
          "(`lockstep generate --spec mtp -k K --spec-gate false`, `tools/train/spec_check.py`; "
          "lockstep reports accepted/proposed per position over all rounds, converted here to "
          "the same conditional rates):")
        w("")
        w("| drafts | position 1 | position 2 | position 3 | tokens per round |")
        w("|---|---|---|---|---|")
        for kk in ("1", "2", "3"):
            pp = ls[kk]["per_position"] + [None] * (3 - len(ls[kk]["per_position"]))
            w("| %s | %s | %s | %s | %.2f |" % (
                kk, *[("%.3f" % x) if x is not None else "" for x in pp],
                ls[kk]["tokens_per_round"]))
        w("")
    else:
        w("lockstep's own measurement (`tools/train/spec_check.py`, run by `train.sh` when a "
          "built `lockstep` is found) is absent from this run.")
        w("")
    w("Greedy continuations of a model this small fall into repetitions (see the samples), which "
      "the drafter predicts well: acceptance on repetitive text is higher than it would be on "
      "fresh text, where the teacher-forced figure above is the better guide.")
    w("")
    w("## Samples")
    w("")
    w("Greedy continuations of the beginnings of held-out files (prompt, then continuation):")
    w("")
    for s in m["samples"]:
        w("```")
        w(s["prompt"] + "⟨" + s["continuation"] + "⟩")
        w("```")
        w("")
    w("## Test data")
    w("")
    w("`test/expected_N.safetensors`: %d held-out sequences (%d prompt tokens and the model's own "
      "greedy continuation), with the logits, the MTP first-draft logits and three chained "
      "drafts at three anchors, computed by the PyTorch model in float64 from the BF16 weights "
      "(format of `tests/reference/glm_ref.py`). The ctest `trained_model_N` (label `model`) "
      "compares lockstep's forward with them within the BF16 bound 2e-2." % (
          len(m["tests"]), m["tests"][0]["prompt_len"] if m["tests"] else 0))
    w("")
    w("## Files")
    w("")
    w("| file | bytes |")
    w("|---|---|")
    for f, b in sorted(sz.items()):
        w("| `%s` | %d |" % (f, b))
    w("")
    with open(os.path.join(model_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def main(argv):
    """card.py MODEL_DIR WORK_DIR: rewrite the card from MODEL_DIR/metrics.json."""
    import json
    import torch
    model, work = argv
    m = json.load(open(os.path.join(model, "metrics.json")))
    cfg = json.load(open(os.path.join(model, "config.json")))
    hist = torch.load(os.path.join(work, "ckpt.pt"))["hist"]
    write(model, cfg, m, hist)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
