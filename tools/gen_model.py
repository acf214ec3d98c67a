# SPDX-License-Identifier: MIT
#
# gen_model.py -- write a random GLM-4.x MoE checkpoint (Glm4MoeForCausalLM,
# model_type "glm4_moe") in exact Hugging Face layout: config.json,
# generation_config.json and safetensors weights (one file, or shards with
# model.safetensors.index.json).  The tensor names, shapes and config fields
# follow /work/shared/MODEL.md sections 1-2 (and the MTP layer of section 3).
# The values are random but chosen so that activations stay O(1) through the
# layers and the logits are well spread; they make no sense as a language
# model.  Output is byte-for-byte deterministic for a given seed and options:
# every tensor draws from its own generator, seeded from (seed, crc32(name)),
# so adding a knob that adds tensors never changes the others.
#
# The safetensors writer is self-contained (no safetensors package): 8-byte
# little-endian header length, a JSON header {name: {dtype, shape,
# data_offsets}} plus "__metadata__": {"format": "pt"}, padded with spaces to
# a multiple of 8, then the tensor data, contiguous, in header order.
#
# Quantized checkpoints (--quant): the random weights are made as for BF16 and then quantized
# the way the published tools do it, in the Hugging Face layouts lockstep loads (model/quant.h):
#   fp8-channel  compressed-tensors float-quantized, strategy channel: X.weight F8_E4M3,
#                X.weight_scale F32 [out, 1] = amax(row) / 448
#   fp8-block    quant_method fp8, weight_block_size [128, 128]: X.weight F8_E4M3,
#                X.weight_scale_inv F32 [ceil(out/128), ceil(in/128)] = amax(block) / 448
#   nvfp4        ModelOpt (hf_quant_config.json): X.weight U8 [out, in/2] (E2M1 codes, low
#                nibble = even column), X.weight_scale F8_E4M3 [out, in/16] = amax(group) / 6 /
#                weight_scale_2, X.weight_scale_2 F32 = amax(W) / (6 * 448), X.input_scale F32
#   nvfp4-ct     compressed-tensors nvfp4-pack-quantized: X.weight_packed, X.weight_scale,
#                X.weight_global_scale = 1 / weight_scale_2 (a divisor), X.input_global_scale
# Rounding is to nearest, ties to the even code. The router (mlp.gate) and the embedding stay
# BF16; --quant-skip keeps more groups BF16 (mixed checkpoints). --quant-defect writes one
# malformed variant for the loader's refusal tests. --exp0-share F sets the exponent of every
# (1/F)-th FP8 code or NVFP4 group scale to 0 after quantizing (sign and mantissa kept: a zero or
# a subnormal; F = 0.01 makes them about 100 times as common as a quantizer does).
#
# Usage:  /usr/bin/python3 tools/gen_model.py --out DIR [options]
#         /usr/bin/python3 tools/gen_model.py --out DIR --preset air-1g

import argparse
import json
import os
import struct
import sys
import time
import zlib

import numpy as np

# Defaults of the small test model.  Every option can be overridden on the
# command line; a preset replaces some of these defaults (explicit options
# still win over the preset).
DEFAULTS = dict(
    seed=0, hidden=128, layers=3, heads=4, kv_heads=2, head_dim=32,
    partial_rotary=0.5, rope_theta=10000.0, qk_norm=1, attn_bias=1,
    first_dense=1, experts=8, shared_experts=1, topk=2, moe_inter=64,
    inter=192, scale=2.5, n_group=1, topk_group=1, norm_topk=1, eps=1e-5,
    vocab=512, mtp=1, mtp_extras=0, dtype="bf16", shards=1,
    max_pos=4096, quant="none", quant_skip="lm_head", quant_defect="none", scale_bf16=0,
    exp0_share=0.0,
)

QUANTS = ("none", "fp8-channel", "fp8-block", "nvfp4", "nvfp4-ct")
QUANT_GROUPS = ("attn", "dense", "experts", "shared", "eh_proj", "mtp", "lm_head")
DEFECTS = ("none", "missing-scale", "scale-shape", "scale-dtype", "unknown-method",
           "group-size", "bad-dtype")

# GLM-4.5-Air proportions (MODEL.md section 2, right column) scaled down so
# that the BF16 checkpoint is about 1 GB: 96/8 heads -> 16/4, 128 experts of
# 1408 -> 32 of 352, top-8, 1 dense layer, no qk-norm, scale 1.0, theta 1e6.
PRESETS = {
    "air-1g": dict(
        hidden=1024, layers=12, heads=16, kv_heads=4, head_dim=64,
        partial_rotary=0.5, rope_theta=1e6, qk_norm=0, attn_bias=1,
        first_dense=1, experts=32, shared_experts=1, topk=8, moe_inter=352,
        inter=2736, scale=1.0, n_group=1, topk_group=1, norm_topk=1,
        vocab=16384, mtp=1,
    ),
    # Deep, for speculation's measurements (issue 19): GLM-4.5-Air's shape with 32 layers, so
    # that the MTP layer is about 1/32 of the layers and the lm_head a few percent of the bytes
    # read per token, as in the real model (46 layers). Hidden 4096 -> 512 and the rest with it:
    # 96 query heads of 128 -> 12 (attention 3x as wide as the hidden state, as in the real
    # model, so the routed experts are about half of the bytes a token reads, not 70 %), 8 KV
    # heads -> 2, experts of 1408 -> 176; about 0.7 GB in BF16. Make it draftable with
    # tests/reference/spec_ref.py --make-draftable.
    "air-deep": dict(
        hidden=512, layers=32, heads=12, kv_heads=2, head_dim=128,
        partial_rotary=0.5, rope_theta=1e6, qk_norm=0, attn_bias=1,
        first_dense=1, experts=32, shared_experts=1, topk=8, moe_inter=176,
        inter=1408, scale=1.0, n_group=1, topk_group=1, norm_topk=1,
        vocab=16384, mtp=1,
    ),
    # Wide, for the kernels' speed at the real model's row lengths: GLM-4.5-Air's own widths
    # (hidden 4096; 96 query heads of 128, 8 KV heads; experts of 1408; dense 10944) in 3 layers
    # (1 dense) with 16 routed experts, top-8, no MTP: 2.4 GB in BF16, 0.84 G weights read a
    # token. Its rows are 4x longer than air-1g's, so a row's fixed costs weigh less.
    "air-wide": dict(
        hidden=4096, layers=3, heads=96, kv_heads=8, head_dim=128,
        partial_rotary=0.5, rope_theta=1e6, qk_norm=0, attn_bias=1,
        first_dense=1, experts=16, shared_experts=1, topk=8, moe_inter=1408,
        inter=10944, scale=1.0, n_group=1, topk_group=1, norm_topk=1,
        vocab=16384, mtp=0,
    ),
}


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Write a random Glm4MoeForCausalLM checkpoint "
                    "(HF layout, safetensors).")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--preset", choices=sorted(PRESETS),
                   help="start from a preset (explicit options override it)")
    # default=None everywhere so that we can tell "given" from "not given".
    add = lambda flag, typ, help_: p.add_argument(flag, type=typ, default=None,
                                                  help=help_)
    add("--seed", int, "random seed (default 0)")
    add("--hidden", int, "hidden_size (128)")
    add("--layers", int, "num_hidden_layers, MTP not counted (3)")
    add("--heads", int, "num_attention_heads (4)")
    add("--kv-heads", int, "num_key_value_heads (2)")
    add("--head-dim", int, "head_dim (32)")
    add("--partial-rotary", float, "partial_rotary_factor (0.5)")
    add("--rope-theta", float, "rope_theta (10000)")
    add("--qk-norm", int, "use_qk_norm 0|1 (1)")
    add("--attn-bias", int, "attention_bias 0|1 (1)")
    add("--first-dense", int, "first_k_dense_replace (1)")
    add("--experts", int, "n_routed_experts (8)")
    add("--shared-experts", int, "n_shared_experts (1)")
    add("--topk", int, "num_experts_per_tok (2)")
    add("--moe-inter", int, "moe_intermediate_size (64)")
    add("--inter", int, "intermediate_size of the dense layers (192)")
    add("--scale", float, "routed_scaling_factor (2.5)")
    add("--n-group", int, "n_group (1)")
    add("--topk-group", int, "topk_group (1)")
    add("--norm-topk", int, "norm_topk_prob 0|1 (1)")
    add("--eps", float, "rms_norm_eps (1e-5)")
    add("--vocab", int, "vocab_size (512)")
    add("--mtp", int, "num_nextn_predict_layers 0|1 (1)")
    add("--mtp-extras", int,
        "0|1 (0): also write the MTP layer's optional embed_tokens and "
        "shared_head.head, with values different from the main ones "
        "(a runtime must ignore them, MODEL.md section 2 Decision)")
    add("--max-pos", int, "max_position_embeddings (4096)")
    p.add_argument("--dtype", choices=["bf16", "f32"], default=None,
                   help="weight dtype (bf16); e_score_correction_bias is F32")
    add("--shards", int, "number of safetensors shards (1)")
    p.add_argument("--quant", choices=QUANTS, default=None,
                   help="quantize the projections (none): fp8-channel, fp8-block, nvfp4 "
                        "(ModelOpt), nvfp4-ct (compressed-tensors)")
    p.add_argument("--quant-skip", default=None,
                   help="comma-separated groups left BF16 (lm_head): %s, or none"
                        % ",".join(QUANT_GROUPS))
    p.add_argument("--quant-defect", choices=DEFECTS, default=None,
                   help="write one malformed variant (tests of the loader's refusals)")
    add("--scale-bf16", int, "0|1 (0): FP8 scales in BF16 instead of F32")
    add("--exp0-share", float, "share of FP8 codes / NVFP4 scales given exponent 0 (0): zeros "
        "and subnormals, which the CPU kernels convert apart")
    a = p.parse_args(argv)

    # Resolve: defaults < preset < explicit options.
    opt = dict(DEFAULTS)
    if a.preset:
        opt.update(PRESETS[a.preset])
    for k in DEFAULTS:
        v = getattr(a, k, None)
        if v is not None:
            opt[k] = v
    opt["out"] = a.out
    opt["preset"] = a.preset
    check_options(opt)
    return opt


def check_options(o):
    def need(cond, msg):
        if not cond:
            sys.exit("gen_model.py: " + msg)
    for k in ("hidden", "layers", "heads", "kv_heads", "head_dim", "experts",
              "topk", "moe_inter", "inter", "vocab", "shards", "n_group",
              "topk_group"):
        need(o[k] >= 1, "--%s must be >= 1" % k.replace("_", "-"))
    need(o["heads"] % o["kv_heads"] == 0, "--heads must be a multiple of --kv-heads")
    r = o["head_dim"] * o["partial_rotary"]
    need(abs(r - round(r)) < 1e-9 and int(round(r)) % 2 == 0 and 0 <= r <= o["head_dim"],
         "head_dim * partial_rotary_factor must be an even integer <= head_dim")
    need(o["topk"] <= o["experts"], "--topk must be <= --experts")
    need(o["experts"] % o["n_group"] == 0, "--experts must be a multiple of --n-group")
    need(o["topk_group"] <= o["n_group"], "--topk-group must be <= --n-group")
    need(o["mtp"] in (0, 1), "--mtp must be 0 or 1")
    need(o["shared_experts"] >= 0, "--shared-experts must be >= 0")
    need(0 <= o["first_dense"], "--first-dense must be >= 0")
    need(o["vocab"] >= 8, "--vocab must be >= 8 (special ids live at the top)")
    skip = [g for g in o["quant_skip"].split(",") if g and g != "none"]
    need(all(g in QUANT_GROUPS for g in skip), "--quant-skip: groups are %s" % ",".join(QUANT_GROUPS))
    o["quant_skip_set"] = set(skip)
    need(o["quant"] != "none" or o["quant_defect"] == "none", "--quant-defect needs --quant")
    need(o["quant"] == "none" or o["dtype"] == "bf16", "--quant needs --dtype bf16")


# ---------------------------------------------------------------------------
# Tensor list: names and shapes of MODEL.md section 2 "Tensor names".
# Weights are [out_features, in_features].  Each entry is
# (name, shape, kind) with kind selecting the initialiser (see init_values).
# ---------------------------------------------------------------------------

def decoder_layer_tensors(o, L, moe):
    H, hd = o["hidden"], o["head_dim"]
    nq, nkv = o["heads"] * hd, o["kv_heads"] * hd
    pre = "model.layers.%d." % L
    t = [(pre + "input_layernorm.weight", (H,), "norm")]
    # Attention: q/k/v with biases when attention_bias, o_proj without bias.
    for proj, n in (("q_proj", nq), ("k_proj", nkv), ("v_proj", nkv)):
        t.append((pre + "self_attn.%s.weight" % proj, (n, H), "proj"))
        if o["attn_bias"]:
            t.append((pre + "self_attn.%s.bias" % proj, (n,), "bias"))
    if o["qk_norm"]:
        # Shared per-head RMSNorm weights, [head_dim].
        t.append((pre + "self_attn.q_norm.weight", (hd,), "norm"))
        t.append((pre + "self_attn.k_norm.weight", (hd,), "norm"))
    t.append((pre + "self_attn.o_proj.weight", (H, nq), "proj"))
    t.append((pre + "post_attention_layernorm.weight", (H,), "norm"))
    if not moe:
        I = o["inter"]
        t += [(pre + "mlp.gate_proj.weight", (I, H), "proj"),
              (pre + "mlp.up_proj.weight", (I, H), "proj"),
              (pre + "mlp.down_proj.weight", (H, I), "proj")]
    else:
        E, I = o["experts"], o["moe_inter"]
        t.append((pre + "mlp.gate.weight", (E, H), "router"))
        t.append((pre + "mlp.gate.e_score_correction_bias", (E,), "ecorr"))
        for e in range(E):
            ep = pre + "mlp.experts.%d." % e
            t += [(ep + "gate_proj.weight", (I, H), "proj"),
                  (ep + "up_proj.weight", (I, H), "proj"),
                  (ep + "down_proj.weight", (H, I), "proj")]
        if o["shared_experts"] > 0:
            Is = I * o["shared_experts"]   # shared intermediate = moe_inter * n_shared
            sp = pre + "mlp.shared_experts."
            t += [(sp + "gate_proj.weight", (Is, H), "proj"),
                  (sp + "up_proj.weight", (Is, H), "proj"),
                  (sp + "down_proj.weight", (H, Is), "proj")]
    return t


def all_tensors(o):
    H, V, N = o["hidden"], o["vocab"], o["layers"]
    t = [("model.embed_tokens.weight", (V, H), "embed")]
    for L in range(N):
        t += decoder_layer_tensors(o, L, moe=(L >= o["first_dense"]))
    if o["mtp"]:
        # MTP layer, index N = num_hidden_layers: enorm, hnorm, eh_proj [H, 2H],
        # a full MoE decoder layer, shared_head.norm (MODEL.md sections 2-3).
        pre = "model.layers.%d." % N
        t += [(pre + "enorm.weight", (H,), "norm"),
              (pre + "hnorm.weight", (H,), "norm"),
              (pre + "eh_proj.weight", (H, 2 * H), "proj")]
        t += decoder_layer_tensors(o, N, moe=True)
        t.append((pre + "shared_head.norm.weight", (H,), "norm"))
        if o["mtp_extras"]:
            # Optional tensors that real checkpoints may carry; the runtime must
            # use the main embed_tokens / lm_head instead.  Random, different.
            t.append((pre + "embed_tokens.weight", (V, H), "embed"))
            t.append((pre + "shared_head.head.weight", (V, H), "proj"))
    t.append(("model.norm.weight", (H,), "norm"))
    t.append(("lm_head.weight", (V, H), "proj"))
    return t


def tensor_dtype(o, name):
    # e_score_correction_bias is F32 in real GLM BF16 checkpoints.
    if name.endswith("e_score_correction_bias"):
        return "F32"
    return "BF16" if o["dtype"] == "bf16" else "F32"


DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "F8_E4M3": 1, "U8": 1, "I8": 1}


def init_values(o, name, shape, kind):
    """float32 values of one tensor from its own generator (seed, crc32(name))."""
    rng = np.random.default_rng([o["seed"], zlib.crc32(name.encode())])
    n = int(np.prod(shape))
    x = rng.standard_normal(n, dtype=np.float32)
    if kind == "embed":                     # embeddings: std 1
        pass
    elif kind == "norm":                    # norm weights: 1 + 0.1 * normal
        x *= np.float32(0.1)
        x += np.float32(1.0)
    elif kind in ("bias", "ecorr"):         # biases, correction bias: 0.1 * normal
        x *= np.float32(0.1)
    elif kind == "router":                  # router rows: std 1/sqrt(H)
        x *= np.float32(1.0 / np.sqrt(shape[1]))
    elif kind == "proj":                    # projections: std 1/sqrt(fan_in)
        x *= np.float32(1.0 / np.sqrt(shape[1]))
    else:
        raise ValueError(kind)
    return x


def f32_to_bf16_bytes(x):
    """float32 array -> BF16 bytes, round to nearest even (no NaNs expected)."""
    u = x.view(np.uint32)
    # Add 0x7FFF plus the lowest kept bit, then truncate: round-half-to-even.
    u = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    return u.astype("<u2").tobytes()


def tensor_bytes(o, name, shape, kind):
    x = init_values(o, name, shape, kind)
    if tensor_dtype(o, name) == "BF16":
        return f32_to_bf16_bytes(x)
    return x.astype("<f4").tobytes()


# ---------------------------------------------------------------------------
# Quantization (see the header): E4M3 "fn" and E2M1 encoders, round to nearest,
# ties to the even code, by search in the sorted table of non-negative values.
# ---------------------------------------------------------------------------

def _e4m3_table():
    v = []
    for c in range(127):                    # 0x7f is NaN
        e, m = c >> 3, c & 7
        v.append(m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))
    return np.array(v)


E4M3 = _e4m3_table()                        # codes 0..126 ascending, max 448
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def encode(x, table):
    """float array -> (codes without sign, sign bits) by nearest table value,
    ties to the even code; magnitudes beyond the table saturate."""
    a = np.minimum(np.abs(x).astype(np.float64), table[-1])
    hi = np.clip(np.searchsorted(table, a), 1, len(table) - 1)
    lo = hi - 1
    dl, dh = a - table[lo], table[hi] - a
    code = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(lo % 2 == 0, lo, hi)))
    return code.astype(np.uint8), (x < 0)


def e4m3_bytes(x):
    c, neg = encode(x, E4M3)
    return (c | (neg.astype(np.uint8) << 7)).astype(np.uint8)


def e4m3_value(b):
    v = E4M3[np.minimum(b & 0x7f, 126)]
    return np.where(b & 0x80, -v, v)


def exp0_share(o, b):
    """E4M3 bytes b with every (1 / o["exp0_share"])-th one's exponent cleared."""
    if not o.get("exp0_share"):
        return b
    flat = b.reshape(-1).copy()
    flat[::max(1, round(1 / o["exp0_share"]))] &= 0x87
    return flat.reshape(b.shape)


def quantize(o, w, scheme):
    """w float32 [out, in] -> dict suffix -> (dtype, shape, bytes)."""
    out_, in_ = w.shape
    w = w.astype(np.float64)
    sdt = "BF16" if o["scale_bf16"] else "F32"

    def scale_bytes(a):
        a = np.asarray(a, dtype=np.float32)
        return f32_to_bf16_bytes(a.ravel()) if sdt == "BF16" else a.astype("<f4").tobytes()

    def scale_used(a):                      # the scale as the file holds it
        a = np.asarray(a, dtype=np.float32)
        if sdt == "BF16":
            u = np.frombuffer(f32_to_bf16_bytes(a.ravel()), "<u2").astype(np.uint32) << 16
            a = u.view(np.float32).reshape(a.shape)
        return a.astype(np.float64)

    if scheme == "fp8-channel":
        s = np.abs(w).max(axis=1, keepdims=True) / 448.0
        s = np.where(s > 0, s, 1.0).astype(np.float32)
        q = exp0_share(o, e4m3_bytes(w / scale_used(s)))
        return {"weight": ("F8_E4M3", (out_, in_), q.tobytes()),
                "weight_scale": (sdt, (out_, 1), scale_bytes(s))}
    if scheme == "fp8-block":
        B = 128
        br, bc = -(-out_ // B), -(-in_ // B)
        pad = np.zeros((br * B, bc * B))
        pad[:out_, :in_] = np.abs(w)
        s = pad.reshape(br, B, bc, B).max(axis=(1, 3)) / 448.0
        s = np.where(s > 0, s, 1.0).astype(np.float32)
        full = np.repeat(np.repeat(scale_used(s), B, axis=0), B, axis=1)[:out_, :in_]
        q = exp0_share(o, e4m3_bytes(w / full))
        return {"weight": ("F8_E4M3", (out_, in_), q.tobytes()),
                "weight_scale_inv": (sdt, (br, bc), scale_bytes(s))}
    # NVFP4: groups of 16 along the input (a malformed width is padded: the loader refuses it).
    G = 16
    ng = -(-in_ // G)
    pad = np.zeros((out_, ng * G))
    pad[:, :in_] = w
    g2 = np.float32(max(np.abs(w).max(), 1e-30) / (6.0 * 448.0))
    gs = np.abs(pad).reshape(out_, ng, G).max(axis=2) / 6.0 / np.float64(g2)
    sb = e4m3_bytes(gs)
    sv = e4m3_value(sb) * np.float64(g2)                # the group's full scale
    sv_full = np.repeat(np.where(sv > 0, sv, 1.0), G, axis=1)
    c, neg = encode(pad / sv_full, E2M1)
    codes = (c | (neg.astype(np.uint8) << 3)).astype(np.uint8)
    codes = codes[:, :2 * (-(-in_ // 2))]
    if codes.shape[1] % 2:
        codes = np.concatenate([codes, np.zeros((out_, 1), np.uint8)], axis=1)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    sb = exp0_share(o, sb)
    one = np.float32(1.0)
    if scheme == "nvfp4":
        return {"weight": ("U8", packed.shape, packed.tobytes()),
                "weight_scale": ("F8_E4M3", sb.shape, sb.tobytes()),
                "weight_scale_2": ("F32", (), np.array(g2, "<f4").tobytes()),
                "input_scale": ("F32", (), np.array(one, "<f4").tobytes())}
    return {"weight_packed": ("U8", packed.shape, packed.tobytes()),
            "weight_scale": ("F8_E4M3", sb.shape, sb.tobytes()),
            "weight_global_scale": ("F32", (1,), np.array([1.0 / g2], "<f4").tobytes()),
            "input_global_scale": ("F32", (1,), np.array([1.0], "<f4").tobytes())}


def quant_group(o, name):
    """The --quant-skip group of a projection weight, or None for tensors that
    are never quantized (embedding, norms, biases, router)."""
    if not name.endswith(".weight") or "norm" in name or "embed_tokens" in name:
        return None
    if name.endswith("mlp.gate.weight"):
        return None
    if name == "lm_head.weight" or "shared_head.head" in name:
        return "lm_head"
    if name.startswith("model.layers.%d." % o["layers"]) and o["mtp"]:
        return "eh_proj" if "eh_proj" in name else "mtp"
    if "self_attn." in name:
        return "attn"
    if "shared_experts." in name:
        return "shared"
    if "mlp.experts." in name:
        return "experts"
    return "dense"


def quant_layout(shape, scheme, sdt):
    """[(suffix, dtype, shape)] that quantize() returns, without computing it."""
    out_, in_ = shape
    if scheme == "fp8-channel":
        return [("weight", "F8_E4M3", (out_, in_)), ("weight_scale", sdt, (out_, 1))]
    if scheme == "fp8-block":
        return [("weight", "F8_E4M3", (out_, in_)),
                ("weight_scale_inv", sdt, (-(-out_ // 128), -(-in_ // 128)))]
    packed, sc = (out_, -(-in_ // 2)), (out_, -(-in_ // 16))
    if scheme == "nvfp4":
        return [("weight", "U8", packed), ("weight_scale", "F8_E4M3", sc),
                ("weight_scale_2", "F32", ()), ("input_scale", "F32", ())]
    return [("weight_packed", "U8", packed), ("weight_scale", "F8_E4M3", sc),
            ("weight_global_scale", "F32", (1,)), ("input_global_scale", "F32", (1,))]


def quant_config(o, ignore):
    q = o["quant"]
    if q == "fp8-channel":
        return {"quant_method": "compressed-tensors", "format": "float-quantized",
                "quantization_status": "compressed", "kv_cache_scheme": None,
                "config_groups": {"group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                "symmetric": True, "dynamic": False, "group_size": None,
                                "block_structure": None, "observer": "minmax"},
                    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                          "symmetric": True, "dynamic": True},
                    "output_activations": None}},
                "ignore": ignore}
    if q == "fp8-block":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                "weight_block_size": [128, 128]}
    if q == "nvfp4":
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                "kv_cache_quant_algo": None, "exclude_modules": ignore}
    return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "quantization_status": "compressed", "kv_cache_scheme": None,
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                            "group_size": 16, "symmetric": True, "dynamic": False},
                "input_activations": {"num_bits": 4, "type": "float",
                                      "strategy": "tensor_group", "group_size": 16,
                                      "symmetric": True, "dynamic": "local"}}},
            "ignore": ignore}


def is_quantized(o, name):
    g = quant_group(o, name)
    return o["quant"] != "none" and g is not None and g not in o["quant_skip_set"]


# ---------------------------------------------------------------------------
# safetensors writer
# ---------------------------------------------------------------------------

def safetensors_header(entries, metadata=None):
    """entries: list of (name, dtype, shape, nbytes) in file order.
    Returns the complete header bytes (length prefix + padded JSON)."""
    hdr = {"__metadata__": dict(metadata or {"format": "pt"})}
    off = 0
    for name, dt, shape, nbytes in entries:
        hdr[name] = {"dtype": dt, "shape": list(shape),
                     "data_offsets": [off, off + nbytes]}
        off += nbytes
    js = json.dumps(hdr, separators=(",", ":")).encode()
    js += b" " * ((-len(js)) % 8)            # pad with spaces to a multiple of 8
    return struct.pack("<Q", len(js)) + js


def write_safetensors(path, items, metadata=None):
    """items: list of (name, dtype, shape, bytes_fn) where bytes_fn() returns
    the raw little-endian data.  Data is produced one tensor at a time."""
    entries = []
    for name, dt, shape, _ in items:
        entries.append((name, dt, shape, int(np.prod(shape)) * DTYPE_SIZE[dt]))
    with open(path, "wb") as f:
        f.write(safetensors_header(entries, metadata))
        for (name, dt, shape, fn), (_, _, _, nbytes) in zip(items, entries):
            b = fn()
            assert len(b) == nbytes, (name, len(b), nbytes)
            f.write(b)


def shard_assignment(sizes, nshards):
    """Spread tensors (in order) over nshards contiguous groups of about equal
    bytes; a tensor goes to the shard that holds the middle of its bytes.
    Falls back to an even split by count if some shard would be empty."""
    total = float(sum(sizes))
    out, cum = [], 0
    for s in sizes:
        mid = cum + s / 2.0
        out.append(min(nshards - 1, int(mid * nshards / total)))
        cum += s
    if len(set(out)) != nshards:
        n = len(sizes)
        out = [min(nshards - 1, i * nshards // n) for i in range(n)]
    return out


# ---------------------------------------------------------------------------
# config.json / generation_config.json
# ---------------------------------------------------------------------------

def make_config(o):
    V = o["vocab"]
    eos = [V - 2, V - 1]                    # GLM ships a list of eos ids
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "attention_bias": bool(o["attn_bias"]),
        "attention_dropout": 0.0,
        "bos_token_id": V - 3,
        "eos_token_id": eos,
        "pad_token_id": eos[0],
        "first_k_dense_replace": o["first_dense"],
        "head_dim": o["head_dim"],
        "hidden_act": "silu",
        "hidden_size": o["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": o["inter"],
        "max_position_embeddings": o["max_pos"],
        "moe_intermediate_size": o["moe_inter"],
        "n_group": o["n_group"],
        "n_routed_experts": o["experts"],
        "n_shared_experts": o["shared_experts"],
        "norm_topk_prob": bool(o["norm_topk"]),
        "num_attention_heads": o["heads"],
        "num_experts_per_tok": o["topk"],
        "num_hidden_layers": o["layers"],
        "num_key_value_heads": o["kv_heads"],
        "num_nextn_predict_layers": o["mtp"],
        "partial_rotary_factor": o["partial_rotary"],
        "rms_norm_eps": o["eps"],
        "rope_scaling": None,
        "rope_theta": o["rope_theta"],
        "routed_scaling_factor": o["scale"],
        "tie_word_embeddings": False,
        "topk_group": o["topk_group"],
        "torch_dtype": "bfloat16" if o["dtype"] == "bf16" else "float32",
        "transformers_version": "4.54.0",
        "use_cache": True,
        "use_qk_norm": bool(o["qk_norm"]),
        "vocab_size": V,
    }


def main(argv):
    o = parse_args(argv)
    t0 = time.time()
    os.makedirs(o["out"], exist_ok=True)
    cfg = make_config(o)
    gen_cfg = {"_from_model_config": True, "do_sample": False,
               "eos_token_id": cfg["eos_token_id"],
               "pad_token_id": cfg["pad_token_id"],
               "transformers_version": cfg["transformers_version"]}
    with open(os.path.join(o["out"], "generation_config.json"), "w") as f:
        json.dump(gen_cfg, f, indent=2)
        f.write("\n")

    tensors = all_tensors(o)
    items, sizes = [], []
    cache = {}                              # the last quantized weight: base -> parts

    def qpart(name, shape, kind, base, suffix):
        if base not in cache:
            cache.clear()
            w = init_values(o, name, shape, kind).reshape(shape)
            # Quantize the BF16 weight (what a BF16 checkpoint would hold).
            w = np.frombuffer(f32_to_bf16_bytes(w.ravel()), "<u2").astype(np.uint32) << 16
            cache[base] = quantize(o, w.view(np.float32).reshape(shape), o["quant"])
        return cache[base][suffix][2]

    defect, ignore = o["quant_defect"], []
    sdt = "BF16" if o["scale_bf16"] else "F32"
    for name, shape, kind in tensors:
        if not is_quantized(o, name):
            if o["quant"] != "none" and quant_group(o, name) is not None or \
                    name.endswith("mlp.gate.weight"):
                ignore.append(name[:-len(".weight")])
            dt = tensor_dtype(o, name)
            # Bind loop variables through default arguments.
            fn = (lambda name=name, shape=shape, kind=kind: tensor_bytes(o, name, shape, kind))
            items.append((name, dt, shape, fn))
            sizes.append(int(np.prod(shape)) * DTYPE_SIZE[dt])
            continue
        base = name[:-len(".weight")]
        for suffix, dt, qshape in quant_layout(shape, o["quant"], sdt):
            fn = (lambda name=name, shape=shape, kind=kind, base=base, suffix=suffix:
                  qpart(name, shape, kind, base, suffix))
            is_scale = suffix in ("weight_scale", "weight_scale_inv")
            if defect != "none" and base.endswith("layers.0.self_attn.q_proj"):
                # The malformed variants (first quantized tensor only).
                if defect == "missing-scale" and is_scale:
                    continue
                if defect == "scale-shape" and is_scale:
                    n0 = int(np.prod(qshape)) * DTYPE_SIZE[dt]
                    qshape = (qshape[0] + 1,) + tuple(qshape[1:])
                    extra = int(np.prod(qshape)) * DTYPE_SIZE[dt] - n0
                    fn = (lambda fn=fn, extra=extra: fn() + b"\0" * extra)
                if defect == "scale-dtype" and is_scale:
                    dt = "U8" if dt == "F8_E4M3" else "I32" if dt == "F32" else "F16"
                if defect == "bad-dtype" and suffix in ("weight", "weight_packed"):
                    dt = "I8"
            items.append(("%s.%s" % (base, suffix), dt, qshape, fn))
            sizes.append(int(np.prod(qshape)) * DTYPE_SIZE[dt])

    hq = os.path.join(o["out"], "hf_quant_config.json")
    if os.path.exists(hq):
        os.remove(hq)
    if o["quant"] != "none":
        qc = quant_config(o, ignore)
        if defect == "unknown-method":
            qc["quant_method"] = "awq"
        if defect == "group-size":
            if "group_size" in qc:
                qc["group_size"] = 32
            elif "weight_block_size" in qc:
                qc["weight_block_size"] = [64, 64]
            else:
                for g in qc["config_groups"].values():
                    g["weights"]["strategy"] = "group"
                    g["weights"]["group_size"] = 32
        cfg["quantization_config"] = qc
        if o["quant"] == "nvfp4":
            hf = {"producer": {"name": "modelopt", "version": "0.33.0"},
                  "quantization": {k: v for k, v in qc.items() if k != "quant_method"}}
            with open(hq, "w") as f:
                json.dump(hf, f, indent=2)
                f.write("\n")
    with open(os.path.join(o["out"], "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    # Remove weights of a previous run with another shard count.
    for fn in os.listdir(o["out"]):
        if fn.startswith("model") and (fn.endswith(".safetensors")
                                       or fn == "model.safetensors.index.json"):
            os.remove(os.path.join(o["out"], fn))

    files = []
    S = o["shards"]
    if S == 1:
        fname = "model.safetensors"
        write_safetensors(os.path.join(o["out"], fname), items)
        files.append(fname)
    else:
        if S > len(items):
            sys.exit("gen_model.py: more shards than tensors")
        assign = shard_assignment(sizes, S)
        weight_map = {}
        for s in range(S):
            fname = "model-%05d-of-%05d.safetensors" % (s + 1, S)
            part = [it for it, a in zip(items, assign) if a == s]
            write_safetensors(os.path.join(o["out"], fname), part)
            for it in part:
                weight_map[it[0]] = fname
            files.append(fname)
        index = {"metadata": {"total_size": int(sum(sizes))},
                 "weight_map": weight_map}
        with open(os.path.join(o["out"], "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")

    nparams = sum(int(np.prod(s)) for _, s, _ in tensors)
    mtp_prefix = "model.layers.%d." % o["layers"]
    nmtp = sum(int(np.prod(s)) for n, s, _ in tensors if n.startswith(mtp_prefix))
    print("wrote %s (%s%s%s, seed %d) in %.1f s" % (
        o["out"], o["dtype"], ", preset " + o["preset"] if o["preset"] else "",
        ", quant " + o["quant"] if o["quant"] != "none" else "",
        o["seed"], time.time() - t0))
    print("parameters: %d (%.3f M), of which MTP layer: %d; %d tensors" % (
        nparams, nparams / 1e6, nmtp, len(tensors)))
    total = 0
    for fname in files:
        sz = os.path.getsize(os.path.join(o["out"], fname))
        total += sz
        print("  %-40s %14d bytes" % (fname, sz))
    print("  %-40s %14d bytes (%.3f GB)" % ("total", total, total / 1e9))


if __name__ == "__main__":
    main(sys.argv[1:])
