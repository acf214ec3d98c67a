# SPDX-License-Identifier: MIT
#
# spec_check.py -- the MTP acceptance of evaluate.py measured again by lockstep's own
# speculative decoder: `lockstep generate --spec mtp -k K --spec-gate false` on the same
# held-out prompts (offsets and lengths of evaluate.py), greedy, per draft position.
# lockstep reports accepted/proposed per position over all rounds; the conditional rate
# (position j given drafts 1..j-1 accepted) is accepted_j / accepted_{j-1}.
#
# Usage: /usr/bin/python3 tools/train/spec_check.py LOCKSTEP WORK MODEL_DIR

import json
import re
import subprocess
import sys

import numpy as np


def main(argv):
    lks, work, model = argv
    val = np.load(work + "/val.npy")
    m = json.load(open(model + "/metrics.json"))
    st = m["acceptance_setup"]
    P, G, NP = st["prompt_len"], st["generated"], st["prompts"]
    offs = [int(k * (len(val) - P - 1) / NP) for k in range(NP)]
    out = {}
    for k in (1, 2, 3):
        acc = [0] * k
        prop = [0] * k
        rounds = 0
        for o in offs:
            ids = ",".join(str(int(x)) for x in val[o:o + P])
            r = subprocess.run([lks, "generate", "--model", model, "--prompt-ids", ids, "-n", str(G),
                                "--ignore-eos", "--spec", "mtp", "-k", str(k), "--spec-gate", "false",
                                "--threads", "2"], capture_output=True, text=True, check=True)
            line = [l for l in r.stderr.splitlines() if "per position accepted/proposed" in l][0]
            rounds += int(re.search(r"(\d+) rounds", line).group(1))
            for j, a, p in re.findall(r"(\d+):(\d+)/(\d+)", line.split("proposed:")[1]):
                acc[int(j) - 1] += int(a)
                prop[int(j) - 1] += int(p)
        cond = [acc[0] / prop[0]] + [acc[j] / acc[j - 1] if acc[j - 1] else 0.0 for j in range(1, k)]
        out[str(k)] = {"accepted": acc, "proposed": prop, "rounds": rounds,
                       "per_position": cond,
                       "tokens_per_round": (sum(acc) + rounds) / rounds}
        mine = m["acceptance"][str(k)]["per_position"]
        print("k=%d  lockstep %s   evaluate.py %s" % (
            k, " ".join("%.3f" % x for x in cond), " ".join("%.3f" % x for x in mine)))
    m["acceptance_lockstep"] = out
    with open(model + "/metrics.json", "w") as f:
        json.dump(m, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
