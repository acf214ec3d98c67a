#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Issue 16's speed check on this machine: decode tokens/s of one model in BF16, FP8 128-blocks
# and NVFP4, the same threads, in alternated rounds (a slow stretch of a shared machine moves all
# three), and the ratios to BF16 against the targets (FP8 >= 1.8x, NVFP4 >= 3x). A measurement,
# not a test. Standard library only (any python3); generating the checkpoints needs numpy
# (Debian's python3-numpy, under /usr/bin/python3).
#
#   tools/quant_ratio.py LOCKSTEP [--models BF16_DIR,FP8_DIR,NVFP4_DIR | --work DIR]
#                        [--threads 1,2] [--rounds 3] [--prefill-len 16] [--decode-len 128]
#                        [--repeats 3] [--check]
#
# Without --models, the GLM-4.5-Air-proportioned model (tools/gen_model.py --preset air-1g) is
# written in the three formats under --work (once; about 1.8 GB), every linear layer quantized.
#
# Each round runs `lockstep bench` on the three models in turn, at each thread count. Beside the
# tokens/s, the bench measures what bounds a decode step here: for BF16 its bytes over the
# measured bandwidth; for FP8 and NVFP4 the larger of that and the format's weights over the
# rate its decode product reaches on this CPU with the weights in cache (`decode limit:`). The
# "ceiling" column is that limit over BF16's achieved tokens/s: the ratio this machine would
# give if the quantized decode reached its limit. Where the ceiling is under the target, these
# kernels cannot reach it here: decode would have to run its products faster than they run with
# the weights in cache.
#
# Prints the rounds, then for each thread count the medians and, per format, the median of the
# rounds' ratios. --check: exit 1 when a median ratio misses its target (else 0).
import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FORMATS = [("BF16", "none", None), ("FP8 blocks", "fp8-block", 1.8), ("NVFP4", "nvfp4", 3.0)]

DECODE = re.compile(r"^decode:\s+\d+ tokens in [0-9.]+ s = ([0-9.]+) tokens/s", re.M)
ACHIEVED = re.compile(r"^achieved: [0-9.]+ GB/s = ([0-9.]+) of measured bandwidth", re.M)
LIMIT = re.compile(r"^decode limit: ([0-9.]+) tokens/s, bound by ([^;]+);", re.M)


def generate(python, work):
    dirs = []
    for _, quant, _ in FORMATS:
        d = work / f"air-1g-{quant}"
        if not (d / "config.json").exists():
            cmd = [python, str(HERE / "gen_model.py"), "--out", str(d), "--preset", "air-1g",
                   "--quant", quant, "--quant-skip", "none"]
            print("+", " ".join(cmd), file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True)
        dirs.append(d)
    return dirs


def bench(lockstep, model, threads, a):
    """(decode tokens/s, limit tokens/s, what bounds it) of one `lockstep bench` run."""
    cmd = [lockstep, "bench", "--model", str(model), "--threads", str(threads),
           "--prefill-len", str(a.prefill_len), "--decode-len", str(a.decode_len),
           "--repeats", str(a.repeats), "--log-level", "warn"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"quant_ratio: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    out = p.stdout
    dec, ach, lim = DECODE.search(out), ACHIEVED.search(out), LIMIT.search(out)
    if not dec or not ach:
        sys.exit(f"quant_ratio: no decode or bandwidth line in the output of {' '.join(cmd)}:\n"
                 f"{out}")
    tps = float(dec.group(1))
    if lim:
        return tps, float(lim.group(1)), lim.group(2)
    # No quantized weights: the step's bytes over the bandwidth bound it.
    return tps, tps / float(ach.group(1)), "bandwidth"


def main():
    p = argparse.ArgumentParser(description="decode tokens/s of BF16, FP8 and NVFP4, and ratios")
    p.add_argument("lockstep")
    p.add_argument("--models", help="BF16_DIR,FP8_DIR,NVFP4_DIR (the same model)")
    p.add_argument("--work", default="build/quant", help="where the generated models go")
    p.add_argument("--python", default="/usr/bin/python3", help="a python3 with numpy")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prefill-len", type=int, default=16)
    p.add_argument("--decode-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    a = p.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    if a.rounds < 1 or not threads or min(threads) < 1:
        sys.exit("quant_ratio: --rounds and --threads must be positive")
    if a.models:
        models = [Path(m) for m in a.models.split(",")]
        if len(models) != len(FORMATS):
            sys.exit("quant_ratio: --models takes three directories: BF16,FP8,NVFP4")
        for m in models:
            if not (m / "config.json").exists():
                sys.exit(f"quant_ratio: {m} has no config.json")
    else:
        models = generate(a.python, Path(a.work))

    # runs[t][format] = [(tok/s, limit, bound) a round]
    runs = {t: {f[0]: [] for f in FORMATS} for t in threads}
    for r in range(1, a.rounds + 1):
        for t in threads:
            res = {}
            for (name, _, _), m in zip(FORMATS, models):
                res[name] = bench(a.lockstep, m, t, a)
                runs[t][name].append(res[name])
            base = res["BF16"][0]
            parts = [f"BF16 {base:.1f}"]
            for name, _, _ in FORMATS[1:]:
                tps, lim, _ = res[name]
                parts.append(f"{name} {tps:.1f} (x{tps / base:.2f}; limit {lim:.1f}, "
                             f"x{lim / base:.2f})")
            print(f"round {r}, {t} thread(s): " + ", ".join(parts) + " tokens/s", flush=True)
            for name, _, _ in FORMATS[1:]:
                if res[name][0] > res[name][1]:
                    print(f"  ({name} ran over its limit: the machine was slower while the bench "
                          "measured the limit than during the decode)", flush=True)

    missed = False
    for t in threads:
        bf = [x[0] for x in runs[t]["BF16"]]
        bf_lim = statistics.median(x[1] for x in runs[t]["BF16"])
        print(f"\n{t} thread(s), medians of {a.rounds} round(s):")
        print("| format | decode tok/s | of its limit | limit tok/s (bound by) | ratio to BF16 "
              "| ceiling | target | met |")
        print("|---|---|---|---|---|---|---|---|")
        print(f"| BF16 | {statistics.median(bf):.1f} | {statistics.median(bf) / bf_lim:.2f} | "
              f"{bf_lim:.1f} (bandwidth) | 1 | - | - | - |")
        for name, _, target in FORMATS[1:]:
            rs = runs[t][name]
            ratio = statistics.median(x[0] / b for x, b in zip(rs, bf))
            ceiling = statistics.median(x[1] / b for x, b in zip(rs, bf))
            tps, lim = statistics.median(x[0] for x in rs), statistics.median(x[1] for x in rs)
            bound = statistics.mode(x[2] for x in rs)
            met = ratio >= target
            missed |= not met
            verdict = "yes" if met else "no" if ceiling >= target else "no (ceiling under it)"
            print(f"| {name} | {tps:.1f} | {tps / lim:.2f} | {lim:.1f} ({bound}) | x{ratio:.2f} "
                  f"| x{ceiling:.2f} | x{target:g} | {verdict} |")
    sys.exit(1 if a.check and missed else 0)


if __name__ == "__main__":
    main()
