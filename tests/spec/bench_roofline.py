# SPDX-License-Identifier: MIT
# `lockstep bench --spec S --spec-gate false -k K`: the roofline's E[tokens/step] at K must be
# 1 + the sum of the printed per-position rates (accepted/proposed, each the rate of rounds that
# accepted drafts 1..i: already a product of conditional rates, not to be multiplied again), and
# must match what the fixed-K run on the same prompt (greedy: the same rounds) produced: its mean
# tokens per round times its R rounds falls short of E x R by the tokens its last round could
# not emit past the length asked for, 0 to K (3 decimals printed: 0.0005 R of rounding).
# Run with /usr/bin/python3.
# usage: bench_roofline.py LOCKSTEP MODEL_DIR SPEC K PROMPT_IDS
import re
import subprocess
import sys

exe, model, spec, k, prompt = sys.argv[1:6]
out = subprocess.run([exe, "bench", "--model", model, "--spec", spec, "--spec-gate", "false",
                      "-k", k, "--threads", "1", "--prompt-ids", prompt, "--decode-len", "48",
                      "--repeats", "1"], capture_output=True, text=True, timeout=600)
print(out.stdout)
if out.returncode != 0:
    print(out.stderr)
    sys.exit(1)
rows = {int(m.group(1)): float(m.group(2)) for m in
        re.finditer(r"^\s+(\d+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s", out.stdout, re.M)}
m = re.search(r"mean accepted length ([\d.]+) tokens per round \((\d+) rounds\)", out.stdout)
mean, n_rounds = float(m.group(1)), int(m.group(2))
rates = [float(x) for x in
         re.findall(r" \d+: ([\d.]+)", re.search(r"acceptance per draft position:([^;]*);",
                                                 out.stdout).group(1))]
e = rows.get(int(k))
fails = 0
for ok, what in [(e is not None, "the roofline has a row for K=%s" % k),
                 (e is not None and -0.001 * n_rounds <= (e - mean) * n_rounds <= int(k) + 0.001 * n_rounds,
                  "roofline E[tokens/step] %s at K=%s: the fixed-K run's %d rounds made %.3f each, "
                  "short by 0..K tokens in all" % (e, k, n_rounds, mean)),
                 (e is not None and len(rates) == int(k) and abs(e - 1 - sum(rates)) <= 0.002 * int(k),
                  "roofline E %s equals 1 + the per-position rates %s" % (e, rates))]:
    print(("ok: " if ok else "FAIL: ") + what)
    fails += not ok
sys.exit(1 if fails else 0)
