# SPDX-License-Identifier: MIT
# Speculative decoding, lockstep against itself at another world size and against the
# independent reference: for every prompt and K = 1..4 the greedy tokens and the per-position
# proposed and accepted counts must be equal, exactly. Run with /usr/bin/python3.
# usage: compare.py SPEC_W1.json SPEC_W2.json REF_DIR|-
import json
import os
import sys

w1 = json.load(open(sys.argv[1]))
w2 = json.load(open(sys.argv[2]))
ref_dir = sys.argv[3]
fails = passes = 0


def check(ok, what):
    global fails, passes
    if ok:
        passes += 1
    else:
        fails += 1
        print("FAIL:", what)


check(len(w1["prompts"]) == len(w2["prompts"]) == 20 or len(w1["prompts"]) == len(w2["prompts"]),
      "same prompts at both world sizes")
for i, (a, b) in enumerate(zip(w1["prompts"], w2["prompts"])):
    check(a["tokens"] == b["tokens"], "prompt %d: world 2 tokens equal world 1" % i)
    check(a["mtp"] == b["mtp"], "prompt %d: world 2 drafts accepted as at world 1" % i)

totals = {}
# REF_DIR "-": no reference run; world sizes only.
for k in range(1, 5) if ref_dir != "-" else []:
    ref = json.load(open(os.path.join(ref_dir, "k%d.json" % k)))
    rp = ref["prompts"] if isinstance(ref, dict) else ref
    check(len(rp) == len(w1["prompts"]), "K=%d: the reference ran every prompt" % k)
    for i, (mine, theirs) in enumerate(zip(w1["prompts"], rp)):
        m = mine["mtp"][str(k)]
        check(mine["tokens"] == theirs["tokens"], "K=%d prompt %d: tokens equal the reference" % (k, i))
        check(m["proposed"] == theirs["proposed"],
              "K=%d prompt %d: proposed %s, reference %s" % (k, i, m["proposed"], theirs["proposed"]))
        check(m["accepted"] == theirs["accepted"],
              "K=%d prompt %d: accepted %s, reference %s" % (k, i, m["accepted"], theirs["accepted"]))
        t = totals.setdefault(k, [0] * k)
        for j in range(k):
            t[j] += m["accepted"][j]
for k, t in sorted(totals.items()):
    print("K=%d accepted per position (all prompts): %s" % (k, t))
print("%d passed, %d failed" % (passes, fails))
sys.exit(1 if fails else 0)
