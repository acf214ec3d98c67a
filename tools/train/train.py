# SPDX-License-Identifier: MIT
#
# train.py -- builds the default lockstep model from scratch on the CPU, in stages:
#
#   prep    corpus (python3.11-doc reStructuredText sources), file-level held-out split
#           (fixed seed), byte-level BPE tokenizer, token streams       -> WORK/
#   train   the Glm4MoeForCausalLM + MTP model (glm.py), AdamW, aux-loss-free expert
#           balancing, checkpoints every --ckpt-every steps (resumable)  -> WORK/ckpt.pt
#   export  Hugging Face layout, BF16 (e_score_correction_bias F32)      -> OUT/
#
# evaluate.py then measures the exported weights.  Everything is seeded; torch runs
# deterministic on --threads threads.
#
# Usage: /usr/bin/python3 tools/train/train.py {prep,train,export} --work DIR [options]

import argparse
import glob
import json
import math
import os
import random
import shutil
import struct
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import glm  # noqa: E402

CORPUS = "/usr/share/doc/python3.11/html/_sources"
HERE = os.path.dirname(os.path.abspath(__file__))


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def add_model_args(p):
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--moe-inter", type=int, default=256)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--scale", type=float, default=2.5)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--max-pos", type=int, default=2048)


# ---------------------------------------------------------------------------
# prep
# ---------------------------------------------------------------------------

def corpus_files():
    fs = sorted(glob.glob(os.path.join(CORPUS, "**", "*.txt"), recursive=True))
    if not fs:
        sys.exit("train.py: no corpus under %s (apt-get install python3.11-doc)" % CORPUS)
    return fs


def split_files(fs, seed, frac):
    order = fs[:]
    random.Random(seed).shuffle(order)
    n_val = max(1, int(round(len(fs) * frac)))
    val = sorted(order[:n_val])
    train = sorted(order[n_val:])
    return train, val


def stage_prep(a):
    os.makedirs(a.work, exist_ok=True)
    fs = corpus_files()
    train_f, val_f = split_files(fs, a.seed, a.val_frac)
    read = lambda f: open(f, encoding="utf-8").read()
    train_t = [read(f) for f in train_f]
    val_t = [read(f) for f in val_f]
    log("corpus: %d files (%d bytes); train %d files (%d bytes), held out %d files (%d bytes)"
        % (len(fs), sum(map(len, train_t)) + sum(map(len, val_t)), len(train_f),
           sum(map(len, train_t)), len(val_f), sum(map(len, val_t))))
    vocab, merges = bpe.train(train_t, a.vocab, log=log)
    bpe.write_tokenizer(os.path.join(a.work, "tokenizer.json"), vocab, merges)
    enc = bpe.Encoder(vocab, merges)
    eot = bpe.special_ids(vocab)["<|endoftext|>"]

    def stream(texts):
        ids = []
        for t in texts:
            ids.extend(enc.encode(t))
            ids.append(eot)
        return np.array(ids, dtype=np.int32)

    tr, va = stream(train_t), stream(val_t)
    # round trip check on the held-out text
    for t in val_t[:3]:
        assert enc.decode(enc.encode(t)) == t
    np.save(os.path.join(a.work, "train.npy"), tr)
    np.save(os.path.join(a.work, "val.npy"), va)
    info = {"files_total": len(fs), "train_files": [os.path.relpath(f, CORPUS) for f in train_f],
            "val_files": [os.path.relpath(f, CORPUS) for f in val_f],
            "train_bytes": sum(len(t.encode()) for t in train_t),
            "val_bytes": sum(len(t.encode()) for t in val_t),
            "train_tokens": int(len(tr)), "val_tokens": int(len(va)),
            "vocab_size": len(vocab) + len(bpe.SPECIAL_TOKENS), "merges": len(merges)}
    with open(os.path.join(a.work, "data.json"), "w") as f:
        json.dump(info, f, indent=1)
    log("tokens: train %d, held out %d (%.2f bytes/token)" % (
        len(tr), len(va), info["train_bytes"] / len(tr)))


# ---------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------

def load_tok(work):
    with open(os.path.join(work, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    vocab = tj["model"]["vocab"]
    merges = [tuple(m.split(" ")) for m in tj["model"]["merges"]]
    return vocab, merges


def make_config(a, work):
    vocab, _ = load_tok(work)
    special = bpe.special_ids(vocab)
    return glm.glm_config(a, len(vocab) + len(bpe.SPECIAL_TOKENS), special)


def set_determinism(threads):
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def batch_at(data, a, step):
    g = np.random.default_rng([a.seed, step])
    starts = g.integers(0, len(data) - a.seq - 1, a.batch)
    x = np.stack([data[s:s + a.seq + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(x)


def losses(model, win):
    """win [B, T+1] -> (main CE, MTP CE on the token after next)."""
    x, y = win[:, :-1], win[:, 1:]
    hn, logits = model(x)
    V = logits.shape[-1]
    main = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    # MTP at position i: (hn_i, t_{i+1}) -> t_{i+2}
    u = model.mtp_input(hn[:, :-1], x[:, 1:])
    _, ml = model.mtp_layer(u)
    mtp = torch.nn.functional.cross_entropy(ml.reshape(-1, V), win[:, 2:].reshape(-1))
    return main, mtp


@torch.no_grad()
def balance_experts(moes, bias_u):
    """Aux-loss-free balancing (DeepSeek-V3) after a step: every MoE layer's
    e_score_correction_bias += u * sign(mean_load - load). Returns each layer's
    imbalance, max load / mean load."""
    imb = []
    with torch.no_grad():
        for m in moes:
            load = m.last_load.float()
            m.gate.e_score_correction_bias += bias_u * torch.sign(load.mean() - load)
            imb.append(float(load.max() / load.mean()))
    return imb


def evaluate_val(model, val, a, n_windows):
    model.eval()
    tot_m = tot_t = 0.0
    n = 0
    for k in range(n_windows):
        s = k * a.seq
        if s + a.seq + 1 > len(val):
            break
        win = torch.from_numpy(val[s:s + a.seq + 1].astype(np.int64))[None]
        m, t = losses(model, win)
        tot_m += float(m)
        tot_t += float(t)
        n += 1
    model.train()
    return tot_m / n, tot_t / n


def stage_train(a):
    set_determinism(a.threads)
    torch.manual_seed(a.seed)
    cfg = make_config(a, a.work)
    model = glm.Glm4Moe(cfg)
    model.init_weights()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    train = np.load(os.path.join(a.work, "train.npy"))
    val = np.load(os.path.join(a.work, "val.npy"))
    ck = os.path.join(a.work, "ckpt.pt")
    step, elapsed, hist = 0, 0.0, []
    if os.path.exists(ck):
        st = torch.load(ck)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed, hist = st["step"], st["elapsed"], st["hist"]
        log("resumed at step %d" % step)
    n_params = sum(p.numel() for p in model.parameters())
    log("model: %d parameters; %d steps of %d x %d tokens" % (n_params, a.steps, a.batch, a.seq))
    moes = model.moe_layers()
    model.train()
    t_last = time.time()
    while step < a.steps:
        t0 = time.time()
        for gp in opt.param_groups:
            gp["lr"] = lr_at(a, step)
        win = batch_at(train, a, step)
        main, mtp = losses(model, win)
        loss = main + a.mtp_weight * mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        imb = balance_experts(moes, a.bias_u)
        step += 1
        elapsed += time.time() - t0
        rec = {"step": step, "loss": float(main), "mtp": float(mtp), "gn": float(gn),
               "lr": lr_at(a, step - 1), "max_load": max(imb)}
        if step % a.log_every == 0 or step == 1:
            log("step %5d  loss %.4f  mtp %.4f  gnorm %.2f  lr %.2e  maxload %.2f  %.2f s/step"
                % (step, rec["loss"], rec["mtp"], rec["gn"], rec["lr"], rec["max_load"],
                   (time.time() - t_last) / (a.log_every if step > 1 else 1)))
            t_last = time.time()
        if a.eval_every and step % a.eval_every == 0:
            vm, vt = evaluate_val(model, val, a, a.eval_windows)
            rec.update(val_loss=vm, val_mtp=vt)
            log("step %5d  val loss %.4f (ppl %.1f)  val mtp %.4f" % (step, vm, math.exp(vm), vt))
        hist.append(rec)
        if step % a.ckpt_every == 0 or step == a.steps:
            tmp = ck + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "elapsed": elapsed, "hist": hist, "cfg": cfg, "args": vars(a)}, tmp)
            os.replace(tmp, ck)
    log("training done: %d steps, %.1f s of training compute" % (step, elapsed))


# ---------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------

def bf16_bytes(t):
    """float32 tensor -> BF16 little-endian bytes, round to nearest even."""
    u = t.detach().float().contiguous().numpy().view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    return u.tobytes()


def write_safetensors(path, items, metadata=None):
    """items: [(name, dtype, shape, bytes)] in file order."""
    hdr = {"__metadata__": metadata or {"format": "pt"}}
    off = 0
    for name, dt, shape, b in items:
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
    js = json.dumps(hdr, separators=(",", ":")).encode()
    js += b" " * ((-len(js)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js)
        for _, _, _, b in items:
            f.write(b)


def hf_order(name):
    """Sort key: embed, layers in order, norm, lm_head (as HF checkpoints list them)."""
    if name.startswith("model.embed_tokens"):
        return (0, 0, name)
    if name.startswith("model.layers."):
        return (1, int(name.split(".")[2]), name)
    if name.startswith("model.norm"):
        return (2, 0, name)
    return (3, 0, name)


def tokenizer_config(vocab, ctx):
    special = bpe.special_ids(vocab)
    with open(os.path.join(HERE, "glm-4.6.jinja"), encoding="utf-8") as f:
        template = f.read()
    return {
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False,
                                          "special": True}
                                 for t, i in special.items()},
        "additional_special_tokens": [t for t in bpe.SPECIAL_TOKENS if t != "<|endoftext|>"],
        "bos_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "eos_token": "<|endoftext|>",
        "extra_special_tokens": {},
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": ctx,
        "pad_token": "<|endoftext|>",
        "padding_side": "left",
        "remove_space": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def stage_export(a):
    st = torch.load(os.path.join(a.work, "ckpt.pt"))
    cfg = st["cfg"]
    os.makedirs(a.out, exist_ok=True)
    sd = st["model"]
    items = []
    for name in sorted(sd, key=hf_order):
        t = sd[name]
        if name.endswith("e_score_correction_bias"):
            items.append((name, "F32", t.shape, t.float().contiguous().numpy().astype("<f4").tobytes()))
        else:
            items.append((name, "BF16", t.shape, bf16_bytes(t)))
    write_safetensors(os.path.join(a.out, "model.safetensors"), items)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    gen = {"_from_model_config": True, "do_sample": False,
           "eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"],
           "transformers_version": cfg["transformers_version"]}
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    shutil.copyfile(os.path.join(a.work, "tokenizer.json"), os.path.join(a.out, "tokenizer.json"))
    vocab, _ = load_tok(a.work)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(vocab, cfg["max_position_embeddings"]), f, indent=2,
                  ensure_ascii=False)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(a.out, x)) for x in os.listdir(a.out)
                if os.path.isfile(os.path.join(a.out, x)))
    log("exported %s: %d tensors, %d bytes in the directory" % (a.out, len(items), total))


def main(argv):
    p = argparse.ArgumentParser(description="train the default lockstep model")
    p.add_argument("stage", choices=["prep", "train", "export"])
    p.add_argument("--work", required=True)
    p.add_argument("--out")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--val-frac", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=700)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--mtp-weight", type=float, default=0.3)
    p.add_argument("--bias-u", type=float, default=1e-2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-windows", type=int, default=16)
    p.add_argument("--ckpt-every", type=int, default=20)
    add_model_args(p)
    a = p.parse_args(argv)
    {"prep": stage_prep, "train": stage_train, "export": stage_export}[a.stage](a)


if __name__ == "__main__":
    main(sys.argv[1:])
