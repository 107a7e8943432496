#!/usr/bin/python3
"""Checks of hf_llava_ref.py's building blocks against what can be worked out by hand, so the
reference that tests/test_hf_llava.cpp trusts is itself tested:
  1. position resizing to the pretrained grid is the identity, and F.interpolate's bicubic
     (align_corners=False) equals the separable cubic convolution written out from its
     definition (A = -0.75, src = (dst + 0.5)·in/out - 0.5, taps clamped to the edge);
  2. the conv patch embedding equals a matrix product with each patch's pixels in (ky, kx, c)
     order and the kernel permuted the same way (dhp's layout), so the reference does not lean
     on dhp's convention;
  3. quick_gelu and gelu_pytorch_tanh are the formulas CLIP and SigLIP name;
  4. end to end on a fixture: an image at the pretrained size gives the same features whether
     or not the resize path runs, and the reference's outputs are finite with the expected
     gradients present (the tower's unused last layer and post_layernorm get none).
Usage: check_hf_llava_ref.py   (exit status 0 when every check holds)
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_llava_ref as ref  # noqa: E402
from hf_llama_ref import read_safetensors  # noqa: E402


def cubic(x, A=-0.75):
    x = abs(x)
    if x <= 1:
        return ((A + 2) * x - (A + 3)) * x * x + 1
    if x < 2:
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
    return 0.0


def resize_1d(v, out):
    """v: list (in), bicubic resize to `out` by the definition."""
    n = len(v)
    res = []
    for d in range(out):
        src = (d + 0.5) * n / out - 0.5
        f = math.floor(src)
        t = src - f
        acc = 0.0
        for k in range(-1, 3):
            idx = min(max(f + k, 0), n - 1)
            acc += v[idx] * cubic(k - t)
        res.append(acc)
    return res


def check_bicubic():
    torch.manual_seed(0)
    g = torch.randn(1, 3, 4, 4, dtype=torch.float64)
    same = F.interpolate(g, size=(4, 4), mode="bicubic", align_corners=False)
    assert torch.equal(same, g), "bicubic to the same size is not the identity"
    for oh, ow in [(3, 5), (6, 4), (7, 2), (1, 9)]:
        got = F.interpolate(g, size=(oh, ow), mode="bicubic", align_corners=False)
        for c in range(3):
            rows = [resize_1d(g[0, c, :, x].tolist(), oh) for x in range(4)]  # columns resized
            want = torch.tensor([resize_1d([rows[x][y] for x in range(4)], ow) for y in range(oh)], dtype=torch.float64)
            err = (got[0, c] - want).abs().max().item()
            assert err < 1e-12, f"bicubic {oh}x{ow} differs from the definition by {err}"
        bil = F.interpolate(g, size=(oh, ow), mode="bilinear", align_corners=False)
        assert (bil - got).abs().max().item() > 1e-3, "bilinear is indistinguishable from bicubic here"
    print("bicubic: identity at the pretrained grid; equals the cubic convolution (A=-0.75) by hand")


def check_conv_patches():
    torch.manual_seed(1)
    p, H, W, dv = 4, 12, 20, 5
    img = torch.randn(1, 3, H, W, dtype=torch.float64)
    w = torch.randn(dv, 3, p, p, dtype=torch.float64)
    b = torch.randn(dv, dtype=torch.float64)
    conv = F.conv2d(img, w, b, stride=p).flatten(2).transpose(1, 2)[0]  # (gh*gw, dv)
    rows = []
    for r in range(H // p):
        for c in range(W // p):
            rows.append(torch.stack([img[0, ch, r * p + ky, c * p + kx]
                                     for ky in range(p) for kx in range(p) for ch in range(3)]))
    patches = torch.stack(rows)  # (gh*gw, p*p*3), (ky, kx, c)
    k = w.permute(0, 2, 3, 1).reshape(dv, p * p * 3)
    err = (patches @ k.T + b - conv).abs().max().item()
    assert err < 1e-12, f"conv patch embedding != (ky, kx, c) matmul: {err}"
    print("conv patch embedding: equals the (ky, kx, c) patch-row product with the permuted kernel")


def check_acts():
    x = torch.linspace(-4, 4, 81, dtype=torch.float64)
    q = ref.ACT["quick_gelu"](x)
    assert torch.allclose(q, x / (1 + torch.exp(-1.702 * x))), "quick_gelu"
    t = ref.ACT["gelu_pytorch_tanh"](x)
    want = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    assert torch.allclose(t, want), "gelu_pytorch_tanh"
    e = ref.ACT["gelu"](x)
    assert torch.allclose(e, 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))), "gelu"
    print("activations: quick_gelu, gelu (erf), gelu_pytorch_tanh as defined")


def check_end_to_end():
    with tempfile.TemporaryDirectory() as d:
        ck = os.path.join(d, "llava")
        subprocess.run([sys.executable, os.path.join(HERE, "make_hf_llava_fixture.py"), ck, "llava_hf"], check=True)

        class Flags:
            bilinear = gelu = last_layer = keep_cls = False
            mean_shift = 0.0
        P = ref.Llava(ck, None)
        pixels = bytes((7 * i) % 256 for i in range(16 * 16 * 3))
        f = ref.encode_image(P, pixels, 16, 16, Flags)
        # The same image with the resize forced through F.interpolate at the same size.
        grid = P.v("embeddings.position_embedding.weight")[1:]
        forced = F.interpolate(grid.reshape(1, 4, 4, -1).permute(0, 3, 1, 2), size=(4, 4), mode="bicubic",
                               align_corners=False).permute(0, 2, 3, 1).reshape(16, -1)
        assert torch.equal(forced, grid), "the resize path at the pretrained grid changes the table"
        assert f.shape == (16, 32), f.shape  # 4x4 patches, class row dropped
        inp = {"tokens": [1, 5] + [0] * 15 + [9, 2], "image_slot": [-1, -1] + list(range(15)) + [-1, -1],
               "targets": [-1] * 17 + [2, -1], "images": [{"height": 12, "width": 20, "pixels": "im.rgb"}]}
        with open(os.path.join(d, "im.rgb"), "wb") as fh:
            fh.write(bytes((3 * i) % 251 for i in range(12 * 20 * 3)))
        with open(os.path.join(d, "in.json"), "w") as fh:
            json.dump(inp, fh)
        out = os.path.join(d, "out")
        subprocess.run([sys.executable, os.path.join(HERE, "hf_llava_ref.py"), ck, os.path.join(d, "in.json"), out],
                       check=True)
        loss = json.load(open(os.path.join(out, "loss.json")))["loss"]
        assert math.isfinite(loss), loss
        grads = read_safetensors(os.path.join(out, "grads.safetensors"))
        v = "vision_tower.vision_model."
        assert v + "encoder.layers.1.mlp.fc2.weight" in grads, "the feature layer's block has no gradient"
        assert v + "encoder.layers.2.mlp.fc2.weight" not in grads, "the layer after hidden_states[-2] has a gradient"
        assert v + "post_layernorm.weight" not in grads, "post_layernorm has a gradient"
        assert grads[v + "embeddings.position_embedding.weight"].abs().sum() > 0
        assert grads["multi_modal_projector.linear_1.weight"].abs().sum() > 0
    print("end to end: identity at the pretrained size, 15 feature rows for a 3x5 grid, gradients where HF has them")


if __name__ == "__main__":
    torch.set_default_dtype(torch.float32)
    check_bicubic()
    check_conv_patches()
    check_acts()
    check_end_to_end()
    print("hf_llava_ref.py: every check holds")
