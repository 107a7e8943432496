#!/usr/bin/python3
"""PyTorch's side of the vision-embedding check (tests/test_kernels.cpp, VisionEmbed.*PyTorch*).

Builds an encoder stream the way Hugging Face's CLIP / SigLIP embeddings with
interpolate_pos_encoding=True do, with torch.nn.functional.interpolate(mode="bicubic",
align_corners=False, size=...) on float32 tables, and differentiates it with autograd.

PyTorch's float32 kernel takes in / out in float and evaluates its weights and sums in float,
so it lies ~1e-6 from the exact resize of its inputs; F.interpolate on the same values in
float64 is that exact resize (to ~1e-16), which dhp's op, computing in double and rounding
once, must match to fp32 rounding. Both are written, and the stream resized with
mode="bilinear", the negative control the C++ test requires to differ.

Usage: bicubic_ref.py DIR. DIR/cases.json: {"C": C, "groups": [{"g0h", "g0w", "cls", "grids":
[[gh, gw], ...]}]}; per group i, float32 files table_i.bin ((cls + g0h*g0w, C)), cls_i.bin (C)
and dy_i.bin (stream rows, C). The stream's rows: per image its class row cls + table[0] (with
cls), then its patches' position embeddings, row-major. Writes, as float32 files of the stream:
exact_i.bin (F.interpolate in float64), torch_i.bin (F.interpolate in float32), bilinear_i.bin;
and the gradients of sum(stream * dy) by autograd: dtable_exact_i.bin and dcls_exact_i.bin
(float64), dtable_torch_i.bin (float32).
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def read(path, shape):
    return torch.from_numpy(np.fromfile(path, dtype=np.float32).reshape(shape))


def write(path, t):
    t.detach().numpy().astype(np.float32).tofile(path)


def resize(grid, gh, gw, mode):
    """grid (g0h, g0w, C) -> (gh * gw, C) through F.interpolate on (1, C, g0h, g0w)."""
    x = grid.permute(2, 0, 1).unsqueeze(0)
    r = F.interpolate(x, size=(gh, gw), mode=mode, align_corners=False)
    return r[0].permute(1, 2, 0).reshape(gh * gw, -1)


def stream(table, cls, g0h, g0w, has_cls, grids, resize_fn):
    off = 1 if has_cls else 0
    grid = table[off:].reshape(g0h, g0w, -1)
    rows = []
    for gh, gw in grids:
        if has_cls:
            rows.append((cls + table[0]).unsqueeze(0))
        rows.append(resize_fn(grid, gh, gw))
    return torch.cat(rows, 0)


def main(d):
    spec = json.load(open(os.path.join(d, "cases.json")))
    C = spec["C"]
    for i, g in enumerate(spec["groups"]):
        g0h, g0w, has_cls, grids = g["g0h"], g["g0w"], g["cls"], g["grids"]
        n_pos = (1 if has_cls else 0) + g0h * g0w
        rows = sum((1 if has_cls else 0) + gh * gw for gh, gw in grids)
        table32 = read(os.path.join(d, f"table_{i}.bin"), (n_pos, C))
        cls32 = read(os.path.join(d, f"cls_{i}.bin"), (C,))
        dy = read(os.path.join(d, f"dy_{i}.bin"), (rows, C))

        def exact(grid, gh, gw):
            return resize(grid, gh, gw, "bicubic")

        table = table32.double().requires_grad_(True)
        cls = cls32.double().requires_grad_(True)
        out = stream(table, cls, g0h, g0w, has_cls, grids, exact)
        (out * dy.double()).sum().backward()
        write(os.path.join(d, f"exact_{i}.bin"), out)
        write(os.path.join(d, f"dtable_exact_{i}.bin"), table.grad)
        write(os.path.join(d, f"dcls_exact_{i}.bin"),
              cls.grad if cls.grad is not None else torch.zeros(C))

        t32 = table32.clone().requires_grad_(True)
        out32 = stream(t32, cls32, g0h, g0w, has_cls, grids,
                       lambda grid, gh, gw: resize(grid, gh, gw, "bicubic"))
        (out32 * dy).sum().backward()
        write(os.path.join(d, f"torch_{i}.bin"), out32)
        write(os.path.join(d, f"dtable_torch_{i}.bin"), t32.grad)
        with torch.no_grad():
            write(os.path.join(d, f"bilinear_{i}.bin"),
                  stream(table32, cls32, g0h, g0w, has_cls, grids,
                         lambda grid, gh, gw: resize(grid, gh, gw, "bilinear")))


if __name__ == "__main__":
    main(sys.argv[1])
