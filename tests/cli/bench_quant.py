#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# `lockstep bench` on a quantized checkpoint reports, for each quantized format the model's decode
# step reads, the rate of that format's decode product with every thread on weights in cache and
# how many of its weights a step reads, then the step's limit (the larger of its bytes over the
# bandwidth and those weights over that rate). This checks the count against one made here from
# the checkpoint's headers and config alone (the target layers' tensors, the routed experts' at
# top_k of n_routed_experts, lm_head; not the MTP layer nor the embedding, whose one row a token
# is never quantized), format by format, and that the rate is a positive figure and the limit line
# is printed. Standard library only (any python3).
#   bench_quant.py LOCKSTEP MODEL_DIR
import json
import os
import re
import struct
import subprocess
import sys


def headers(model):
    """name -> (dtype, shape) over the checkpoint's safetensors files."""
    index = os.path.join(model, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for name in files:
        with open(os.path.join(model, name), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            for k, v in json.loads(f.read(n)).items():
                if k != "__metadata__":
                    out[k] = (v["dtype"], v["shape"])
    return out


def fmt_of(h, base, qc):
    """The weight format of the linear layer `base` (its tensors base.*), and its element count."""
    if base + ".weight_packed" in h:  # compressed-tensors NVFP4: two codes a byte
        rows, half = h[base + ".weight_packed"][1]
        return "nvfp4", rows * half * 2
    dtype, shape = h[base + ".weight"]
    if len(shape) != 2:
        return "other", 0  # norms, biases
    rows, cols = shape
    if dtype == "U8":  # ModelOpt NVFP4
        return "nvfp4", rows * cols * 2
    if dtype == "F8_E4M3":
        block = qc.get("quant_method") == "fp8" and "weight_block_size" in qc
        return ("fp8-block" if block else "fp8-channel"), rows * cols
    return "other", rows * cols


def expected_counts(model):
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg.get("quantization_config", {})
    h = headers(model)
    layers = cfg["num_hidden_layers"]
    counts = {}
    bases = set()
    for name in h:
        for suffix in (".weight", ".weight_packed"):
            if name.endswith(suffix):
                bases.add(name[: -len(suffix)])
    for base in bases:
        m = re.match(r"model\.layers\.(\d+)\.", base)
        if m and int(m.group(1)) >= layers:
            continue  # the MTP layer: not read by a decode step
        if not m and base != "lm_head":
            continue  # embedding, final norm
        fmt, n = fmt_of(h, base, qc)
        if fmt == "other":
            continue
        if ".mlp.experts." in base:
            n = n * cfg["num_experts_per_tok"] / cfg["n_routed_experts"]
        counts[fmt] = counts.get(fmt, 0) + n
    return counts


def main():
    lockstep, model = sys.argv[1], sys.argv[2]
    out = subprocess.run([lockstep, "bench", "--model", model, "--prefill-len", "8",
                          "--decode-len", "8", "--repeats", "1", "--threads", "2",
                          "--log-level", "warn"], capture_output=True, text=True, timeout=300)
    print(out.stdout)
    if out.returncode != 0:
        sys.exit(f"bench failed ({out.returncode}): {out.stderr}")
    want = expected_counts(model)
    got = {}
    for fmt, rate, n in re.findall(r"^(\S+) decode product \(measured, \d+ threads, weights in "
                                   r"cache[^)]*\): ([0-9.]+) G weights/s; the ([0-9.]+) M",
                                   out.stdout, re.M):
        if float(rate) <= 0:
            sys.exit(f"{fmt}: rate {rate}")
        got[fmt] = float(n) * 1e6
    print("expected quantized weights a decode step reads:", want)
    print("reported:", got)
    if set(got) != set(want):
        sys.exit(f"formats reported {sorted(got)}, expected {sorted(want)}")
    for fmt, n in want.items():
        # printed to 1e-3 M: half of that is the rounding
        if abs(got[fmt] - n) > 500 + 1e-9 * n:
            sys.exit(f"{fmt}: {got[fmt]:.0f} weights reported, {n:.0f} expected")
    if not re.search(r"^decode limit: [0-9.]+ tokens/s, bound by ", out.stdout, re.M):
        sys.exit("no decode limit line")
    if not re.search(r"^summary: .* of the limit \((compute|memory)-bound\)", out.stdout, re.M):
        sys.exit("summary without the limit")
    print("ok")


if __name__ == "__main__":
    main()
