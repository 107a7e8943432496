#!/usr/bin/python3
"""An independent implementation of LLaVA-1.5 with a CLIP or SigLIP tower, written from the
definitions in transformers' modeling_clip.py, modeling_siglip.py and modeling_llava.py (and
haotian-liu/LLaVA's llava_arch.py / clip_encoder.py for the original layout), not from dhp's
C++. The decoder is hf_llama_ref.py's. It reads a LLaVA folder of any naming generation with
its own safetensors reader, encodes the given images at their own resolution
(CLIPVisionModel / SiglipVisionModel with interpolate_pos_encoding=True: the conv patch
embedding on the image tensor, position embeddings resized by F.interpolate bicubic,
align_corners=False), takes hidden_states[vision_feature_layer], drops CLIP's class row
(select strategy "default" / "patch"), runs the projector (Linear, GELU, Linear), scatters the
image rows into the token embeddings in order and runs the decoder; it writes the logits, the
mean loss and the gradient of every tensor that receives one, under the folder's names.

Usage: hf_llava_ref.py CHECKPOINT_DIR INPUT.json OUT_DIR [--tower-dir DIR] [controls]
  INPUT.json {"tokens": [...], "targets": [...], "image_slot": [...],
              "images": [{"height": H, "width": W, "pixels": "FILE"}]}
    tokens: ids (ignored where image_slot >= 0); targets: next id or -1 (no loss);
    image_slot: -1 for text, else the row of the images' projected features (images in order,
    each gh·gw rows, CLIP's class row dropped); FILE (beside INPUT.json): H·W·3 RGB bytes.
  OUT_DIR/loss.json {"loss": L}, OUT_DIR/logits.bin (T, V) fp32,
  OUT_DIR/grads.safetensors (F32, the folder's tensor names).
  --tower-dir: the vision tower's folder (CLIPVisionModel, CLIPModel, SiglipVisionModel or
    SiglipModel) for the original layout, whose config names no tower shape; its tensors are
    read when the LLaVA folder holds none.
Negative controls (dhp must not match them): --bilinear (positions resized bilinearly),
--gelu (the tower's MLP with erf GELU instead of its hidden_act), --last-layer
(hidden_states[-1] instead of the configured layer), --keep-cls (CLIP's class row kept and
the last patch row dropped, so the image keeps its number of rows),
--mean-shift X (X added to every channel's normalisation mean).
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F

from hf_llama_ref import forward as llama_forward
from hf_llama_ref import read_checkpoint
from make_hf_fixture import write_safetensors

ACT = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
}


def load_json(path):
    with open(path) as f:
        return json.load(f)


class Llava:
    """The folder's tensors by role: decoder names as LlamaForCausalLM has them, the tower's
    under its vision_model prefix, the projector's two linears."""

    def __init__(self, d, tower_dir):
        self.state = {k: v for k, v in read_checkpoint(d).items() if v.is_floating_point()}
        c = load_json(os.path.join(d, "config.json"))
        s = self.state
        if "model.mm_projector.0.weight" in s:  # haotian-liu/LLaVA
            assert c.get("mm_projector_type", "linear") == "mlp2x_gelu", c.get("mm_projector_type")
            self.text_cfg = c
            self.dec = {k: k for k in s if k.startswith("model.") and not k.startswith(("model.mm_", "model.vision_tower."))}
            self.dec["lm_head.weight"] = "lm_head.weight"
            self.proj = ["model.mm_projector.0", "model.mm_projector.2"]
            self.vis_prefix = "model.vision_tower.vision_tower.vision_model."
            self.feature_layer = c.get("mm_vision_select_layer", -2)
            self.keep_cls = c.get("mm_vision_select_feature", "patch") == "cls_patch"
            self.proj_act = "gelu"
        else:
            new = "model.language_model.embed_tokens.weight" in s
            dec_pre = "model.language_model." if new else "language_model.model."
            head = "lm_head.weight" if new else "language_model.lm_head.weight"
            self.text_cfg = c["text_config"]
            self.dec = {"model." + k[len(dec_pre):]: k for k in s if k.startswith(dec_pre)}
            if head in s:
                self.dec["lm_head.weight"] = head
            pre = "model." if new else ""
            self.proj = [pre + "multi_modal_projector.linear_1", pre + "multi_modal_projector.linear_2"]
            self.vis_prefix = pre + "vision_tower.vision_model."
            self.feature_layer = c.get("vision_feature_layer", -2)
            self.keep_cls = c.get("vision_feature_select_strategy", "default") == "full"
            self.proj_act = c.get("projector_hidden_act", "gelu")
            self.vision_cfg = c["vision_config"]
        pre_path = os.path.join(d, "preprocessor_config.json")
        if tower_dir:
            tc = load_json(os.path.join(tower_dir, "config.json"))
            self.vision_cfg = tc.get("vision_config", tc)
            if not any(k.startswith(self.vis_prefix) for k in s):
                for k, v in read_checkpoint(tower_dir).items():
                    if k.startswith("vision_model.") and v.is_floating_point():
                        s[self.vis_prefix + k[len("vision_model."):]] = v
            if not os.path.exists(pre_path):
                pre_path = os.path.join(tower_dir, "preprocessor_config.json")
        self.pre = load_json(pre_path)
        self.siglip = self.vision_cfg.get("model_type", "clip_vision_model").startswith("siglip")
        self.c = c

    def v(self, name):
        return self.state[self.vis_prefix + name]


def layer_norm(x, P, name, eps):
    return F.layer_norm(x, (x.shape[-1],), P.v(name + ".weight"), P.v(name + ".bias"), eps)


def linear(x, P, name):
    return F.linear(x, P.v(name + ".weight"), P.v(name + ".bias"))


def encoder_layer(x, P, i, vc, act, eps):
    """CLIPEncoderLayer / SiglipEncoderLayer: pre-norm attention and MLP, full attention."""
    q = f"encoder.layers.{i}."
    B, T, C = x.shape
    H = vc["num_attention_heads"]
    hd = C // H
    residual = x
    h = layer_norm(x, P, q + "layer_norm1", eps)
    def heads(t):
        return t.view(B, T, H, hd).transpose(1, 2)
    qs = heads(linear(h, P, q + "self_attn.q_proj")) * hd ** -0.5
    ks = heads(linear(h, P, q + "self_attn.k_proj"))
    vs = heads(linear(h, P, q + "self_attn.v_proj"))
    w = F.softmax(qs @ ks.transpose(-1, -2), dim=-1, dtype=torch.float32)
    a = (w @ vs).transpose(1, 2).reshape(B, T, C)
    x = residual + linear(a, P, q + "self_attn.out_proj")
    residual = x
    h = layer_norm(x, P, q + "layer_norm2", eps)
    return residual + linear(act(linear(h, P, q + "mlp.fc1")), P, q + "mlp.fc2")


def encode_image(P, pixels, H, W, flags):
    """One image (H, W, 3) uint8 -> its features (n, dv) before the projector."""
    vc = P.vision_cfg
    p = vc["patch_size"]
    eps = vc.get("layer_norm_eps", 1e-6 if P.siglip else 1e-5)
    act = ACT["gelu" if flags.gelu else vc.get("hidden_act", "gelu_pytorch_tanh" if P.siglip else "quick_gelu")]
    mean = torch.tensor(P.pre["image_mean"]) + flags.mean_shift
    std = torch.tensor(P.pre["image_std"])
    x = torch.tensor(list(pixels), dtype=torch.float32).view(H, W, 3) / 255.0  # rescale 1/255
    x = ((x - mean) / std).permute(2, 0, 1)[None]  # (1, 3, H, W)
    patch_b = P.state.get(P.vis_prefix + "embeddings.patch_embedding.bias")
    emb = F.conv2d(x, P.v("embeddings.patch_embedding.weight"), patch_b, stride=p)  # (1, dv, gh, gw)
    gh, gw, dv = emb.shape[2], emb.shape[3], emb.shape[1]
    emb = emb.flatten(2).transpose(1, 2)  # (1, gh*gw, dv)
    table = P.v("embeddings.position_embedding.weight")
    grid = table if P.siglip else table[1:]
    g0 = int(math.isqrt(grid.shape[0]))
    if (gh, gw) != (g0, g0):  # interpolate_pos_encoding
        g = grid.reshape(1, g0, g0, dv).permute(0, 3, 1, 2)
        g = F.interpolate(g, size=(gh, gw), mode="bilinear" if flags.bilinear else "bicubic", align_corners=False)
        grid = g.permute(0, 2, 3, 1).reshape(gh * gw, dv)
    if P.siglip:
        h = emb + grid[None]
    else:
        cls = P.v("embeddings.class_embedding").expand(1, 1, dv)
        h = torch.cat([cls, emb], dim=1) + torch.cat([table[:1], grid], dim=0)[None]
        h = layer_norm(h, P, "pre_layrnorm", eps)
    hidden_states = [h]
    for i in range(vc["num_hidden_layers"]):
        h = encoder_layer(h, P, i, vc, act, eps)
        hidden_states.append(h)
    f = hidden_states[-1 if flags.last_layer else P.feature_layer]
    if flags.keep_cls:  # the class row kept in place of the last patch: as many rows, shifted
        f = f[:, :-1]
    elif not P.siglip and not P.keep_cls:
        f = f[:, 1:]
    return f[0]



def write_results(out, loss, logits, state):
    """What the C++ tests read (tests/hf_reference.h): OUT/loss.json, OUT/logits.bin (T, V) fp32 and
    OUT/grads.safetensors, every tensor of `state` that got a gradient under its folder name."""
    os.makedirs(out, exist_ok=True)
    json.dump({"loss": loss.item()}, open(os.path.join(out, "loss.json"), "w"))
    logits.detach().numpy().astype("float32").tofile(os.path.join(out, "logits.bin"))
    grads = [(k, "F32", tuple(v.shape), v.grad.detach().contiguous().numpy().astype("float32").tobytes())
             for k, v in sorted(state.items()) if v.grad is not None]
    write_safetensors(os.path.join(out, "grads.safetensors"), grads)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("input")
    ap.add_argument("out")
    ap.add_argument("--tower-dir")
    ap.add_argument("--bilinear", action="store_true")
    ap.add_argument("--gelu", action="store_true")
    ap.add_argument("--last-layer", action="store_true")
    ap.add_argument("--keep-cls", action="store_true")
    ap.add_argument("--mean-shift", type=float, default=0.0)
    a = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    P = Llava(a.ckpt, a.tower_dir)
    for t in P.state.values():
        t.requires_grad_(True)
    inp = load_json(a.input)
    feats = []
    for im in inp["images"]:
        with open(os.path.join(os.path.dirname(a.input), im["pixels"]), "rb") as f:
            raw = f.read()
        feats.append(encode_image(P, raw, im["height"], im["width"], a))
    dec = {k: P.state[v] for k, v in P.dec.items()}
    ids = inp["tokens"]
    x = dec["model.embed_tokens.weight"][torch.tensor(ids)]  # (T, d)
    slots = torch.tensor(inp["image_slot"])
    if feats:
        f = torch.cat(feats)
        l1, l2 = P.proj
        f = F.linear(ACT[P.proj_act](F.linear(f, P.state[l1 + ".weight"], P.state[l1 + ".bias"])),
                     P.state[l2 + ".weight"], P.state[l2 + ".bias"])
        is_image = slots >= 0
        assert int(is_image.sum()) == f.shape[0], f"{int(is_image.sum())} image positions, {f.shape[0]} feature rows"
        x = x.masked_scatter(is_image[:, None], f[slots[is_image]])  # rows in order, as LLaVA scatters
    c = P.text_cfg
    logits = llama_forward(dec, c, ids, c.get("rms_norm_eps", 1e-6), False, embeds=x[None])
    loss = F.cross_entropy(logits, torch.tensor(inp["targets"]), ignore_index=-1)
    loss.backward()
    write_results(a.out, loss, logits, P.state)


if __name__ == "__main__":
    main()
