#!/usr/bin/python3
"""An independent PyTorch implementation of model-spec.md, written from the spec alone.

Reads a dump written by tests/test_reference.cpp (the model config, the parameter arena with its
table, one packed batch), computes the loss and every parameter gradient with autograd, and
writes them back for the C++ test to compare: loss.json and grads.bin (the arena's layout).
Usage: model_ref.py DUMP_DIR
"""
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F


def rms_norm(x, w, eps=1e-6):
    """eps: the decoder's rms_norm_eps (dhp's addition; model-spec.md's 1e-6 by default)."""
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def proj(x, P, name):
    """x·Wᵀ, plus the bias when the table has one (the decoder's q/k/v with attention_bias)."""
    y = x @ P[name + ".weight"].T
    return y + P[name + ".bias"] if name + ".bias" in P else y


def rope(x, pos, theta):
    """Half-split rotary embedding of x (T, H, n) by integer positions pos (T)."""
    n = x.shape[-1]
    half = n // 2
    i = torch.arange(half, dtype=torch.float64)
    angle = pos.double()[:, None] * theta ** (-2.0 * i / n)  # (T, half)
    c = torch.cos(angle).float()[:, None, :]
    s = torch.sin(angle).float()[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def attention(x, P, pre, heads, kv_heads, hd, mask, rope_fn):
    T = x.shape[0]
    q = rope_fn(proj(x, P, pre + "attn.wq").view(T, heads, hd))
    k = rope_fn(proj(x, P, pre + "attn.wk").view(T, kv_heads, hd))
    v = proj(x, P, pre + "attn.wv").view(T, kv_heads, hd)
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
    scores = scores.masked_fill(~mask[None], float("-inf"))
    out = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), v)
    return out.reshape(T, heads * hd) @ P[pre + "attn.wo.weight"].T


def block(x, P, pre, heads, kv_heads, hd, mask, rope_fn, eps=1e-6):
    h = x + attention(rms_norm(x, P[pre + "attn_norm.weight"], eps), P, pre, heads, kv_heads, hd, mask, rope_fn)
    y = rms_norm(h, P[pre + "mlp_norm.weight"], eps)
    gate = F.silu(y @ P[pre + "mlp.w1.weight"].T) * (y @ P[pre + "mlp.w3.weight"].T)
    return h + gate @ P[pre + "mlp.w2.weight"].T


def image_tokens(pixels, gh, gw, P, cfg):
    """One image's decoder tokens from its (gh*gw, p*p*3) patches."""
    v = cfg["vision"]
    dv, heads, m = v["dim"], v["heads"], v["merge"]
    hd = dv // heads
    x = pixels @ P["vision.patch_embed.weight"].T + P["vision.patch_embed.bias"]
    rows = torch.arange(gh).repeat_interleave(gw)
    cols = torch.arange(gw).repeat(gh)
    h2 = hd // 2

    def rope2d(t):
        return torch.cat([rope(t[..., :h2], rows, cfg["rope_theta"]),
                          rope(t[..., h2:], cols, cfg["rope_theta"])], dim=-1)

    full = torch.ones(gh * gw, gh * gw, dtype=torch.bool)  # bidirectional inside the image
    for i in range(v["layers"]):
        x = block(x, P, f"vision.layers.{i}.", heads, heads, hd, full, rope2d)
    x = rms_norm(x, P["vision.norm.weight"])
    # m x m merge: blocks in order (r,c),(r,c+1),(r+1,c),(r+1,c+1), row-major over the merged grid.
    x = x.view(gh // m, m, gw // m, m, dv).permute(0, 2, 1, 3, 4).reshape(-1, m * m * dv)
    x = F.gelu(x @ P["projector.fc1.weight"].T + P["projector.fc1.bias"], approximate="tanh")
    return x @ P["projector.fc2.weight"].T + P["projector.fc2.bias"]


def main(d):
    cfg = json.load(open(f"{d}/config.json"))
    table = json.load(open(f"{d}/params.json"))
    arena = np.fromfile(f"{d}/params.bin", dtype=np.float32)
    P = {}
    for s in table:
        n = int(np.prod(s["shape"]))
        P[s["name"]] = torch.tensor(arena[s["offset"]:s["offset"] + n].reshape(s["shape"]), requires_grad=True)
    b = json.load(open(f"{d}/batch.json"))
    v = cfg["vision"]
    patches = torch.tensor(np.fromfile(f"{d}/patches.bin", dtype=np.float32).reshape(-1, v["patch"] ** 2 * 3))

    img = [image_tokens(patches[im["patch_offset"]:im["patch_offset"] + im["grid_h"] * im["grid_w"]],
                        im["grid_h"], im["grid_w"], P, cfg) for im in b["images"]]
    img = torch.cat(img) if img else torch.zeros(0, cfg["dim"])

    tokens = torch.tensor(b["tokens"])
    slot = torch.tensor(b["image_slot"])
    doc = torch.tensor(b["doc"])
    pos = torch.tensor(b["pos"])
    targets = torch.tensor(b["targets"])
    T = len(b["tokens"])
    rows = [img[slot[t]] if slot[t] >= 0 else P["tok_embed.weight"][tokens[t]] for t in range(T)]
    x = torch.stack(rows)
    idx = torch.arange(T)
    mask = (doc[:, None] == doc[None, :]) & (idx[None, :] <= idx[:, None])
    hd = cfg["head_dim"] or cfg["dim"] // cfg["heads"]
    eps = cfg.get("rms_norm_eps", 1e-6)
    for i in range(cfg["layers"]):
        x = block(x, P, f"layers.{i}.", cfg["heads"], cfg["kv_heads"], hd, mask,
                  lambda t: rope(t, pos, cfg["rope_theta"]), eps)
    x = rms_norm(x, P["final_norm.weight"], eps)
    head = P["tok_embed.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    logits = x @ head.T
    keep = targets >= 0
    loss = F.cross_entropy(logits[keep], targets[keep], reduction="sum") / keep.sum()
    loss.backward()

    grads = np.zeros_like(arena)
    for s in table:
        g = P[s["name"]].grad
        if g is not None:
            grads[s["offset"]:s["offset"] + g.numel()] = g.numpy().reshape(-1)
    grads.tofile(f"{d}/grads.bin")
    json.dump({"loss": loss.item()}, open(f"{d}/loss.json", "w"))


if __name__ == "__main__":
    main(sys.argv[1])
