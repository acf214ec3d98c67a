# SPDX-License-Identifier: MIT
# Prints the `tokens` tensor of a glm_ref.py output file as two comma-separated lines: the first
# N ids (the prompt) and the rest (the greedy continuation). Run with /usr/bin/python3.
import json
import struct
import sys

path, n = sys.argv[1], int(sys.argv[2])
blob = open(path, "rb").read()
hlen = struct.unpack("<Q", blob[:8])[0]
meta = json.loads(blob[8:8 + hlen])["tokens"]
begin, end = meta["data_offsets"]
ids = struct.unpack("<%di" % ((end - begin) // 4), blob[8 + hlen + begin:8 + hlen + end])
print(",".join(map(str, ids[:n])))
print(",".join(map(str, ids[n:])))
