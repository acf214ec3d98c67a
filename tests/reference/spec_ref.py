# SPDX-License-Identifier: MIT
#
# spec_ref.py -- the exact acceptance counts of GREEDY speculative decoding
# with the checkpoint's MTP layer as the drafter (K chained drafts a round),
# computed in float64 from the math of /work/shared/MODEL.md sections 2-3
# and DESIGN.md section 7, on top of glm_ref.py (same directory) and
# independent of lockstep's C code.  GLM-5 checkpoints (model_type
# glm_moe_dsa) run on glm5_ref.py's model instead (MLA in the absorbed form
# with a per-layer cache of latent, rope key and indexer key; the DSA top-k
# selection in every layer, the MTP layer's own indexer in the drafter); the
# drafting loop, the checks and the output are the same.
#
# Usage:
#   /usr/bin/python3 tests/reference/spec_ref.py --model DIR --k K \
#       --n-gen 64 --prompts FILE --out OUT.json [--check]
#   /usr/bin/python3 tests/reference/spec_ref.py --model DIR \
#       --write-prompts FILE [--count 20] [--prompt-len 16] [--seed 1] \
#       [--pattern M]           # write a prompts file and exit
#   /usr/bin/python3 tests/reference/spec_ref.py --model SRC \
#       --make-draftable DST [--mix 0.1]   # derived checkpoint, and exit
#
# FILE: one prompt per line, token ids separated by commas (blank lines and
# lines starting with '#' are skipped).  --pattern M makes every prompt the
# repetition of a random M-token pattern.
#
# A random checkpoint from tools/gen_model.py accepts (almost) nothing, even
# on repeated patterns: its MTP layer is unrelated to its target.  For a case
# with partial acceptance, --make-draftable writes a derived F32 checkpoint
# (see make_draftable()); with gen_model.py --dtype f32 --seed 11 and mix 0.1,
# 20 random 16-token prompts, 64 tokens: K=1 accepts 514/755, K=3 accepts
# 355/229/162 of 535 rounds.
#
# The algorithm (no stop tokens: exactly n_gen tokens are generated per
# prompt, EOS included as an ordinary token):
#   After the prompt t_0..t_{n-1} the target's greedy next token t_n is
#   emitted; L = n (positions 0..L-1 have target hiddens), T = t_n (at L).
#   Each round, until n_gen tokens have been emitted:
#   - Drafter.  The MTP layer's cache holds rows j = 0..L-2 built from the
#     pairs (h_j, t_{j+1}), h_j = the target hidden after model.norm.  The
#     first draft d1 = argmax of the MTP step on (h_{L-1}, T) at position
#     L-1; draft d_{i+1} = argmax of the step on (shared_head.norm(z_i), d_i)
#     at position L-1+i (MODEL.md 3, the chained procedure of glm_ref.py).
#   - Verify.  The target runs [T, d1..dK] at positions L..L+K;
#     g_i = argmax of its logits at position L+i (i = 0..K);
#     a = the number of leading i (1-based) with d_i == g_{i-1}.
#   - Emit d_1..d_a and the bonus g_a, clipped to the n_gen budget (the
#     round still counts as K proposed and a accepted, a unclipped).
#   - proposed[i] += 1 for i = 1..K; accepted[i] += 1 for i <= a;
#     rounds += 1; L += a + 1; T = g_a.  The drafter's rows for the chained
#     drafts are dropped (rollback) and the accepted rows are re-fed next
#     round from the target's own hiddens (catch-up), so its cache again
#     holds (h_j, t_{j+1}) for j = 0..L-2.
#   --k 0 is plain greedy decoding: proposed = accepted = [], and rounds
#   counts the plain decode steps after the first token (n_gen - 1).
#   Ties in an argmax go to the lowest token id (np.argmax).
#
# Implementation: both the target and the MTP layer run incrementally with
# per-layer K/V caches (a position's hidden never changes once its inputs
# are fixed; running at a start position drops the cache rows from it on,
# which is the rollback); the math per row is glm_ref.py's, reused through
# its GlmRef methods (norms, RoPE, projections, MoE, MTP input, lm_head).
# GLM-5: the cache of a layer is glm5_ref.py's (c, k_pe, indexer key, pos)
# rows, run through Glm5Ref.decoder_layer5 in the absorbed form; a shared
# indexer layer reuses the selection of the last full layer of the same call
# (the same queries over the same keys); rollback truncates all three,
# the drafter's indexer keys included.  A position's selection depends only
# on the keys 0..pos, so incremental and full forwards select the same keys.
#
# Checks (always): the generated tokens are plain greedy decoding -- one full
# glm_ref forward over prompt + tokens gives, by causality, the logits after
# every prefix, and each generated token must be the argmax there.
# With --check, in addition, per prompt, using only glm_ref's full-recompute
# functions (the way glm_ref.py's main computes its outputs):
#   1. plain greedy by a full forward per generated token equals `tokens`;
#   2. the target hiddens of the incremental engine equal the full forward's;
#   3. a teacher-forced replay of the rounds: since every accepted draft is a
#      greedy token, g_{i-1} is the greedy token at position L+i whenever
#      d_1..d_{i-1} were accepted, so a = the number of leading drafts equal to
#      the greedy continuation t_{L+1}, t_{L+2}, ...; the drafts at round
#      anchor j = L-1 are glm_ref's chained drafts over
#      u = mtp_input(hn[0:j+1], t[1:j+2]) (mtp_layer recomputed for each
#      chained step).  The replayed proposed / accepted / rounds must be equal.
#      For K = 1 the drafts are just glm_ref's `mtp_logits` rows (the first
#      draft teacher-forced on the greedy sequence), so the K=1 acceptance is
#      the fraction of the VISITED anchors j (j = n-1, then j += 2 after an
#      accept and j += 1 after a reject) at which argmax(mtp_logits[j]) ==
#      t_{j+2}; the fraction over all positions j >= n-1 is printed beside it
#      for information (it differs only by the skipped anchors).
#
# Output JSON:
#   {"model": DIR, "k": K, "n_gen": N, "generator": "...",
#    "prompts": [{"prompt": [...], "tokens": [N ids], "proposed": [K],
#                 "accepted": [K], "rounds": R,
#                 "min_target_margin": x, "min_draft_margin": y}, ...],
#    "totals": {"prompts": P, "tokens": sum, "rounds": sum,
#               "proposed": [K], "accepted": [K], "acceptance": [K rates],
#               "accepted_per_round": mean a,
#               "min_target_margin": x, "min_draft_margin": y}}
# The margins are the smallest top-1/top-2 logit gaps over the argmax
# decisions that the counts depend on (the target rows 0..a of each verify,
# and drafts d_1..d_min(a+1,K)): a runtime in lower precision may flip a
# decision whose margin is tiny.  GLM-5 adds "min_index_margin" and
# "index_boundary_ties" to the totals: the smallest gap between the last
# selected and the first dropped indexer score over every DSA selection made
# (target and drafter, rows later dropped included), and the number of exact
# ties straddling the cut (ties go to the lower position).

import argparse
import json
import os
import sys
import time

# Tiny matrices: BLAS threads only cost time (and spin); one thread also keeps
# the float summation order fixed.  An explicit setting in the environment wins.
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from glm_ref import GlmRef, write_safetensors  # noqa: E402


def is_glm5(cfg):
    return (cfg.get("model_type") == "glm_moe_dsa"
            or "GlmMoeDsaForCausalLM" in (cfg.get("architectures") or []))


def load_model(model_dir):
    """GlmRef for glm4_moe, glm5_ref.Glm5Ref for glm_moe_dsa."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if is_glm5(cfg):
        from glm5_ref import Glm5Ref
        return Glm5Ref(model_dir)
    return GlmRef(model_dir)


def top2_margin(row):
    s = np.partition(row, -2)[-2:]
    return float(s[1] - s[0])


# ---------------------------------------------------------------------------
# Incremental forward over a stack of decoder layers with K/V caches
# ---------------------------------------------------------------------------

class CachedStack:
    """Decoder layers `layers` of model m, run incrementally.  run(x, start)
    feeds rows x [n, H] at positions start..start+n-1, first dropping every
    cached row at position >= start, and returns the residual stream out of
    the last layer."""

    def __init__(self, m, layers, max_len):
        self.m = m
        self.layers = list(layers)
        self.k = {L: np.zeros((max_len, m.nkv, m.hd)) for L in self.layers}
        self.v = {L: np.zeros((max_len, m.nkv, m.hd)) for L in self.layers}
        self.len = 0

    def attention(self, L, x, pos, start):
        m = self.m
        p = "model.layers.%d." % L
        n = x.shape[0]
        hd, nh, nkv = m.hd, m.nh, m.nkv
        h = m.rmsnorm(x, m.w(p + "input_layernorm.weight"))
        q = h @ m.w(p + "self_attn.q_proj.weight").T
        k = h @ m.w(p + "self_attn.k_proj.weight").T
        v = h @ m.w(p + "self_attn.v_proj.weight").T
        if m.attn_bias:
            q = q + m.w(p + "self_attn.q_proj.bias")
            k = k + m.w(p + "self_attn.k_proj.bias")
            v = v + m.w(p + "self_attn.v_proj.bias")
        q = q.reshape(n, nh, hd)
        k = k.reshape(n, nkv, hd)
        v = v.reshape(n, nkv, hd)
        if m.qk_norm:
            q = m.rmsnorm(q, m.w(p + "self_attn.q_norm.weight"))
            k = m.rmsnorm(k, m.w(p + "self_attn.k_norm.weight"))
        q = m.rope(q, pos)
        k = m.rope(k, pos)
        end = start + n
        self.k[L][start:end] = k
        self.v[L][start:end] = v
        K, V = self.k[L][:end], self.v[L][:end]
        group = nh // nkv
        mask = np.arange(end)[None, :] <= pos[:, None]     # key s <= query pos
        out = np.empty((n, nh, hd))
        for i in range(nh):
            kv = i // group
            s = (q[:, i, :] @ K[:, kv, :].T) / np.sqrt(hd)
            s = np.where(mask, s, -np.inf)
            s = s - s.max(axis=1, keepdims=True)
            pr = np.exp(s)
            pr /= pr.sum(axis=1, keepdims=True)
            out[:, i, :] = pr @ V[:, kv, :]
        return out.reshape(n, nh * hd) @ m.w(p + "self_attn.o_proj.weight").T

    def run(self, x, start):
        m = self.m
        if start > self.len:
            raise ValueError("run at %d but only %d rows cached" % (start, self.len))
        pos = np.arange(start, start + x.shape[0])
        for L in self.layers:
            x = x + self.attention(L, x, pos, start)
            h2 = m.rmsnorm(x, m.w("model.layers.%d.post_attention_layernorm.weight" % L))
            if L >= m.first_dense:
                x = x + m.moe(L, h2)
            else:
                x = x + m.swiglu("model.layers.%d.mlp." % L, h2)
        self.len = start + x.shape[0]
        return x


class MlaCachedStack:
    """The same for glm_moe_dsa (layer m.N, the MTP layer, runs as an MoE
    layer with a full indexer): per layer glm5_ref's cache dict of the normed
    latent c, the roped k_pe, the indexer key kI and the position, appended
    by Glm5Ref.decoder_layer5 in the absorbed form."""

    def __init__(self, m, layers, max_len):
        del max_len                        # the caches grow as rows arrive
        self.m = m
        self.layers = list(layers)
        self.cache = {L: {"c": None, "k_pe": None, "kI": None,
                          "pos": np.zeros(0, dtype=np.int64)} for L in self.layers}
        self.len = 0

    def run(self, x, start):
        m = self.m
        if start > self.len:
            raise ValueError("run at %d but only %d rows cached" % (start, self.len))
        for c in self.cache.values():      # rollback: drop rows at >= start
            for k in ("c", "k_pe", "kI"):
                if c[k] is not None:
                    c[k] = c[k][:start]
            c["pos"] = c["pos"][:start]
        pos = np.arange(start, start + x.shape[0])
        prev = None
        for L in self.layers:
            mtp = L == m.N
            moe = True if mtp else m.moe_layer[L]
            full = True if mtp else m.indexer_full[L]
            x, st = m.decoder_layer5(L, x, pos, moe, full, prev, cache=self.cache[L],
                                     absorbed=True)
            if full:
                prev = st
        self.len = start + x.shape[0]
        return x


def make_stack(m, layers, max_len):
    cls = MlaCachedStack if is_glm5(m.cfg) else CachedStack
    return cls(m, layers, max_len)


class Target:
    def __init__(self, m, max_len):
        self.m = m
        self.st = make_stack(m, range(m.N), max_len)

    def run(self, tokens, start):
        """-> (hn [n,H] after model.norm, logits [n,V])"""
        m = self.m
        x = m.w("model.embed_tokens.weight")[np.asarray(tokens)]
        x = self.st.run(x, start)
        hn = m.rmsnorm(x, m.w("model.norm.weight"))
        return hn, m.lm_head(hn)


class Drafter:
    def __init__(self, m, max_len):
        self.m = m
        self.st = make_stack(m, [m.N], max_len)

    def run(self, h, t, start):
        """MTP steps on pairs (h [n,H], t [n]) at positions start.. ->
        (shared_head.norm(z) [n,H], logits [n,V])."""
        m = self.m
        u = m.mtp_input(h, np.asarray(t))
        z = self.st.run(u, start)
        hs = m.rmsnorm(z, m.w("model.layers.%d.shared_head.norm.weight" % m.N))
        return hs, m.lm_head(hs)


# ---------------------------------------------------------------------------
# Speculative decoding, greedy (the algorithm of the header)
# ---------------------------------------------------------------------------

def spec_decode(m, prompt, K, n_gen, keep_hidden=False):
    n = len(prompt)
    max_len = n + n_gen + K + 2
    tgt = Target(m, max_len)
    drf = Drafter(m, max_len) if K > 0 else None
    H = np.zeros((max_len, m.H))           # target hiddens, positions 0..L-1
    seq = list(prompt)                     # verified tokens, positions 0..L
    proposed, accepted = [0] * K, [0] * K
    rounds = 0
    tmarg, dmarg = [], []

    hn, lg = tgt.run(prompt, 0)
    H[:n] = hn
    T = int(np.argmax(lg[-1]))
    tmarg.append(top2_margin(lg[-1]))
    seq.append(T)
    out = [T]
    L = n
    fed = 0                                # drafter rows valid: 0..fed-1
    while len(out) < n_gen:
        if K == 0:
            hn, lg = tgt.run([T], L)
            H[L] = hn[0]
            T = int(np.argmax(lg[0]))
            tmarg.append(top2_margin(lg[0]))
            seq.append(T)
            out.append(T)
            L += 1
            rounds += 1
            continue
        # Drafter: catch-up rows fed..L-2 from the target's hiddens, then the
        # first-draft row (h_{L-1}, T) at L-1, all in one call; running at
        # `fed` drops the previous round's chained rows (rollback).
        hs, lgm = drf.run(H[fed:L], seq[fed + 1:L + 1], fed)
        fed = L
        d = [int(np.argmax(lgm[-1]))]
        dl = [lgm[-1]]
        hc = hs[-1:]
        for i in range(1, K):              # chained: position L-1+i
            hs, lgm = drf.run(hc, [d[-1]], L - 1 + i)
            d.append(int(np.argmax(lgm[0])))
            dl.append(lgm[0])
            hc = hs
        # Verify [T, d1..dK] at L..L+K.
        hn, lg = tgt.run([T] + d, L)
        g = [int(x) for x in np.argmax(lg, axis=1)]
        a = 0
        while a < K and d[a] == g[a]:
            a += 1
        tmarg.extend(top2_margin(lg[i]) for i in range(a + 1))
        dmarg.extend(top2_margin(dl[i]) for i in range(min(a + 1, K)))
        for i in range(K):
            proposed[i] += 1
            if i < a:
                accepted[i] += 1
        rounds += 1
        H[L:L + a + 1] = hn[:a + 1]        # positions L..L+a now verified
        new = d[:a] + [g[a]]
        seq.extend(new)
        out.extend(new[:n_gen - len(out)])
        L += a + 1
        T = g[a]
    res = {"prompt": list(prompt), "tokens": out, "proposed": proposed,
           "accepted": accepted, "rounds": rounds,
           "min_target_margin": min(tmarg),
           "min_draft_margin": min(dmarg) if dmarg else None}
    if keep_hidden:
        res["_H"] = H[:L].copy()
    return res


def assert_greedy(m, prompt, tokens):
    """By causality, one full forward over prompt + tokens[:-1] gives the
    logits after every prefix; every generated token must be their argmax."""
    n = len(prompt)
    _, lg = m.forward(list(prompt) + list(tokens[:-1]))
    g = np.argmax(lg[n - 1:], axis=1)
    bad = np.nonzero(g != np.asarray(tokens))[0]
    if len(bad):
        raise AssertionError("tokens differ from plain greedy at generated index %d "
                             "(%d vs %d)" % (bad[0], tokens[bad[0]], g[bad[0]]))


# ---------------------------------------------------------------------------
# --check: an independent replay with glm_ref's full-recompute functions
# ---------------------------------------------------------------------------

def greedy_full(m, prompt, count):
    toks = list(prompt)
    for _ in range(count):
        _, lg = m.forward(toks, last=True)
        toks.append(int(np.argmax(lg[-1])))
    return toks[len(prompt):]


def replay(m, prompt, K, n_gen, res):
    """Returns a dict of figures; raises AssertionError on any mismatch."""
    n = len(prompt)
    # 1. plain greedy, full recompute per token, K extra for the last round.
    gr = greedy_full(m, prompt, n_gen + K)
    if gr[:n_gen] != res["tokens"]:
        raise AssertionError("tokens != full-recompute greedy")
    if K == 0:
        return {}
    S = list(prompt) + gr                  # greedy sequence, positions 0..
    hn, _ = m.forward(S[:n + n_gen + K - 1])
    # 2. incremental target hiddens vs the full forward.
    Hi = res["_H"]
    hdiff = float(np.abs(Hi - hn[:len(Hi)]).max())
    # Both are float64 sums of the same terms in other orders: apart by a few hundred float64
    # roundings of the largest value at most (eps 2.2e-16); 1e-10 of it is far above that and
    # far below any real difference (measured: about 1e-15).
    if not hdiff <= 1e-10 * max(1.0, float(np.abs(hn).max())):
        raise AssertionError("incremental target hiddens differ from the full forward by %.3g"
                             % hdiff)
    # 3. teacher-forced replay of the rounds.
    prop, acc, rounds = [0] * K, [0] * K, 0
    L, emitted = n, 1
    u_all = m.mtp_input(hn[:n + n_gen + K - 2], S[1:n + n_gen + K - 1])
    hs_all, mtp_logits = m.mtp_layer(u_all)   # glm_ref's first drafts
    visited = []
    while emitted < n_gen:
        j = L - 1
        visited.append(j)
        seqm = u_all[:j + 1]
        h_c, lg_c = hs_all[j], mtp_logits[j]
        d = []
        for step in range(K):
            if step > 0:
                u_new = m.mtp_input(h_c[None, :], [d[-1]])
                seqm = np.concatenate([seqm, u_new], axis=0)
                hs_s, lg_s = m.mtp_layer(seqm, last=True)
                h_c, lg_c = hs_s[-1], lg_s[-1]
            d.append(int(np.argmax(lg_c)))
        a = 0
        while a < K and d[a] == S[L + 1 + a]:
            a += 1
        for i in range(K):
            prop[i] += 1
            acc[i] += i < a
        rounds += 1
        emitted += a + 1
        L += a + 1
    if (prop, acc, rounds) != (res["proposed"], res["accepted"], res["rounds"]):
        raise AssertionError("replay %s %s %d != spec %s %s %d"
                             % (prop, acc, rounds, res["proposed"], res["accepted"],
                                res["rounds"]))
    fig = {"hidden_maxdiff": hdiff}
    if K == 1:
        first = np.argmax(mtp_logits, axis=1)
        # anchors j >= n-1 with t_{j+2} inside the generated budget
        js = np.arange(n - 1, n + n_gen - 2)
        fig["k1_visited"] = (int(sum(first[j] == S[j + 2] for j in visited)), len(visited))
        fig["k1_all_positions"] = (int(np.sum(first[js] == np.asarray(S)[js + 2])), len(js))
    return fig


# ---------------------------------------------------------------------------

def read_prompts(path, V):
    prompts = []
    with open(path) as f:
        for ln, line in enumerate(f, 1):
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            try:
                p = [int(x) for x in s.split(",") if x.strip() != ""]
            except ValueError:
                sys.exit("%s:%d: not a comma-separated list of token ids" % (path, ln))
            if not p:
                sys.exit("%s:%d: empty prompt" % (path, ln))
            if min(p) < 0 or max(p) >= V:
                sys.exit("%s:%d: token id outside [0, %d)" % (path, ln, V))
            prompts.append(p)
    if not prompts:
        sys.exit("%s: no prompts" % path)
    return prompts


def write_prompts(path, V, count, plen, seed, pattern):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(count):
            if pattern > 0:
                pat = rng.integers(0, V, pattern)
                p = np.resize(pat, plen)
            else:
                p = rng.integers(0, V, plen)
            f.write(",".join(str(int(t)) for t in p) + "\n")


def make_draftable(m, src, dst, mix):
    """Write a derived F32 checkpoint whose MTP layer drafts well: every
    decoder layer's output projections (o_proj, every down_proj) are scaled
    by `mix`, so both the target's next token and the MTP draft stay close to
    the same bigram rule argmax lm_head(model.norm * rmsnorm(embed(t)));
    eh_proj becomes [I | 0] + mix * eh_proj, enorm.weight = 1 and
    shared_head.norm.weight = model.norm.weight.  Every part of both forwards
    still contributes (at scale mix), and mix sets how often the drafts miss."""
    W = dict(m.W)
    H, N = m.H, m.N
    for name in list(W):
        if name.endswith("self_attn.o_proj.weight") or name.endswith("down_proj.weight"):
            W[name] = W[name] * mix
    p = "model.layers.%d." % N
    eh = np.concatenate([np.eye(H), np.zeros((H, H))], axis=1)
    W[p + "eh_proj.weight"] = eh + mix * W[p + "eh_proj.weight"]
    W[p + "enorm.weight"] = np.ones(H)
    W[p + "shared_head.norm.weight"] = W["model.norm.weight"].copy()
    os.makedirs(dst, exist_ok=True)
    cfg = dict(m.cfg)
    cfg["torch_dtype"] = "float32"
    if "dtype" in cfg:                     # transformers' newer name (gen_glm5.py writes it)
        cfg["dtype"] = "float32"
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    gc = os.path.join(src, "generation_config.json")
    if os.path.exists(gc):
        with open(gc) as f, open(os.path.join(dst, "generation_config.json"), "w") as g:
            g.write(f.read())
    write_safetensors(os.path.join(dst, "model.safetensors"),
                      [(k, W[k]) for k in sorted(W)],
                      {"format": "pt", "derived_from": os.path.abspath(src),
                       "draftable_mix": mix})


def dump_json(path, doc):
    """One prompt per line, everything else indented."""
    lines = ["{"]
    for key in ("model", "k", "n_gen", "generator"):
        lines.append("  %s: %s," % (json.dumps(key), json.dumps(doc[key])))
    lines.append('  "prompts": [')
    ps = doc["prompts"]
    for i, p in enumerate(ps):
        lines.append("    " + json.dumps(p, separators=(", ", ": "))
                     + ("," if i + 1 < len(ps) else ""))
    lines.append("  ],")
    lines.append('  "totals": ' + json.dumps(doc["totals"], separators=(", ", ": ")))
    lines.append("}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv):
    ap = argparse.ArgumentParser(description="greedy MTP speculative decoding: exact "
                                             "acceptance counts (float64 reference)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--k", type=int, default=1, help="drafts per round (0 = plain greedy)")
    ap.add_argument("--n-gen", type=int, default=64, help="tokens generated per prompt")
    ap.add_argument("--prompts", help="prompt file: one prompt a line, comma-separated ids")
    ap.add_argument("--out", help="output JSON")
    ap.add_argument("--check", action="store_true",
                    help="also replay with glm_ref's full-recompute functions")
    ap.add_argument("--write-prompts", metavar="FILE",
                    help="write a prompts file (random ids) and exit")
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pattern", type=int, default=0,
                    help="with --write-prompts: repeat a random pattern of this length")
    ap.add_argument("--make-draftable", metavar="DIR",
                    help="write a derived checkpoint whose MTP layer drafts well, and exit")
    ap.add_argument("--mix", type=float, default=0.1,
                    help="with --make-draftable: scale of the layers' contributions")
    a = ap.parse_args(argv)

    t0 = time.time()
    m = load_model(a.model)
    glm5 = is_glm5(m.cfg)
    if a.make_draftable:
        if not m.has_mtp:
            sys.exit("spec_ref.py: --make-draftable needs an MTP layer")
        make_draftable(m, a.model, a.make_draftable, a.mix)
        print("spec_ref: wrote %s (draftable, mix %g)" % (a.make_draftable, a.mix))
        return
    if a.write_prompts:
        if a.count < 1 or a.prompt_len < 1 or a.pattern < 0:
            sys.exit("spec_ref.py: need --count >= 1, --prompt-len >= 1, --pattern >= 0")
        write_prompts(a.write_prompts, m.V, a.count, a.prompt_len, a.seed, a.pattern)
        print("spec_ref: wrote %d prompts to %s" % (a.count, a.write_prompts))
        return
    if not a.prompts or not a.out:
        sys.exit("spec_ref.py: need --prompts FILE and --out FILE")
    if a.k < 0 or a.n_gen < 1:
        sys.exit("spec_ref.py: need --k >= 0 and --n-gen >= 1")
    if a.k > 0 and not m.has_mtp:
        sys.exit("spec_ref.py: --k %d needs an MTP layer (num_nextn_predict_layers >= 1)"
                 % a.k)
    prompts = read_prompts(a.prompts, m.V)
    K, N = a.k, a.n_gen

    results, checks = [], []
    if glm5:
        m.reset_index_stats()
    for p in prompts:
        r = spec_decode(m, p, K, N, keep_hidden=a.check)
        assert len(r["tokens"]) == N
        assert_greedy(m, p, r["tokens"])
        if a.check:
            checks.append(replay(m, p, K, N, r))
        r.pop("_H", None)
        results.append(r)

    prop = [sum(r["proposed"][i] for r in results) for i in range(K)]
    acc = [sum(r["accepted"][i] for r in results) for i in range(K)]
    rounds = sum(r["rounds"] for r in results)
    dm = [r["min_draft_margin"] for r in results if r["min_draft_margin"] is not None]
    totals = {"prompts": len(results), "tokens": sum(len(r["tokens"]) for r in results),
              "rounds": rounds, "proposed": prop, "accepted": acc,
              "acceptance": [acc[i] / prop[i] if prop[i] else 0.0 for i in range(K)],
              "accepted_per_round": (sum(acc) / rounds) if (K and rounds) else 0.0,
              "min_target_margin": min(r["min_target_margin"] for r in results),
              "min_draft_margin": min(dm) if dm else None}
    if glm5:
        totals["min_index_margin"] = float(m.min_index_margin)
        totals["index_boundary_ties"] = int(m.index_boundary_ties)
    doc = {"model": os.path.abspath(a.model), "k": K, "n_gen": N,
           "generator": "tests/reference/spec_ref.py (float64, greedy, MTP drafter%s)"
                        % (", glm5_ref.py's MLA + DSA" if glm5 else ""),
           "prompts": results, "totals": totals}
    dump_json(a.out, doc)

    print("spec_ref: %s  k=%d n_gen=%d prompts=%d  (%.2f s)"
          % (a.model, K, N, len(results), time.time() - t0))
    print("  tokens == plain greedy: yes (all prompts)")
    print("  rounds %d  proposed %s  accepted %s" % (rounds, prop, acc))
    if K:
        print("  acceptance %s  accepted/round %.4f"
              % (" ".join("%.4f" % x for x in totals["acceptance"]),
                 totals["accepted_per_round"]))
    print("  min margins: target %.3g  draft %s"
          % (totals["min_target_margin"],
             "%.3g" % totals["min_draft_margin"] if dm else "-"))
    if glm5:
        print("  DSA selections: min index margin %.3g, boundary ties %d"
              % (totals["min_index_margin"], totals["index_boundary_ties"]))
    if a.check:
        print("  check: full-recompute greedy equal; replayed counts equal")
        if K:
            print("  check: max |hidden incremental - full| = %.3g"
                  % max(c["hidden_maxdiff"] for c in checks))
        if K == 1:
            v = [sum(c["k1_visited"][i] for c in checks) for i in (0, 1)]
            w = [sum(c["k1_all_positions"][i] for c in checks) for i in (0, 1)]
            print("  check: K=1 teacher-forced mtp_logits agreement at visited anchors "
                  "%d/%d (= accepted/proposed %d/%d); over all positions %d/%d"
                  % (v[0], v[1], acc[0], prop[0], w[0], w[1]))
            if v != [acc[0], prop[0]]:
                raise AssertionError("K=1 teacher-forced agreement != acceptance")
    print("  wrote %s" % a.out)


if __name__ == "__main__":
    main(sys.argv[1:])
