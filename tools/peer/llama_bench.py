#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# lockstep against llama.cpp on the same weights, on this machine, in one run (issues 15 and 16:
# "measured side by side ... with the peer"). A measurement, not a test.
#
#   /usr/bin/python3 tools/peer/llama_bench.py LOCKSTEP BF16_DIR [--quant FP8_DIR NVFP4_DIR]
#                     [--threads 1,2] [--rounds 3] [--work build/peer]
#
# Needs, beyond deploy/install-deps.sh: npm and Debian's python3-torch (the peer's converter
# imports torch): apt-get install npm python3-torch.
#
# 1. The peer's source: the llama.cpp tree that the npm package node-llama-cpp ships as a git
#    bundle (`npm pack`, no install scripts run; npm is the one registry besides Debian's that
#    this machine reaches). Built here, CPU only, GGML_NATIVE (the peer's best kernels for this
#    CPU): llama-bench and llama-quantize.
# 2. The weights: BF16_DIR converted by the peer's own convert_hf_to_gguf.py
#    (tools/peer/to_gguf.py), then quantized by its llama-quantize to Q8_0 and Q4_0, the formats
#    of the peer's that come closest to FP8 (8 bits and a scale per 32) and NVFP4 (4 bits and a
#    scale per 32; the peer's NVFP4 type is not offered by llama-quantize).
# 3. Rounds: each round runs, for each thread count, `lockstep bench` on BF16_DIR (decode after a
#    64-token prompt, prefill 64 and 512) and `llama-bench` on the BF16 GGUF (tg64 at depth 64,
#    pp64, pp512), and with --quant the quantized models likewise (at the last thread count);
#    the two programs alternate, so a slow stretch of this shared machine moves both. Medians
#    over the rounds.
#
# llama.cpp's quantized dot products round the activations to 8-bit integers (Q8_0/Q8_K) and use
# integer dot instructions; lockstep keeps F32 activations (weight-only dequantization), so the
# two quantized columns are not the same arithmetic: the table says so.
import argparse
import csv
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

NODE_LLAMA_CPP = "3.22.1"  # its bundle is llama.cpp commit de3ff81 (2026-09-28), tag v0.5.0
HERE = Path(__file__).resolve().parent


def run(cmd, **kw):
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def fetch_and_build(work):
    src = work / "llama.cpp"
    if not (src / "CMakeLists.txt").exists():
        work.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(["npm", "pack", "--silent", f"node-llama-cpp@{NODE_LLAMA_CPP}"],
                             cwd=work, check=True, capture_output=True, text=True)
        tgz = work / out.stdout.strip().splitlines()[-1]
        with tarfile.open(tgz) as t:
            member = t.getmember("package/llama/gitRelease.bundle")
            with open(work / "llama.cpp.bundle", "wb") as f:
                shutil.copyfileobj(t.extractfile(member), f)
        run(["git", "clone", "-q", work / "llama.cpp.bundle", src])
    build = src / "build"
    bins = [build / "bin" / "llama-bench", build / "bin" / "llama-quantize"]
    if not all(b.exists() for b in bins):
        run(["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
             "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
             "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"], stdout=subprocess.DEVNULL)
        run(["cmake", "--build", build, "-j", str(os.cpu_count() or 2), "--target",
             "llama-bench", "llama-quantize"], stdout=subprocess.DEVNULL)
    commit = subprocess.run(["git", "-C", src, "log", "-1", "--format=%h %ad", "--date=short"],
                            check=True, capture_output=True, text=True).stdout.strip()
    return src, bins[0], bins[1], commit


def gguf_models(src, quantize, bf16_dir, work, quant):
    name = Path(bf16_dir).resolve().name
    bf16 = work / f"{name}-bf16.gguf"
    if not bf16.exists():
        run([sys.executable, HERE / "to_gguf.py", src, bf16_dir, bf16], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
    out = {"bf16": bf16}
    for q in (("q8_0", "q4_0") if quant else ()):
        f = work / f"{name}-{q}.gguf"
        if not f.exists():
            run([quantize, bf16, f, q.upper()], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
        out[q] = f
    return out


def lockstep(binary, model, threads, decode_only):
    cmd = [binary, "bench", "--model", model, "--threads", threads, "--prefill-len", "64",
           "--decode-len", "64", "--repeats", "3", "--log-level", "warn"]
    if not decode_only:
        cmd += ["--prefill-lens", "512"]
    out = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("summary:"))
    r = {"decode": float(re.search(r"decode ([\d.]+) tok/s", line).group(1))}
    for n, v in re.findall(r"prefill (\d+): ([\d.]+) tok/s", line):
        r[f"prefill {n}"] = float(v)
    return r


def llama(binary, gguf, threads, decode_only):
    def bench(args):
        out = subprocess.run([str(binary), "-m", str(gguf), "-t", str(threads), "-r", "3",
                              "-o", "csv"] + args, check=True, capture_output=True,
                             text=True).stdout
        return list(csv.DictReader(io.StringIO(out)))
    r = {}
    for row in bench(["-p", "0", "-n", "64", "-d", "64"]):
        r["decode"] = float(row["avg_ts"])
    if not decode_only:
        for row in bench(["-p", "64,512", "-n", "0"]):
            r[f"prefill {row['n_prompt']}"] = float(row["avg_ts"])
    return r


def main():
    p = argparse.ArgumentParser(description="lockstep against llama.cpp on the same weights")
    p.add_argument("lockstep")
    p.add_argument("bf16_dir")
    p.add_argument("--quant", nargs=2, metavar=("FP8_DIR", "NVFP4_DIR"))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", default="build/peer")
    a = p.parse_args()
    if subprocess.run([sys.executable, "-c", "import numpy, torch"]).returncode != 0:
        sys.exit("llama_bench.py: the peer's converter needs numpy and torch in "
                 f"{sys.executable}: apt-get install python3-numpy python3-torch")
    if shutil.which("npm") is None:
        sys.exit("llama_bench.py: npm fetches the peer's source: apt-get install npm")
    work = Path(a.work).resolve()
    src, bench, quantize, commit = fetch_and_build(work)
    gg = gguf_models(src, quantize, a.bf16_dir, work, a.quant is not None)
    threads = [int(t) for t in a.threads.split(",")]
    ours = {"bf16": a.bf16_dir}
    if a.quant:
        ours.update({"fp8": a.quant[0], "nvfp4": a.quant[1]})
    samples = {}  # (program, format, threads, measure) -> [tokens/s]

    def add(prog, fmt, t, res):
        for m, v in res.items():
            samples.setdefault((prog, fmt, t, m), []).append(v)

    for rnd in range(a.rounds):
        print(f"round {rnd + 1}/{a.rounds}", file=sys.stderr, flush=True)
        for t in threads:
            add("lockstep", "bf16", t, lockstep(a.lockstep, a.bf16_dir, t, False))
            add("llama.cpp", "bf16", t, llama(bench, gg["bf16"], t, False))
            if a.quant and t == threads[-1]:
                for ofmt, pfmt in (("fp8", "q8_0"), ("nvfp4", "q4_0")):
                    add("lockstep", ofmt, t, lockstep(a.lockstep, ours[ofmt], t, False))
                    add("llama.cpp", pfmt, t, llama(bench, gg[pfmt], t, False))

    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"peer: llama.cpp {commit} (node-llama-cpp {NODE_LLAMA_CPP}'s bundle), built here "
          f"with GGML_NATIVE; the same BF16 weights ({a.bf16_dir}) through its own converter; "
          f"medians of {a.rounds} rounds, each program's own 3-repeat figure a round")
    # The two programs of a round run back to back, so a round's own ratio spans less of this
    # shared host's drift than the ratio of the medians; both are printed, with the rounds' range.
    print(f"{'threads':>7}  {'measure':<12} {'lockstep':>10} {'llama.cpp':>10} {'ratio':>7}"
          f"  {'per round: median [least, most]'}")
    for t in threads:
        for m in ("decode", "prefill 64", "prefill 512"):
            x, y = med.get(("lockstep", "bf16", t, m)), med.get(("llama.cpp", "bf16", t, m))
            if x and y:
                rr = [u / v for u, v in zip(samples[("lockstep", "bf16", t, m)],
                                            samples[("llama.cpp", "bf16", t, m)])]
                print(f"{t:>7}  {m:<12} {x:>10.1f} {y:>10.1f} {x / y:>7.2f}  "
                      f"{statistics.median(rr):.2f} [{min(rr):.2f}, {max(rr):.2f}]")
    if a.quant:
        t = threads[-1]
        print(f"quantized, {t} threads, tokens/s and x its own BF16 (lockstep: F32 activations; "
              f"llama.cpp: 8-bit activations)")
        for m in ("decode", "prefill 64", "prefill 512"):
            b0, b1 = med[("lockstep", "bf16", t, m)], med[("llama.cpp", "bf16", t, m)]
            for ofmt, pfmt in (("fp8", "q8_0"), ("nvfp4", "q4_0")):
                x, y = med[("lockstep", ofmt, t, m)], med[("llama.cpp", pfmt, t, m)]
                print(f"  {m:<12} lockstep {ofmt:<6} {x:8.1f} (x{x / b0:.2f})   llama.cpp {pfmt:<5}"
                      f" {y:8.1f} (x{y / b1:.2f})   lockstep / llama.cpp {x / y:.2f}")
    print("samples: " + json.dumps({" ".join(map(str, k)): v for k, v in samples.items()}))


if __name__ == "__main__":
    main()
