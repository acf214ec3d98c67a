# SPDX-License-Identifier: MIT
#
# evaluate.py -- measures an exported model (the BF16 weights as shipped, loaded into the
# PyTorch model of glm.py) and writes its model card figures and test data:
#
#   - held-out loss and perplexity (main head and MTP head), every held-out token;
#   - MTP greedy acceptance on held-out prompts: the target generates greedily; at each
#     verify point (anchor i, verified token t_{i+1}) the drafter proposes k = 1, 2, 3 chained
#     drafts (the first from the target's final-normed hidden at i, later ones carrying
#     shared_head.norm(z), MODEL.md section 3); drafts are accepted while they equal the
#     target's greedy tokens; the next anchor follows the accepted drafts plus the target's
#     own token, as a speculative decoder runs.  Per draft position: accepted / attempted;
#   - sample continuations of held-out prompts, as text;
#   - the test data beside the model: MODEL/test/expected_N.safetensors in the format of
#     tests/reference/glm_ref.py (tokens, logits, mtp_logits, mtp_chain_logits,
#     mtp_chain_pos), computed in float64 on held-out text, the continuation being the
#     model's own greedy one;
#   - WORK/metrics.json and MODEL/README.md (the model card) from these figures.
#
# Usage: /usr/bin/python3 tools/train/evaluate.py --work WORK --model MODEL_DIR [--quick]

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bpe  # noqa: E402
import glm  # noqa: E402
import train as tr  # noqa: E402


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def read_safetensors(path):
    import struct
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
        base = 8 + n
        data = f.read()
    out = {}
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = np.frombuffer(data[a:b], dtype=np.uint8)
        if info["dtype"] == "BF16":
            x = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F32":
            x = raw.view("<f4")
        else:
            raise ValueError(info["dtype"])
        out[name] = torch.from_numpy(x.reshape(info["shape"]).copy())
    return out


def load_model(d, dtype):
    cfg = json.load(open(os.path.join(d, "config.json")))
    m = glm.Glm4Moe(cfg)
    m.load_state_dict(read_safetensors(os.path.join(d, "model.safetensors")), strict=True)
    m = m.to(dtype)
    m.model.layers[-1].mlp.gate.e_score_correction_bias.data = \
        m.model.layers[-1].mlp.gate.e_score_correction_bias.data.float()
    for moe in m.moe_layers():
        moe.gate.e_score_correction_bias.data = moe.gate.e_score_correction_bias.data.float()
    m.eval()
    return m, cfg


@torch.no_grad()
def val_loss(m, val, seq, batch, limit):
    n = min(limit, (len(val) - 1) // seq)
    tot = mtp = 0.0
    cnt = mcnt = 0
    agree = agree_n = 0
    for s0 in range(0, n, batch):
        ws = [val[k * seq:k * seq + seq + 1] for k in range(s0, min(n, s0 + batch))]
        win = torch.from_numpy(np.stack(ws).astype(np.int64))
        x, y = win[:, :-1], win[:, 1:]
        hn, lg = m(x)
        V = lg.shape[-1]
        tot += float(torch.nn.functional.cross_entropy(lg.reshape(-1, V), y.reshape(-1),
                                                       reduction="sum"))
        cnt += y.numel()
        u = m.mtp_input(hn[:, :-1], x[:, 1:])
        _, ml = m.mtp_layer(u)
        mtp += float(torch.nn.functional.cross_entropy(ml.reshape(-1, V),
                                                       win[:, 2:].reshape(-1), reduction="sum"))
        mcnt += win[:, 2:].numel()
        # teacher-forced: first draft at i vs the target's argmax at i+1
        agree += int((ml.argmax(-1) == lg[:, 1:].argmax(-1)).sum())
        agree_n += ml.shape[0] * ml.shape[1]
    return tot / cnt, mtp / mcnt, agree / agree_n, cnt


@torch.no_grad()
def greedy(m, prompts, G):
    """prompts [B, P] -> tokens [B, P+G] (full recompute each step)."""
    toks = prompts.clone()
    for _ in range(G):
        _, lg = m(toks)
        toks = torch.cat([toks, lg[:, -1].argmax(-1, keepdim=True)], dim=1)
    return toks


@torch.no_grad()
def chain_drafts(m, toks, first_anchor, last_anchor, chain):
    """Drafts [B, n_anchor, chain] and their logits at anchors first..last (inclusive)."""
    hn, _ = m(toks)
    T = toks.shape[1]
    u = m.mtp_input(hn[:, :T - 1], toks[:, 1:])           # u_i: (h_i, t_{i+1})
    hs, ml = m.mtp_layer(u)
    anchors = list(range(first_anchor, last_anchor + 1))
    B = toks.shape[0]
    drafts = torch.zeros(B, len(anchors), chain, dtype=torch.long)
    logits = torch.zeros(B, len(anchors), chain, ml.shape[-1], dtype=ml.dtype)
    for ai, i in enumerate(anchors):
        seq = u[:, :i + 1]
        h_c, lg_c = hs[:, i], ml[:, i]
        for d in range(chain):
            if d > 0:
                un = m.mtp_input(h_c[:, None], drafts[:, ai, d - 1][:, None])
                seq = torch.cat([seq, un], dim=1)
                hs_s, lg_s = m.mtp_layer(seq)
                h_c, lg_c = hs_s[:, -1], lg_s[:, -1]
            logits[:, ai, d] = lg_c
            drafts[:, ai, d] = lg_c.argmax(-1)
    return anchors, drafts, logits, ml


def acceptance(toks, anchors, drafts, P, k):
    """Speculative-decoding walk with k drafts per step (greedy verify)."""
    B, T = toks.shape
    att = [0] * k
    acc = [0] * k
    steps = emitted = 0
    a0 = anchors[0]
    for b in range(B):
        i = P - 1
        while i + 1 + k <= T - 1 and i - a0 < len(anchors):
            n_ok = 0
            for d in range(k):
                att[d] += 1
                if int(drafts[b, i - a0, d]) == int(toks[b, i + 2 + d]):
                    acc[d] += 1
                    n_ok += 1
                else:
                    break
            steps += 1
            emitted += n_ok + 1
            i += n_ok + 1
    return {"per_position": [acc[d] / att[d] if att[d] else 0.0 for d in range(k)],
            "accepted": acc, "attempted": att, "verify_steps": steps,
            "tokens_per_step": emitted / steps}


def margin(row):
    s = np.sort(row)
    return float(s[-1] - s[-2])


@torch.no_grad()
def write_expected(m64, toks_np, P, G, chain, path):
    """glm_ref-format expected file for tokens toks_np [P] + greedy G+1 (float64 model)."""
    t = torch.from_numpy(toks_np[None].astype(np.int64))
    full = greedy(m64, t, G + 1)                          # [1, P+G+1]
    T = P + G
    hn, lg = m64(full[:, :T])
    margins = [margin(lg[0, p].numpy()) for p in range(P - 1, T)]
    anchors = sorted({x for x in (P - 1, P + G // 2, P + G - 2) if 0 <= x <= T - 2})
    u = m64.mtp_input(hn[:, :T - 1], full[:, 1:T])
    hs, ml = m64.mtp_layer(u)
    ch = np.zeros((len(anchors), chain, lg.shape[-1]))
    cm = []
    for ai, i in enumerate(anchors):
        seq = u[:, :i + 1]
        h_c, lg_c = hs[:, i], ml[:, i]
        for d in range(chain):
            if d > 0:
                un = m64.mtp_input(h_c[:, None], lg_c.argmax(-1)[:, None])
                seq = torch.cat([seq, un], dim=1)
                hs_s, lg_s = m64.mtp_layer(seq)
                h_c, lg_c = hs_s[:, -1], lg_s[:, -1]
            ch[ai, d] = lg_c[0].numpy()
            cm.append(margin(ch[ai, d]))
    items = []
    for name, arr, dt in (("tokens", full[0].numpy(), "I32"), ("logits", lg[0].numpy(), "F32"),
                          ("mtp_logits", ml[0].numpy(), "F32"), ("mtp_chain_logits", ch, "F32"),
                          ("mtp_chain_pos", np.array(anchors), "I32")):
        a = np.ascontiguousarray(arr, dtype="<i4" if dt == "I32" else "<f4")
        items.append((name, dt, a.shape, a.tobytes()))
    meta = {"format": "pt", "prompt_len": str(P), "gen": str(G), "chain": str(chain),
            "generator": "tools/train/evaluate.py (PyTorch, float64, BF16 weights)"}
    tr.write_safetensors(path, items, meta)
    return min(margins), min(cm), full[0].tolist()


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small figures, for a smoke run")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    t_start = time.time()
    q = a.quick
    val = np.load(os.path.join(a.work, "val.npy"))
    data = json.load(open(os.path.join(a.work, "data.json")))
    ck = torch.load(os.path.join(a.work, "ckpt.pt"))
    hist, targs, elapsed = ck["hist"], ck["args"], ck["elapsed"]
    del ck
    vocab, merges = tr.load_tok(a.work)
    enc = bpe.Encoder(vocab, merges)
    specials = {i: t for t, i in bpe.special_ids(vocab).items()}
    m, cfg = load_model(a.model, torch.float32)
    out = {"train_seconds": elapsed, "steps": len(hist), "args": targs, "data": {
        k: v for k, v in data.items() if not k.endswith("_files")},
        "val_files": data["val_files"]}

    # 1. held-out loss
    seq = targs["seq"]
    vl, vm, agree, n_tok = val_loss(m, val, seq, 8, 8 if q else 10 ** 9)
    out["val"] = {"loss": vl, "ppl": math.exp(vl), "mtp_loss": vm, "mtp_ppl": math.exp(vm),
                  "tokens": n_tok, "bits_per_byte": vl * len(val) / data["val_bytes"] / math.log(2),
                  "mtp_teacher_forced_agreement": agree}
    log("held out: loss %.4f ppl %.2f, MTP loss %.4f, teacher-forced draft agreement %.3f"
        % (vl, math.exp(vl), vm, agree))

    # 2. MTP acceptance on held-out prompts
    P, G, NP = 64, (16 if q else 64), (4 if q else 32)
    offs = [int(k * (len(val) - P - 1) / NP) for k in range(NP)]
    prompts = torch.from_numpy(np.stack([val[o:o + P] for o in offs]).astype(np.int64))
    toks = greedy(m, prompts, G)
    anchors, drafts, _, _ = chain_drafts(m, toks, P - 1, P + G - 3, 3)
    acc = {str(k): acceptance(toks, anchors, drafts, P, k) for k in (1, 2, 3)}
    # every anchor (conditional on the earlier drafts of the chain being right)
    att, ok = [0, 0, 0], [0, 0, 0]
    for b in range(toks.shape[0]):
        for ai, i in enumerate(anchors):
            for d in range(3):
                if i + 2 + d >= toks.shape[1]:
                    break
                att[d] += 1
                if int(drafts[b, ai, d]) != int(toks[b, i + 2 + d]):
                    break
                ok[d] += 1
    acc["all_anchors"] = {"per_position": [ok[d] / att[d] if att[d] else 0.0 for d in range(3)],
                         "attempted": att}
    out["acceptance"] = acc
    out["acceptance_setup"] = {"prompts": NP, "prompt_len": P, "generated": G}
    for k in ("1", "2", "3"):
        log("MTP acceptance, %s draft(s): per position %s, %.2f tokens per verify" % (
            k, " ".join("%.3f" % x for x in acc[k]["per_position"]), acc[k]["tokens_per_step"]))

    # 3. samples: beginnings of held-out files
    eot = bpe.special_ids(vocab)["<|endoftext|>"]
    starts = [0] + [int(i) + 1 for i in np.nonzero(val == eot)[0][:-1]]
    samples = []
    for s in starts[:(1 if q else 4)]:
        pr = torch.from_numpy(val[s:s + 24].astype(np.int64))[None]
        g = greedy(m, pr, 16 if q else 64)[0].tolist()
        samples.append({"prompt": enc.decode(g[:24], specials),
                        "continuation": enc.decode(g[24:], specials)})
    out["samples"] = samples

    # 4. test data beside the model (float64)
    m64, _ = load_model(a.model, torch.float64)
    tdir = os.path.join(a.model, "test")
    os.makedirs(tdir, exist_ok=True)
    tests = []
    PT, GT = 48, 15          # tokens [P+G+1] = 64, logits [P+G] rows
    cand = [int(k * (len(val) - 100) / 40) + 17 for k in range(40)]
    for o in cand:
        if len(tests) == 2:
            break
        path = os.path.join(tdir, "expected_%d.safetensors" % len(tests))
        mg, cmg, tk = write_expected(m64, val[o:o + PT], PT, GT, 3, path)
        if mg < 0.05 or cmg < 0.05:
            log("test candidate at %d skipped: greedy margin %.3g, chain margin %.3g" % (o, mg, cmg))
            os.remove(path)
            continue
        tests.append({"file": os.path.basename(path), "val_offset": o, "prompt_len": PT,
                      "gen": GT, "min_greedy_margin": mg, "min_chain_margin": cmg,
                      "text": enc.decode(tk, specials)})
        log("wrote %s (margins %.3f / %.3f)" % (path, mg, cmg))
    out["tests"] = tests
    out["eval_seconds"] = time.time() - t_start
    out["files_bytes"] = {f: os.path.getsize(os.path.join(a.model, f))
                          for f in sorted(os.listdir(a.model))
                          if os.path.isfile(os.path.join(a.model, f))}
    out["files_bytes"].update({"test/" + f: os.path.getsize(os.path.join(tdir, f))
                               for f in sorted(os.listdir(tdir))})
    with open(os.path.join(a.work, "metrics.json"), "w") as f:
        json.dump(out, f, indent=1)
    with open(os.path.join(a.model, "metrics.json"), "w") as f:
        json.dump(out, f, indent=1)
    log_src = os.path.join(a.work, "train.log")
    if os.path.exists(log_src):
        import shutil
        shutil.copyfile(log_src, os.path.join(a.model, "train.log"))
    import card
    card.write(a.model, cfg, out, hist)
    log("evaluate: done in %.0f s" % (time.time() - t_start))


if __name__ == "__main__":
    main(sys.argv[1:])
