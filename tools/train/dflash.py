# SPDX-License-Identifier: MIT
#
# dflash.py -- trains a DFlash block drafter (block-diffusion drafting, arXiv 2602.06036;
# checkpoint format of z-lab/dflash) for the default model, on the CPU, with the target
# frozen, and exports it in Hugging Face layout beside the model.
#
# Architecture (as z-lab/dflash's DFlashDraftModel, which this follows where sources differ):
#   - context features: the target's residual stream after each decoder layer listed in
#     dflash_config.target_layer_ids (HF hidden_states[L + 1]), concatenated in list order,
#     c = hidden_norm(fc [f_L1 ; f_L2 ; ...])                      fc: [H, nL*H], no bias
#   - block: [last verified token, mask, mask, ...] (block_size tokens at positions s..s+B-1),
#     embedded with the target's embed_tokens (mask_token_id is [MASK]).
#   - each drafter layer (Qwen3-style, dense): h = input_layernorm(x);
#     q = q_norm(Wq h) (rows of the block only); k/v for the context rows from c directly
#     (no input_layernorm on c: every layer reads the same c) and for the block rows from h;
#     k_norm on both; full half-split RoPE (theta as the target's) at each row's position;
#     the block attends to every context row (positions < s) and to all of its own rows
#     (non-causal within the block); x += Wo attn; x += mlp(post_attention_layernorm(x)).
#   - out = norm(x); logits of block rows 1..B-1 through the target's lm_head = B-1 drafts.
#   - the drafter's KV cache keeps only context rows (block rows are dropped after each
#     forward); after a verify, the features of the accepted rows are appended.
#
# Training (self-distillation): the frozen target continues windows of real text greedily
# (build_pool; its layer outputs are captured on the way) and the drafter learns the token
# the target would emit at each block row given only the tokens <= s it sees: row k at
# anchor s is trained towards argmax target(. | tokens <= s+k-1), which is that token only
# where tokens s+1 .. s+k-1 are the target's own picks -- always in the generated part; on
# the real prompt row 1 always, rows 2.. only where the text equals the picks (else weight
# 0). Weight exp(-(k-1)/(B-1)); anchors at random, many blocks per sequence in one forward
# (a block mask).
#
# Usage: /usr/bin/python3 tools/train/dflash.py {train,export,measure,card} --work DIR [options]

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bpe  # noqa: E402
import glm  # noqa: E402
import train as tr  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
TARGET = os.path.join(ROOT, "models", "glm-pydoc-tiny")


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def read_safetensors(path):
    import struct
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
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


def load_target(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    m = glm.Glm4Moe(cfg)
    m.load_state_dict(read_safetensors(os.path.join(d, "model.safetensors")), strict=True)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m, cfg


# ---------------------------------------------------------------------------
# the drafter
# ---------------------------------------------------------------------------

class DAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, hd = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        self.q_proj = nn.Linear(H, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=False)
        self.q_norm = glm.RMSNorm(hd, c["rms_norm_eps"])
        self.k_norm = glm.RMSNorm(hd, c["rms_norm_eps"])

    def forward(self, h, ctx, cq, sq, ck, sk, mask):
        """h [B, Q, H] block rows, ctx [B, C, H]; keys = [ctx ; block]; mask [B|1, Q, C+Q]
        True = masked."""
        B, Q, _ = h.shape
        C = ctx.shape[1]
        q = self.q_norm(self.q_proj(h).view(B, Q, self.nh, self.hd)).transpose(1, 2)
        kv_in = torch.cat([ctx, h], dim=1)
        k = self.k_norm(self.k_proj(kv_in).view(B, C + Q, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(kv_in).view(B, C + Q, self.nkv, self.hd).transpose(1, 2)
        q = glm.apply_rope(q, cq[:, None], sq[:, None])
        k = glm.apply_rope(k, ck[:, None], sk[:, None])
        g = self.nh // self.nkv
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd))
        att = att.masked_fill(mask[:, None], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, Q, self.nh * self.hd)
        return self.o_proj(y)


class DLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        self.input_layernorm = glm.RMSNorm(H, eps)
        self.self_attn = DAttention(c)
        self.post_attention_layernorm = glm.RMSNorm(H, eps)
        self.mlp = glm.MLP(H, c["intermediate_size"])

    def forward(self, x, ctx, cq, sq, ck, sk, mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx, cq, sq, ck, sk, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlash(nn.Module):
    """Parameter names are the checkpoint's (z-lab/dflash: fc, hidden_norm, layers.L.*, norm)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        H, nL = c["hidden_size"], len(c["dflash_config"]["target_layer_ids"])
        self.fc = nn.Linear(nL * H, H, bias=False)
        self.hidden_norm = glm.RMSNorm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList([DLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = glm.RMSNorm(H, c["rms_norm_eps"])
        self.rcfg = {"head_dim": c["head_dim"], "partial_rotary_factor": 1.0,
                     "rope_theta": c["rope_theta"]}

    def init_weights(self, std=0.02):
        out_std = std / math.sqrt(2 * len(self.layers))
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def rope(self, pos):
        """pos [B, T] -> cos, sin [B, T, hd/2]"""
        cs, sn = glm.rope_tables(self.rcfg, pos.reshape(-1), torch.float32)
        return cs.view(*pos.shape, -1), sn.view(*pos.shape, -1)

    def forward(self, feats, ctx_pos, x, blk_pos, mask):
        """feats [B, C, nL*H] target features, ctx_pos [B, C]; x [B, Q, H] block embeddings,
        blk_pos [B, Q]; mask [B, Q, C+Q] -> normed hidden of the block rows [B, Q, H]."""
        ctx = self.hidden_norm(self.fc(feats))
        cq, sq = self.rope(blk_pos)
        ck, sk = self.rope(torch.cat([ctx_pos, blk_pos], dim=1))
        for l in self.layers:
            x = l(x, ctx, cq, sq, ck, sk, mask)
        return self.norm(x)


def drafter_config(a, tcfg):
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": a.block_size,
        "dflash_config": {"block_size": a.block_size, "mask_token_id": a.mask_token_id,
                          "target_layer_ids": a.target_layer_ids},
        "head_dim": tcfg["head_dim"],
        "hidden_act": "silu",
        "hidden_size": tcfg["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": a.inter,
        "max_position_embeddings": tcfg["max_position_embeddings"],
        "num_attention_heads": tcfg["num_attention_heads"],
        "num_hidden_layers": a.layers,
        "num_key_value_heads": tcfg["num_key_value_heads"],
        "num_target_layers": tcfg["num_hidden_layers"],
        "rms_norm_eps": tcfg["rms_norm_eps"],
        "rope_theta": tcfg["rope_theta"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": tcfg["vocab_size"],
    }


# ---------------------------------------------------------------------------
# target features
# ---------------------------------------------------------------------------

@torch.no_grad()
def target_features(m, layer_ids, tokens):
    """tokens [B, T] -> (features [B, T, nL*H]: residual after each listed layer, in list
    order; greedy next tokens [B, T])."""
    B, T = tokens.shape
    x = m.model.embed_tokens(tokens)
    cos, sin = glm.rope_tables(m.cfg, torch.arange(T), x.dtype)
    mask = m.causal(T, x.device)
    got = {}
    for L in range(m.N):
        x = m.model.layers[L](x, cos, sin, mask)
        if L in layer_ids:
            got[L] = x
    hn = m.model.norm(x)
    return torch.cat([got[L] for L in layer_ids], dim=-1), m.lm_head(hn).argmax(-1)


def block_batch(m, dc, tokens, feats, anchors):
    """Blocks anchored at anchors [B, A] (block start s; tokens[s] is the verified token).
    Returns block embeddings [B, A*Bs, H], positions [B, A*Bs], mask [B, A*Bs, T + A*Bs]."""
    Bs = dc["dflash_config"]["block_size"]
    mask_id = dc["dflash_config"]["mask_token_id"]
    B, A = anchors.shape
    T = tokens.shape[1]
    j = torch.arange(Bs)
    pos = (anchors[:, :, None] + j[None, None]).reshape(B, A * Bs)
    ids = torch.full((B, A, Bs), mask_id, dtype=torch.long)
    ids[:, :, 0] = tokens.gather(1, anchors)
    x = m.model.embed_tokens(ids.reshape(B, A * Bs))
    blk_anchor = anchors[:, :, None].expand(B, A, Bs).reshape(B, A * Bs)
    ctx_mask = torch.arange(T)[None, None, :] >= blk_anchor[:, :, None]      # ctx at >= s hidden
    blk_id = torch.arange(A)[:, None].expand(A, Bs).reshape(-1)
    own = blk_id[:, None] != blk_id[None, :]                                  # other blocks hidden
    mask = torch.cat([ctx_mask, own[None].expand(B, -1, -1)], dim=2)
    return x, pos, mask


def draft_logits(m, dr, dc, tokens, feats, anchors):
    """-> logits [B, A, Bs-1, V] of block rows 1..Bs-1."""
    Bs = dc["dflash_config"]["block_size"]
    B, A = anchors.shape
    T = tokens.shape[1]
    x, pos, mask = block_batch(m, dc, tokens, feats, anchors)
    ctx_pos = torch.arange(T)[None].expand(B, T)
    hb = dr(feats, ctx_pos, x, pos, mask).view(B, A, Bs, -1)
    return m.lm_head(hb[:, :, 1:])


# ---------------------------------------------------------------------------
# data: the target's token streams, re-encoded with its shipped tokenizer
# ---------------------------------------------------------------------------

def prep_streams(work):
    os.makedirs(work, exist_ok=True)
    tp, vp = os.path.join(work, "train.npy"), os.path.join(work, "val.npy")
    if os.path.exists(tp) and os.path.exists(vp):
        return np.load(tp), np.load(vp)
    tj = json.load(open(os.path.join(TARGET, "tokenizer.json"), encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    merges = [tuple(x.split(" ")) for x in tj["model"]["merges"]]
    enc = bpe.Encoder(vocab, merges)
    eot = bpe.special_ids(vocab)["<|endoftext|>"]
    # the target's file-level split (train.py split_files, seed 1234, 5 % held out)
    train_f, val_f = tr.split_files(tr.corpus_files(), 1234, 0.05)
    held = set(json.load(open(os.path.join(TARGET, "metrics.json")))["val_files"])
    assert sorted(os.path.relpath(f, tr.CORPUS) for f in val_f) == sorted(held)

    def stream(fs):
        ids = []
        for f in fs:
            ids.extend(enc.encode(open(f, encoding="utf-8").read()))
            ids.append(eot)
        return np.array(ids, dtype=np.int32)

    t0 = time.time()
    va = stream(val_f)
    tr_ = stream(train_f)
    np.save(tp, tr_)
    np.save(vp, va)
    log("streams: train %d tokens, held out %d tokens (%.0f s)" % (len(tr_), len(va),
                                                                 time.time() - t0))
    return tr_, va


# ---------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------

@torch.no_grad()
def greedy_pool(m, layer_ids, prompts, G):
    """Self-distillation data: the frozen target continues prompts [B, P] greedily for G tokens
    (a KV cache; the layer outputs are captured on the way). -> tokens [B, P+G], features
    [B, P+G, nL*H] (as target_features over the whole sequence), nxt [B, P+G]: the target's
    arg-max after each position (nxt[t] = tokens[t+1] for t >= P-1)."""
    B, P = prompts.shape
    cache = [None] * m.N

    def fwd(tok, pos0):
        T = tok.shape[1]
        x = m.model.embed_tokens(tok)
        cos, sin = glm.rope_tables(m.cfg, torch.arange(pos0, pos0 + T), x.dtype)
        mask = torch.cat([torch.zeros(T, pos0, dtype=torch.bool), m.causal(T, x.device)], 1)
        got = {}
        for L in range(m.N):
            ly = m.model.layers[L]
            at = ly.self_attn
            q, k, v = at.qkv(ly.input_layernorm(x), cos, sin)
            if cache[L] is not None:
                k = torch.cat([cache[L][0], k], 2)
                v = torch.cat([cache[L][1], v], 2)
            cache[L] = (k, v)
            x = x + at.attend(q, k, v, mask)
            x = x + ly.mlp(ly.post_attention_layernorm(x))
            if L in layer_ids:
                got[L] = x
        nx = m.lm_head(m.model.norm(x)).argmax(-1)
        return torch.cat([got[L] for L in layer_ids], dim=-1), nx

    f, nx = fwd(prompts, 0)
    feats, nxts, toks = [f], [nx], [prompts]
    for i in range(G):
        t = nxts[-1][:, -1:]
        f, nx = fwd(t, P + i)
        toks.append(t)
        feats.append(f)
        nxts.append(nx)
    return torch.cat(toks, 1), torch.cat(feats, 1), torch.cat(nxts, 1)


def build_pool(m, dc, train, a):
    """a.pool windows of a.prompt real tokens (fixed seed) continued greedily to a.seq tokens;
    cached in the work directory by chunks of a.gen_batch."""
    g = np.random.default_rng([a.seed, 77])
    starts = g.integers(0, len(train) - a.prompt - 1, a.pool)
    t0 = time.time()
    out = {"tokens": [], "feats": [], "nxt": []}
    gen_s = 0.0
    for c in range(0, a.pool, a.gen_batch):
        cp = os.path.join(a.work, "pool_%d_%d_%d_%d_%d.pt" % (a.seed, c, a.gen_batch, a.prompt,
                                                            a.seq))
        tc = time.time()
        if os.path.exists(cp):                       # chunk c of the same seed: the same data
            ch = torch.load(cp)
        else:
            pr = torch.from_numpy(np.stack([train[s:s + a.prompt]
                                            for s in starts[c:c + a.gen_batch]]).astype(np.int64))
            tk, f, nx = greedy_pool(m, dc["dflash_config"]["target_layer_ids"], pr,
                                    a.seq - a.prompt)
            ch = {"tokens": tk, "feats": f.to(torch.bfloat16), "nxt": nx,
                  "seconds": time.time() - tc}
            torch.save(ch, cp)
        for k in out:
            out[k].append(ch[k])
        gen_s += ch["seconds"]
        log("pool: %d / %d sequences, %.0f s" % (c + ch["tokens"].shape[0], a.pool,
                                                 time.time() - t0))
    pool = {k: torch.cat(v) for k, v in out.items()}
    pool["seconds"] = gen_s                          # generation time, cached chunks included
    return pool


def losses(m, dr, dc, win, feats, nxt, g, n_anchor, lo):
    """win [B, T] tokens (prompt + the target's greedy continuation), feats its captured target
    features, nxt the target's arg-max after each position. Row k at anchor s is labelled
    nxt[s+k-1] where that is the token the target would emit there given only tokens <= s:
    always in the generated part (the tokens after s are the target's own picks); in the real
    prompt only while the real tokens s+1 .. s+k-1 equal the target's picks (weight 0 else)."""
    Bs = dc["dflash_config"]["block_size"]
    B, T = win.shape
    anchors = torch.stack([torch.from_numpy(np.sort(g.choice(np.arange(lo, T - Bs + 1),
                                                              n_anchor, replace=False)))
                           for _ in range(B)])
    lg = draft_logits(m, dr, dc, win, feats, anchors)            # [B, A, Bs-1, V]
    k = torch.arange(1, Bs)
    idx = (anchors[:, :, None] + k[None, None] - 1).reshape(B, -1)
    lab = nxt.gather(1, idx).view(B, n_anchor, Bs - 1)
    # row k valid iff tokens s+1 .. s+k-1 are the target's own picks
    same = (win[:, 1:] == nxt[:, :-1])                            # same[t-1]: tokens[t] == pick
    same = torch.cat([same, torch.ones(B, 1, dtype=torch.bool)], 1)
    ok = same.gather(1, idx).view(B, n_anchor, Bs - 1)           # ok[.., k-1]: token s+k is a pick
    valid = torch.cat([torch.ones(B, n_anchor, 1, dtype=torch.bool),
                       ok[:, :, :-1].cumprod(-1).bool()], -1).float()
    ce = F.cross_entropy(lg.float().reshape(-1, lg.shape[-1]), lab.reshape(-1),
                         reduction="none").view(B, n_anchor, Bs - 1)
    w = torch.exp(-(k - 1).float() / (Bs - 1)) * valid
    loss = (ce * w).sum() / w.sum()
    n = valid.sum((0, 1)).clamp(min=1)
    acc = ((lg.argmax(-1) == lab).float() * valid).sum((0, 1)) / n
    return loss, (ce * valid).sum((0, 1)) / n, acc


def lr_at(a, step, frac):
    """Warm-up by steps, then cosine to 0.1 of the peak over the time budget (frac: the share
    of --minutes spent; the machine is shared, so steps per minute vary)."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = min(1.0, frac)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def stage_train(a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    m, tcfg = load_target(TARGET)
    train, val = prep_streams(a.work)
    dc = drafter_config(a, tcfg)
    pool = build_pool(m, dc, train, a)
    dr = DFlash(dc)
    dr.init_weights()
    opt = torch.optim.AdamW([{"params": [p for p in dr.parameters() if p.dim() >= 2],
                              "weight_decay": a.wd},
                             {"params": [p for p in dr.parameters() if p.dim() < 2],
                              "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))
    ck = os.path.join(a.work, "dflash.pt")
    step, elapsed, hist = 0, 0.0, []
    if os.path.exists(ck):
        st = torch.load(ck)
        dr.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed, hist = st["step"], st["elapsed"], st["hist"]
        log("resumed at step %d" % step)
    log("drafter: %d parameters; up to %d steps or %.0f minutes of %d x %d tokens, %d blocks "
        "of %d per window" % (sum(p.numel() for p in dr.parameters()), a.steps, a.minutes,
                               a.batch, a.seq, a.anchors, a.block_size))
    t_last = time.time()
    budget = a.minutes * 60.0
    while step < a.steps and elapsed < budget:
        t0 = time.time()
        for gp in opt.param_groups:
            gp["lr"] = lr_at(a, step, elapsed / budget)
        g = np.random.default_rng([a.seed, step])
        sel = torch.from_numpy(g.choice(a.pool, a.batch, replace=False))
        loss, ce, acc = losses(m, dr, dc, pool["tokens"][sel], pool["feats"][sel].float(),
                               pool["nxt"][sel], g, a.anchors, a.anchor_from)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dr.parameters(), 1.0)
        opt.step()
        step += 1
        elapsed += time.time() - t0
        rec = {"step": step, "loss": float(loss), "ce": [float(c) for c in ce],
               "agree": [float(x) for x in acc]}
        if step % a.log_every == 0 or step == 1:
            log("step %4d  loss %.4f  ce %s  agree %s  %.2f s/step" % (
                step, rec["loss"], " ".join("%.3f" % c for c in rec["ce"]),
                " ".join("%.3f" % x for x in rec["agree"]),
                (time.time() - t_last) / (a.log_every if step > 1 else 1)))
            t_last = time.time()
        hist.append(rec)
        if step % a.ckpt_every == 0 or step == a.steps or elapsed >= budget:
            torch.save({"model": dr.state_dict(), "opt": opt.state_dict(), "step": step,
                        "elapsed": elapsed, "hist": hist, "cfg": dc, "args": vars(a),
                        "pool_seconds": pool["seconds"]}, ck + ".tmp")
            os.replace(ck + ".tmp", ck)
    log("training done: %d steps, %.1f s" % (step, elapsed))


# ---------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------

def stage_export(a):
    st = torch.load(os.path.join(a.work, "dflash.pt"))
    os.makedirs(a.out, exist_ok=True)
    sd = st["model"]
    order = sorted(sd, key=lambda n: (0 if n.startswith("fc") or n.startswith("hidden_norm")
                                      else 1 if n.startswith("layers.") else 2,
                                      int(n.split(".")[1]) if n.startswith("layers.") else 0, n))
    items = [(n, "BF16", sd[n].shape, tr.bf16_bytes(sd[n])) for n in order]
    tr.write_safetensors(os.path.join(a.out, "model.safetensors"), items)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(st["cfg"], f, indent=2)
        f.write("\n")
    log("exported %s: %d tensors" % (a.out, len(items)))


# ---------------------------------------------------------------------------
# measure: held-out greedy acceptance of the exported (BF16) drafter
# ---------------------------------------------------------------------------

def load_drafter(d):
    dc = json.load(open(os.path.join(d, "config.json")))
    dr = DFlash(dc)
    dr.load_state_dict(read_safetensors(os.path.join(d, "model.safetensors")), strict=True)
    dr.eval()
    return dr, dc


@torch.no_grad()
def stage_measure(a):
    torch.set_num_threads(a.threads)
    m, tcfg = load_target(TARGET)
    _, val = prep_streams(a.work)
    dr, dc = load_drafter(a.out)
    Bs = dc["dflash_config"]["block_size"]
    ids = dc["dflash_config"]["target_layer_ids"]
    P, G, NP = 64, 64, 32                       # evaluate.py's MTP acceptance setup
    offs = [int(k * (len(val) - P - 1) / NP) for k in range(NP)]
    prompts = torch.from_numpy(np.stack([val[o:o + P] for o in offs]).astype(np.int64))
    toks = prompts.clone()
    for _ in range(G):
        _, lg = m(toks)
        toks = torch.cat([toks, lg[:, -1].argmax(-1, keepdim=True)], dim=1)
    T = toks.shape[1]
    feats, _ = target_features(m, ids, toks)
    starts = torch.arange(P, T - Bs + 1)
    drafts = draft_logits(m, dr, dc, toks, feats,
                          starts[None].expand(toks.shape[0], -1).contiguous()).argmax(-1)
    k = Bs - 1
    att, acc = [0] * k, [0] * k
    steps = emitted = 0
    for b in range(toks.shape[0]):
        s = P
        while s + k <= T - 1:
            n_ok = 0
            for d in range(k):
                att[d] += 1
                if int(drafts[b, s - P, d]) == int(toks[b, s + 1 + d]):
                    acc[d] += 1
                    n_ok += 1
                else:
                    break
            steps += 1
            emitted += n_ok + 1
            s += n_ok + 1
    res = {"setup": {"prompts": NP, "prompt_len": P, "generated": G},
           "per_position": [acc[d] / att[d] for d in range(k)], "accepted": acc,
           "attempted": att, "verify_steps": steps, "tokens_per_step": emitted / steps}
    st = torch.load(os.path.join(a.work, "dflash.pt"))
    res["train"] = {"steps": st["step"], "seconds": st["elapsed"], "args": st["args"],
                    "pool_seconds": st.get("pool_seconds", 0.0), "last": st["hist"][-20:]}
    with open(os.path.join(a.out, "metrics.json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    log("held-out greedy acceptance per position %s, %.3f tokens per verify" % (
        " ".join("%.3f" % x for x in res["per_position"]), res["tokens_per_step"]))


# ---------------------------------------------------------------------------
# card
# ---------------------------------------------------------------------------

def stage_card(a):
    mt = json.load(open(os.path.join(a.out, "metrics.json")))
    dc = json.load(open(os.path.join(a.out, "config.json")))
    tr_ = mt["train"]
    ar = tr_["args"]
    n_params = sum(int(np.prod(v.shape)) for v in read_safetensors(
        os.path.join(a.out, "model.safetensors")).values())
    size = os.path.getsize(os.path.join(a.out, "model.safetensors"))
    last = tr_["last"]
    ce = [sum(r["ce"][j] for r in last) / len(last) for j in range(len(last[0]["ce"]))]
    ag = [sum(r["agree"][j] for r in last) / len(last) for j in range(len(last[0]["agree"]))]
    pp = mt["per_position"]
    lines = [
        "# glm-pydoc-tiny DFlash drafter",
        "",
        "A DFlash block drafter (block-diffusion drafting, arXiv 2602.06036; the checkpoint format of "
        "z-lab/dflash's `DFlashDraftModel`) for `models/glm-pydoc-tiny`, trained here on the CPU by "
        "`tools/train/dflash.py` with the target frozen. `lockstep generate --spec dflash` loads it "
        "from `MODEL/dflash` (or `--draft-model DIR`). It has no embeddings and no lm_head of its own: "
        "it uses the target's `model.embed_tokens` and `lm_head`, and the target's tokenizer.",
        "",
        "Every figure below was written by `tools/train/dflash.py` (`metrics.json` holds them).",
        "",
        "## Architecture",
        "",
        "| | |",
        "|---|---|",
        "| `dflash_config` | block_size %d, mask_token_id %d (`[MASK]`), target_layer_ids %s |" % (
            dc["dflash_config"]["block_size"], dc["dflash_config"]["mask_token_id"],
            dc["dflash_config"]["target_layer_ids"]),
        "| context | f_p = [residual after target layer %s] (%d x %d), c_p = hidden_norm(fc f_p), fc [%d, %d] |" % (
            " ; ".join(str(x) for x in dc["dflash_config"]["target_layer_ids"]),
            len(dc["dflash_config"]["target_layer_ids"]), dc["hidden_size"], dc["hidden_size"],
            len(dc["dflash_config"]["target_layer_ids"]) * dc["hidden_size"]),
        "| layers | %d Qwen3-style dense layers: hidden %d, %d heads / %d KV heads, head_dim %d, q/k-norm, "
        "no bias, full half-split RoPE (theta %g), SwiGLU %d |" % (
            dc["num_hidden_layers"], dc["hidden_size"], dc["num_attention_heads"],
            dc["num_key_value_heads"], dc["head_dim"], dc["rope_theta"], dc["intermediate_size"]),
        "| attention | queries: the block's rows; keys/values: the context rows (from c, every layer, no "
        "input_layernorm) then the block's rows (from input_layernorm(x)); not causal within the block |",
        "| block | [last verified token, mask x %d] at positions s .. s+%d; drafts = argmax of the target's "
        "lm_head(norm(x)) at rows 1 .. %d |" % (dc["dflash_config"]["block_size"] - 1,
                                                 dc["dflash_config"]["block_size"] - 1,
                                                 dc["dflash_config"]["block_size"] - 1),
        "| parameters | %d (%.2f MB in BF16) |" % (n_params, size / 1e6),
        "",
        "## Training",
        "",
        "- Data (self-distillation): %d windows of %d real tokens from the target's training split "
        "(the same token stream as `tools/train/train.py`, re-encoded with the shipped tokenizer; "
        "fixed seed), each continued greedily by the frozen target to %d tokens (%.1f minutes, a KV "
        "cache); the target's layer outputs over prompt + continuation are the context features. "
        "Per step %d of these sequences, %d blocks each at random anchors from position %d on "
        "(about two thirds in the generated part), all in one forward (a block mask)." % (
            ar["pool"], ar["prompt"], ar["seq"], tr_.get("pool_seconds", 0) / 60, ar["batch"],
            ar["anchors"], ar["anchor_from"]),
        "- Labels: the token the target itself would emit at each block row given only the tokens "
        "<= s (the drafter sees nothing after s): row k at anchor s is labelled with the target's "
        "arg-max after tokens <= s+k-1, which is the label only where tokens s+1 .. s+k-1 are the "
        "target's own greedy picks. In the generated part that always holds (the label is the "
        "continuation's token s+k); on real text row 1 always counts, rows 2.. only where the real "
        "tokens happen to equal the target's picks (weight 0 otherwise). Cross-entropy weighted "
        "exp(-(k-1)/(B-1)).",
        "- AdamW (0.9 / 0.95, weight decay %g on matrices), peak learning rate %g, %d warm-up steps, "
        "cosine to 0.1 of the peak over a %g-minute budget after the data (the machine is shared: the "
        "budget, not a step count, ends training)." % (ar["wd"], ar["lr"], ar["warmup"], ar["minutes"]),
        "- %d steps in %.1f minutes on two cores (PyTorch on the CPU, `nice`, two threads)." % (
            tr_["steps"], tr_["seconds"] / 60),
        "- Last %d steps, mean: cross-entropy per block row %s; agreement with the label "
        "(where it counts) %s." % (len(last), " / ".join("%.3f" % x for x in ce),
                                  " / ".join("%.3f" % x for x in ag)),
        "",
        "## Acceptance on held-out text",
        "",
        "%d held-out prompts of %d tokens (the target model card's setup); the target continues "
        "greedily for %d tokens; a speculative decoder walks the continuation, drafting %d tokens "
        "per block from the context before the block, accepting drafts while they equal the "
        "target's tokens." % (mt["setup"]["prompts"], mt["setup"]["prompt_len"],
                              mt["setup"]["generated"], len(pp)),
        "",
        "| draft position | " + " | ".join(str(i + 1) for i in range(len(pp))) + " |",
        "|---|" + "---|" * len(pp),
        "| accepted / proposed | " + " | ".join("%d / %d" % (mt["accepted"][i], mt["attempted"][i])
                                               for i in range(len(pp))) + " |",
        "| acceptance (given the earlier drafts) | " + " | ".join("%.3f" % x for x in pp) + " |",
        "",
        "Tokens per verify: %.3f (%d verifies)." % (mt["tokens_per_step"], mt["verify_steps"]),
        "",
        "lockstep's own figures (per-position acceptance equal to the float64 reference "
        "`tests/reference/dflash_ref.py`, tokens/s against mtp and plain decoding) are in the "
        "repository's README and in the test `dflash_compare`.",
        "",
        "## Reproduce",
        "",
        "```sh",
        "W=/tmp/dflash-work",
        "/usr/bin/python3 tools/train/dflash.py train --work $W --minutes %g --pool %d --anchors %d" % (
            ar["minutes"], ar["pool"], ar["anchors"]),
        "/usr/bin/python3 tools/train/dflash.py export --work $W",
        "/usr/bin/python3 tools/train/dflash.py measure --work $W",
        "/usr/bin/python3 tools/train/dflash.py card --work $W",
        "```",
        "",
        "Licence: a work derived from the target model and its corpus (the Python documentation, "
        "PSF-2.0); see `../README.md`.",
        "",
    ]
    with open(os.path.join(a.out, "README.md"), "w") as f:
        f.write("\n".join(lines))
    log("wrote %s" % os.path.join(a.out, "README.md"))


def main(argv):
    p = argparse.ArgumentParser(description="train the DFlash drafter of the default model")
    p.add_argument("stage", choices=["train", "export", "measure", "card"])
    p.add_argument("--work", required=True)
    p.add_argument("--out", default=os.path.join(TARGET, "dflash"))
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--minutes", type=float, default=22.0, help="training time budget")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--anchors", type=int, default=32)
    p.add_argument("--pool", type=int, default=512, help="self-distilled sequences")
    p.add_argument("--prompt", type=int, default=64, help="real tokens before the greedy part")
    p.add_argument("--gen-batch", type=int, default=128)
    p.add_argument("--anchor-from", type=int, default=32,
                   help="first anchor position (anchors before --prompt - 1 are on real text)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--mask-token-id", type=int, default=4065)     # [MASK]
    p.add_argument("--target-layer-ids", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 3])
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--ckpt-every", type=int, default=25)
    a = p.parse_args(argv)
    {"train": stage_train, "export": stage_export, "measure": stage_measure,
     "card": stage_card}[a.stage](a)


if __name__ == "__main__":
    main(sys.argv[1:])
