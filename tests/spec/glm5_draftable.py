# SPDX-License-Identifier: MIT
# A GLM-5 (glm_moe_dsa) checkpoint whose MTP layer drafts well, derived from a random one, for
# the speculative tests: the recipe of spec_ref.py --make-draftable (o_proj and every down_proj
# scaled by MIX, eh_proj = [I | 0] + MIX * eh_proj, enorm = 1, shared_head.norm = model.norm),
# so target and drafter both stay close to the same bigram rule and the drafts are accepted part
# of the time. Written as F32. Run with /usr/bin/python3.
# usage: glm5_draftable.py SRC DST [MIX]
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from glm_ref import load_weights, write_safetensors  # noqa: E402

src, dst = sys.argv[1], sys.argv[2]
mix = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
cfg = json.load(open(os.path.join(src, "config.json")))
W = {k: np.asarray(v, dtype=np.float64) for k, v in load_weights(src).items()}
H, N = cfg["hidden_size"], cfg["num_hidden_layers"]
for name in list(W):
    if name.endswith("self_attn.o_proj.weight") or name.endswith("down_proj.weight"):
        W[name] = W[name] * mix
p = "model.layers.%d." % N
W[p + "eh_proj.weight"] = np.concatenate([np.eye(H), np.zeros((H, H))], axis=1) + mix * W[p + "eh_proj.weight"]
W[p + "enorm.weight"] = np.ones(H)
W[p + "shared_head.norm.weight"] = W["model.norm.weight"].copy()
os.makedirs(dst, exist_ok=True)
cfg["torch_dtype"] = cfg["dtype"] = "float32"
with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
for extra in ("generation_config.json",):
    if os.path.exists(os.path.join(src, extra)):
        with open(os.path.join(src, extra)) as f, open(os.path.join(dst, extra), "w") as g:
            g.write(f.read())
write_safetensors(os.path.join(dst, "model.safetensors"), [(k, W[k]) for k in sorted(W)],
                  {"format": "pt", "derived_from": os.path.abspath(src), "draftable_mix": mix})
print("wrote %s (mix %g)" % (dst, mix))
