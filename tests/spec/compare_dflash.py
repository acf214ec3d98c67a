# SPDX-License-Identifier: MIT
# DFlash speculative decoding, lockstep at world 1 against world 2 and against the independent
# float64 reference (tests/reference/dflash_ref.py): for every prompt and K = 1 .. block - 1 the
# greedy tokens and the per-position proposed and accepted counts must be equal, exactly.
# Prints the acceptance per position. Run with /usr/bin/python3.
# usage: compare_dflash.py W1.json W2.json REF_DIR
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


check(len(w1["prompts"]) == len(w2["prompts"]) > 0, "same prompts at both world sizes")
for i, (a, b) in enumerate(zip(w1["prompts"], w2["prompts"])):
    check(a["tokens"] == b["tokens"], "prompt %d: world 2 tokens equal world 1" % i)
    check(a["dflash"] == b["dflash"], "prompt %d: world 2 drafts accepted as at world 1" % i)
ks = sorted(int(k) for k in w1["prompts"][0]["dflash"])
for k in ks:
    ref = json.load(open(os.path.join(ref_dir, "k%d.json" % k)))
    rp = ref["prompts"]
    check(len(rp) == len(w1["prompts"]), "K=%d: the reference ran every prompt" % k)
    prop, acc, rprop, racc = [0] * k, [0] * k, [0] * k, [0] * k
    for i, (mine, theirs) in enumerate(zip(w1["prompts"], rp)):
        m = mine["dflash"][str(k)]
        check(mine["tokens"][:len(theirs["tokens"])] == theirs["tokens"],
              "K=%d prompt %d: tokens equal the reference" % (k, i))
        check(m["proposed"] == theirs["proposed"],
              "K=%d prompt %d: proposed %s, reference %s" % (k, i, m["proposed"], theirs["proposed"]))
        check(m["accepted"] == theirs["accepted"],
              "K=%d prompt %d: accepted %s, reference %s" % (k, i, m["accepted"], theirs["accepted"]))
        for j in range(k):
            prop[j] += m["proposed"][j]
            acc[j] += m["accepted"][j]
            rprop[j] += theirs["proposed"][j]
            racc[j] += theirs["accepted"][j]
    print("K=%d per position accepted/proposed: lockstep %s, reference %s" % (
        k, " ".join("%d/%d" % (acc[j], prop[j]) for j in range(k)),
        " ".join("%d/%d" % (racc[j], rprop[j]) for j in range(k))))
print("%d passed, %d failed" % (passes, fails))
sys.exit(1 if fails else 0)
