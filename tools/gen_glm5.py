# SPDX-License-Identifier: MIT
#
# gen_glm5.py -- write a random GLM-5 checkpoint (GlmMoeDsaForCausalLM,
# model_type "glm_moe_dsa": MLA attention + the DSA lightning indexer, MoE,
# MTP) in Hugging Face layout: config.json, generation_config.json and
# safetensors weights (one file, or shards with model.safetensors.index.json).
# Tensor names, shapes and config fields follow tests/reference/GLM5.md (from
# transformers' glm_moe_dsa / deepseek_v32 / deepseek_v3 sources).  Values are
# random, O(1) activations, deterministic by seed: each tensor draws from its
# own generator seeded from (seed, crc32(name)) -- the same initialisers as
# tools/gen_model.py, whose safetensors writer this script reuses.
#
# Indexer schedule (GLM-5.2+): `indexer_types[i]` is "full" or "shared".
#   --index-topk-pattern FSSF...   writes index_topk_pattern (one letter/layer)
#   --index-topk-freq F --index-skip-topk-offset O
#                                  full iff max(i - O + 1, 0) % F == 0
# With freq 1 and no pattern (the default, GLM-5 / 5.1) every layer is full
# and no schedule field is written unless --write-indexer-types 1.  Shared
# layers carry no indexer tensors.  The MTP layer always has its own indexer.
#
# --quant fp8-block: GLM-5-FP8's layout (quant_method fp8, weight_block_size
# [128, 128]): each quantized projection X.weight is F8_E4M3 with X.weight_scale_inv
# F32 [ceil(out/128), ceil(in/128)] = amax(block) / 448, edge blocks cropped,
# codes rounded to nearest even (gen_model.py's quantizer, applied to the BF16
# weights). Quantized, as in zai-org's GLM-5.x FP8 releases: the MLA projections
# (q_a, q_b, kv_a_proj_with_mqa, kv_b, o_proj), the indexer's wq_b and wk, the
# dense FFN, the routed and shared experts, the MTP layer's attention and experts.
# Left BF16 there (and here): embed_tokens, lm_head, the norms (and k_norm's bias),
# the router mlp.gate, eh_proj and the indexer's weights_proj; the router's
# e_score_correction_bias stays F32. (Public tensor inventories of GLM-5.x-FP8
# derivatives, e.g. the butler-compute GLM-5.3-FP8-NVFP4 card, and sglang-jax's
# GLM-5.1-FP8 loader, PR #1111: indexer.weights_proj unquantized, the dense
# down_proj block-wise.) With --real-shapes glm5 it writes the FP8 release's
# layout: 756 GB, as zai-org/GLM-5-FP8.
#
# --real-shapes glm5|glm5.2: metadata only.  Writes config.json with the real
# configuration and a sharded safetensors layout whose shard files have
# correct headers and sizes but no data (sparse files: header written, then
# truncated to the full size).  For `inspect` and loaders' size arithmetic.
#
# Usage:  /usr/bin/python3 tools/gen_glm5.py --out DIR [options]
#         /usr/bin/python3 tools/gen_glm5.py --out DIR --real-shapes glm5

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_model as gm  # noqa: E402  (safetensors writer, initialisers)

DEFAULTS = dict(
    seed=0, hidden=64, layers=3, first_dense=1, heads=4,
    q_lora=32, kv_lora=32, nope=16, rope=8, v_dim=16,
    index_heads=8, index_head_dim=16, index_topk=8,
    index_topk_freq=1, index_skip_topk_offset=2, index_topk_pattern=None,
    write_indexer_types=0,
    experts=8, shared_experts=1, topk=2, moe_inter=32, inter=96, scale=2.5,
    n_group=1, topk_group=1, norm_topk=1, eps=1e-5, vocab=512, mtp=1,
    rope_theta=10000.0, max_pos=4096, dtype="bf16", shards=1, quant="none",
)
QUANTS = ("none", "fp8-block")

# GLM-5 / 5.1 (zai-org/GLM-5; transformers GlmMoeDsaConfig defaults) and
# GLM-5.2 (zai-org/GLM-5.2: theta 8e6, 1M context, IndexShare freq 4 offset 3).
REAL = {
    "glm5": dict(
        hidden=6144, layers=78, first_dense=3, heads=64, q_lora=2048,
        kv_lora=512, nope=192, rope=64, v_dim=256, index_heads=32,
        index_head_dim=128, index_topk=2048, index_topk_freq=1,
        index_skip_topk_offset=2, index_topk_pattern=None,
        write_indexer_types=0, experts=256, shared_experts=1, topk=8,
        moe_inter=2048, inter=12288, scale=2.5, n_group=1, topk_group=1,
        norm_topk=1, eps=1e-5, vocab=154880, mtp=1, rope_theta=1e6,
        max_pos=202752, dtype="bf16", shards=80),
    "glm5.2": dict(
        hidden=6144, layers=78, first_dense=3, heads=64, q_lora=2048,
        kv_lora=512, nope=192, rope=64, v_dim=256, index_heads=32,
        index_head_dim=128, index_topk=2048, index_topk_freq=4,
        index_skip_topk_offset=3, index_topk_pattern=None,
        write_indexer_types=1, experts=256, shared_experts=1, topk=8,
        moe_inter=2048, inter=12288, scale=2.5, n_group=1, topk_group=1,
        norm_topk=1, eps=1e-5, vocab=154880, mtp=1, rope_theta=8e6,
        max_pos=1048576, dtype="bf16", shards=80),
}


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Write a random GlmMoeDsaForCausalLM checkpoint (HF layout).")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--real-shapes", choices=sorted(REAL),
                   help="metadata only: real config, sparse shard files")
    add = lambda flag, typ, help_: p.add_argument(flag, type=typ, default=None,
                                                  help=help_)
    add("--seed", int, "random seed (0)")
    add("--hidden", int, "hidden_size (64)")
    add("--layers", int, "num_hidden_layers, MTP not counted (3)")
    add("--first-dense", int, "first_k_dense_replace (1)")
    add("--heads", int, "num_attention_heads (4)")
    add("--q-lora", int, "q_lora_rank (32)")
    add("--kv-lora", int, "kv_lora_rank (32)")
    add("--nope", int, "qk_nope_head_dim (16)")
    add("--rope", int, "qk_rope_head_dim (8)")
    add("--v-dim", int, "v_head_dim (16)")
    add("--index-heads", int, "index_n_heads (8)")
    add("--index-head-dim", int, "index_head_dim (16), >= qk_rope_head_dim")
    add("--index-topk", int, "index_topk (8)")
    add("--index-topk-freq", int, "index_topk_freq (1)")
    add("--index-skip-topk-offset", int, "index_skip_topk_offset (2)")
    add("--index-topk-pattern", str, "index_topk_pattern, e.g. FSSF (none)")
    add("--write-indexer-types", int,
        "0|1 (0): also write the derived indexer_types list (GLM-5.2 style)")
    add("--experts", int, "n_routed_experts (8)")
    add("--shared-experts", int, "n_shared_experts (1)")
    add("--topk", int, "num_experts_per_tok (2)")
    add("--moe-inter", int, "moe_intermediate_size (32)")
    add("--inter", int, "intermediate_size of the dense layers (96)")
    add("--scale", float, "routed_scaling_factor (2.5)")
    add("--n-group", int, "n_group (1)")
    add("--topk-group", int, "topk_group (1)")
    add("--norm-topk", int, "norm_topk_prob 0|1 (1)")
    add("--eps", float, "rms_norm_eps (1e-5)")
    add("--vocab", int, "vocab_size (512)")
    add("--mtp", int, "num_nextn_predict_layers 0|1 (1)")
    add("--rope-theta", float, "rope_parameters.rope_theta (10000)")
    add("--max-pos", int, "max_position_embeddings (4096)")
    p.add_argument("--dtype", choices=["bf16", "f32"], default=None,
                   help="weight dtype (bf16); e_score_correction_bias is F32")
    add("--shards", int, "number of safetensors shards (1)")
    p.add_argument("--quant", choices=QUANTS, default=None,
                   help="none | fp8-block: GLM-5-FP8's 128x128-block E4M3 projections (none)")
    a = p.parse_args(argv)
    opt = dict(DEFAULTS)
    if a.real_shapes:
        opt.update(REAL[a.real_shapes])
    for k in DEFAULTS:
        v = getattr(a, k, None)
        if v is not None:
            opt[k] = v
    opt["out"] = a.out
    opt["real_shapes"] = a.real_shapes
    check_options(opt)
    return opt


def check_options(o):
    def need(cond, msg):
        if not cond:
            sys.exit("gen_glm5.py: " + msg)
    for k in ("hidden", "layers", "heads", "q_lora", "kv_lora", "nope", "v_dim",
              "index_heads", "index_head_dim", "index_topk", "experts", "topk",
              "moe_inter", "inter", "vocab", "shards", "n_group", "topk_group",
              "index_topk_freq"):
        need(o[k] >= 1, "--%s must be >= 1" % k.replace("_", "-"))
    need(o["rope"] >= 2 and o["rope"] % 2 == 0, "--rope must be even and >= 2")
    need(o["index_head_dim"] >= o["rope"],
         "--index-head-dim must be >= --rope (the indexer ropes qk_rope_head_dim dims)")
    need(o["topk"] <= o["experts"], "--topk must be <= --experts")
    need(o["experts"] % o["n_group"] == 0, "--experts must be a multiple of --n-group")
    need(o["topk_group"] <= o["n_group"], "--topk-group must be <= --n-group")
    need(o["mtp"] in (0, 1), "--mtp must be 0 or 1")
    need(o["shared_experts"] >= 0, "--shared-experts must be >= 0")
    need(o["first_dense"] >= 0, "--first-dense must be >= 0")
    need(o["vocab"] >= 8, "--vocab must be >= 8")
    need(o["quant"] == "none" or o["dtype"] == "bf16", "--quant needs --dtype bf16")
    pat = o["index_topk_pattern"]
    if pat is not None:
        need(len(pat) == o["layers"] and set(pat) <= set("FS"),
             "--index-topk-pattern must have one F or S per layer")
    types = indexer_types(o)
    need(types[0] == "full", "layer 0 must run its indexer (a shared layer "
         "reuses the previous full layer's top-k)")


def indexer_types(o):
    """transformers GlmMoeDsaConfig.__post_init__: pattern wins, else
    full iff max(i - offset + 1, 0) % freq == 0."""
    pat = o["index_topk_pattern"]
    if pat is not None:
        return [{"F": "full", "S": "shared"}[c] for c in pat]
    freq = max(o["index_topk_freq"], 1)
    off = o["index_skip_topk_offset"]
    return ["full" if max(i - off + 1, 0) % freq == 0 else "shared"
            for i in range(o["layers"])]


# ---------------------------------------------------------------------------
# Tensor list (GLM5.md "Tensor names"); weights are [out_features, in_features].
# ---------------------------------------------------------------------------

def decoder_layer_tensors(o, L, moe, indexer):
    H, nh = o["hidden"], o["heads"]
    qk = o["nope"] + o["rope"]
    pre = "model.layers.%d." % L
    a = pre + "self_attn."
    t = [(pre + "input_layernorm.weight", (H,), "norm"),
         (a + "q_a_proj.weight", (o["q_lora"], H), "proj"),
         (a + "q_a_layernorm.weight", (o["q_lora"],), "norm"),
         (a + "q_b_proj.weight", (nh * qk, o["q_lora"]), "proj"),
         (a + "kv_a_proj_with_mqa.weight", (o["kv_lora"] + o["rope"], H), "proj"),
         (a + "kv_a_layernorm.weight", (o["kv_lora"],), "norm"),
         (a + "kv_b_proj.weight", (nh * (o["nope"] + o["v_dim"]), o["kv_lora"]), "proj"),
         (a + "o_proj.weight", (H, nh * o["v_dim"]), "proj")]
    if indexer:
        ih, idim = o["index_heads"], o["index_head_dim"]
        t += [(a + "indexer.wq_b.weight", (ih * idim, o["q_lora"]), "proj"),
              (a + "indexer.wk.weight", (idim, H), "proj"),
              (a + "indexer.k_norm.weight", (idim,), "norm"),
              (a + "indexer.k_norm.bias", (idim,), "bias"),
              (a + "indexer.weights_proj.weight", (ih, H), "proj")]
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
            Is = I * o["shared_experts"]
            sp = pre + "mlp.shared_experts."
            t += [(sp + "gate_proj.weight", (Is, H), "proj"),
                  (sp + "up_proj.weight", (Is, H), "proj"),
                  (sp + "down_proj.weight", (H, Is), "proj")]
    return t


def all_tensors(o):
    H, V, N = o["hidden"], o["vocab"], o["layers"]
    types = indexer_types(o)
    t = [("model.embed_tokens.weight", (V, H), "embed")]
    for L in range(N):
        t += decoder_layer_tensors(o, L, moe=(L >= o["first_dense"]),
                                   indexer=(types[L] == "full"))
    if o["mtp"]:
        pre = "model.layers.%d." % N
        t += [(pre + "enorm.weight", (H,), "norm"),
              (pre + "hnorm.weight", (H,), "norm"),
              (pre + "eh_proj.weight", (H, 2 * H), "proj")]
        t += decoder_layer_tensors(o, N, moe=True, indexer=True)
        t.append((pre + "shared_head.norm.weight", (H,), "norm"))
    t.append(("model.norm.weight", (H,), "norm"))
    t.append(("lm_head.weight", (V, H), "proj"))
    return t


def make_config(o):
    V = o["vocab"]
    eos = [V - 3, V - 2, V - 1]                   # GLM-5 ships three eos ids
    qk = o["nope"] + o["rope"]
    cfg = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "dtype": "bfloat16" if o["dtype"] == "bf16" else "float32",
        "eos_token_id": eos,
        "pad_token_id": eos[0],
        "ep_size": 1,
        "first_k_dense_replace": o["first_dense"],
        # GLM-5's config carries head_dim = qk_nope_head_dim; transformers
        # overwrites it with qk_rope_head_dim; nothing should read it.
        "head_dim": o["nope"],
        "hidden_act": "silu",
        "hidden_size": o["hidden"],
        "index_head_dim": o["index_head_dim"],
        "index_n_heads": o["index_heads"],
        "index_topk": o["index_topk"],
        "indexer_rope_interleave": True,
        "initializer_range": 0.02,
        "intermediate_size": o["inter"],
        "kv_lora_rank": o["kv_lora"],
        "max_position_embeddings": o["max_pos"],
        "moe_intermediate_size": o["moe_inter"],
        "moe_layer_freq": 1,
        "n_group": o["n_group"],
        "n_routed_experts": o["experts"],
        "n_shared_experts": o["shared_experts"],
        "norm_topk_prob": bool(o["norm_topk"]),
        "num_attention_heads": o["heads"],
        "num_experts_per_tok": o["topk"],
        "num_hidden_layers": o["layers"],
        "num_key_value_heads": o["heads"],
        "num_nextn_predict_layers": o["mtp"],
        "pretraining_tp": 1,
        "q_lora_rank": o["q_lora"],
        "qk_head_dim": qk,
        "qk_nope_head_dim": o["nope"],
        "qk_rope_head_dim": o["rope"],
        "rms_norm_eps": o["eps"],
        "rope_interleave": True,
        "rope_parameters": {"rope_theta": o["rope_theta"], "rope_type": "default"},
        "routed_scaling_factor": o["scale"],
        "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": o["topk_group"],
        "topk_method": "noaux_tc",
        "transformers_version": "5.2.0",
        "use_cache": True,
        "v_head_dim": o["v_dim"],
        "vocab_size": V,
    }
    sched = (o["index_topk_pattern"] is not None or o["index_topk_freq"] != 1
             or o["write_indexer_types"])
    if sched:
        cfg["index_topk_freq"] = o["index_topk_freq"]
        cfg["index_skip_topk_offset"] = o["index_skip_topk_offset"]
        cfg["index_topk_pattern"] = o["index_topk_pattern"]
        cfg["index_share_for_mtp_iteration"] = False
    if o["write_indexer_types"]:
        cfg["indexer_types"] = indexer_types(o)
    if o["real_shapes"] == "glm5.2":
        cfg["index_share_for_mtp_iteration"] = True
        cfg["eos_token_id"] = [154820, 154827, 154829]
        cfg["pad_token_id"] = 154820
    elif o["real_shapes"] == "glm5":
        cfg["eos_token_id"] = [154820, 154827, 154829]
        cfg["pad_token_id"] = 154820
    return dict(sorted(cfg.items()))


def tensor_dtype(o, name):
    if name.endswith("e_score_correction_bias"):
        return "F32"
    return "BF16" if o["dtype"] == "bf16" else "F32"


# The projections GLM-5-FP8 leaves BF16 (see the header); every other 2-D weight
# but the embedding, the norms and the router is quantized.
BF16_PROJ = ("lm_head.weight", ".eh_proj.weight", ".indexer.weights_proj.weight",
             ".mlp.gate.weight")


def is_quantized(o, name, shape):
    if o["quant"] == "none" or len(shape) != 2 or not name.endswith(".weight"):
        return False
    if "norm" in name or "embed_tokens" in name:
        return False
    return not any(name == s or name.endswith(s) for s in BF16_PROJ)


def bf16_values(o, name, shape, kind):
    """The weight as the BF16 checkpoint would hold it, as float32 [out, in]."""
    w = gm.init_values(o, name, shape, kind)
    u = np.frombuffer(gm.f32_to_bf16_bytes(w), "<u2").astype(np.uint32) << np.uint32(16)
    return u.view(np.float32).reshape(shape)


def main(argv):
    o = parse_args(argv)
    t0 = time.time()
    os.makedirs(o["out"], exist_ok=True)
    cfg = make_config(o)
    if o["quant"] == "fp8-block":
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": [128, 128]}
    with open(os.path.join(o["out"], "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    gen_cfg = {"_from_model_config": True, "do_sample": False,
               "eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"],
               "transformers_version": cfg["transformers_version"]}
    with open(os.path.join(o["out"], "generation_config.json"), "w") as f:
        json.dump(gen_cfg, f, indent=2)
        f.write("\n")

    tensors = all_tensors(o)
    items, sizes = [], []
    o["scale_bf16"] = 0                     # gen_model.quantize: F32 scales, as GLM-5-FP8's
    cache = {}                              # the last quantized weight: name -> parts

    def qpart(name, shape, kind, suffix):
        if name not in cache:
            cache.clear()
            cache[name] = gm.quantize(o, bf16_values(o, name, shape, kind), "fp8-block")
        return cache[name][suffix][2]

    for name, shape, kind in tensors:
        if is_quantized(o, name, shape):
            base = name[:-len(".weight")]
            for suffix, dt, qshape in gm.quant_layout(shape, "fp8-block", "F32"):
                fn = (lambda name=name, shape=shape, kind=kind, suffix=suffix:
                      qpart(name, shape, kind, suffix))
                items.append(("%s.%s" % (base, suffix), dt, qshape, fn))
                sizes.append(int(np.prod(qshape)) * gm.DTYPE_SIZE[dt])
            continue
        dt = tensor_dtype(o, name)
        fn = (lambda name=name, shape=shape, kind=kind, dt=dt:
              gm.f32_to_bf16_bytes(gm.init_values(o, name, shape, kind)) if dt == "BF16"
              else gm.init_values(o, name, shape, kind).astype("<f4").tobytes())
        items.append((name, dt, shape, fn))
        sizes.append(int(np.prod(shape)) * gm.DTYPE_SIZE[dt])

    for fn in os.listdir(o["out"]):
        if fn.startswith("model") and (fn.endswith(".safetensors")
                                       or fn == "model.safetensors.index.json"):
            os.remove(os.path.join(o["out"], fn))

    files = []
    S = o["shards"]
    if S == 1 and not o["real_shapes"]:
        fname = "model.safetensors"
        gm.write_safetensors(os.path.join(o["out"], fname), items)
        files.append(fname)
    else:
        if S > len(items):
            sys.exit("gen_glm5.py: more shards than tensors")
        assign = gm.shard_assignment(sizes, S)
        weight_map = {}
        for s in range(S):
            fname = "model-%05d-of-%05d.safetensors" % (s + 1, S)
            part = [it for it, a in zip(items, assign) if a == s]
            path = os.path.join(o["out"], fname)
            if o["real_shapes"]:
                # Header only, then a sparse extension to the full size.
                entries = [(n, dt, sh, int(np.prod(sh)) * gm.DTYPE_SIZE[dt])
                           for n, dt, sh, _ in part]
                hdr = gm.safetensors_header(entries)
                with open(path, "wb") as f:
                    f.write(hdr)
                    f.truncate(len(hdr) + sum(e[3] for e in entries))
            else:
                gm.write_safetensors(path, part)
            for it in part:
                weight_map[it[0]] = fname
            files.append(fname)
        index = {"metadata": {"total_size": int(sum(sizes))}, "weight_map": weight_map}
        with open(os.path.join(o["out"], "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")

    nparams = sum(int(np.prod(s)) for _, s, _ in tensors)
    mtp_prefix = "model.layers.%d." % o["layers"]
    nmtp = sum(int(np.prod(s)) for n, s, _ in tensors if n.startswith(mtp_prefix))
    types = indexer_types(o)
    print("wrote %s (%s%s%s, seed %d) in %.1f s" % (
        o["out"], o["dtype"], ", quant " + o["quant"] if o["quant"] != "none" else "",
        ", real shapes " + o["real_shapes"] + " (metadata only, sparse shards)"
        if o["real_shapes"] else "", o["seed"], time.time() - t0))
    print("parameters: %d (%.3f M), of which MTP layer: %d; %d tensors" % (
        nparams, nparams / 1e6, nmtp, len(tensors)))
    print("indexer_types: %s" % "".join("F" if x == "full" else "S" for x in types))
    total = 0
    for fname in files:
        total += os.path.getsize(os.path.join(o["out"], fname))
    if len(files) <= 8:
        for fname in files:
            print("  %-40s %14d bytes" % (fname, os.path.getsize(os.path.join(o["out"], fname))))
    print("  %-40s %14d bytes (%.3f GB) in %d file(s)" % ("total", total, total / 1e9, len(files)))


if __name__ == "__main__":
    main(sys.argv[1:])
