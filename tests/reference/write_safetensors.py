#!/usr/bin/python3
"""Writes a safetensors file the way Python tooling does, without dhp: for every tensor of a
parameter table (JSON: [{"name", "shape"}]), values i * 0.001 - 1 (i = flat index) in F32,
except every third tensor in F16 and every third + 1 in BF16, to exercise conversions.
Usage: write_safetensors.py TABLE.json OUT.safetensors
"""
import json
import struct
import sys

import numpy as np


def to_bf16_bytes(x):
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    return rounded.astype(np.uint16).tobytes()


def main(table_path, out_path):
    table = json.load(open(table_path))
    header, blobs, offset = {}, [], 0
    for k, t in enumerate(table):
        n = int(np.prod(t["shape"]))
        values = (np.arange(n, dtype=np.float64) * 0.001 - 1.0).astype(np.float32)
        if k % 3 == 0:
            dtype, raw = "F16", values.astype(np.float16).tobytes()
        elif k % 3 == 1:
            dtype, raw = "BF16", to_bf16_bytes(values)
        else:
            dtype, raw = "F32", values.tobytes()
        header[t["name"]] = {"dtype": dtype, "shape": t["shape"], "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    with open(out_path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
