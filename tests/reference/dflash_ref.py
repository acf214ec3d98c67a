# SPDX-License-Identifier: MIT
#
# dflash_ref.py -- the exact acceptance counts of GREEDY speculative decoding with a DFlash
# block drafter (arXiv 2602.06036; the checkpoint format of z-lab/dflash), in float64 from the
# drafter's checkpoint and the target's (glm_ref.py / spec_ref.py in this directory), independent
# of lockstep's C code.
#
# Usage:
#   /usr/bin/python3 tests/reference/dflash_ref.py --model DIR --draft DIR --k K \
#       --n-gen N --prompts FILE --out OUT.json
#
# The drafter (the card of models/glm-pydoc-tiny/dflash has the same description):
#   features f_p = [x_p after target layer L for L in dflash_config.target_layer_ids]
#   (the residual stream after the layer, before model.norm), c_p = hidden_norm(fc f_p).
#   Per drafter layer: context keys k_norm(Wk c_p) with full half-split RoPE at p, values
#   Wv c_p.  A block at s: x = embed([T, mask, ..., mask]) at positions s..s+B-1;
#   h = input_layernorm(x); q = q_norm(Wq h), k = k_norm(Wk h), v = Wv h, RoPE at the rows'
#   positions; every block row attends to all context rows (< s) and all B block rows;
#   x += Wo attn; x += down(silu(gate h2) * up h2) with h2 = post_attention_layernorm(x).
#   Drafts: argmax of the target's lm_head(norm(x)) at block rows 1..K (K <= B - 1).
#
# The algorithm (no stop tokens, exactly n_gen tokens per prompt):
#   After the prompt t_0..t_{n-1}: the target's greedy token T at L = n; the drafter's context
#   holds the features of positions 0..L-1.  Each round: the block at L with T gives d_1..d_K;
#   the target verifies [T, d_1..d_K] at L..L+K, g_i its argmax at L+i, a = leading d_i == g_{i-1};
#   proposed[i] += 1 (i < K), accepted[i] += 1 (i < a); the features of rows 0..a (positions
#   L..L+a) join the context (rejected rows never do: the rollback); L += a + 1, T = g_a.
#   Emitted tokens are clipped to n_gen (the round still counts).  Ties go to the lowest id.
#
# Output JSON: {"model", "draft", "k", "n_gen", "prompts": [{"prompt", "tokens", "proposed",
#   "accepted", "rounds", "min_draft_margin", "min_target_margin"}], "totals": {...}}.

import argparse
import json
import os
import sys

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from glm_ref import read_safetensors  # noqa: E402
from spec_ref import CachedStack, load_model, read_prompts, top2_margin  # noqa: E402


class CaptureStack(CachedStack):
    """spec_ref's incremental target stack that also returns the residual stream after each
    layer listed in `capture` (in that order, concatenated)."""

    def __init__(self, m, max_len, capture):
        super().__init__(m, range(m.N), max_len)
        self.capture = list(capture)

    def run_capture(self, x, start):
        m = self.m
        if start > self.len:
            raise ValueError("run at %d but only %d rows cached" % (start, self.len))
        pos = np.arange(start, start + x.shape[0])
        got = {}
        for L in self.layers:
            x = x + self.attention(L, x, pos, start)
            h2 = m.rmsnorm(x, m.w("model.layers.%d.post_attention_layernorm.weight" % L))
            if L >= m.first_dense:
                x = x + m.moe(L, h2)
            else:
                x = x + m.swiglu("model.layers.%d.mlp." % L, h2)
            got[L] = x
        self.len = start + x.shape[0]
        return x, np.concatenate([got[L] for L in self.capture], axis=1)


class DFlashRef:
    def __init__(self, draft_dir, m):
        with open(os.path.join(draft_dir, "config.json")) as f:
            c = json.load(f)
        dc = c["dflash_config"]
        self.m = m
        self.B = dc["block_size"]
        self.mask = dc["mask_token_id"]
        self.capture = list(dc["target_layer_ids"])
        self.nl = c["num_hidden_layers"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.eps = c["rms_norm_eps"]
        self.theta = c.get("rope_theta", 10000.0)
        assert c["hidden_size"] == m.H and c["vocab_size"] == m.V
        self.W = read_safetensors(os.path.join(draft_dir, "model.safetensors"))

    def rms(self, x, w):
        return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)

    def rope(self, x, pos):
        """Full half-split RoPE on x [T, heads, hd]."""
        half = self.hd // 2
        j = np.arange(half, dtype=np.float64)
        ang = pos.astype(np.float64)[:, None] * (self.theta ** (-2.0 * j / self.hd))[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    def kv(self, l, src, pos):
        p = "layers.%d.self_attn." % l
        n = src.shape[0]
        k = (src @ self.W[p + "k_proj.weight"].T).reshape(n, self.nkv, self.hd)
        v = (src @ self.W[p + "v_proj.weight"].T).reshape(n, self.nkv, self.hd)
        k = self.rope(self.rms(k, self.W[p + "k_norm.weight"]), pos)
        return k, v

    def new_context(self):
        return {"k": [np.zeros((0, self.nkv, self.hd)) for _ in range(self.nl)],
                "v": [np.zeros((0, self.nkv, self.hd)) for _ in range(self.nl)]}

    def append(self, ctx, feats, start):
        """Context rows for positions start.. from target features [n, nL*H]."""
        assert ctx["k"][0].shape[0] == start
        c = self.rms(feats @ self.W["fc.weight"].T, self.W["hidden_norm.weight"])
        pos = np.arange(start, start + feats.shape[0])
        for l in range(self.nl):
            k, v = self.kv(l, c, pos)
            ctx["k"][l] = np.concatenate([ctx["k"][l], k])
            ctx["v"][l] = np.concatenate([ctx["v"][l], v])

    def block(self, ctx, s, T):
        """-> logits [B-1, V] of block rows 1..B-1 for the block at s starting with T."""
        m, B = self.m, self.B
        assert ctx["k"][0].shape[0] == s
        ids = np.array([T] + [self.mask] * (B - 1))
        x = m.w("model.embed_tokens.weight")[ids]
        pos = np.arange(s, s + B)
        g = self.nh // self.nkv
        for l in range(self.nl):
            p = "layers.%d." % l
            h = self.rms(x, self.W[p + "input_layernorm.weight"])
            q = (h @ self.W[p + "self_attn.q_proj.weight"].T).reshape(B, self.nh, self.hd)
            q = self.rope(self.rms(q, self.W[p + "self_attn.q_norm.weight"]), pos)
            kb, vb = self.kv(l, h, pos)
            K = np.concatenate([ctx["k"][l], kb])
            V = np.concatenate([ctx["v"][l], vb])
            out = np.empty((B, self.nh, self.hd))
            for i in range(self.nh):
                sc = (q[:, i, :] @ K[:, i // g, :].T) / np.sqrt(self.hd)   # no mask at all
                sc = sc - sc.max(axis=1, keepdims=True)
                pr = np.exp(sc)
                pr /= pr.sum(axis=1, keepdims=True)
                out[:, i, :] = pr @ V[:, i // g, :]
            x = x + out.reshape(B, self.nh * self.hd) @ self.W[p + "self_attn.o_proj.weight"].T
            h2 = self.rms(x, self.W[p + "post_attention_layernorm.weight"])
            a = h2 @ self.W[p + "mlp.gate_proj.weight"].T
            u = h2 @ self.W[p + "mlp.up_proj.weight"].T
            x = x + (a / (1.0 + np.exp(-a)) * u) @ self.W[p + "mlp.down_proj.weight"].T
        hn = self.rms(x[1:], self.W["norm.weight"])
        return m.lm_head(hn)


def spec_decode(m, d, prompt, K, n_gen):
    n = len(prompt)
    max_len = n + n_gen + d.B + 2
    tgt = CaptureStack(m, max_len, d.capture)
    emb = m.w("model.embed_tokens.weight")

    def target(tokens, start):
        x, f = tgt.run_capture(emb[np.asarray(tokens)], start)
        return f, m.lm_head(m.rmsnorm(x, m.w("model.norm.weight")))

    ctx = d.new_context()
    proposed, accepted = [0] * K, [0] * K
    rounds = 0
    tmarg, dmarg = [], []
    f, lg = target(prompt, 0)
    d.append(ctx, f, 0)
    T = int(np.argmax(lg[-1]))
    tmarg.append(top2_margin(lg[-1]))
    out = [T]
    L = n
    while len(out) < n_gen:
        if K == 0:
            f, lg = target([T], L)
            d.append(ctx, f, L)
            T = int(np.argmax(lg[0]))
            out.append(T)
            L += 1
            rounds += 1
            continue
        dl = d.block(ctx, L, T)[:K]
        dr = [int(np.argmax(r)) for r in dl]
        f, lg = target([T] + dr, L)
        g = [int(x) for x in np.argmax(lg, axis=1)]
        a = 0
        while a < K and dr[a] == g[a]:
            a += 1
        tmarg.extend(top2_margin(lg[i]) for i in range(a + 1))
        dmarg.extend(top2_margin(dl[i]) for i in range(min(a + 1, K)))
        for i in range(K):
            proposed[i] += 1
            accepted[i] += i < a
        rounds += 1
        d.append(ctx, f[:a + 1], L)        # the accepted rows only: the rollback
        new = dr[:a] + [g[a]]
        out.extend(new[:n_gen - len(out)])
        L += a + 1
        T = g[a]
    return {"prompt": list(prompt), "tokens": out, "proposed": proposed, "accepted": accepted,
            "rounds": rounds, "min_target_margin": min(tmarg),
            "min_draft_margin": min(dmarg) if dmarg else None}


def main(argv):
    ap = argparse.ArgumentParser(description="greedy DFlash speculative decoding: exact "
                                             "acceptance counts (float64 reference)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--n-gen", type=int, default=48)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    m = load_model(a.model)
    d = DFlashRef(a.draft, m)
    if a.k < 0 or a.k > d.B - 1:
        sys.exit("dflash_ref.py: --k must be in 0..%d (block_size - 1)" % (d.B - 1))
    prompts = read_prompts(a.prompts, m.V)
    res = [spec_decode(m, d, p, a.k, a.n_gen) for p in prompts]
    K = a.k
    prop = [sum(r["proposed"][i] for r in res) for i in range(K)]
    acc = [sum(r["accepted"][i] for r in res) for i in range(K)]
    rounds = sum(r["rounds"] for r in res)
    dm = [r["min_draft_margin"] for r in res if r["min_draft_margin"] is not None]
    totals = {"prompts": len(res), "rounds": rounds, "proposed": prop, "accepted": acc,
              "acceptance": [acc[i] / prop[i] if prop[i] else 0.0 for i in range(K)],
              "tokens_per_round": (sum(acc) + rounds) / rounds if rounds else 0.0,
              "min_target_margin": min(r["min_target_margin"] for r in res),
              "min_draft_margin": min(dm) if dm else None}
    doc = {"model": os.path.abspath(a.model), "draft": os.path.abspath(a.draft), "k": K,
           "n_gen": a.n_gen, "generator": "tests/reference/dflash_ref.py (float64, greedy)",
           "prompts": res, "totals": totals}
    with open(a.out, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    print("dflash_ref: k=%d prompts=%d rounds %d proposed %s accepted %s acceptance %s; "
          "min margins target %.3g draft %s" % (
              K, len(res), rounds, prop, acc, " ".join("%.3f" % x for x in totals["acceptance"]),
              totals["min_target_margin"], "%.3g" % totals["min_draft_margin"] if dm else "-"))


if __name__ == "__main__":
    main(sys.argv[1:])
