#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Converts a lockstep checkpoint (Glm4MoeForCausalLM, Hugging Face layout, BF16) to GGUF with
# llama.cpp's own converter (convert_hf_to_gguf.py from a llama.cpp source tree), so that the peer
# runs the same weights (tools/peer/llama_bench.sh). Debian's /usr/bin/python3 with python3-numpy
# and python3-torch; no transformers or tokenizer: the generated checkpoints have none, and a
# benchmark needs token ids only. Two things are supplied here instead:
#   - a `transformers` module whose AutoConfig fails, so that the converter reads config.json
#     itself (its own fallback), and a silent `tqdm`;
#   - the vocabulary: vocab_size tokens as a sentencepiece ("llama") vocabulary, 256 byte tokens
#     then t256, t257, ..., every score 0 (llama-bench draws random ids; nothing is tokenized).
#
#   /usr/bin/python3 tools/peer/to_gguf.py LLAMA_CPP_DIR MODEL_DIR OUT.gguf
import sys
import types
from pathlib import Path

if len(sys.argv) != 4:
    sys.exit("usage: to_gguf.py LLAMA_CPP_DIR MODEL_DIR OUT.gguf")
src, model, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
sys.path[:0] = [str(src), str(src / "gguf-py")]


class _NoAutoConfig:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise RuntimeError("transformers is not installed: reading config.json")


shim = types.ModuleType("transformers")
shim.AutoConfig = _NoAutoConfig
sys.modules["transformers"] = shim


class _Bar:  # the writer's progress bar (tqdm), silent
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


sys.modules.setdefault("tqdm", types.ModuleType("tqdm")).tqdm = _Bar

import torch  # noqa: E402

# Debian 12's torch (1.13) predates the float8 dtypes, which the converter names in a table;
# BF16 checkpoints never use them.
for name in ("float8_e4m3fn", "float8_e5m2"):
    if not hasattr(torch, name):
        setattr(torch, name, torch.uint8)

import convert_hf_to_gguf  # noqa: E402
from conversion import glm  # noqa: E402


def set_vocab(self):
    n = self.hparams["vocab_size"]
    w = self.gguf_writer
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([f"<0x{i:02X}>" for i in range(256)] + [f"t{i}" for i in range(256, n)])
    w.add_token_scores([0.0] * n)
    w.add_token_types([6] * 256 + [1] * (n - 256))  # 6: byte, 1: normal
    w.add_add_bos_token(False)


glm.Glm4MoeModel.set_vocab = set_vocab
sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", out, "--outtype", "bf16", "--no-mtp"]
convert_hf_to_gguf.main()
