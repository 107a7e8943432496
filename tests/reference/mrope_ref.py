#!/usr/bin/python3
"""PyTorch's side of the M-RoPE check (tests/test_kernels.cpp, MRope.*).

Rotates q as Hugging Face's Qwen-VL text models do, written from their public definitions:
Qwen3-VL's Qwen3VLTextRotaryEmbedding (inv_freq = 1 / theta^(arange(0, hd, 2) / hd), the
frequencies of the three position rows (temporal, height, width) laid out by
apply_interleaved_mrope: slots 1, 4, 7, ... below 3·section[1] from the height row, slots 2, 5,
8, ... below 3·section[2] from the width row, the rest from the temporal row), and Qwen2-VL's
apply_multimodal_rotary_pos_emb (cos and sin of cat(freqs, freqs) split into section * 2
chunks, chunk i taken from row i % 3: the blocked layout); then apply_rotary_pos_emb with
rotate_half. Everything in float64.

Usage: mrope_ref.py DIR. DIR/case.json: {"T", "H", "hd", "theta", "section": [t, h, w]};
DIR/x.bin float32 (T, H, hd), DIR/pos.bin int32 (T, 3). Writes float32 (T, H, hd) files:
interleaved.bin, blocked.bin, plain.bin (1-D RoPE by the temporal row alone), and vision.bin:
the Qwen-VL vision towers' 2-D RoPE by the height and width rows as (patch row, patch column),
Qwen3VLVisionRotaryEmbedding(head_dim // 2) and rot_pos_emb (row·inv_freq and col·inv_freq
concatenated over head_dim / 2, then cat(emb, emb)) with apply_rotary_pos_emb_vision.
"""
import json
import os
import sys

import numpy as np
import torch


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def freqs_of(pos, hd, theta):
    """(3, T, hd/2): each position row times inv_freq."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    return pos.to(torch.float64)[:, :, None] * inv_freq[None, None, :]


def interleaved(freqs, section):
    f = freqs[0].clone()
    for dim, offset in ((1, 1), (2, 2)):
        length = section[dim] * 3
        idx = slice(offset, length, 3)
        f[..., idx] = freqs[dim, ..., idx]
    emb = torch.cat((f, f), dim=-1)
    return emb.cos(), emb.sin()


def blocked(freqs, section):
    emb = torch.cat((freqs, freqs), dim=-1)  # (3, T, hd)
    cos, sin = emb.cos(), emb.sin()
    split = list(section) * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(split, dim=-1))], dim=-1)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(split, dim=-1))], dim=-1)
    return cos, sin


def vision(pos, hd, theta):
    dim = hd // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rows = pos[1].to(torch.float64)[:, None] * inv_freq[None, :]
    cols = pos[2].to(torch.float64)[:, None] * inv_freq[None, :]
    rotary = torch.cat((rows, cols), dim=-1)
    emb = torch.cat((rotary, rotary), dim=-1)
    return emb.cos(), emb.sin()


def plain(freqs):
    emb = torch.cat((freqs[0], freqs[0]), dim=-1)
    return emb.cos(), emb.sin()


def rotate(x, cos, sin):
    # x (T, H, hd); cos, sin (T, hd), broadcast over heads.
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def main():
    d = sys.argv[1]
    c = json.load(open(os.path.join(d, "case.json")))
    T, H, hd = c["T"], c["H"], c["hd"]
    x = torch.from_numpy(np.fromfile(os.path.join(d, "x.bin"), dtype=np.float32).reshape(T, H, hd)).double()
    pos = torch.from_numpy(np.fromfile(os.path.join(d, "pos.bin"), dtype=np.int32).reshape(T, 3)).T
    freqs = freqs_of(pos, hd, c["theta"])
    for name, (cos, sin) in (("interleaved", interleaved(freqs, c["section"])),
                             ("blocked", blocked(freqs, c["section"])), ("plain", plain(freqs)),
                             ("vision", vision(pos, hd, c["theta"]))):
        rotate(x, cos, sin).numpy().astype(np.float32).tofile(os.path.join(d, name + ".bin"))


if __name__ == "__main__":
    main()
