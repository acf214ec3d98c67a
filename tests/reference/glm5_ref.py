# SPDX-License-Identifier: MIT
#
# glm5_ref.py -- an independent float64 reference forward for GLM-5 checkpoints
# (GlmMoeDsaForCausalLM, model_type "glm_moe_dsa": multi-head latent attention
# with the DeepSeek sparse-attention "lightning indexer", MoE, MTP), written
# from the math pinned down in tests/reference/GLM5.md (transformers'
# glm_moe_dsa / deepseek_v32 / deepseek_v3 sources), for checking lockstep's C
# runtime.  Everything is float64.  The MoE, norms, MTP input and lm_head are
# glm_ref.py's (same directory), reused through its GlmRef class.
#
# Two implementations of the attention live here and are compared on every run:
#   naive     -- the transformers form: kv_b_proj expands the latent to per-head
#                nope keys and values, full-sequence causal forward (no cache),
#                the DSA selection applied as a mask;
#   absorbed  -- the decode form: a cache of the normed latent c (kv_lora_rank)
#                and the roped k_pe (qk_rope_head_dim) per token plus the
#                indexer's key cache; queries are multiplied into the latent
#                space (W_UK), outputs leave it through W_UV.  Tokens run
#                incrementally (prompt as one chunk, then one token per step),
#                the indexer scoring every query against the whole cache.
# Greedy decoding runs on the absorbed engine; the logits written are the
# naive full forward over tokens[0:P+G]; the largest difference between the
# two is printed (max_engine_diff) and must be at rounding level.
#
# Output (the format of glm_ref.py, for tests/model/test_model_ref):
#   tokens            I32 [P+G+1]      prompt (P ids) + G+1 greedy tokens
#   logits            F32 [P+G, V]     target logits of the forward over
#                                      tokens[0:P+G]; row p = after position p
#   mtp_logits        F32 [P+G-1, V]   first MTP draft at position j (from the
#                                      target hidden at j after model.norm and
#                                      token tokens[j+1])           (MTP only)
#   mtp_chain_logits  F32 [A, C, V]    chained drafts 1..C at anchors (MTP only)
#   mtp_chain_pos     I32 [A]          the anchor positions          (MTP only)
#
# --dump-topk FILE writes, for the naive forward over tokens[0:P+G], the DSA
# selection of every layer: `topk.L` I32 [P+G, index_topk], row t = the
# selected key positions of query t in selection order (best score first,
# ties to the lower position), -1 where fewer than index_topk keys exist;
# shared layers repeat their full layer's rows; `mtp_topk` likewise for the
# MTP layer's pass over the first-draft inputs.
#
# Quantized checkpoints (e.g. GLM-5-FP8's E4M3 weights with 128x128-block
# weight_scale_inv) are dequantized to float64 when loaded, as in glm_ref.py.
#
# Usage:
#   /usr/bin/python3 tests/reference/glm5_ref.py --model DIR --out FILE \
#       [--prompt-len 64] [--gen 32] [--chain 3] [--seed 1] \
#       [--dump-topk FILE] [--index-topk N] [--lora-norm-eps hf|config]

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from glm_ref import GlmRef, dequantize, load_weights, write_safetensors, top2_margin  # noqa: E402

# transformers builds q_a_layernorm / kv_a_layernorm as DeepseekV3RMSNorm(dim)
# without passing config.rms_norm_eps: their eps is the class default 1e-6
# (MODEL.md's choice, the default here).  vLLM / SGLang pass rms_norm_eps
# (1e-5 for GLM-5): --lora-norm-eps config selects that (GLM5.md "Norms").
# The indexer's k_norm is nn.LayerNorm(dim, eps=1e-6) everywhere.
LORA_NORM_EPS = 1e-6
INDEXER_LN_EPS = 1e-6


def relu(x):
    return np.maximum(x, 0.0)


class Glm5Ref(GlmRef):
    def __init__(self, model_dir, index_topk=None, lora_eps=None):
        # GlmRef.__init__ is not called: it checks for glm4_moe.  The
        # attributes its reused methods read (W, eps, routing fields, N) are
        # set here.
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        arch = cfg.get("architectures") or []
        if cfg.get("model_type") != "glm_moe_dsa" and "GlmMoeDsaForCausalLM" not in arch:
            raise ValueError("not a glm_moe_dsa model: model_type=%r architectures=%r"
                             % (cfg.get("model_type"), arch))

        def req(k):
            if cfg.get(k) is None:
                raise KeyError("config.json: missing required field %r" % k)
            return cfg[k]

        self.cfg = cfg
        self.H = req("hidden_size")
        self.N = req("num_hidden_layers")
        self.nh = req("num_attention_heads")
        self.V = req("vocab_size")
        self.eps = req("rms_norm_eps")
        self.q_lora = req("q_lora_rank")
        self.kv_lora = req("kv_lora_rank")
        self.nope = req("qk_nope_head_dim")
        self.r = req("qk_rope_head_dim")
        self.vd = req("v_head_dim")
        self.ih = req("index_n_heads")
        self.idim = req("index_head_dim")
        self.index_topk = index_topk if index_topk is not None else req("index_topk")
        if cfg.get("attention_bias", False):
            raise ValueError("attention_bias=true is not a GLM-5 layout")
        rp = cfg.get("rope_parameters") or {}
        rs = cfg.get("rope_scaling")
        rtype = rp.get("rope_type", "default")
        if rs or rtype != "default":
            # GLM-5/5.1/5.2 ship plain RoPE.  YaRN (DeepSeek-V3 style, with the
            # mscale^2 softmax factor) is not implemented here.
            raise ValueError("rope scaling %r / rope_type %r not supported" % (rs, rtype))
        self.theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        self.rope_interleave = bool(cfg.get("rope_interleave", True))
        self.indexer_interleave = bool(cfg.get("indexer_rope_interleave", True))
        self.E = req("n_routed_experts")
        self.n_shared = req("n_shared_experts")
        self.topk = req("num_experts_per_tok")
        self.scale = req("routed_scaling_factor")
        self.n_group = cfg.get("n_group", 1) or 1
        self.topk_group = cfg.get("topk_group", 1) or 1
        self.norm_topk = bool(req("norm_topk_prob"))
        sf = cfg.get("scoring_func", "sigmoid")
        if sf != "sigmoid":
            raise ValueError("scoring_func %r not supported" % sf)
        self.n_mtp = cfg.get("num_nextn_predict_layers", 0) or 0
        if cfg.get("tie_word_embeddings", False):
            raise ValueError("tie_word_embeddings=true is not a GLM-5 layout")
        # Dense / MoE per layer.
        mlt = cfg.get("mlp_layer_types")
        if mlt is None:
            fd = req("first_k_dense_replace")
            mlt = ["dense"] * min(fd, self.N) + ["sparse"] * (self.N - min(fd, self.N))
        self.moe_layer = [t == "sparse" for t in mlt]
        # Indexer schedule (GlmMoeDsaConfig.__post_init__).
        it = cfg.get("indexer_types")
        if it is None:
            pat = cfg.get("index_topk_pattern")
            if pat is not None:
                it = ([{"F": "full", "S": "shared"}[c] for c in pat]
                      if isinstance(pat, str) else list(pat))
            else:
                freq = max(cfg.get("index_topk_freq", 1) or 1, 1)
                off = cfg.get("index_skip_topk_offset", 2)
                off = 2 if off is None else off
                it = ["full" if max(i - off + 1, 0) % freq == 0 else "shared"
                      for i in range(self.N)]
        if len(it) != self.N or it[0] != "full":
            raise ValueError("indexer_types %r: need %d entries, the first 'full'" % (it, self.N))
        self.indexer_full = [t == "full" for t in it]
        self.lora_eps = LORA_NORM_EPS if lora_eps is None else lora_eps
        self.qk = self.nope + self.r
        self.softmax_scale = self.qk ** -0.5
        assert self.r % 2 == 0 and self.idim >= self.r

        # Quantized checkpoints (GLM-5-FP8: quant_method fp8, 128x128 blocks) are
        # dequantized to float64 by glm_ref.py's dequantize(), from the format
        # descriptions; the forward is then the same as on BF16 weights.
        self.W = dequantize(load_weights(model_dir), model_dir, cfg)
        self.dt = np.dtype(np.float64)  # GlmRef (main) computes in self.dt; the GLM-5 reference is float64
        self.min_route_margin = np.inf
        self.reset_index_stats()
        self.has_mtp = self.n_mtp >= 1
        if self.has_mtp:
            need = "model.layers.%d.eh_proj.weight" % self.N
            if need not in self.W:
                raise KeyError("num_nextn_predict_layers=%d but %s is missing"
                               % (self.n_mtp, need))
        for L in range(self.N):
            has = ("model.layers.%d.self_attn.indexer.wk.weight" % L) in self.W
            if has != self.indexer_full[L]:
                raise KeyError("layer %d: indexer_types says %s but indexer tensors are %s"
                               % (L, "full" if self.indexer_full[L] else "shared",
                                  "present" if has else "absent"))

    # --- small pieces ----------------------------------------------------------
    def reset_index_stats(self):
        self.min_index_margin = np.inf      # k-th minus (k+1)-th causal score
        self.index_boundary_ties = 0        # exact ties straddling the cut
        self.index_dropping_queries = 0     # queries with more keys than topk

    @staticmethod
    def rmsnorm_eps(x, weight, eps):
        return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)

    @staticmethod
    def layernorm(x, weight, bias, eps):
        mu = np.mean(x, axis=-1, keepdims=True)
        var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)     # biased
        return (x - mu) / np.sqrt(var + eps) * weight + bias

    def rope(self, x, pos, interleave):
        """RoPE on all of the last axis (r dims) of x [T, ..., r] at pos [T].
        Frequencies theta^(-2i/r), i < r/2.  Interleaved: pair (2i, 2i+1),
        rotated in place (transformers' apply_rotary_pos_emb_interleave also
        moves evens before odds, identically in q and k, which leaves every
        dot product unchanged).  Half-split: pair (i, i + r/2)."""
        r = x.shape[-1]
        half = r // 2
        i = np.arange(half, dtype=np.float64)
        inv = self.theta ** (-2.0 * i / r)
        ang = pos.astype(np.float64)[:, None] * inv[None, :]      # [T, r/2]
        shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (half,)
        cos, sin = np.cos(ang).reshape(shape), np.sin(ang).reshape(shape)
        out = np.empty_like(x)
        if interleave:
            a, b = x[..., 0::2], x[..., 1::2]
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = b * cos + a * sin
        else:
            a, b = x[..., :half], x[..., half:]
            out[..., :half] = a * cos - b * sin
            out[..., half:] = b * cos + a * sin
        return out

    # --- MLA projections (GLM5.md "Attention") ---------------------------------
    def mla_project(self, L, h, pos):
        """h [T,H] (after input_layernorm) -> cq [T,q_lora], q_nope [T,nh,nope],
        q_pe [T,nh,r] (roped), c [T,kv_lora] (normed latent), k_pe [T,r] (roped)."""
        a = "model.layers.%d.self_attn." % L
        T = h.shape[0]
        cq = self.rmsnorm_eps(h @ self.w(a + "q_a_proj.weight").T,
                              self.w(a + "q_a_layernorm.weight"), self.lora_eps)
        q = (cq @ self.w(a + "q_b_proj.weight").T).reshape(T, self.nh, self.qk)
        q_nope, q_pe = q[..., :self.nope], q[..., self.nope:]     # nope first
        q_pe = self.rope(q_pe, pos, self.rope_interleave)
        ckv = h @ self.w(a + "kv_a_proj_with_mqa.weight").T       # [T, kv_lora + r]
        c = self.rmsnorm_eps(ckv[:, :self.kv_lora], self.w(a + "kv_a_layernorm.weight"),
                             self.lora_eps)
        k_pe = self.rope(ckv[:, self.kv_lora:], pos, self.rope_interleave)
        return cq, q_nope, q_pe, c, k_pe

    # --- the lightning indexer (GLM5.md "Indexer") -----------------------------
    def indexer_keys(self, L, h, pos):
        """k = LayerNorm(wk h) [T, idim], rope on the first r dims."""
        a = "model.layers.%d.self_attn.indexer." % L
        k = self.layernorm(h @ self.w(a + "wk.weight").T, self.w(a + "k_norm.weight"),
                           self.w(a + "k_norm.bias"), INDEXER_LN_EPS)
        k = k.copy()
        k[:, :self.r] = self.rope(k[:, :self.r], pos, self.indexer_interleave)
        return k

    def indexer_scores(self, L, h, cq, pos, keys, key_pos):
        """I[t, s] = sum_h w[t,h] * relu(q[t,h] . k[s] / sqrt(idim)),
        w = weights_proj(h) / sqrt(index_n_heads); -inf where key_pos > pos."""
        a = "model.layers.%d.self_attn.indexer." % L
        T = h.shape[0]
        q = (cq @ self.w(a + "wq_b.weight").T).reshape(T, self.ih, self.idim)
        q = q.copy()
        q[..., :self.r] = self.rope(q[..., :self.r], pos, self.indexer_interleave)
        w = (h @ self.w(a + "weights_proj.weight").T) * self.ih ** -0.5   # [T, ih]
        dots = np.einsum("thd,sd->ths", q, keys) * self.idim ** -0.5
        score = np.einsum("ths,th->ts", relu(dots), w)
        causal = key_pos[None, :] <= pos[:, None]
        return np.where(causal, score, -np.inf), causal

    def select(self, score, causal):
        """Top-min(index_topk, causal keys) positions per query; ties to the
        lower key index.  Returns (sel bool [T,S], idx int [T,k] padded -1)."""
        T, S = score.shape
        k = self.index_topk
        order = np.argsort(-score, axis=1, kind="stable")          # ties: lower s
        ncausal = causal.sum(axis=1)
        sel = np.zeros((T, S), dtype=bool)
        idx = np.full((T, k), -1, dtype=np.int64)
        for t in range(T):
            n = min(k, int(ncausal[t]))
            sel[t, order[t, :n]] = True
            idx[t, :n] = order[t, :n]
            if ncausal[t] > k:
                self.index_dropping_queries += 1
                last, first_out = score[t, order[t, k - 1]], score[t, order[t, k]]
                gap = last - first_out
                if gap == 0.0:
                    self.index_boundary_ties += 1
                else:
                    self.min_index_margin = min(self.min_index_margin, float(gap))
        return sel, idx

    # --- the two attention forms -------------------------------------------------
    def attend_naive(self, L, q_nope, q_pe, c, k_pe, mask):
        """transformers form: expand the latent per head. mask [T,S] bool."""
        a = "model.layers.%d.self_attn." % L
        S = c.shape[0]
        kv = (c @ self.w(a + "kv_b_proj.weight").T).reshape(S, self.nh, self.nope + self.vd)
        k_nope, v = kv[..., :self.nope], kv[..., self.nope:]
        T = q_nope.shape[0]
        out = np.empty((T, self.nh, self.vd))
        for i in range(self.nh):
            s = (q_nope[:, i, :] @ k_nope[:, i, :].T + q_pe[:, i, :] @ k_pe.T) * self.softmax_scale
            s = np.where(mask, s, -np.inf)
            s = s - s.max(axis=1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(axis=1, keepdims=True)
            out[:, i, :] = p @ v[:, i, :]
        return out.reshape(T, self.nh * self.vd) @ self.w(a + "o_proj.weight").T

    def attend_absorbed(self, L, q_nope, q_pe, c, k_pe, mask):
        """decode form: scores and outputs in the latent space.
        kv_b_proj rows of head i: [nope rows (W_UK_i) ; v rows (W_UV_i)]."""
        a = "model.layers.%d.self_attn." % L
        Wkvb = self.w(a + "kv_b_proj.weight").reshape(self.nh, self.nope + self.vd, self.kv_lora)
        W_uk, W_uv = Wkvb[:, :self.nope, :], Wkvb[:, self.nope:, :]
        q_lat = np.einsum("thn,hnc->thc", q_nope, W_uk)              # [T, nh, kv_lora]
        s = (np.einsum("thc,sc->hts", q_lat, c) + np.einsum("thr,sr->hts", q_pe, k_pe))
        s = s * self.softmax_scale
        s = np.where(mask[None], s, -np.inf)
        s = s - s.max(axis=2, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=2, keepdims=True)
        o_lat = np.einsum("hts,sc->thc", p, c)                        # [T, nh, kv_lora]
        out = np.einsum("thc,hvc->thv", o_lat, W_uv)
        T = q_nope.shape[0]
        return out.reshape(T, self.nh * self.vd) @ self.w(a + "o_proj.weight").T

    # --- one decoder layer -------------------------------------------------------
    def decoder_layer5(self, L, x, pos, moe, full_indexer, prev, cache=None,
                       absorbed=False, dense_mla=False, dump=None):
        """x [T,H] at positions pos.  prev = (sel) of the previous full layer
        (for a shared layer).  cache: dict with 'c', 'k_pe', 'kI', 'pos' of
        earlier tokens (appended in place) or None (the sequence is x alone).
        Returns (x, sel)."""
        p = "model.layers.%d." % L
        h = self.rmsnorm(x, self.w(p + "input_layernorm.weight"))
        cq, q_nope, q_pe, c, k_pe = self.mla_project(L, h, pos)
        kI = self.indexer_keys(L, h, pos) if full_indexer else None
        if cache is not None:
            if len(cache["pos"]):
                c = np.concatenate([cache["c"], c])
                k_pe = np.concatenate([cache["k_pe"], k_pe])
                if kI is not None:
                    kI = np.concatenate([cache["kI"], kI])
                key_pos = np.concatenate([cache["pos"], pos])
            else:
                key_pos = pos
            cache["c"], cache["k_pe"], cache["pos"] = c, k_pe, key_pos
            if kI is not None:
                cache["kI"] = kI
        else:
            key_pos = pos
        causal = key_pos[None, :] <= pos[:, None]
        if dense_mla:
            sel, idx = causal, None
        elif full_indexer:
            score, causal = self.indexer_scores(L, h, cq, pos, kI, key_pos)
            sel, idx = self.select(score, causal)
        else:
            sel, idx = prev
        if dump is not None and idx is not None:
            dump.append(idx)
        mask = sel & causal
        att = (self.attend_absorbed if absorbed else self.attend_naive)(L, q_nope, q_pe, c, k_pe, mask)
        x = x + att
        h2 = self.rmsnorm(x, self.w(p + "post_attention_layernorm.weight"))
        x = x + (self.moe(L, h2) if moe else self.swiglu(p + "mlp.", h2))
        return x, (sel, idx)

    # --- full forward (naive) ------------------------------------------------------
    def forward(self, tokens, dense_mla=False, dump=None, absorbed=False, last=False):
        """Full causal forward.  Returns (hn [T,H] after model.norm, logits [T,V]; with last,
        [1,V] of the last row, as glm_ref's). dump: a list that receives one idx array per
        layer."""
        tokens = np.asarray(tokens)
        pos = np.arange(len(tokens))
        x = self.w("model.embed_tokens.weight")[tokens]
        prev = None
        for L in range(self.N):
            x, st = self.decoder_layer5(L, x, pos, self.moe_layer[L], self.indexer_full[L], prev,
                                        absorbed=absorbed, dense_mla=dense_mla, dump=dump)
            if self.indexer_full[L]:
                prev = st
        hn = self.rmsnorm(x, self.w("model.norm.weight"))
        return hn, self.lm_head(hn[-1:] if last else hn)

    # --- MTP (MODEL.md section 3); the MTP layer always has its own indexer ----
    def mtp_layer(self, u, dense_mla=False, dump=None, last=False):
        N = self.N
        z, st = self.decoder_layer5(N, u, np.arange(u.shape[0]), True, True, None,
                                    dense_mla=dense_mla, dump=dump)
        hs = self.rmsnorm(z, self.w("model.layers.%d.shared_head.norm.weight" % N))
        return hs, self.lm_head(hs[-1:] if last else hs)


class Engine:
    """Incremental target forward on the absorbed form: per layer a cache of
    (c, k_pe, indexer key, position) rows.  run() appends a chunk of tokens
    at the next positions; truncate(n) keeps the first n rows (rollback)."""

    def __init__(self, m):
        self.m = m
        self.caches = [{"c": None, "k_pe": None, "kI": None, "pos": np.zeros(0, dtype=np.int64)}
                       for _ in range(m.N)]
        self.n = 0

    def run(self, tokens):
        m = self.m
        tokens = np.asarray(tokens)
        pos = np.arange(self.n, self.n + len(tokens))
        x = m.w("model.embed_tokens.weight")[tokens]
        prev = None
        for L in range(m.N):
            x, st = m.decoder_layer5(L, x, pos, m.moe_layer[L], m.indexer_full[L], prev,
                                     cache=self.caches[L], absorbed=True)
            if m.indexer_full[L]:
                prev = st
        self.n += len(tokens)
        hn = m.rmsnorm(x, m.w("model.norm.weight"))
        return hn, m.lm_head(hn)

    def truncate(self, n):
        for cache in self.caches:
            for k in ("c", "k_pe", "kI"):
                if cache[k] is not None:
                    cache[k] = cache[k][:n]
            cache["pos"] = cache["pos"][:n]
        self.n = n


def main(argv):
    ap = argparse.ArgumentParser(description="float64 reference forward for glm_moe_dsa")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--chain", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dump-topk", default=None,
                    help="write the DSA selection per layer to this safetensors file")
    ap.add_argument("--index-topk", type=int, default=None,
                    help="override config index_topk (debugging)")
    ap.add_argument("--lora-norm-eps", choices=["hf", "config"], default="hf",
                    help="eps of q_a_layernorm / kv_a_layernorm: 1e-6 as transformers "
                         "(default, MODEL.md) or config rms_norm_eps as vLLM / SGLang")
    a = ap.parse_args(argv)
    if a.prompt_len < 1 or a.gen < 0 or a.chain < 1:
        sys.exit("glm5_ref.py: need --prompt-len >= 1, --gen >= 0, --chain >= 1")

    t0 = time.time()
    m = Glm5Ref(a.model, index_topk=a.index_topk)
    if a.lora_norm_eps == "config":
        m.lora_eps = m.eps
    t_load = time.time() - t0
    P, G, V = a.prompt_len, a.gen, m.V

    # 1. Prompt.
    tokens = [int(t) for t in np.random.default_rng(a.seed).integers(0, V, P)]

    # 2. Greedy on the absorbed engine: the prompt as one chunk, then one
    #    token per step (the indexer over the whole cache each step); ties of
    #    the argmax to the lowest index.
    eng = Engine(m)
    _, lg = eng.run(tokens)
    eng_rows = [lg]
    margins = []
    for g in range(G + 1):
        last = eng_rows[-1][-1]
        margins.append(top2_margin(last))
        tokens.append(int(np.argmax(last)))
        if g < G:
            _, lg = eng.run(tokens[-1:])
            eng_rows.append(lg)
    eng_logits = np.concatenate(eng_rows)                 # rows 0..P+G-1
    tokens = np.array(tokens, dtype=np.int64)
    T = P + G

    # 3. Target logits over tokens[0:T], naive full forward.
    m.min_route_margin = np.inf
    m.reset_index_stats()
    dump = [] if a.dump_topk else None
    hn, logits = m.forward(tokens[:T], dump=dump)
    engine_diff = float(np.abs(logits - eng_logits).max())
    greedy_ok = bool(np.all(np.argmax(logits, axis=1)[P - 1:] == tokens[P:T + 1]))
    outs = [("tokens", tokens.astype(np.int32)), ("logits", logits)]
    summary = {"max_abs_logit": float(np.abs(logits).max()),
               "max_engine_diff": engine_diff,
               "greedy_consistent": greedy_ok,
               "min_greedy_margin": float(min(margins)),
               "min_route_margin": float(m.min_route_margin),
               "index_topk": m.index_topk,
               "index_dropping_queries": m.index_dropping_queries,
               "min_index_margin": float(m.min_index_margin),
               "index_boundary_ties": m.index_boundary_ties,
               "indexer_types": "".join("F" if f else "S" for f in m.indexer_full)}
    if engine_diff > 1e-8 * max(1.0, summary["max_abs_logit"]) or not greedy_ok:
        sys.exit("glm5_ref.py: absorbed engine and naive forward disagree (%.3g, greedy %s)"
                 % (engine_diff, greedy_ok))
    dump_tensors = []
    if dump is not None:
        for L, idx in enumerate(dump):
            dump_tensors.append(("topk.%d" % L, idx.astype(np.int32)))

    if m.has_mtp and T >= 2:
        # 4. First drafts (glm_ref.py's procedure).
        u = m.mtp_input(hn[:T - 1], tokens[1:T])
        m.min_route_margin = np.inf
        m.reset_index_stats()
        mdump = [] if a.dump_topk else None
        hs, mtp_logits = m.mtp_layer(u, dump=mdump)
        summary["min_mtp_route_margin"] = float(m.min_route_margin)
        summary["min_mtp_index_margin"] = float(m.min_index_margin)
        summary["mtp_index_boundary_ties"] = m.index_boundary_ties
        outs.append(("mtp_logits", mtp_logits))
        if mdump:
            dump_tensors.append(("mtp_topk", mdump[0].astype(np.int32)))

        # 5. Chained drafts at anchors: step d+1 appends
        #    u' = mtp_input(shared_head.norm(z_d), draft_d) at position i+d and
        #    reruns the MTP layer (its own indexer) over [u_0..u_i, u'..].
        anchors = sorted({x for x in (P - 1, P + G // 2, P + G - 2) if 0 <= x <= T - 2})
        chain = np.zeros((len(anchors), a.chain, V))
        chain_margin = []
        for ai, i in enumerate(anchors):
            seq = u[:i + 1]
            h_c, lg_c = hs[i], mtp_logits[i]
            for d in range(a.chain):
                if d > 0:
                    u_new = m.mtp_input(h_c[None, :], [int(np.argmax(lg_c))])
                    seq = np.concatenate([seq, u_new], axis=0)
                    hs_s, lg_s = m.mtp_layer(seq, last=True)
                    h_c, lg_c = hs_s[-1], lg_s[-1]
                chain[ai, d] = lg_c
                chain_margin.append(top2_margin(lg_c))
        outs.append(("mtp_chain_logits", chain))
        outs.append(("mtp_chain_pos", np.array(anchors, dtype=np.int32)))
        agree = np.mean(np.argmax(mtp_logits, axis=1) == tokens[2:T + 1])
        summary.update({"max_abs_mtp_logit": float(np.abs(mtp_logits).max()),
                        "min_mtp_margin": float(min(top2_margin(r) for r in mtp_logits)),
                        "min_chain_margin": float(min(chain_margin)),
                        "mtp_top1_agreement": float(agree),
                        "chain_anchors": anchors})

    for name, arr in outs:
        if not np.all(np.isfinite(arr)):
            sys.exit("glm5_ref.py: non-finite values in %s" % name)

    meta = {"format": "pt", "model": os.path.abspath(a.model),
            "prompt_len": P, "gen": G, "chain": a.chain, "seed": a.seed,
            "index_topk": m.index_topk, "lora_norm_eps": m.lora_eps,
            "generator": "tests/reference/glm5_ref.py (float64)"}
    write_safetensors(a.out, outs, meta)
    if a.dump_topk:
        write_safetensors(a.dump_topk, dump_tensors, meta)

    print("glm5_ref: %s  P=%d G=%d chain=%d seed=%d  (load %.2f s, total %.2f s)"
          % (a.model, P, G, a.chain, a.seed, t_load, time.time() - t0))
    print("  generated: %s" % " ".join(str(t) for t in tokens[P:]))
    for k, v in summary.items():
        print("  %-22s %s" % (k, ("%.6g" % v) if isinstance(v, float) else v))
    print("  wrote %s: %s" % (a.out, ", ".join("%s%s" % (n, list(x.shape)) for n, x in outs)))
    if a.dump_topk:
        print("  wrote %s: %d selections" % (a.dump_topk, len(dump_tensors)))


if __name__ == "__main__":
    main(sys.argv[1:])
