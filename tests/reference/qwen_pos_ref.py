#!/usr/bin/python3
"""Qwen3-VL's position embeddings on images of several grids (tests/test_kernels.cpp,
VisionEmbed.MatchesQwen3VlBilinearAndItsGradient), written from the public definition of
transformers' Qwen3VLVisionModel.fast_pos_embed_interpolate: per image of h x w patches,
h_idxs = linspace(0, N-1, h) (and w_idxs), floor and ceil (clipped to N-1) corners, weights
(1-dh)(1-dw), (1-dh)dw, dh(1-dw), dh·dw over the N x N table nn.Embedding, summed. Rows are
left in row-major patch order (transformers then reorders them into merge blocks; dhp keeps
row-major patches). Run in float64 from the float32 inputs, and differentiated by autograd.

Usage: qwen_pos_ref.py DIR. DIR/case.json: {"N": N, "C": C, "grids": [[h, w], ...]}; float32
table.bin (N*N, C) and dy.bin (sum of h*w, C). Writes float32 out.bin (sum of h*w, C) and
dtable.bin (N*N, C): the gradient of sum(out * dy).
"""
import json
import os
import sys

import numpy as np
import torch


def interpolate(table, N, grids):
    outs = []
    for h, w in grids:
        h_idxs = torch.linspace(0, N - 1, h, dtype=torch.float64)
        w_idxs = torch.linspace(0, N - 1, w, dtype=torch.float64)
        h_floor, w_floor = h_idxs.int(), w_idxs.int()
        h_ceil = (h_idxs.int() + 1).clip(max=N - 1)
        w_ceil = (w_idxs.int() + 1).clip(max=N - 1)
        dh, dw = h_idxs - h_floor, w_idxs - w_floor
        base_h, base_h_ceil = h_floor * N, h_ceil * N
        indices = [
            (base_h[None].T + w_floor[None]).flatten(),
            (base_h[None].T + w_ceil[None]).flatten(),
            (base_h_ceil[None].T + w_floor[None]).flatten(),
            (base_h_ceil[None].T + w_ceil[None]).flatten(),
        ]
        weights = [
            ((1 - dh)[None].T * (1 - dw)[None]).flatten(),
            ((1 - dh)[None].T * dw[None]).flatten(),
            (dh[None].T * (1 - dw)[None]).flatten(),
            (dh[None].T * dw[None]).flatten(),
        ]
        emb = sum(table[indices[i].long()] * weights[i][:, None] for i in range(4))
        outs.append(emb)
    return torch.cat(outs)


def main():
    d = sys.argv[1]
    c = json.load(open(os.path.join(d, "case.json")))
    N, C, grids = c["N"], c["C"], c["grids"]
    rows = sum(h * w for h, w in grids)
    table = torch.from_numpy(np.fromfile(os.path.join(d, "table.bin"), dtype=np.float32).reshape(N * N, C)).double()
    dy = torch.from_numpy(np.fromfile(os.path.join(d, "dy.bin"), dtype=np.float32).reshape(rows, C)).double()
    table.requires_grad_(True)
    out = interpolate(table, N, grids)
    (out * dy).sum().backward()
    out.detach().numpy().astype(np.float32).tofile(os.path.join(d, "out.bin"))
    table.grad.numpy().astype(np.float32).tofile(os.path.join(d, "dtable.bin"))


if __name__ == "__main__":
    main()
