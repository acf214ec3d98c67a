# SPDX-License-Identifier: MIT
#
# finetune_tools.py -- trains glm-pydoc-tools, a model that answers a request with tools with a
# GLM-4.5/4.6 tool call and a tool's result with an answer that uses it.  Stages:
#
#   data    synthetic conversations from fixed-seed generators (toolcall_data.py), rendered by
#           GLM-4.6's chat template and tokenized (render_chat.mjs: @huggingface/jinja and
#           Hugging Face's JS tokenizers, which lockstep's renderer and tokenizer equal), with a
#           loss mask on the assistant turns; a slice of the original corpus    -> WORK/
#           (check_render.py checks that lockstep's server renders the same tokens)
#   train   --init base: from the BF16 weights of the base model (models/glm-pydoc-tiny);
#           --init primed: from scratch in the base's tokenizer and layer shapes with 4 heads of
#           128 and a copying circuit written in (prime_copy), as the shipped model is;
#           next-token + MTP loss on the assistant turns (and, with --corpus-batch, on corpus
#           windows so a fine-tuned base does not forget it)                  -> WORK/ckpt.pt
#   export  Hugging Face layout, BF16 (e_score_correction_bias F32)            -> OUT/
#
# evaluate_tools.py then measures the exported weights (tool-call accuracy on held-out prompts).
#
# Usage: /usr/bin/python3 tools/train/finetune_tools.py {data,train,export} --work DIR [options]

import argparse
import json
import math
import os
import pickle
import shutil
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import bpe  # noqa: E402
import glm  # noqa: E402
import toolcall_data as td  # noqa: E402
from check_render import render, special_ids  # noqa: E402
import train as tr  # noqa: E402
from evaluate import read_safetensors  # noqa: E402


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def assistant_mask(ids, sp):
    """1 for every token the model writes in an assistant turn: after <|assistant|> up to and
    including the token that ends the turn (<|observation|>, <|user|> or <|endoftext|>)."""
    ends = {sp["<|observation|>"], sp["<|user|>"], sp["<|endoftext|>"]}
    m = np.zeros(len(ids), dtype=np.uint8)
    inside = False
    for i, t in enumerate(ids):
        if inside:
            m[i] = 1
            if t in ends:
                inside = False
        elif t == sp["<|assistant|>"]:
            inside = True
    return m


def stage_data(a):
    os.makedirs(a.work, exist_ok=True)
    sp = special_ids(a.base)
    eot = sp["<|endoftext|>"]
    groups = td.training_groups(a.n_groups, a.batch, a.seed, a.synth)
    log("data: rendering %d groups of %d training conversations" % (len(groups), a.batch))
    rows = render(a.base, [c for grp in groups for c in grp])
    data, lens, n_asst, n_prefix = [], [], 0, []
    for k in range(len(groups)):
        rs = [r + [eot] for r in rows[k * a.batch:(k + 1) * a.batch]]
        # the prefix the group shares: at most up to its first <|user|> (inclusive)
        P = min(r.index(sp["<|user|>"]) + 1 for r in rs)
        while any(r[:P] != rs[0][:P] for r in rs):
            P -= 1
        S = max(len(r) for r in rs) - P
        suf = np.full((len(rs), S), eot, dtype=np.int32)
        msk = np.zeros((len(rs), S), dtype=np.uint8)
        for i, r in enumerate(rs):
            m = assistant_mask(r, sp)
            assert m[:P].sum() == 0
            suf[i, :len(r) - P] = r[P:]
            msk[i, :len(r) - P] = m[P:]
            lens.append(len(r))
            n_asst += int(m.sum())
        data.append((np.array(rs[0][:P], dtype=np.int32), suf, msk))
        n_prefix.append(P)
    with open(os.path.join(a.work, "groups_synth.pkl" if a.synth else "groups.pkl"), "wb") as f:
        pickle.dump(data, f)
    log("data: %d conversations of %d-%d tokens (mean %.0f), %.1f assistant tokens each; shared "
        "prefixes of %d-%d tokens (mean %.0f)" % (len(lens), min(lens), max(lens), np.mean(lens),
                                                  n_asst / len(lens), min(n_prefix),
                                                  max(n_prefix), np.mean(n_prefix)))
    stats = {"n_conversations": len(lens), "group_size": a.batch, "tokens_min": min(lens),
             "tokens_max": max(lens), "tokens_mean": float(np.mean(lens)),
             "assistant_tokens_mean": n_asst / len(lens),
             "shared_prefix_mean": float(np.mean(n_prefix))}
    if a.synth:
        json.dump(stats, open(os.path.join(a.work, "data_synth.json"), "w"), indent=1)
        return
    # The original corpus: the training files of train.py's split (same seed), as many as
    # --corpus-bytes, encoded by bpe.py's encoder (equal to Hugging Face's, checked by train.sh).
    fs = tr.corpus_files()
    train_f, _ = tr.split_files(fs, 1234, 0.05)
    tj = json.load(open(os.path.join(a.base, "tokenizer.json"), encoding="utf-8"))
    enc = bpe.Encoder(tj["model"]["vocab"], [tuple(m.split(" ")) for m in tj["model"]["merges"]])
    order = train_f[:]
    np.random.default_rng(a.seed).shuffle(order)
    stream, nbytes = [], 0
    for f in order:
        t = open(f, encoding="utf-8").read()
        stream.extend(enc.encode(t))
        stream.append(eot)
        nbytes += len(t.encode())
        if nbytes >= a.corpus_bytes:
            break
    np.save(os.path.join(a.work, "corpus.npy"), np.array(stream, dtype=np.int32))
    log("data: corpus slice %d bytes, %d tokens" % (nbytes, len(stream)))
    json.dump(dict(stats, corpus_bytes=nbytes, corpus_tokens=len(stream)),
              open(os.path.join(a.work, "data.json"), "w"), indent=1)


def masked_losses(model, win, mask):
    """win [B, T+1], mask [B, T+1] (1: a token the loss covers) -> (main CE, MTP CE), each the
    mean over the covered targets.  lm_head runs only at the positions whose target is covered
    (a tenth of a conversation's tokens): the same loss, a third less compute."""
    x, y = win[:, :-1], win[:, 1:]
    hn, _ = forward_hidden(model, x)
    sel = mask[:, 1:].bool()
    main = torch.nn.functional.cross_entropy(model.lm_head(hn[sel]), y[sel])
    u = model.mtp_input(hn[:, :-1], x[:, 1:])
    hs = mtp_hidden(model, u)
    sel2 = mask[:, 2:].bool()
    mtp = torch.nn.functional.cross_entropy(model.lm_head(hs[sel2]), win[:, 2:][sel2])
    return main, mtp


def forward_hidden(model, tokens):
    """glm.Glm4Moe.forward without lm_head: hn [B, T, H]."""
    B, T = tokens.shape
    x = model.model.embed_tokens(tokens)
    cos, sin = glm.rope_tables(model.cfg, torch.arange(T), x.dtype)
    mask = model.causal(T, x.device)
    for L in range(model.N):
        x = model.model.layers[L](x, cos, sin, mask)
    return model.model.norm(x), None


def mtp_hidden(model, u):
    """glm.Glm4Moe.mtp_layer without lm_head: shared_head.norm(z) [B, T, H]."""
    m = model.model.layers[model.N]
    T = u.shape[1]
    cos, sin = glm.rope_tables(model.cfg, torch.arange(T), u.dtype)
    return m.shared_head.norm(m(u, cos, sin, model.causal(T, u.device)))


def shared_layer(layer, xp, xs, rp, rs):
    """One decoder layer over a shared prefix xp [1, P, H] and its G continuations
    xs [G, S, H] (positions P..P+S-1): the same as the layer over the G whole sequences, with
    the prefix computed once.  rp, rs: the RoPE tables of the two spans."""
    att = layer.self_attn
    G, S, H = xs.shape
    P = xp.shape[1]
    qp, kp, vp = att.qkv(layer.input_layernorm(xp), *rp)
    qs, ks, vs = att.qkv(layer.input_layernorm(xs), *rs)
    ap = att.attend(qp, kp, vp, glm.Glm4Moe.causal(P, xp.device))
    k = torch.cat([kp.expand(G, -1, -1, -1), ks], dim=2)
    v = torch.cat([vp.expand(G, -1, -1, -1), vs], dim=2)
    m = torch.cat([torch.zeros(S, P, dtype=torch.bool), glm.Glm4Moe.causal(S, xs.device)], dim=1)
    xp, xs = xp + ap, xs + att.attend(qs, k, v, m)
    flat = torch.cat([xp.reshape(-1, H), xs.reshape(-1, H)])   # the FFN is per token
    y = layer.mlp(layer.post_attention_layernorm(flat))
    return xp + y[:P][None], xs + y[P:].view(G, S, H)


def group_losses(model, pre, suf, msk):
    """pre [P] (the shared prefix), suf [G, S], msk [G, S] (1: a target the loss covers; none
    in the prefix) -> (main CE, MTP CE), means over the covered targets: equal to
    masked_losses on the G whole sequences."""
    cfg, N = model.cfg, model.N
    P, S = pre.shape[0], suf.shape[1]
    rope = lambda a, b: glm.rope_tables(cfg, torch.arange(a, b), torch.float32)
    xp, xs = model.model.embed_tokens(pre[None]), model.model.embed_tokens(suf)
    rp, rs = rope(0, P), rope(P, P + S)
    for L in range(N):
        xp, xs = shared_layer(model.model.layers[L], xp, xs, rp, rs)
    hp, hs = model.model.norm(xp), model.model.norm(xs)
    sel = msk[:, 1:].bool()                 # suffix position j predicts suf[j + 1]
    main = torch.nn.functional.cross_entropy(model.lm_head(hs[:, :-1][sel]), suf[:, 1:][sel])
    # MTP: u_i = (h_i, t_{i+1}) predicts t_{i+2}; the shared part is u_0..u_{P-2}; u_{P-1+j}
    # = (h_{P-1+j}, suf[j]) predicts suf[j + 1], the target of the main head at j.
    G = suf.shape[0]
    up = model.mtp_input(hp[:, :P - 1], pre[None, 1:])
    hcat = torch.cat([hp[:, P - 1:].expand(G, -1, -1), hs[:, :S - 2]], dim=1)
    us = model.mtp_input(hcat, suf[:, :S - 1])
    mp, ms = shared_layer(model.model.layers[N], up, us, rope(0, P - 1), rope(P - 1, P + S - 2))
    zs = model.model.layers[N].shared_head.norm(ms)
    mtp = torch.nn.functional.cross_entropy(model.lm_head(zs[sel]), suf[:, 1:][sel])
    return main, mtp


def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def primed_config(base):
    """--init primed: the base model's config (tokenizer, layers, experts, MTP layer) with
    4 heads of 128 (4 KV heads) and no q/k norms, so that a head's scores can be as sharp as
    copying needs (the base's normed heads of 32 bound a score near 7) and a head has 64
    dims of content to match two tokens on."""
    cfg = dict(base)
    cfg.update(head_dim=128, num_attention_heads=4, num_key_value_heads=4, use_qk_norm=False)
    return cfg


def prime_copy(model, seed, vocab, a=15.0, s=2.3, c=1.6, f=2.0, g0=0.5, g1=0.7):
    """Writes a copying circuit into a freshly initialised model (--init primed), which the
    training then learns to use: gradient descent on these 2 cores did not find one in a few
    hundred steps (earlier runs; the model card).  The residual stream's dims: E = 0..63 the
    token's embedding (random; the embedding's other dims 0), P = 64..127 the previous token's,
    C = 128..191 the copied token's, Q = 192..223 the token before the previous one's (seen
    through a random 32 x 64 projection R2), 224 the space flag, 225 the copied one's, the
    rest free.
    - layer 0, heads 0 and 1 (the previous token, the one before it): q and k are biases only,
      on the rotary dims, k's pairs turned by one (two) steps' angle, so at distance d
      q.k = a^2 sum_j cos((d - 1 (2)) theta_j): largest at d = 1 (2), by about 20 logits over
      the neighbouring distances; v is E; o_proj writes head 0's to P (gain g0) and head 1's,
      through R2, to Q;
    - layer 1, head 0 (induction): on the non-rotary dims, q = (s R E, s R2 P) and
      k = (s R P, s Q), R a random 32 x 64 orthonormal projection: at position i it reads
      the position j whose two previous tokens are the tokens at i - 1 and i, so a repeated
      token or pair inside a name does not send the copy back; v is E at j, written to C
      (gain g1);
    - layer 2, heads 0 and 1, and layer 3, head 0 (pointers): v is E, written to C, q and k
      left random: what they learn is where to copy from (the argument in the request, the
      result in the observation);
    - lm_head reads C: token t's row is c times t's unit embedding there, so a copied token's
      logit leads the rest by about 5 c;
    - a token "Gx" (x after a space) and the token "x" share E and their row on C (an
      argument's first piece is "x" after <arg_value> where the request has " x"); dim 224
      of the embedding is +1 for the tokens after a space and -1 for the others, so they
      stay apart elsewhere; the copying heads carry it to dim 225 (gain g1), which lm_head
      reads as f (+1 after a space, -1 not): a copy keeps the source's form, by about
      3 f logits, unless the context learns to turn it.
    copy_check gives what the circuit does; the training logs it every 50 steps."""
    cfg = model.cfg
    hd, V = cfg["head_dim"], cfg["vocab_size"]
    r = int(round(hd * cfg["partial_rotary_factor"]))
    half = r // 2
    th = cfg["rope_theta"] ** (-2.0 * torch.arange(half, dtype=torch.float64) / r)
    E, P, C, Q = slice(0, 64), slice(64, 128), slice(128, 192), slice(192, 224)
    head = lambda h: slice(h * hd, (h + 1) * hd)
    g = torch.Generator().manual_seed(seed)
    base = torch.arange(V)
    space = torch.zeros(V)
    for tok, i in vocab.items():
        if tok.startswith("\u0120") and len(tok) > 1 and i < V:
            space[i] = 1
            if tok[1:] in vocab:
                base[i] = vocab[tok[1:]]
    orth = lambda: torch.linalg.qr(torch.randn(64, 32, generator=g))[0].T   # 32 x 64
    with torch.no_grad():
        e = torch.randn(V, 64, generator=g)[base]
        R, R2 = orth(), orth()
        emb = model.model.embed_tokens.weight
        emb.zero_()
        emb[:, E] = e
        emb[:, 224] = 2 * space - 1
        # every primed head: q, k, v zero but for what is set below; o_proj's input zero
        primed = [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (3, 0)]
        for L, h in primed:
            att = model.model.layers[L].self_attn
            for w in (att.v_proj,) + ((att.q_proj, att.k_proj) if L < 2 else ()):
                w.weight[head(h)] = 0
                w.bias[head(h)] = 0
            b = head(h).start
            att.v_proj.weight[b:b + 64, E] = torch.eye(64)
            att.o_proj.weight[:, head(h)] = 0
            if L >= 1:
                att.v_proj.weight[b + 64, 224] = 1
                att.o_proj.weight[225, b + 64] = g1
            if L >= 2:
                att.o_proj.weight[C, b:b + 64] = g1 * torch.eye(64)
        A0, A1 = model.model.layers[0].self_attn, model.model.layers[1].self_attn
        for h, steps in ((0, 1), (1, 2)):
            b = head(h).start
            A0.q_proj.bias[b:b + half] = a
            A0.k_proj.bias[b:b + half] = (a * torch.cos(steps * th)).float()
            A0.k_proj.bias[b + half:b + r] = (a * torch.sin(steps * th)).float()
        A0.o_proj.weight[P, 0:64] = g0 * torch.eye(64)
        A0.o_proj.weight[Q, hd:hd + 64] = g0 * R2
        A1.q_proj.weight[r:r + 32, E] = s * R
        A1.q_proj.weight[r + 32:r + 64, P] = s * R2
        A1.k_proj.weight[r:r + 32, P] = s * R
        A1.k_proj.weight[r + 32:r + 64, Q] = s * torch.eye(32)
        A1.o_proj.weight[C, 0:64] = g1 * torch.eye(64)
        model.lm_head.weight[:, C] = c * e / e.norm(dim=1, keepdim=True)
        model.lm_head.weight[:, 225] = f * (2 * space - 1)


def copy_check(model, seed=5, prefix=300, n=150, alphabet=4000):
    """Fraction of a repeated random sequence's second copy (tokens below alphabet) that the
    model predicts (greedy), after a random prefix: what the copying circuit does."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, alphabet, (4, n), generator=g)
    x = torch.cat([torch.randint(0, 4000, (4, prefix), generator=g), seq, seq], 1)
    with torch.no_grad():
        _, lg = model(x)
    return float((lg[:, prefix + n:-1].argmax(-1) == x[:, prefix + n + 1:]).float().mean())


def stage_train(a):
    tr.set_determinism(a.threads)
    torch.manual_seed(a.seed)
    cfg = json.load(open(os.path.join(a.base, "config.json")))
    if a.init == "primed":
        cfg = primed_config(cfg)
        model = glm.Glm4Moe(cfg)
        model.init_weights()
        vocab = json.load(open(os.path.join(a.base, "tokenizer.json"), encoding="utf-8"))
        prime_copy(model, a.seed, vocab["model"]["vocab"])
    else:
        model = glm.Glm4Moe(cfg)
        model.load_state_dict(read_safetensors(os.path.join(a.base, "model.safetensors")),
                              strict=True)
    model = model.float()
    log("init %s: copies %.3f of a repeated random sequence" % (a.init, copy_check(model)))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    data = {}
    for name in ("groups", "groups_synth"):
        if os.path.exists(os.path.join(a.work, name + ".pkl")):
            with open(os.path.join(a.work, name + ".pkl"), "rb") as f:
                data[name] = pickle.load(f)
    groups = data["groups"]
    corpus = np.load(os.path.join(a.work, "corpus.npy"))
    ck = os.path.join(a.work, "ckpt.pt")
    step, elapsed, hist = 0, 0.0, []
    if os.path.exists(ck):
        st = torch.load(ck)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed, hist = st["step"], st["elapsed"], st["hist"]
        log("resumed at step %d" % step)
    log("fine-tuning: %d steps of a group of %d conversations + %d corpus windows of %d tokens; "
        "%d groups" % (a.steps, groups[0][1].shape[0], a.corpus_batch, a.corpus_seq, len(groups)))
    moes = model.moe_layers()
    model.train()
    t_last = time.time()
    while step < a.steps:
        t0 = time.time()
        for gp in opt.param_groups:
            gp["lr"] = lr_at(a, step)
        g = np.random.default_rng([a.seed, step])
        # which data this step draws from (--synth-from)
        src = "groups_synth" if a.synth_from and step >= a.synth_from else "groups"
        pool = data[src]
        pre, suf, msk = pool[int(g.integers(0, len(pool)))]
        main, mtp = group_losses(model, torch.from_numpy(pre.astype(np.int64)),
                                 torch.from_numpy(suf.astype(np.int64)),
                                 torch.from_numpy(msk.astype(np.int64)))
        loss = main + a.mtp_weight * mtp
        cmain = cmtp = torch.zeros(())
        if a.corpus_batch and step % a.corpus_every == 0:
            C = a.corpus_seq
            starts = g.integers(0, len(corpus) - C - 1, a.corpus_batch)
            cw = torch.from_numpy(np.stack([corpus[s:s + C + 1] for s in starts]).astype(np.int64))
            cmain, cmtp = masked_losses(model, cw, torch.ones_like(cw))
            loss = loss + a.corpus_weight * (cmain + a.mtp_weight * cmtp)
        cp = torch.zeros(())
        if a.copy_batch:
            # copying practice, which keeps the circuit general while the tool data narrows
            # it: a random ordinary-token sequence after a random prefix, repeated; the loss
            # covers the repeat (but its first token, which nothing announces)
            gc = torch.Generator().manual_seed(a.seed * 100003 + step)
            L = a.copy_len
            seq = torch.randint(0, a.copy_vocab, (a.copy_batch, L), generator=gc)
            pre = torch.randint(0, a.copy_vocab, (a.copy_batch, L // 2), generator=gc)
            cw = torch.cat([pre, seq, seq], 1)
            cm = torch.zeros_like(cw)
            cm[:, L // 2 + L + 1:] = 1
            cp, cpm = masked_losses(model, cw, cm)
            loss = loss + a.copy_weight * (cp + a.mtp_weight * cpm)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        imb = tr.balance_experts(moes, a.bias_u)
        step += 1
        elapsed += time.time() - t0
        rec = {"step": step, "data": src, "loss": float(main), "mtp": float(mtp),
               "corpus_loss": float(cmain), "corpus_mtp": float(cmtp), "copy_loss": float(cp),
               "gn": float(gn), "lr": lr_at(a, step - 1), "max_load": max(imb)}
        hist.append(rec)
        if step % a.log_every == 0 or step == 1:
            log("step %4d  tool loss %.4f  mtp %.4f  corpus loss %.4f  mtp %.4f  copy loss %.4f  "
                "gnorm %.2f  lr %.2e  %.2f s/step" % (step, rec["loss"], rec["mtp"],
                                                     rec["corpus_loss"], rec["corpus_mtp"],
                                                     rec["copy_loss"], rec["gn"], rec["lr"],
                                          (time.time() - t_last) / (a.log_every if step > 1 else 1)))
            t_last = time.time()
        if a.init == "primed" and step % 50 == 0:
            model.eval()
            log("step %4d  copies %.3f of a repeated random sequence"
                % (step, copy_check(model)))
            model.train()
        if step % a.ckpt_every == 0 or step == a.steps:
            tmp = ck + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "elapsed": elapsed, "hist": hist, "cfg": cfg, "args": vars(a)}, tmp)
            os.replace(tmp, ck)
    log("fine-tuning done: %d steps, %.1f s of training compute" % (step, elapsed))


def stage_export(a):
    st = torch.load(os.path.join(a.work, "ckpt.pt"))
    os.makedirs(a.out, exist_ok=True)
    sd = st["model"]
    items = []
    for name in sorted(sd, key=tr.hf_order):
        t = sd[name]
        if name.endswith("e_score_correction_bias"):
            items.append((name, "F32", t.shape, t.float().contiguous().numpy().astype("<f4").tobytes()))
        else:
            items.append((name, "BF16", t.shape, tr.bf16_bytes(t)))
    tr.write_safetensors(os.path.join(a.out, "model.safetensors"), items)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(st["cfg"], f, indent=2)
        f.write("\n")
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(a.base, f), os.path.join(a.out, f))
    log("exported %s: %d tensors" % (a.out, len(items)))


def main(argv):
    p = argparse.ArgumentParser(description="fine-tune the default model on tool-call transcripts")
    p.add_argument("stage", choices=["data", "train", "export"])
    p.add_argument("--work", required=True)
    p.add_argument("--base", default=os.path.join(ROOT, "models", "glm-pydoc-tiny"))
    p.add_argument("--init", choices=["base", "primed"], default="base",
                   help="train: from the base model's weights, or from scratch with a copying "
                   "circuit written in (prime_copy), the base's tokenizer and layer shapes")
    p.add_argument("--out", default=os.path.join(ROOT, "models", "glm-pydoc-tools"))
    p.add_argument("--seed", type=int, default=4321)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-groups", type=int, default=500)
    p.add_argument("--synth", action="store_true", help="data: the groups with made-up values "
                   "(every other conversation), groups_synth.pkl")
    p.add_argument("--synth-from", type=int, default=0, help="train: draw from groups_synth.pkl "
                   "from this step on (0: never)")
    p.add_argument("--corpus-bytes", type=int, default=1500000)
    p.add_argument("--seq", type=int, default=480)
    p.add_argument("--steps", type=int, default=44)
    p.add_argument("--batch", type=int, default=8, help="conversations per group (and step)")
    p.add_argument("--corpus-batch", type=int, default=1)
    p.add_argument("--corpus-seq", type=int, default=256)
    p.add_argument("--corpus-every", type=int, default=4, help="a corpus window every N steps")
    p.add_argument("--corpus-weight", type=float, default=0.5)
    p.add_argument("--copy-batch", type=int, default=0, help="train: copying practice "
                   "sequences a step (0: none)")
    p.add_argument("--copy-len", type=int, default=48)
    p.add_argument("--copy-vocab", type=int, default=4064, help="copying practice draws "
                   "tokens below this id (the ordinary tokens)")
    p.add_argument("--copy-weight", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr-frac", type=float, default=1.0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--wd", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--mtp-weight", type=float, default=0.3)
    p.add_argument("--bias-u", type=float, default=1e-3)
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--ckpt-every", type=int, default=1)
    a = p.parse_args(argv)
    {"data": stage_data, "train": stage_train, "export": stage_export}[a.stage](a)


if __name__ == "__main__":
    main(sys.argv[1:])
