# SPDX-License-Identifier: MIT
#
# bpe.py -- a byte-level BPE tokenizer trainer that writes a standard Hugging Face
# tokenizer.json (MODEL.md section 5): GPT-2 byte-to-unicode mapping, the GLM-4 /
# cl100k pre-tokenizer split pattern, model type BPE with vocab and merges, GLM's
# special tokens as added tokens after the BPE vocabulary.
#
# Training: the text is split by the pattern into words; words are counted; the
# most frequent adjacent pair is merged repeatedly (ties: the lexicographically
# smallest pair, so the result is deterministic), with incremental pair counts.
# Encoding applies the merges by rank, as Hugging Face's BPE model does.

import heapq
import json

import regex

# MODEL.md section 5, verbatim.
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# GLM-4.5 / 4.6 special tokens, in GLM's id order (<|endoftext|> first).
SPECIAL_TOKENS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
    "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>",
    "<|end_of_transcription|>", "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>",
    "/nothink", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>",
    "<arg_value>", "</arg_value>",
]


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


BYTE_MAP = bytes_to_unicode()
_split = regex.compile(SPLIT_PATTERN)


def pretokenize(text):
    """Words of `text` as byte-level unicode strings."""
    return ["".join(BYTE_MAP[b] for b in w.encode("utf-8")) for w in _split.findall(text)]


def train(texts, vocab_size, log=print):
    """Train merges so that len(base) + len(merges) + len(SPECIAL_TOKENS) == vocab_size.
    Returns (vocab {token: id}, merges [(a, b)])."""
    n_merges = vocab_size - 256 - len(SPECIAL_TOKENS)
    counts = {}
    for t in texts:
        for w in pretokenize(t):
            counts[w] = counts.get(w, 0) + 1
    words = sorted(counts)                       # deterministic order
    freq = [counts[w] for w in words]
    syms = [list(w) for w in words]
    log("bpe: %d distinct words, %d merges to learn" % (len(words), n_merges))

    pair_count = {}
    pair_words = {}
    for i, s in enumerate(syms):
        f = freq[i]
        for a, b in zip(s, s[1:]):
            p = (a, b)
            pair_count[p] = pair_count.get(p, 0) + f
            pair_words.setdefault(p, set()).add(i)

    alphabet = [BYTE_MAP[b] for b in range(256)]
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = []
    # Max-heap of (-count, pair) with lazy invalidation: an entry is current
    # when its count equals pair_count[pair].  Ties pop the smallest pair.
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    while len(merges) < n_merges and heap:
        negc, best = heapq.heappop(heap)
        if pair_count.get(best, 0) != -negc or negc >= 0:
            continue
        a, b = best
        ab = a + b
        merges.append(best)
        vocab[ab] = len(vocab)
        touched = set()
        for i in sorted(pair_words.pop(best, ())):
            s = syms[i]
            f = freq[i]
            for p in zip(s, s[1:]):
                pair_count[p] -= f
                touched.add(p)
            out = []
            j = 0
            while j < len(s):
                if j + 1 < len(s) and s[j] == a and s[j + 1] == b:
                    out.append(ab)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            syms[i] = out
            for p in zip(out, out[1:]):
                pair_count[p] = pair_count.get(p, 0) + f
                pair_words.setdefault(p, set()).add(i)
                touched.add(p)
        pair_count.pop(best, None)
        touched.discard(best)
        for p in touched:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p))
        if len(merges) % 500 == 0:
            log("bpe: %d merges, last %r" % (len(merges), ab))
    return vocab, merges


class Encoder:
    """Encode text with trained merges (Hugging Face BPE semantics: merges by rank)."""

    def __init__(self, vocab, merges):
        self.vocab = vocab
        self.ranks = {tuple(m): r for r, m in enumerate(merges)}
        self.cache = {}
        self.inv = {i: t for t, i in vocab.items()}
        self.byte_dec = {c: b for b, c in BYTE_MAP.items()}

    def _word(self, w):
        ids = self.cache.get(w)
        if ids is not None:
            return ids
        s = list(w)
        while len(s) > 1:
            best, br = None, None
            for k in range(len(s) - 1):
                r = self.ranks.get((s[k], s[k + 1]))
                if r is not None and (br is None or r < br):
                    best, br = k, r
            if best is None:
                break
            a, b = s[best], s[best + 1]
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and s[j] == a and s[j + 1] == b:
                    out.append(a + b)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            s = out
        ids = [self.vocab[t] for t in s]
        self.cache[w] = ids
        return ids

    def encode(self, text):
        out = []
        for w in pretokenize(text):
            out.extend(self._word(w))
        return out

    def decode(self, ids, specials=None):
        parts = []
        buf = []
        for i in ids:
            if i in self.inv:
                buf.extend(self.byte_dec[c] for c in self.inv[i])
            else:
                parts.append(bytes(buf).decode("utf-8", "replace"))
                buf = []
                parts.append(specials.get(i, "<%d>" % i) if specials else "<%d>" % i)
        parts.append(bytes(buf).decode("utf-8", "replace"))
        return "".join(parts)


def tokenizer_json(vocab, merges):
    """The Hugging Face tokenizer.json document (tokenizers 'version 1.0' format)."""
    n = len(vocab)
    added = [{"id": n + k, "content": t, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for k, t in enumerate(SPECIAL_TOKENS)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": SPLIT_PATTERN},
                 "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                 "use_regex": False},
            ],
        },
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab,
            "merges": ["%s %s" % (a, b) for a, b in merges],
        },
    }


def write_tokenizer(path, vocab, merges):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(vocab, merges), f, ensure_ascii=False, indent=1)
        f.write("\n")


def special_ids(vocab):
    n = len(vocab)
    return {t: n + k for k, t in enumerate(SPECIAL_TOKENS)}
