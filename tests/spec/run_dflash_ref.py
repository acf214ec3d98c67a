# SPDX-License-Identifier: MIT
# Runs the independent reference of DFlash speculative decoding (tests/reference/dflash_ref.py)
# for K = 1 .. KMAX on the test prompts: OUTDIR/k1.json ... Run with /usr/bin/python3.
# usage: run_dflash_ref.py DFLASH_REF MODEL DRAFT PROMPTS N_GEN KMAX OUTDIR
import os
import subprocess
import sys

ref, model, draft, prompts, n_gen, kmax, outdir = sys.argv[1:8]
os.makedirs(outdir, exist_ok=True)
for k in range(1, int(kmax) + 1):
    subprocess.run([sys.executable, ref, "--model", model, "--draft", draft, "--k", str(k),
                    "--n-gen", n_gen, "--prompts", prompts,
                    "--out", os.path.join(outdir, "k%d.json" % k)], check=True)
