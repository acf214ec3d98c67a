# SPDX-License-Identifier: MIT
#
# logits_ref.py -- checks what `lockstep serve` reported and picked against the independent
# numpy reference of the model (tests/reference/glm_ref.py, float64), for the cases that
# sampling_test.mjs collected:
#
#   {"kind": "logprobs", "prompt": [ids], "tokens": [ids], "logprobs": [lp per token],
#    "top": [[lp, ...] per token, best first], "k": alternatives asked for}
#       every reported logprob equals log_softmax of the reference logits of its row (the raw
#       model distribution) within TOL, and the reported alternatives equal the reference's k
#       largest log-probabilities, rank by rank (when the legacy dict merged alternatives of the
#       same text, each value is one of the reference's best k).
#   {"kind": "greedy", "prompt": [ids], "tokens": [ids], "presence": p, "frequency": f,
#    "repetition": r, "bias": {"id": value}}
#       every token is the arg-max of the reference row after logit_bias, then the repetition
#       penalty over prompt + generated, then logit -= frequency * count + presence * (count > 0)
#       over the tokens generated before it; a row whose two best processed logits are closer
#       than 2 * TOL cannot be decided against the reference, and ends the check of that case.
#
# TOL: tests/model/test_model_ref.c holds every row of the C logits within 4 times that row's
# float32 rounding error as glm_ref.py measures it, about 1e-6 of the row's largest |logit| in
# all (README, "Test models and the reference"). log_softmax moves by at most twice the largest
# error of its row (the token's own logit and the log-sum-exp, each by at most that much), so for
# rows whose largest |logit| is at most MAX_LOGIT = 50 (checked below) the reported logprob is
# within 2 * 1e-6 * 50 = 1e-4 of the reference: TOL = 1e-4.
#
# Usage: /usr/bin/python3 tests/serve/logits_ref.py MODEL_DIR CASES.json

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from glm_ref import GlmRef  # noqa: E402

TOL = 1e-4
MAX_LOGIT = 50.0


def log_softmax(x):
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def main(argv):
    model_dir, cases_path = argv[1], argv[2]
    with open(cases_path) as f:
        cases = json.load(f)
    m = GlmRef(model_dir)
    failed = checked = 0
    worst = 0.0
    for ci, c in enumerate(cases):
        prompt, toks = c["prompt"], c["tokens"]
        seq = prompt + toks
        _, logits = m.forward(seq[:-1] if toks else prompt)
        P = len(prompt)
        what = "case %d (%s, %s)" % (ci, c["kind"], c.get("name", ""))
        for i, t in enumerate(toks):
            row = logits[P - 1 + i]
            if np.abs(row).max() > MAX_LOGIT:
                print("FAIL: %s token %d: |logit| %.1f is beyond the bound's %.0f"
                      % (what, i, np.abs(row).max(), MAX_LOGIT))
                failed += 1
                break
            if c["kind"] == "logprobs":
                ls = log_softmax(row)
                d = abs(ls[t] - c["logprobs"][i])
                worst = max(worst, d)
                checked += 1
                if d > TOL:
                    print("FAIL: %s token %d (id %d): logprob %.7f, reference %.7f"
                          % (what, i, t, c["logprobs"][i], ls[t]))
                    failed += 1
                top = c["top"][i]
                k = c.get("k", len(top))
                ref = np.sort(ls)[::-1][:k]
                if len(top) < k:
                    # The legacy form is a dict by token text: alternatives whose texts coincide
                    # are one entry. Each entry must still be one of the reference's best k.
                    ref = [min(ref, key=lambda v: abs(v - g)) for g in top]
                for r, (got, want) in enumerate(zip(top, ref)):
                    d = abs(got - want)
                    worst = max(worst, d)
                    checked += 1
                    if d > TOL:
                        print("FAIL: %s token %d: alternative %d logprob %.7f, reference %.7f"
                              % (what, i, r, got, want))
                        failed += 1
            else:
                x = row.copy()
                for k, v in c.get("bias", {}).items():
                    x[int(k)] += v
                rp = c.get("repetition", 1.0)
                if rp != 1.0:
                    for u in set(prompt + toks[:i]):
                        x[u] = x[u] / rp if x[u] > 0 else x[u] * rp
                counts = {}
                for u in toks[:i]:
                    counts[u] = counts.get(u, 0) + 1
                for u, n in counts.items():
                    x[u] -= c.get("frequency", 0.0) * n + c.get("presence", 0.0)
                order = np.argsort(-x, kind="stable")
                if x[order[0]] - x[order[1]] < 2 * TOL:
                    print("note: %s token %d: a near tie (%.2g); the rest is not checked"
                          % (what, i, x[order[0]] - x[order[1]]))
                    break
                checked += 1
                if order[0] != t:
                    print("FAIL: %s token %d: the server picked %d, the reference %d"
                          % (what, i, t, order[0]))
                    failed += 1
                    break
    print("logits_ref: %d checks over %d cases, %d failed; largest logprob difference %.2e"
          % (checked, len(cases), failed, worst))
    return 1 if failed or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
