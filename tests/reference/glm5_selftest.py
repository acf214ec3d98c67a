# SPDX-License-Identifier: MIT
#
# glm5_selftest.py -- checks of tests/reference/glm5_ref.py against itself and
# against a second, torch implementation written in the shape of transformers'
# modular_glm_moe_dsa.py / modular_deepseek_v32.py / modeling_deepseek_v3.py
# (apply_rotary_pos_emb_interleave with its even/odd reordering and
# rotate_half, the indexer's torch.topk over causally masked scores, the
# scatter-built index mask added to the causal mask, eager attention over the
# expanded K/V, route_tokens_to_experts, top-k sharing between layers).
# Runs in well under a minute on 2 cores:
#
#   /usr/bin/python3 tests/reference/glm5_selftest.py
#
# 1. indexer_types schedules (GLM-5: all full; GLM-5.2: freq 4 offset 3).
# 2. absorbed (latent) attention == naive (expanded) attention, full forward.
# 3. index_topk >= context: DSA == dense MLA; index_topk small: they differ
#    and positions are really dropped.
# 4. the incremental engine (chunked prefill, token steps, rollback) == the
#    full forward.
# 5. the torch transformers-shaped model == the numpy reference (float64),
#    with all-full and with shared indexer layers.
# 6. glm5_ref.py's command line end to end (MTP outputs, --dump-topk).

import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_glm5  # noqa: E402
from glm5_ref import Glm5Ref, Engine  # noqa: E402
from glm_ref import read_safetensors as read_safetensors_out  # noqa: E402

FAILS = []


def check(cond, what):
    print("  %-68s %s" % (what, "ok" if cond else "FAIL"))
    if not cond:
        FAILS.append(what)


def gen(out, *args):
    gen_glm5.main(["--out", out] + list(args))


# ---------------------------------------------------------------------------
# The torch model, written from the transformers sources (GLM5.md cites them).
# ---------------------------------------------------------------------------

def torch_forward(m, tokens):
    import torch
    import torch.nn.functional as F
    dt = torch.float64
    W = {k: torch.tensor(v, dtype=dt) for k, v in m.W.items()}
    ids = torch.tensor(np.asarray(tokens))[None]            # [1, S]
    B, S = ids.shape

    def rms(x, w, eps):
        var = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + eps))

    def lin(x, name):
        return F.linear(x, W[name])

    def rotate_half(x):
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def rope_interleave(q, k, cos, sin, unsqueeze_dim=1):
        # DeepseekV3 apply_rotary_pos_emb_interleave: (d/2, 2) -> transpose.
        cos = cos.unsqueeze(unsqueeze_dim)
        sin = sin.unsqueeze(unsqueeze_dim)
        if unsqueeze_dim == 1:
            b, h, s, d = q.shape
            q = q.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
            b, h, s, d = k.shape
            k = k.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
        else:                                                 # [B, S, H, D]
            b, s, h, d = q.shape
            q = q.view(b, s, h, d // 2, 2).transpose(4, 3).reshape(b, s, h, d)
            b, s, h, d = k.shape
            k = k.view(b, s, h, d // 2, 2).transpose(4, 3).reshape(b, s, h, d)
        return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)

    # Rotary embedding (default rope): inv_freq over head_dim = qk_rope_head_dim.
    r = m.r
    inv_freq = 1.0 / (m.theta ** (torch.arange(0, r, 2, dtype=dt) / r))
    pos = torch.arange(S, dtype=dt)[None]
    freqs = (inv_freq[None, :, None] @ pos[:, None, :]).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()                           # [1, S, r]

    causal = torch.full((S, S), float("-inf"), dtype=dt).triu(1)[None, None]   # [1,1,S,S]

    x = W["model.embed_tokens.weight"][ids]
    prev_topk = None
    for L in range(m.N):
        p = "model.layers.%d." % L
        a = p + "self_attn."
        resid = x
        hs = rms(x, W[p + "input_layernorm.weight"], m.eps)
        q_resid = rms(lin(hs, a + "q_a_proj.weight"), W[a + "q_a_layernorm.weight"], m.lora_eps)
        q_states = lin(q_resid, a + "q_b_proj.weight").view(B, S, -1, m.qk).transpose(1, 2)
        q_pass, q_rot = torch.split(q_states, [m.nope, m.r], dim=-1)
        ckv = lin(hs, a + "kv_a_proj_with_mqa.weight")
        kv_pass, k_rot = torch.split(ckv, [m.kv_lora, m.r], dim=-1)
        k_pass = rms(kv_pass, W[a + "kv_a_layernorm.weight"], m.lora_eps).view(B, 1, S, m.kv_lora)
        k_rot = k_rot.view(B, 1, S, m.r)
        q_rot, k_rot = rope_interleave(q_rot, k_rot, cos, sin)
        query = torch.cat((q_pass, q_rot), dim=-1)
        # expand_kv: kv_b_proj on the latent, per-head nope keys and values.
        kv = F.linear(k_pass, W[a + "kv_b_proj.weight"]).view(B, S, -1, m.nope + m.vd).transpose(1, 2)
        k_nope, value = torch.split(kv, [m.nope, m.vd], dim=-1)
        key = torch.cat((k_nope, k_rot.expand(-1, m.nh, -1, -1)), dim=-1)

        if m.indexer_full[L]:
            ia = a + "indexer."
            q = lin(q_resid, ia + "wq_b.weight").view(B, S, m.ih, m.idim)
            qr, qp = torch.split(q, [m.r, m.idim - m.r], dim=-1)
            k = F.layer_norm(lin(hs, ia + "wk.weight"), (m.idim,), W[ia + "k_norm.weight"],
                             W[ia + "k_norm.bias"], eps=1e-6).unsqueeze(2)
            kr, kp = torch.split(k, [m.r, m.idim - m.r], dim=-1)
            qr, kr = rope_interleave(qr, kr, cos, sin, unsqueeze_dim=2)
            q = torch.cat([qr, qp], dim=-1)
            k = torch.cat([kr, kp], dim=-1).squeeze(2)
            scores = torch.matmul(q, k.transpose(-1, -2).unsqueeze(1)) * m.idim ** -0.5
            scores = F.relu(scores)                                        # [B,S,H,T]
            weights = lin(hs, ia + "weights_proj.weight") * (m.ih ** -0.5)
            index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)
            index_scores = index_scores + causal[:, 0]
            topk = min(m.index_topk, index_scores.shape[-1])
            topk_idx = index_scores.topk(topk, dim=-1).indices
            prev_topk = topk_idx
        else:
            topk_idx = prev_topk
        index_mask = torch.ones((B, S, S), dtype=torch.bool).scatter(-1, topk_idx, False).unsqueeze(1)
        mask = causal.masked_fill(index_mask, torch.finfo(dt).min)
        aw = torch.matmul(query, key.transpose(2, 3)) * (m.qk ** -0.5) + mask
        aw = torch.softmax(aw, dim=-1)
        out = torch.matmul(aw, value).transpose(1, 2).reshape(B, S, -1)
        x = resid + lin(out, a + "o_proj.weight")

        resid = x
        h2 = rms(x, W[p + "post_attention_layernorm.weight"], m.eps)
        if not m.moe_layer[L]:
            y = lin(F.silu(lin(h2, p + "mlp.gate_proj.weight")) * lin(h2, p + "mlp.up_proj.weight"),
                    p + "mlp.down_proj.weight")
        else:
            hf = h2.view(-1, m.H)
            logits = F.linear(hf, W[p + "mlp.gate.weight"]).sigmoid()
            choice = logits + W[p + "mlp.gate.e_score_correction_bias"]
            E = m.E
            gs = choice.view(-1, m.n_group, E // m.n_group).topk(2, dim=-1)[0].sum(dim=-1)
            gidx = torch.topk(gs, k=m.topk_group, dim=-1, sorted=False)[1]
            gmask = torch.zeros_like(gs).scatter_(1, gidx, 1)
            smask = gmask.unsqueeze(-1).expand(-1, m.n_group, E // m.n_group).reshape(-1, E)
            choice = choice.masked_fill(~smask.bool(), float("-inf"))
            tki = torch.topk(choice, k=m.topk, dim=-1, sorted=False)[1]
            tkw = logits.gather(1, tki)
            if m.norm_topk:
                tkw = tkw / (tkw.sum(dim=-1, keepdim=True) + 1e-20)
            tkw = tkw * m.scale
            y = torch.zeros_like(hf)
            for t in range(hf.shape[0]):
                for j in range(m.topk):
                    e = int(tki[t, j])
                    ep = p + "mlp.experts.%d." % e
                    g = F.linear(hf[t], W[ep + "gate_proj.weight"])
                    u = F.linear(hf[t], W[ep + "up_proj.weight"])
                    y[t] += tkw[t, j] * F.linear(F.silu(g) * u, W[ep + "down_proj.weight"])
            if m.n_shared:
                sp = p + "mlp.shared_experts."
                y = y + lin(F.silu(lin(hf, sp + "gate_proj.weight")) * lin(hf, sp + "up_proj.weight"),
                            sp + "down_proj.weight")
            y = y.view(B, S, m.H)
        x = resid + y
    x = rms(x, W["model.norm.weight"], m.eps)
    return F.linear(x, W["lm_head.weight"])[0].numpy()


def main():
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="glm5_selftest.")
    rng = np.random.default_rng(7)

    print("1. indexer_types schedules")
    o = dict(gen_glm5.DEFAULTS, layers=78, index_topk_freq=4, index_skip_topk_offset=3)
    full = [i for i, t in enumerate(gen_glm5.indexer_types(o)) if t == "full"]
    check(full == [0, 1, 2] + list(range(6, 78, 4)), "GLM-5.2 freq 4 offset 3: full at 0,1,2,6,10,...,74 (21)")
    o = dict(gen_glm5.DEFAULTS, layers=78)
    check(all(t == "full" for t in gen_glm5.indexer_types(o)), "GLM-5 defaults (freq 1, offset 2): all full")

    # Models: A all-full f32 (16 indexer heads: no exact-zero index ties);
    # B shared indexer layers FSSF, f32, grouped routing.
    A = os.path.join(tmp, "A")
    gen(A, "--dtype", "f32", "--seed", "3", "--layers", "3", "--index-heads", "16")
    B = os.path.join(tmp, "B")
    gen(B, "--dtype", "f32", "--seed", "4", "--layers", "4", "--index-topk-pattern", "FSSF",
        "--index-heads", "16", "--experts", "8", "--n-group", "4", "--topk-group", "2",
        "--topk", "3", "--first-dense", "1", "--write-indexer-types", "1")
    for name, d in (("A (all full)", A), ("B (FSSF, grouped routing)", B)):
        m = Glm5Ref(d)
        toks = rng.integers(0, m.V, 48)
        print("2-4. model %s" % name)
        hn, lg = m.forward(toks)
        _, lg_abs = m.forward(toks, absorbed=True)
        check(np.abs(lg - lg_abs).max() < 1e-10, "absorbed == naive attention (max %.1e)"
              % np.abs(lg - lg_abs).max())
        m.reset_index_stats()
        m.forward(toks)
        check(m.index_dropping_queries > 0 and m.index_boundary_ties == 0,
              "index_topk=%d drops positions (%d queries), no boundary ties"
              % (m.index_topk, m.index_dropping_queries))
        _, lg_dense = m.forward(toks, dense_mla=True)
        check(np.abs(lg - lg_dense).max() > 1e-3, "sparse != dense when positions are dropped (%.2g)"
              % np.abs(lg - lg_dense).max())
        k0 = m.index_topk
        m.index_topk = len(toks)
        _, lg_all = m.forward(toks)
        check(np.abs(lg_all - lg_dense).max() < 1e-12, "index_topk >= context: DSA == dense MLA")
        m.index_topk = k0
        # Engine: chunked prefill + steps + rollback.
        eng = Engine(m)
        rows = []
        for a_, b_ in ((0, 5), (5, 22), (22, 23), (23, 40)):
            rows.append(eng.run(toks[a_:b_])[1])
        for t in range(40, 48):
            rows.append(eng.run(toks[t:t + 1])[1])
        el = np.concatenate(rows)
        check(np.abs(el - lg).max() < 1e-10, "engine chunked 5/17/1/17 + 8 steps == full forward (%.1e)"
              % np.abs(el - lg).max())
        eng.truncate(30)
        r2 = eng.run(toks[30:48])[1]
        check(np.abs(r2 - lg[30:]).max() < 1e-10, "engine rollback to 30 and re-run == full forward")
        print("5. torch (transformers-shaped) vs numpy, model %s" % name)
        try:
            import torch  # noqa: F401
        except ImportError:
            print("  SKIPPED: no torch for /usr/bin/python3 (apt-get install python3-torch)")
            continue
        lt = torch_forward(m, toks)
        check(np.abs(lt - lg).max() < 1e-10, "torch float64 == numpy (max %.1e)" % np.abs(lt - lg).max())

    print("6. glm5_ref.py command line")
    C = os.path.join(tmp, "C")
    gen(C, "--dtype", "bf16", "--seed", "5", "--layers", "3", "--index-topk-freq", "2",
        "--index-skip-topk-offset", "1")
    out, dump = os.path.join(C, "exp.safetensors"), os.path.join(C, "topk.safetensors")
    r = subprocess.run([sys.executable, os.path.join(HERE, "glm5_ref.py"), "--model", C, "--out", out,
                        "--prompt-len", "40", "--gen", "12", "--chain", "3", "--dump-topk", dump],
                       capture_output=True, text=True)
    check(r.returncode == 0, "glm5_ref.py exits 0")
    if r.returncode == 0:
        e = read_safetensors_out(out)
        check(e["tokens"].shape == (53,) and e["logits"].shape == (52, 512)
              and e["mtp_logits"].shape == (51, 512) and e["mtp_chain_logits"].shape == (3, 3, 512),
              "output shapes (tokens, logits, mtp_logits, mtp_chain_logits)")
        d = read_safetensors_out(dump)
        check(sorted(d) == ["mtp_topk", "topk.0", "topk.1", "topk.2"], "dump names: topk.L + mtp_topk")
        t1 = d["topk.1"]
        check(np.array_equal(t1, d["topk.0"]), "shared layer 1 repeats layer 0's selection (FSF)")
        ok = all(set(t1[t][t1[t] >= 0]) <= set(range(t + 1)) and (t1[t] >= 0).sum() == min(8, t + 1)
                 for t in range(t1.shape[0]))
        check(ok, "selections causal, min(index_topk, t+1) per row")
    else:
        print(r.stdout, r.stderr)

    print("%s in %.1f s (%s)" % ("FAILED: %d" % len(FAILS) if FAILS else "all passed",
                                 time.time() - t0, tmp))
    if not FAILS:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
