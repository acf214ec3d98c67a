# SPDX-License-Identifier: MIT
#
# glm_ref.py -- an independent float64 reference forward for GLM-4.x MoE
# checkpoints (Glm4MoeForCausalLM, model_type "glm4_moe"), written only from
# the math in /work/shared/MODEL.md sections 1-3, for checking lockstep's C
# runtime.  It reads config.json and the safetensors weights of a model
# directory with its own small reader, computes everything in float64 with
# plain full-sequence causal attention (no KV cache: every step recomputes
# the whole sequence), and writes the results as a safetensors file:
#
#   tokens            I32 [P+G+1]      prompt (P ids) + G+1 greedy tokens
#   logits            F32 [P+G, V]     target logits of the forward over
#                                      tokens[0:P+G]; row p = after position p
#   mtp_logits        F32 [P+G-1, V]   first MTP draft at position j (from the
#                                      target hidden at j after model.norm and
#                                      token tokens[j+1])           (MTP only)
#   mtp_chain_logits  F32 [A, C, V]    chained drafts 1..C at anchors (MTP only)
#   mtp_chain_pos     I32 [A]          the anchor positions          (MTP only)
#
# Quantized checkpoints are dequantized to float64 when loaded (dequantize()),
# from the published descriptions of the formats: FP8 E4M3 ("fn": 4 exponent
# bits of bias 7, 3 mantissa bits, no infinities) times a per-row scale
# (compressed-tensors strategy channel) or a per-128x128-block scale
# (weight_scale_inv of quant_method fp8, a multiplier; blocks at the edges
# are cut short); NVFP4 E2M1 codes (sign, 2 exponent bits of bias 1, 1 mantissa
# bit), two a byte with the first element in the low nibble, times an E4M3
# scale per 16 elements of a row, times ModelOpt's weight_scale_2, or divided
# by compressed-tensors' weight_global_scale.  The forward then runs on the
# dequantized weights exactly as on BF16 ones.
#
# Usage:
#   /usr/bin/python3 tests/reference/glm_ref.py --model DIR --out FILE \
#       [--prompt-len 64] [--gen 32] [--chain 3] [--seed 1]

import argparse
import json
import os
import struct
import sys
import time

import numpy as np


# ---------------------------------------------------------------------------
# safetensors reader / writer (MODEL.md section 1: model.safetensors, or
# shards listed by model.safetensors.index.json "weight_map")
# ---------------------------------------------------------------------------

def read_safetensors(path, want=None):
    """Return {name: float64 ndarray} for the tensors of one file (only the
    names in `want` when given).  BF16, F16, F32 (and F64) become float64;
    I32 (used by the output files of this script) becomes int64."""
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(hlen).decode("utf-8"))
    base = 8 + hlen
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in hdr.items():
        if name == "__metadata__" or (want is not None and name not in want):
            continue
        a, b = info["data_offsets"]
        raw = mm[base + a: base + b]
        shape = tuple(info["shape"])
        dt = info["dtype"]
        if dt == "BF16":
            # BF16 is the top half of an IEEE float32: shift into place.
            u = raw.view("<u2").astype(np.uint32) << np.uint32(16)
            x = u.view(np.float32).astype(np.float64)
        elif dt == "F16":
            x = raw.view("<f2").astype(np.float64)
        elif dt == "F32":
            x = raw.view("<f4").astype(np.float64)
        elif dt == "F64":
            x = raw.view("<f8").astype(np.float64)
        elif dt == "I32":                                  # our own output files
            x = raw.view("<i4").astype(np.int64)
        elif dt == "F8_E4M3":
            x = e4m3_decode(np.asarray(raw, dtype=np.uint8))
        elif dt == "U8":                                   # packed FP4 codes
            x = np.asarray(raw, dtype=np.uint8).copy()
        else:
            raise ValueError("%s: tensor %s has unsupported dtype %s" % (path, name, dt))
        out[name] = x.reshape(shape)
    del mm
    return out


def e4m3_decode(b):
    """uint8 array of E4M3 ("fn") bytes -> float64 values."""
    b = b.astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = (b & 0x7).astype(np.float64)
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * np.exp2(e - 7.0))
    mag = np.where((e == 15) & (m == 7), np.nan, mag)
    return sign * mag


def e2m1_decode(nib):
    """4-bit E2M1 codes -> float64: 1 sign bit, 2 exponent bits (bias 1),
    1 mantissa bit; exponent 0 is subnormal (0 or 0.5)."""
    nib = nib.astype(np.int64)
    sign = np.where(nib & 8, -1.0, 1.0)
    e = (nib >> 1) & 3
    m = (nib & 1).astype(np.float64)
    mag = np.where(e == 0, m * 0.5, (1.0 + m / 2.0) * np.exp2(e - 1.0))
    return sign * mag


def unpack_fp4(packed):
    """[out, in/2] bytes -> [out, in] float64 E2M1 values; low nibble first."""
    lo, hi = packed & 0xF, packed >> 4
    out = np.empty((packed.shape[0], packed.shape[1] * 2))
    out[:, 0::2] = e2m1_decode(lo)
    out[:, 1::2] = e2m1_decode(hi)
    return out


def expand_blocks(s, shape, bm, bn):
    """Per-block scales [ceil(out/bm), ceil(in/bn)] -> per-element [out, in]."""
    return np.repeat(np.repeat(s, bm, axis=0), bn, axis=1)[:shape[0], :shape[1]]


def dequantize(W, model_dir, cfg):
    """Replace every quantized weight of W (and its scale tensors) by its
    float64 value; leaves BF16/F32 tensors alone."""
    qc = cfg.get("quantization_config") or {}
    hq = os.path.join(model_dir, "hf_quant_config.json")
    if os.path.exists(hq):
        with open(hq) as f:
            qc = dict(json.load(f)["quantization"], quant_method="modelopt")
    method = qc.get("quant_method")
    block = None
    if method == "fp8":
        block = tuple(qc["weight_block_size"])
    elif method == "compressed-tensors":
        for g in qc["config_groups"].values():
            if g["weights"].get("strategy") == "block":
                block = tuple(g["weights"]["block_structure"])
    out = {}
    for name, x in W.items():
        if name.endswith(".weight_packed"):                 # compressed-tensors NVFP4
            base = name[:-len(".weight_packed")]
            v = unpack_fp4(x)
            s = np.repeat(W[base + ".weight_scale"], 16, axis=1)
            out[base + ".weight"] = v * s / float(W[base + ".weight_global_scale"].ravel()[0])
        elif name.endswith(".weight") and x.dtype == np.uint8:   # ModelOpt NVFP4
            base = name[:-len(".weight")]
            v = unpack_fp4(x)
            s = np.repeat(W[base + ".weight_scale"], 16, axis=1)
            out[name] = v * s * float(W[base + ".weight_scale_2"].ravel()[0])
        elif name.endswith(".weight") and name + "_scale_inv" in W:   # fp8 blocks
            out[name] = x * expand_blocks(W[name + "_scale_inv"], x.shape, *block)
        elif name.endswith(".weight") and name + "_scale" in W and method == "compressed-tensors":
            s = W[name + "_scale"]
            if block is not None:
                out[name] = x * expand_blocks(s, x.shape, *block)
            else:
                out[name] = x * s.reshape(-1, 1)               # per channel, or [1]
        elif any(name.endswith(sfx) for sfx in (
                ".weight_scale", ".weight_scale_inv", ".weight_scale_2", ".input_scale",
                ".weight_global_scale", ".input_global_scale")):
            continue
        else:
            out[name] = x
    return out


def load_weights(model_dir):
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(single):
        return read_safetensors(single)
    if os.path.exists(index):
        with open(index) as f:
            wm = json.load(f)["weight_map"]
        files = {}
        for name, fn in wm.items():
            files.setdefault(fn, set()).add(name)
        W = {}
        for fn, names in sorted(files.items()):
            W.update(read_safetensors(os.path.join(model_dir, fn), names))
        missing = set(wm) - set(W)
        if missing:
            raise KeyError("tensors in the index but not in their shard: %s"
                           % sorted(missing)[:5])
        return W
    raise FileNotFoundError("%s: no model.safetensors nor model.safetensors.index.json"
                            % model_dir)


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, ndarray); F32 / I32 written little-endian,
    contiguous in header order; header padded with spaces to 8 bytes."""
    hdr = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    blobs, off = [], 0
    for name, arr in tensors:
        if arr.dtype.kind == "f":
            b, dt = np.ascontiguousarray(arr, dtype="<f4").tobytes(), "F32"
        elif arr.dtype.kind in "iu":
            b, dt = np.ascontiguousarray(arr, dtype="<i4").tobytes(), "I32"
        else:
            raise ValueError(arr.dtype)
        hdr[name] = {"dtype": dt, "shape": list(arr.shape),
                     "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    js = json.dumps(hdr, separators=(",", ":")).encode()
    js += b" " * ((-len(js)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------
# The model (MODEL.md section 2 "Forward pass" and section 3 "MTP draft step")
# ---------------------------------------------------------------------------

def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


class GlmRef:
    """The forward in one floating-point type: float64 for the reference values, float32 (every
    weight widened exactly, every intermediate rounded to float32 as lockstep's CPU backend keeps
    them) to measure how far float32 rounding alone moves each output row (see main)."""

    def __init__(self, model_dir, dtype=np.float64, weights=None):
        self.dt = np.dtype(dtype)
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        arch = cfg.get("architectures") or []
        if cfg.get("model_type") != "glm4_moe" and "Glm4MoeForCausalLM" not in arch:
            raise ValueError("not a glm4_moe model: model_type=%r architectures=%r"
                             % (cfg.get("model_type"), arch))

        def req(k):
            if k not in cfg:
                raise KeyError("config.json: missing required field %r" % k)
            return cfg[k]

        self.cfg = cfg
        self.H = req("hidden_size")
        self.N = req("num_hidden_layers")
        self.nh = req("num_attention_heads")
        self.nkv = req("num_key_value_heads")
        self.hd = cfg.get("head_dim") or self.H // self.nh
        self.V = req("vocab_size")
        self.eps = req("rms_norm_eps")
        self.theta = req("rope_theta")
        self.prf = cfg.get("partial_rotary_factor", 1.0)
        self.qk_norm = bool(cfg.get("use_qk_norm", False))
        self.attn_bias = bool(cfg.get("attention_bias", False))
        self.first_dense = req("first_k_dense_replace")
        self.E = req("n_routed_experts")
        self.n_shared = req("n_shared_experts")
        self.topk = req("num_experts_per_tok")
        self.scale = req("routed_scaling_factor")
        self.n_group = cfg.get("n_group", 1) or 1
        self.topk_group = cfg.get("topk_group", 1) or 1
        self.norm_topk = bool(req("norm_topk_prob"))
        self.n_mtp = cfg.get("num_nextn_predict_layers", 0) or 0
        if cfg.get("tie_word_embeddings", False):
            raise ValueError("tie_word_embeddings=true is not a GLM-4.x layout")
        # Rotary dims: r = head_dim * partial_rotary_factor (MODEL.md 2, step 3).
        self.r = int(round(self.hd * self.prf))
        assert self.r % 2 == 0 and self.r <= self.hd
        assert self.nh % self.nkv == 0

        W = weights if weights is not None else dequantize(load_weights(model_dir), model_dir, cfg)
        self.W = W if self.dt == np.float64 else {k: v.astype(self.dt) for k, v in W.items()}
        self.min_route_margin = np.inf        # diagnostics, see route()
        self.has_mtp = self.n_mtp >= 1
        if self.has_mtp:
            need = "model.layers.%d.eh_proj.weight" % self.N
            if need not in self.W:
                raise KeyError("num_nextn_predict_layers=%d but %s is missing"
                               % (self.n_mtp, need))

    def w(self, name):
        try:
            return self.W[name]
        except KeyError:
            raise KeyError("missing tensor %s" % name) from None

    # RMSNorm: y = w * x / sqrt(mean(x^2) + eps), over the last axis.
    def rmsnorm(self, x, weight):
        eps = self.dt.type(self.eps)
        return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)

    # Partial half-split (NeoX) RoPE on x [T, heads, head_dim] at positions pos [T].
    def rope(self, x, pos):
        r, half = self.r, self.r // 2
        if r == 0:
            return x
        j = np.arange(half, dtype=np.float64)
        inv = self.theta ** (-2.0 * j / r)                 # theta^(-2j/r)
        ang = pos.astype(np.float64)[:, None] * inv[None, :]   # [T, r/2]
        cos = np.cos(ang)[:, None, :].astype(self.dt)      # tables rounded once to the type
        sin = np.sin(ang)[:, None, :].astype(self.dt)
        a, b = x[..., :half], x[..., half:r]               # pair (j, j + r/2)
        out = x.copy()
        out[..., :half] = a * cos - b * sin
        out[..., half:r] = b * cos + a * sin
        return out                                         # dims >= r pass through

    def attention(self, L, x, pos):
        """x [T, H] residual stream -> attention output [T, H] (before the add)."""
        p = "model.layers.%d." % L
        T = x.shape[0]
        hd, nh, nkv = self.hd, self.nh, self.nkv
        h = self.rmsnorm(x, self.w(p + "input_layernorm.weight"))
        q = h @ self.w(p + "self_attn.q_proj.weight").T
        k = h @ self.w(p + "self_attn.k_proj.weight").T
        v = h @ self.w(p + "self_attn.v_proj.weight").T
        if self.attn_bias:
            q = q + self.w(p + "self_attn.q_proj.bias")
            k = k + self.w(p + "self_attn.k_proj.bias")
            v = v + self.w(p + "self_attn.v_proj.bias")
        q = q.reshape(T, nh, hd)
        k = k.reshape(T, nkv, hd)
        v = v.reshape(T, nkv, hd)
        if self.qk_norm:                                   # before RoPE
            q = self.rmsnorm(q, self.w(p + "self_attn.q_norm.weight"))
            k = self.rmsnorm(k, self.w(p + "self_attn.k_norm.weight"))
        q = self.rope(q, pos)
        k = self.rope(k, pos)
        group = nh // nkv
        mask = np.tril(np.ones((T, T), dtype=bool))        # key s <= query t
        out = np.empty((T, nh, hd), dtype=self.dt)
        for i in range(nh):
            kv = i // group                                # GQA
            s = (q[:, i, :] @ k[:, kv, :].T) / self.dt.type(np.sqrt(hd))
            s = np.where(mask, s, -np.inf)
            s = s - s.max(axis=1, keepdims=True)
            pr = np.exp(s)
            pr /= pr.sum(axis=1, keepdims=True)
            out[:, i, :] = pr @ v[:, kv, :]
        return out.reshape(T, nh * hd) @ self.w(p + "self_attn.o_proj.weight").T

    def swiglu(self, prefix, h):
        g = h @ self.w(prefix + "gate_proj.weight").T
        u = h @ self.w(prefix + "up_proj.weight").T
        return (silu(g) * u) @ self.w(prefix + "down_proj.weight").T

    def route(self, L, h2):
        """MoE routing (MODEL.md 2, MoE steps 1-5) -> (idx [T,k], weights [T,k])."""
        p = "model.layers.%d.mlp.gate." % L
        logits = h2 @ self.w(p + "weight").T               # [T, E]
        s = sigmoid(logits)
        c = s + self.w(p + "e_score_correction_bias")      # selection only
        T, E = c.shape
        if self.n_group > 1:
            gs = E // self.n_group
            cg = c.reshape(T, self.n_group, gs)
            top2 = -np.sort(-cg, axis=2)[:, :, :min(2, gs)]
            gscore = top2.sum(axis=2)                      # [T, n_group]
            gorder = np.argsort(-gscore, axis=1, kind="stable")
            keep = np.zeros((T, self.n_group), dtype=bool)
            np.put_along_axis(keep, gorder[:, :self.topk_group], True, axis=1)
            c = np.where(np.repeat(keep, gs, axis=1), c, -np.inf)
        # top-k, ties to the lower expert id (stable sort of -c).
        order = np.argsort(-c, axis=1, kind="stable")
        idx = order[:, :self.topk]
        if self.topk < E:
            # Gap between the last selected and the first rejected corrected
            # score: how close a routing decision came to flipping.
            cs = np.take_along_axis(c, order[:, self.topk - 1:self.topk + 1], axis=1)
            gap = cs[:, 0] - cs[:, 1]
            self.min_route_margin = min(self.min_route_margin, float(gap.min()))
        w = np.take_along_axis(s, idx, axis=1)             # uncorrected sigmoid
        if self.norm_topk:
            w = w / (w.sum(axis=1, keepdims=True) + 1e-20)
        w = w * self.scale
        return idx, w

    def moe(self, L, h2):
        p = "model.layers.%d.mlp." % L
        idx, w = self.route(L, h2)
        y = np.zeros_like(h2)
        for e in np.unique(idx):
            rows, slot = np.nonzero(idx == e)
            y[rows] += w[rows, slot][:, None] * self.swiglu(p + "experts.%d." % e, h2[rows])
        if self.n_shared > 0:
            y += self.swiglu(p + "shared_experts.", h2)    # unweighted
        return y

    def decoder_layer(self, L, x, pos, moe):
        x = x + self.attention(L, x, pos)
        h2 = self.rmsnorm(x, self.w("model.layers.%d.post_attention_layernorm.weight" % L))
        x = x + (self.moe(L, h2) if moe else self.swiglu("model.layers.%d.mlp." % L, h2))
        return x

    def lm_head(self, hn):
        return hn @ self.w("lm_head.weight").T

    def forward(self, tokens, last=False):
        """Full causal forward.  Returns (hn [T,H] after model.norm, logits [T,V]); with last,
        the logits of the last row only ([1,V]: a row's logits depend on no other row, and the
        lm_head over every row was most of this script's time at V = 151,552)."""
        tokens = np.asarray(tokens)
        pos = np.arange(len(tokens))
        x = self.w("model.embed_tokens.weight")[tokens]    # no scaling
        for L in range(self.N):
            x = self.decoder_layer(L, x, pos, moe=(L >= self.first_dense))
        hn = self.rmsnorm(x, self.w("model.norm.weight"))
        return hn, self.lm_head(hn[-1:] if last else hn)

    # --- MTP (MODEL.md section 3) ---------------------------------------------
    def mtp_input(self, h, t):
        """u = eh_proj [enorm(embed(t)); hnorm(h)], embedding half first."""
        p = "model.layers.%d." % self.N
        e = self.rmsnorm(self.w("model.embed_tokens.weight")[np.asarray(t)],
                         self.w(p + "enorm.weight"))      # main embed_tokens
        g = self.rmsnorm(h, self.w(p + "hnorm.weight"))
        return np.concatenate([e, g], axis=-1) @ self.w(p + "eh_proj.weight").T

    def mtp_layer(self, u, last=False):
        """Run the MTP decoder layer causally over u [T,H] (row t at position t).
        Returns (hs = shared_head.norm(z) [T,H], logits [T,V]; with last, [1,V] of the last row)."""
        N = self.N
        z = self.decoder_layer(N, u, np.arange(u.shape[0]), moe=True)
        hs = self.rmsnorm(z, self.w("model.layers.%d.shared_head.norm.weight" % N))
        return hs, self.lm_head(hs[-1:] if last else hs)  # main lm_head


def top2_margin(row):
    s = np.sort(row)
    return s[-1] - s[-2]


def outputs(m, tokens, T, anchors, chain_len, drafts=None):
    """Every compared output of model m over tokens[0:T]: target logits [T, V]; with MTP, the
    first drafts [T-1, V] and the chained drafts [A, C, V] at the anchors.  Chain step d+1 is fed
    drafts[a, d+1] when given (so that a float32 run follows the float64 run's drafts), else the
    arg-max of step d.  Returns (dict of arrays, drafts [A, C] used, route margins)."""
    V = m.V
    res, margins = {}, {}
    m.min_route_margin = np.inf
    hn, res["logits"] = m.forward(tokens[:T])
    margins["min_route_margin"] = float(m.min_route_margin)
    used = np.zeros((len(anchors), chain_len), dtype=np.int64)
    if m.has_mtp and T >= 2:
        # First drafts: MTP input at position j from (hn[j], tokens[j+1]); the MTP layer
        # attends causally over inputs 0..j.
        u = m.mtp_input(hn[:T - 1], tokens[1:T])           # [T-1, H]
        m.min_route_margin = np.inf
        hs, res["mtp_logits"] = m.mtp_layer(u)
        margins["min_mtp_route_margin"] = float(m.min_route_margin)
        # Chained drafts at anchors.  Step 1 at anchor i = mtp_logits[i]; step d+1 appends
        # u' = mtp_input(shared_head.norm(z_d), draft_d) at position i+d and reruns the MTP
        # layer over [u_0..u_i, u'_(i+1)..].
        chain = np.zeros((len(anchors), chain_len, V), dtype=m.dt)
        for ai, i in enumerate(anchors):
            seq = u[:i + 1]
            h_c, lg_c = hs[i], res["mtp_logits"][i]
            for d in range(chain_len):
                if d > 0:
                    t = int(drafts[ai, d]) if drafts is not None else int(np.argmax(lg_c))
                    used[ai, d] = t
                    u_new = m.mtp_input(h_c[None, :], [t])
                    seq = np.concatenate([seq, u_new], axis=0)
                    hs_s, lg_s = m.mtp_layer(seq, last=True)
                    h_c, lg_c = hs_s[-1], lg_s[-1]
                chain[ai, d] = lg_c
        res["mtp_chain_logits"] = chain
    return res, used, margins


# The float32 rounding error of each compared row (max over the vocabulary of |float32 run -
# float64 run|), written beside the logits for test_model_ref's per-row bounds.
ERR_NAMES = {"logits": "logits_f32err", "mtp_logits": "mtp_logits_f32err",
             "mtp_chain_logits": "mtp_chain_f32err"}


def f32_errors(model_dir, m64, tokens, T, anchors, chain_len, r64, drafts):
    """Reruns the compared outputs in float32 (same weights, widened exactly; the float64 run's
    tokens, drafts and, but for near ties, routing) and returns [(name, per-row error)]."""
    m32 = GlmRef(model_dir, np.float32, m64.W)
    r32, _, _ = outputs(m32, tokens, T, anchors, chain_len, drafts)
    out = []
    for k, name in ERR_NAMES.items():
        if k in r64:
            d = np.abs(r32[k].astype(np.float64) - r64[k])
            out.append((name, d.max(axis=-1)))
    return out


def main(argv):
    ap = argparse.ArgumentParser(description="float64 reference forward for glm4_moe")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--chain", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--f32err-for", metavar="EXPECTED",
                    help="instead of generating: copy EXPECTED (the same tensors, made by another "
                         "implementation, e.g. tools/train/evaluate.py) to --out and add the float32 "
                         "error rows measured on its tokens, drafts and anchors")
    a = ap.parse_args(argv)
    if a.prompt_len < 1 or a.gen < 0 or a.chain < 1:
        sys.exit("glm_ref.py: need --prompt-len >= 1, --gen >= 0, --chain >= 1")

    t0 = time.time()
    m = GlmRef(a.model)
    t_load = time.time() - t0
    V = m.V

    if a.f32err_for:
        ex = read_safetensors(a.f32err_for)
        tokens = ex["tokens"].astype(np.int64)
        T = ex["logits"].shape[0]
        anchors = [int(x) for x in ex.get("mtp_chain_pos", np.zeros(0))]
        chain_len = ex["mtp_chain_logits"].shape[1] if "mtp_chain_logits" in ex else 1
        drafts = np.zeros((len(anchors), chain_len), dtype=np.int64)
        for ai in range(len(anchors)):
            for d in range(1, chain_len):
                drafts[ai, d] = int(np.argmax(ex["mtp_chain_logits"][ai, d - 1]))
        r64, _, _ = outputs(m, tokens, T, anchors, chain_len, drafts)
        for k in ERR_NAMES:
            if k in ex:
                agree = np.abs(r64[k] - ex[k]).max() / np.abs(ex[k]).max()
                print("  this reference against %s %-18s max|diff|/max|ref| %.3e"
                      % (os.path.basename(a.f32err_for), k, agree))
        outs = [(n, x.astype(np.int32) if x.dtype.kind in "iu" else x) for n, x in ex.items()
                if n not in ERR_NAMES.values()]
        errs = f32_errors(a.model, m, tokens, T, anchors, chain_len, r64, drafts)
        outs += errs
        write_safetensors(a.out, outs, {"format": "pt", "from": os.path.abspath(a.f32err_for),
                                        "generator": "tests/reference/glm_ref.py --f32err-for"})
        for name, e in errs:
            print("  %-20s max %.3e, median %.3e" % (name, e.max(), np.median(e)))
        print("  wrote %s (%.2f s)" % (a.out, time.time() - t0))
        return

    P, G = a.prompt_len, a.gen

    # 1. Prompt.
    tokens = [int(t) for t in np.random.default_rng(a.seed).integers(0, V, P)]

    # 2. Greedy: full recompute each step, argmax of the last row (ties: lowest
    #    index, which np.argmax gives), until G+1 tokens are generated.
    margins = []
    for _ in range(G + 1):
        _, lg = m.forward(tokens, last=True)
        last = lg[-1]
        margins.append(top2_margin(last))
        tokens.append(int(np.argmax(last)))
    tokens = np.array(tokens, dtype=np.int64)
    T = P + G                                              # rows of `logits`

    # 3.-5. Target logits over tokens[0:T], first MTP drafts, chained drafts at anchors.
    anchors = sorted({x for x in (P - 1, P + G // 2, P + G - 2) if 0 <= x <= T - 2})
    if not (m.has_mtp and T >= 2):
        anchors = []
    r64, drafts, rm = outputs(m, tokens, T, anchors, a.chain)
    logits = r64["logits"]
    outs = [("tokens", tokens.astype(np.int32)), ("logits", logits)]
    summary = {"max_abs_logit": float(np.abs(logits).max()),
               "min_greedy_margin": float(min(margins)),
               "min_route_margin": rm["min_route_margin"]}

    if "mtp_logits" in r64:
        mtp_logits, chain = r64["mtp_logits"], r64["mtp_chain_logits"]
        summary["min_mtp_route_margin"] = rm["min_mtp_route_margin"]
        outs.append(("mtp_logits", mtp_logits))
        outs.append(("mtp_chain_logits", chain))
        outs.append(("mtp_chain_pos", np.array(anchors, dtype=np.int32)))
        # Agreement of the first draft with the target's next token (on a
        # random model this is typically low; reported for information only).
        agree = np.mean(np.argmax(mtp_logits, axis=1) == tokens[2:T + 1])
        summary.update({"max_abs_mtp_logit": float(np.abs(mtp_logits).max()),
                        "min_mtp_margin": float(min(top2_margin(r) for r in mtp_logits)),
                        "min_chain_margin": float(min(top2_margin(r) for r in chain.reshape(-1, V))),
                        "mtp_top1_agreement": float(agree),
                        "chain_anchors": anchors})

    # 6. The float32 rounding error of every row, for the per-row bounds of test_model_ref.
    errs = f32_errors(a.model, m, tokens, T, anchors, a.chain, r64, drafts)
    outs += errs
    for name, e in errs:
        summary[name] = "max %.3e, median %.3e" % (e.max(), np.median(e))

    for name, arr in outs:
        if not np.all(np.isfinite(arr)):
            sys.exit("glm_ref.py: non-finite values in %s" % name)

    meta = {"format": "pt", "model": os.path.abspath(a.model),
            "prompt_len": P, "gen": G, "chain": a.chain, "seed": a.seed,
            "generator": "tests/reference/glm_ref.py (float64)"}
    write_safetensors(a.out, outs, meta)

    print("glm_ref: %s  P=%d G=%d chain=%d seed=%d  (load %.2f s, total %.2f s)"
          % (a.model, P, G, a.chain, a.seed, t_load, time.time() - t0))
    print("  generated: %s" % " ".join(str(t) for t in tokens[P:]))
    for k, v in summary.items():
        print("  %-20s %s" % (k, ("%.6g" % v) if isinstance(v, float) else v))
    print("  wrote %s: %s" % (a.out, ", ".join("%s%s" % (n, list(x.shape)) for n, x in outs)))


if __name__ == "__main__":
    main(sys.argv[1:])
