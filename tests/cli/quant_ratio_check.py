#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# tools/quant_ratio.py (issue 16's speed check) on three small checkpoints of one model, BF16,
# FP8 128-blocks and NVFP4, written here by tools/gen_model.py: the tool parses today's
# `lockstep bench` output, and its ratios, medians and --check verdict are recomputed here from
# the tokens/s it prints. A program whose output has no bench lines makes it fail, naming them.
# Standard library only; GEN_PYTHON (a python3 with numpy) writes the checkpoints.
#   quant_ratio_check.py LOCKSTEP GEN_PYTHON WORK_DIR
import re
import statistics
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]
TARGETS = {"FP8 blocks": 1.8, "NVFP4": 3.0}
ROUND = re.compile(r"^round (\d+), (\d+) thread\(s\): BF16 ([0-9.]+), FP8 blocks ([0-9.]+) "
                   r"\(x([0-9.]+); limit ([0-9.]+), x([0-9.]+)\), NVFP4 ([0-9.]+) \(x([0-9.]+); "
                   r"limit ([0-9.]+), x([0-9.]+)\) tokens/s$", re.M)
ROW = re.compile(r"^\| (FP8 blocks|NVFP4) \| ([0-9.]+) \| [0-9.]+ \| [0-9.]+ \([^)]+\) "
                 r"\| x([0-9.]+) \| x([0-9.]+) \| x[0-9.]+ \| (yes|no|no \(ceiling under it\)) \|$",
                 re.M)


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def near(printed, exact, a, b):
    """printed (2 decimals) against the ratio a / b of values printed to 1 decimal: each of a, b
    is off by at most 0.05, so a / b by at most (a / b) (0.05 / a + 0.05 / b), then rounding to
    2 decimals adds 0.005."""
    return abs(printed - exact) <= exact * (0.05 / a + 0.05 / b) + 0.005 + 1e-9


def main():
    lockstep, python, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    models = []
    for quant in ("none", "fp8-block", "nvfp4"):
        d = work / quant
        subprocess.run([python, str(SRC / "tools/gen_model.py"), "--out", str(d), "--quant", quant,
                        "--quant-skip", "none", "--hidden", "192", "--head-dim", "128", "--inter",
                        "256", "--moe-inter", "128", "--shared-experts", "2", "--seed", "22"],
                       check=True, capture_output=True)
        models.append(str(d))
    tool = [sys.executable, str(SRC / "tools/quant_ratio.py")]
    args = ["--models", ",".join(models), "--rounds", "3", "--threads", "1", "--decode-len", "8",
            "--repeats", "1", "--check"]
    p = subprocess.run(tool + [lockstep] + args, capture_output=True, text=True)
    print(p.stdout, p.stderr)
    rounds = ROUND.findall(p.stdout)
    if len(rounds) != 3:
        fail(f"{len(rounds)} round lines, not 3")
    ratios = {"FP8 blocks": [], "NVFP4": []}
    ceilings = {"FP8 blocks": [], "NVFP4": []}
    for r in rounds:
        base = float(r[2])
        for name, i in (("FP8 blocks", 3), ("NVFP4", 7)):
            tps, x, lim, xl = float(r[i]), float(r[i + 1]), float(r[i + 2]), float(r[i + 3])
            if not near(x, tps / base, tps, base):
                fail(f"round {r[0]}: {name} x{x} is not {tps} / {base}")
            if not near(xl, lim / base, lim, base):
                fail(f"round {r[0]}: {name}'s limit x{xl} is not {lim} / {base}")
            ratios[name].append(tps / base)
            ceilings[name].append(lim / base)
    rows = ROW.findall(p.stdout)
    if [r[0] for r in rows] != ["FP8 blocks", "NVFP4"]:
        fail(f"summary rows {rows}")
    missed, undecided = False, False
    for name, _, x, ceil, verdict in rows:
        ratio, ceiling = statistics.median(ratios[name]), statistics.median(ceilings[name])
        # The medians of ratios of tokens/s printed to 1 decimal: within the per-round bound of
        # the largest such error (the tool takes them from the unrounded figures).
        tol = max(ratios[name]) * 0.002 + 0.005
        ctol = max(ceilings[name]) * 0.002 + 0.005
        if abs(float(x) - ratio) > tol or abs(float(ceil) - ceiling) > ctol:
            fail(f"{name}: median x{x} / ceiling x{ceil} against {ratio:.4f} / {ceiling:.4f}")
        target = TARGETS[name]
        met = ratio >= target
        missed |= not met
        want = "yes" if met else "no" if ceiling >= target else "no (ceiling under it)"
        # Within those bounds of the target the printed figures cannot tell the tool's verdict:
        # a ratio that close, either verdict (and --check's status follows the printed ones); a
        # ceiling that close, either kind of "no".
        if abs(ratio - target) <= tol:
            undecided = True
        elif abs(ceiling - target) <= ctol and not met:
            if not verdict.startswith("no"):
                fail(f"{name}: verdict '{verdict}', want a 'no'")
        elif verdict != want:
            fail(f"{name}: verdict '{verdict}', want '{want}'")
    if undecided:
        missed = any(r[4] != "yes" for r in rows)
    if p.returncode != (1 if missed else 0):
        fail(f"--check exited {p.returncode} with a target {'missed' if missed else 'met'}")

    # A program that prints no bench lines: the tool stops, naming what it ran.
    e = subprocess.run(tool + ["/bin/echo"] + args, capture_output=True, text=True)
    if e.returncode == 0 or "no decode or bandwidth line" not in e.stderr:
        fail(f"against /bin/echo: exit {e.returncode}, stderr {e.stderr!r}")
    print("PASS")


if __name__ == "__main__":
    main()
