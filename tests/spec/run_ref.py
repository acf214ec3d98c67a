# SPDX-License-Identifier: MIT
# Runs the independent reference of speculative decoding (tests/reference/spec_ref.py) for
# K = 1..4 on the test prompts: OUTDIR/k1.json .. k4.json. Run with /usr/bin/python3.
# usage: run_ref.py SPEC_REF MODEL PROMPTS N_GEN OUTDIR
import os
import subprocess
import sys

spec_ref, model, prompts, n_gen, outdir = sys.argv[1:6]
os.makedirs(outdir, exist_ok=True)
for k in range(1, 5):
    subprocess.run([sys.executable, spec_ref, "--model", model, "--k", str(k), "--n-gen", n_gen,
                    "--prompts", prompts, "--out", os.path.join(outdir, "k%d.json" % k)],
                   check=True)
