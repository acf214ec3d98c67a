# SPDX-License-Identifier: MIT
#
# glm.py -- a PyTorch Glm4MoeForCausalLM (model_type glm4_moe) with its MTP layer, written
# from /work/shared/MODEL.md sections 2-3.  Module names equal the Hugging Face tensor
# names, so state_dict() is the checkpoint: model.embed_tokens, model.layers.L.*, the MTP
# layer as model.layers.N (enorm, hnorm, eh_proj, a MoE decoder layer, shared_head.norm),
# model.norm, lm_head.

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_tables(cfg, pos, dtype):
    """cos, sin [T, r/2] for partial half-split RoPE (MODEL.md 2, attention step 3)."""
    r = int(round(cfg["head_dim"] * cfg["partial_rotary_factor"]))
    j = torch.arange(r // 2, dtype=torch.float64)
    inv = cfg["rope_theta"] ** (-2.0 * j / r)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def apply_rope(x, cos, sin):
    """x [B, heads, T, hd]; rotates the first r dims in half-split pairs (j, j + r/2)."""
    h = cos.shape[-1]
    x1, x2, rest = x[..., :h], x[..., h:2 * h], x[..., 2 * h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, hd = cfg["hidden_size"], cfg["head_dim"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hd
        bias = cfg["attention_bias"]
        self.q_proj = nn.Linear(H, self.nh * hd, bias=bias)
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=bias)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=bias)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=False)
        self.qk_norm = cfg["use_qk_norm"]
        if self.qk_norm:
            self.q_norm = RMSNorm(hd, cfg["rms_norm_eps"])
            self.k_norm = RMSNorm(hd, cfg["rms_norm_eps"])

    def qkv(self, x, cos, sin):
        """q [B, nh, T, hd], k and v [B, nkv, T, hd] of x, normed and roped."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd)
        if self.qk_norm:                       # before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q, k, v, mask):
        """o_proj of q's attention over k, v (KV heads, any length; mask True: hidden)."""
        B, _, T, _ = q.shape
        g = self.nh // self.nkv                # query head i reads KV head i // g
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd))
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(y)

    def forward(self, x, cos, sin, mask):
        return self.attend(*self.qkv(x, cos, sin), mask)


class MLP(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, H, E):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(E, H))
        # selection only; updated aux-loss-free style, never by gradient
        self.register_buffer("e_score_correction_bias", torch.zeros(E, dtype=torch.float32))


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, E, I = cfg["hidden_size"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        self.E, self.k = E, cfg["num_experts_per_tok"]
        self.norm_topk = cfg["norm_topk_prob"]
        self.scale = cfg["routed_scaling_factor"]
        self.gate = Gate(H, E)
        self.experts = nn.ModuleList([MLP(H, I) for _ in range(E)])
        self.shared_experts = MLP(H, I * cfg["n_shared_experts"])
        self.last_load = None                  # tokens per expert of the last forward

    def forward(self, x):
        shp = x.shape
        h = x.reshape(-1, shp[-1])
        logits = F.linear(h.float(), self.gate.weight.float())
        s = torch.sigmoid(logits)
        c = s + self.gate.e_score_correction_bias
        idx = torch.topk(c.detach(), self.k, dim=-1).indices          # [T, k]
        w = s.gather(1, idx)
        if self.norm_topk:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = (w * self.scale).to(h.dtype)
        self.last_load = torch.bincount(idx.reshape(-1), minlength=self.E).detach()
        y = torch.zeros_like(h)
        flat = idx.reshape(-1)
        tok = torch.arange(h.shape[0], device=h.device).repeat_interleave(self.k)
        wf = w.reshape(-1)
        order = torch.sort(flat, stable=True).indices
        counts = self.last_load.tolist()
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            sel = order[start:start + n]
            start += n
            t = tok[sel]
            out = self.experts[e](h[t]) * wf[sel][:, None]
            y = y.index_add(0, t, out)
        y = y + self.shared_experts(h)
        return y.view(shp)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, moe):
        super().__init__()
        H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(H, eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = MoE(cfg) if moe else MLP(H, cfg["intermediate_size"])

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class SharedHead(nn.Module):
    def __init__(self, H, eps):
        super().__init__()
        self.norm = RMSNorm(H, eps)


class MTPLayer(DecoderLayer):
    def __init__(self, cfg):
        super().__init__(cfg, moe=True)
        H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.enorm = RMSNorm(H, eps)
        self.hnorm = RMSNorm(H, eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.shared_head = SharedHead(H, eps)


class Inner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, V, N = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
        self.embed_tokens = nn.Embedding(V, H)
        layers = [DecoderLayer(cfg, moe=(L >= cfg["first_k_dense_replace"])) for L in range(N)]
        if cfg["num_nextn_predict_layers"]:
            layers.append(MTPLayer(cfg))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(H, cfg["rms_norm_eps"])


class Glm4Moe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.N = cfg["num_hidden_layers"]
        self.model = Inner(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def init_weights(self, std=0.02):
        out_std = std / math.sqrt(2 * (self.N + 1))
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def moe_layers(self):
        return [l.mlp for l in self.model.layers if isinstance(l.mlp, MoE)]

    @staticmethod
    def causal(T, dev):
        return torch.ones(T, T, dtype=torch.bool, device=dev).triu(1)

    def forward(self, tokens, pos0=0):
        """tokens [B, T] -> (hn [B, T, H] after model.norm, logits [B, T, V])."""
        B, T = tokens.shape
        x = self.model.embed_tokens(tokens)
        pos = torch.arange(pos0, pos0 + T)
        cos, sin = rope_tables(self.cfg, pos, x.dtype)
        mask = self.causal(T, x.device)
        for L in range(self.N):
            x = self.model.layers[L](x, cos, sin, mask)
        hn = self.model.norm(x)
        return hn, self.lm_head(hn)

    def mtp_input(self, h, t):
        m = self.model.layers[self.N]
        e = m.enorm(self.model.embed_tokens(t))          # main embed_tokens
        return m.eh_proj(torch.cat([e, m.hnorm(h)], dim=-1))   # embedding half first

    def mtp_layer(self, u, mask=None):
        """u [B, T, H] at positions 0..T-1 -> (shared_head.norm(z), logits)."""
        m = self.model.layers[self.N]
        T = u.shape[1]
        cos, sin = rope_tables(self.cfg, torch.arange(T), u.dtype)
        if mask is None:
            mask = self.causal(T, u.device)
        z = m(u, cos, sin, mask)
        hs = m.shared_head.norm(z)
        return hs, self.lm_head(hs)                       # main lm_head


def glm_config(a, vocab_size, special):
    """config.json of the model (every field lockstep reads; see tools/gen_model.py)."""
    eos = [special["<|endoftext|>"], special["<|user|>"], special["<|observation|>"]]
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "attention_bias": True,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": special["<|endoftext|>"],
        "first_k_dense_replace": 1,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "intermediate_size": a.inter,
        "max_position_embeddings": a.max_pos,
        "moe_intermediate_size": a.moe_inter,
        "n_group": 1,
        "n_routed_experts": a.experts,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": a.heads,
        "num_experts_per_tok": a.topk,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv_heads,
        "num_nextn_predict_layers": 1,
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-5,
        "rope_scaling": None,
        "rope_theta": a.rope_theta,
        "routed_scaling_factor": a.scale,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.54.0",
        "use_cache": True,
        "use_qk_norm": True,
        "vocab_size": vocab_size,
    }
