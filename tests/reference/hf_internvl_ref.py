#!/usr/bin/python3
"""An independent implementation of Hugging Face's InternVL (InternVL3,
InternVLForConditionalGeneration), written from the definitions in transformers'
modeling_internvl.py (InternVLVisionEmbeddings with interpolate_pos_encoding,
InternVLVisionAttention, InternVLVisionLayer with its lambda_1/lambda_2 layer scale,
InternVLVisionMLP, InternVLVisionEncoder, InternVLVisionModel, InternVLMultiModalProjector,
InternVLModel.pixel_shuffle / get_image_features) and configuration_internvl.py, with the Qwen2
decoder of modeling_qwen2.py, and from OpenGVLab's remote code (modeling_internvl_chat.py:
pixel_shuffle, extract_feature; modeling_intern_vit.py; dynamic_preprocess of
internvl/train/dataset.py and the model cards' load_image) for the original layout and the
tiling; not from dhp's C++. It reads an InternVL folder of either layout (make_hf_internvl_fixture.py
makes both) with its own safetensors reader, encodes the given tiles, runs the decoder on one
sequence (batch 1, no padding, full causal attention) and writes the logits, the mean loss and
the gradient of every tensor that receives one, under the folder's names. Everything is float32,
as transformers computes it.

What is computed (transformers' names):
  pixels: each tile S x S x 3 uint8 -> float32 (x - mean/rescale_factor) / (std/rescale_factor)
    with preprocessor_config.json's mean, std and rescale_factor (GotOcr2ImageProcessorFast's
    fused rescale + normalise); the original layout: InternVL's build_transform, ToTensor then
    Normalize with ImageNet's mean and std: (x/255 - mean) / std (an ulp apart).
  tower, per tile: Conv2d patch embedding (kernel = stride = p, bias), the class row
    (cls_token) put first, + position_embeddings ((1, 1 + g0², dv), class row first; the patch
    part resized by F.interpolate bicubic, align_corners=False, only when the grid is not
    g0 x g0 or the tile not square: never for S x S tiles); each layer
        h = h + lambda_1 * proj(attn(LN_before(h)))      (q/k/v Linear with bias; optional
                                                          q_norm/k_norm RMSNorm over all dv)
        h = h + lambda_2 * fc2(gelu(fc1(LN_after(h))))
    (LayerScale: the per-channel vectors multiply each branch's output before its residual
    add; LayerNorm eps layer_norm_eps = 1e-6, or RMSNorm with norm_type "rms_norm"; softmax
    without upcast, scale head_dim^-0.5; hidden_act "gelu" = erf GELU). At its end
    InternVLVisionModel applies self.layernorm, an nn.Identity whenever use_mean_pooling (every
    released config, whose "mean pooling" is never computed: the model returns no pooler
    output); with use_mean_pooling false it is a LayerNorm over last_hidden_state.
  features (get_image_features): vision_feature_layer -1: last_hidden_state, else
    hidden_states[layer] (the embeddings' output, then each layer's; transformers up to at
    least 4.5x calls a nonexistent self.vision_model there, so only -1 runs in transformers;
    InternVL's extract_feature takes hidden_states[select_layer]); "default" drops the class
    row; the g x g patch rows (row-major) viewed (g, g, dv) and pixel-shuffled with
    downsample_ratio 0.5 into (g/2)² rows of 4·dv: row (I, J) of the half grid, rows in
    row-major order, is cat(x[2I, 2J], x[2I, 2J+1], x[2I+1, 2J], x[2I+1, 2J+1]): the 2x2
    neighbours row-major (top-left, top-right, bottom-left, bottom-right); this is what both
    transformers' pixel_shuffle and InternVL's (ps_version "v2") view/permute/view/permute
    sequence does (checked here by --check-shuffle against a transcription of it). InternVL's
    ps_version "v1" (no final permute) keeps that channel order but lists the rows
    column-major (J-major); it is honoured for the original layout.
  projector (multi_modal_projector / mlp1): LayerNorm over 4·dv (nn.LayerNorm's default eps
    1e-5, not the tower's 1e-6), Linear, projector_hidden_act ("gelu": erf), Linear.
  decoder: tiles' rows in order into the image_token_id positions (masked_scatter); Qwen2
    (RMSNorm in float32, q/k/v with bias, o_proj without, GQA, 1-D RoPE rotate_half with
    cos/sin of cat(f, f), f = positions arange(T) · 1/theta^(arange(0, hd, 2)/hd), softmax in
    float32, SiLU-gated MLP), final RMSNorm, lm_head (embed_tokens when tied: text_config's
    tie_word_embeddings, as transformers 4.x ties, else the top level's; Qwen2Config's default
    is false). rope_scaling "dynamic" (InternVL3's llm_config has it) is the default RoPE for
    sequences within max_position_embeddings and is accepted as such; other types are refused.

Usage: hf_internvl_ref.py CHECKPOINT_DIR INPUT.json OUT_DIR [controls] [--image-token ID]
  INPUT.json {"tokens": [...], "targets": [...], "tiles": [{"pixels": "FILE"}, ...]}
    tokens: the ids, with image_token_id (the original layout: added_tokens.json's
    <IMG_CONTEXT>, or --image-token) at each image position, (S/p/2)² per tile, tiles in order;
    targets: the id each position predicts or -1 (no loss), not shifted; loss = mean
    cross-entropy over targets >= 0. FILE (beside INPUT.json): S·S·3 RGB uint8 bytes, row by
    row (HWC), S = vision_config.image_size. The tiling is not part of this input.
  OUT_DIR/loss.json {"loss": L}, OUT_DIR/logits.bin (T, V) fp32,
  OUT_DIR/grads.safetensors (F32, the folder's names, only tensors that get a gradient; with
  tied embeddings the head's gradient is in embed_tokens; the original layout's attn.qkv gets
  the three projections' gradients stacked). The tower's k_proj bias adds the same amount to
  every score of a query's softmax (no RoPE there): its gradient is zero up to rounding.
Negative controls (dhp must not match them): --shuffle-order (the 2x2 neighbours concatenated
column-major: top-left, bottom-left, top-right, bottom-right), --no-layer-scale (lambda_1 and
lambda_2 taken as 1), --keep-cls (the class row kept and the last patch row dropped, so the
tile keeps its g² rows), --no-projector-norm (the projector's LayerNorm left out),
--qk-norm-per-head (InternViT-6B's q/k norms over each head instead of the whole width).
Checks of this file (nothing written): --fd-check (the model in float64, autograd against
central differences on a few entries of tensors of every kind), --check-controls (how far each
control moves the logits), --check-shuffle (the pixel shuffle against a literal transcription
of transformers' view/permute sequence), --compare-with DIR (the same input through another
folder, e.g. the same seed in the other layout: the largest logit difference).

Tiling: hf_internvl_ref.py --tiles-of IMAGE [--max-num 12] [--min-num 1] [--image-size 448]
          [--no-thumbnail] [--tiles-out DIR]
  runs dynamic_preprocess (InternVL's, with find_closest_aspect_ratio's tie rule) on the image
  (converted to RGB as load_image does), prints the chosen grid and the tile count as JSON and
  writes DIR/tile_K.rgb (S·S·3 bytes, tiles row-major, then the thumbnail when there is one) and
  DIR/tiles.json. The tiles are what load_image feeds build_transform, whose T.Resize((S, S),
  BICUBIC) then leaves them as they are (Pillow returns a copy at the same size).
"""
import argparse
import json
import math
import os
import re

import torch
import torch.nn.functional as F

from hf_llama_ref import default_inv_freq, read_checkpoint, repeat_kv, rope_settings, rope_type_of, rotate_half
from hf_llava_ref import ACT, load_json, write_results
from hf_qwen3_vl_ref import rms_norm, upcast

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # InternVL's internvl/train/constants.py
IMAGENET_STD = (0.229, 0.224, 0.225)

# The remote-code names -> transformers' (convert_internvl_weights_to_hf.py's
# ORIGINAL_TO_CONVERTED_KEY_MAPPING_VISION / _MULTI, applied in this order; the model. prefix of
# transformers >= 4.52 is left off on both sides here).
VISION_RENAMES = [
    (r"vision_model", "vision_tower"),
    (r"layers", "layer"),
    (r"class_embedding", "cls_token"),
    (r"position_embedding", "position_embeddings"),
    (r"patch_embedding", "patch_embeddings.projection"),
    (r"ls(\d+)", r"lambda_\1"),
    (r"attn.proj", "attention.projection_layer"),
    (r"attn.dropout", "attention.projection_dropout"),
    (r"attn", "attention"),
    (r"norm1", "layernorm_before"),
    (r"norm2", "layernorm_after"),
]
PROJECTOR_RENAMES = [
    (r"mlp1.0", "multi_modal_projector.layer_norm"),
    (r"mlp1.1", "multi_modal_projector.linear_1"),
    (r"mlp1.3", "multi_modal_projector.linear_2"),
]


class InternVL:
    """The folder: its tensors (the leaves gradients go to), the configs, the image settings.
    params() gives the tensors under one naming, transformers' without the model. prefix."""

    def __init__(self, d, image_token=None):
        self.state = {k: v for k, v in read_checkpoint(d).items() if v.is_floating_point()}
        c = load_json(os.path.join(d, "config.json"))
        self.c = c
        if "model.vision_tower.embeddings.cls_token" in self.state:
            self.layout = "hf"
            self.vc, self.tc = dict(c["vision_config"]), c["text_config"]
            self.image_token_id = c["image_token_id"] if image_token is None else image_token
            self.ratio = c.get("downsample_ratio", 0.5)
            self.feature_layer = c.get("vision_feature_layer", -1)
            self.strategy = c.get("vision_feature_select_strategy", "default")
            self.proj_act = c.get("projector_hidden_act", "gelu")
            self.ps_v1 = False
            self.qk_eps = 1e-6  # InternVLVisionRMSNorm(embed_dim): its default eps
            pre = load_json(os.path.join(d, "preprocessor_config.json"))
            self.norm = ("fused", pre["image_mean"], pre["image_std"], pre.get("rescale_factor", 1 / 255))
            text_tie, top_tie = self.tc.get("tie_word_embeddings"), c.get("tie_word_embeddings")
            self.tied = bool(text_tie if text_tie is not None else top_tie if top_tie is not None else False)
            if text_tie is not None and top_tie is not None and text_tie != top_tie:
                print("hf_internvl_ref.py: tie_word_embeddings differs between text_config and the top level; "
                      "text_config's is used (transformers 4.x)")
        elif "vision_model.embeddings.class_embedding" in self.state:
            self.layout = "original"
            vc = dict(c["vision_config"])
            vc["attention_bias"] = vc.get("qkv_bias", False)
            vc["use_qk_norm"] = vc.get("qk_normalization", False)
            vc["use_mean_pooling"] = True  # InternVisionModel has no final norm
            vc["image_size"] = c.get("force_image_size") or vc["image_size"]
            self.vc, self.tc = vc, c["llm_config"]
            if image_token is None:
                tokens_path = os.path.join(d, "added_tokens.json")
                if not os.path.exists(tokens_path):
                    raise SystemExit("hf_internvl_ref.py: original layout without added_tokens.json: "
                                     "pass --image-token")
                image_token = load_json(tokens_path)["<IMG_CONTEXT>"]
            self.image_token_id = image_token
            self.ratio = c.get("downsample_ratio", 0.5)
            self.feature_layer = c.get("select_layer", -1)
            self.strategy = "default"  # extract_feature always drops the class row
            self.proj_act = "gelu"  # mlp1.2 is nn.GELU()
            self.ps_v1 = c.get("ps_version", "v1") == "v1"
            self.qk_eps = vc.get("layer_norm_eps", 1e-6)
            self.norm = ("totensor", list(IMAGENET_MEAN), list(IMAGENET_STD), 1 / 255)
            self.tied = bool(self.tc.get("tie_word_embeddings", False))
        else:
            raise SystemExit("hf_internvl_ref.py: no InternVL vision tower in this folder")
        for key in ("image_size", "patch_size"):
            if isinstance(self.vc[key], (list, tuple)):
                assert self.vc[key][0] == self.vc[key][1], f"non-square {key} {self.vc[key]}"
                self.vc[key] = self.vc[key][0]
        if self.strategy != "default":
            raise SystemExit(f"hf_internvl_ref.py: vision_feature_select_strategy {self.strategy!r}: the class row "
                             "makes the rows no square grid; transformers fails there too")
        if abs(1 / self.ratio - round(1 / self.ratio)) > 1e-9:
            raise SystemExit(f"hf_internvl_ref.py: downsample_ratio {self.ratio}")
        self.k = int(round(1 / self.ratio))
        if not self.tied and self.head_name() not in self.state:
            raise SystemExit("hf_internvl_ref.py: no lm_head and tie_word_embeddings is false")
        sliding = self.tc.get("use_sliding_window", False) or "sliding_attention" in self.tc.get("layer_types", [])
        if sliding:
            raise SystemExit("hf_internvl_ref.py: Qwen2 sliding-window layers are not implemented")

    def head_name(self):
        return "lm_head.weight" if self.layout == "hf" else "language_model.lm_head.weight"

    def params(self):
        """{transformers name without model.: tensor}, built from the leaves on every call (the
        original layout's fused qkv sliced into q, k, v as the conversion script does)."""
        if self.layout == "hf":
            return {(k[len("model."):] if k.startswith("model.") else k): v for k, v in self.state.items()}
        out = {}
        dv = self.vc["hidden_size"]
        for k, v in self.state.items():
            if k == "language_model.lm_head.weight":
                out["lm_head.weight"] = v
                continue
            if k.startswith("language_model.model."):
                out["language_model." + k[len("language_model.model."):]] = v
                continue
            name = k
            for pattern, repl in VISION_RENAMES if k.startswith("vision_model.") else PROJECTOR_RENAMES:
                name = re.sub(pattern, repl, name)
            if ".attention.qkv." in name:
                for j, part in enumerate(("q_proj", "k_proj", "v_proj")):
                    out[name.replace(".attention.qkv.", f".attention.{part}.")] = v[j * dv:(j + 1) * dv]
            else:
                out[name] = v
        return out


# ---------------------------------------------------------------- pixels and tower


def tile_pixels(P, raw):
    """S·S·3 uint8 bytes -> (3, S, S) float32, normalised as the layout's processor does."""
    S = P.vc["image_size"]
    assert len(raw) == S * S * 3, f"{len(raw)} bytes for a {S}x{S} tile"
    x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(S, S, 3).permute(2, 0, 1).to(torch.float32)
    kind, mean, std, rescale = P.norm
    if kind == "fused":  # BaseImageProcessorFast: mean and std divided by rescale_factor
        m = torch.tensor(mean) * (1.0 / rescale)
        s = torch.tensor(std) * (1.0 / rescale)
        return (x - m.view(3, 1, 1)) / s.view(3, 1, 1)
    x = x.div(255)  # torchvision ToTensor, then Normalize
    return (x - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)


def vnorm(x, W, name, P):
    """layernorm_before / layernorm_after: nn.LayerNorm or InternVLVisionRMSNorm, layer_norm_eps."""
    eps = P.vc.get("layer_norm_eps", 1e-6)
    if P.vc.get("norm_type", "layer_norm") == "rms_norm":
        return rms_norm(x, W[name + ".weight"], eps)
    return F.layer_norm(x, (x.shape[-1],), W[name + ".weight"], W[name + ".bias"], eps)


def lin(x, W, name):
    return F.linear(x, W[name + ".weight"], W.get(name + ".bias"))


def embeddings(W, P, pix):
    """InternVLVisionEmbeddings: (B, 3, H, W) -> (B, 1 + gh·gw, dv)."""
    p = P.vc["patch_size"]
    e = "vision_tower.embeddings."
    x = F.conv2d(pix, W[e + "patch_embeddings.projection.weight"], W[e + "patch_embeddings.projection.bias"], stride=p)
    B, dv, gh, gw = x.shape
    x = torch.cat([W[e + "cls_token"].expand(B, 1, dv), x.flatten(2).transpose(1, 2)], dim=1)
    table = W[e + "position_embeddings"]  # (1, 1 + g0², dv)
    n = table.shape[1] - 1
    height, width = pix.shape[2], pix.shape[3]
    if not (gh * gw == n and height == width):  # interpolate_pos_encoding
        g0 = math.isqrt(n)
        grid = table[:, 1:].reshape(1, g0, g0, dv).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(height // p, width // p), mode="bicubic", align_corners=False)
        table = torch.cat([table[:, :1], grid.permute(0, 2, 3, 1).reshape(1, -1, dv)], dim=1)
    return x + table


def vision_layer(h, W, P, i, flags):
    """InternVLVisionLayer: pre-norm attention and MLP, each branch scaled by lambda_1 / lambda_2."""
    b = f"vision_tower.encoder.layer.{i}."
    B, L, dv = h.shape
    nh = P.vc["num_attention_heads"]
    hd = dv // nh
    x = vnorm(h, W, b + "layernorm_before", P)
    q, k, v = (lin(x, W, b + f"attention.{n}_proj") for n in "qkv")
    if P.vc.get("use_qk_norm", False) and flags.qk_norm_per_head:  # the control: each head on its own
        q, k = (rms_norm(z.view(B, L, nh, hd), W[b + f"attention.{n}_norm.weight"].view(nh, hd), P.qk_eps).view(B, L, dv)
                for z, n in ((q, "q"), (k, "k")))
    elif P.vc.get("use_qk_norm", False):  # over the whole embed_dim, before the head split
        q = rms_norm(q, W[b + "attention.q_norm.weight"], P.qk_eps)
        k = rms_norm(k, W[b + "attention.k_norm.weight"], P.qk_eps)
    q, k, v = (z.view(B, L, nh, hd).transpose(1, 2) for z in (q, k, v))
    w = F.softmax(torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5, dim=-1)  # no upcast (eager_attention_forward)
    a = torch.matmul(w, v).transpose(1, 2).reshape(B, L, dv)
    a = lin(a, W, b + "attention.projection_layer")
    h = (a if flags.no_layer_scale else W[b + "lambda_1"] * a) + h
    x = vnorm(h, W, b + "layernorm_after", P)
    m = lin(ACT[P.vc.get("hidden_act", "gelu")](lin(x, W, b + "mlp.fc1")), W, b + "mlp.fc2")
    return (m if flags.no_layer_scale else W[b + "lambda_2"] * m) + h


def pixel_shuffle(x, k, order):
    """(B, h, w, C) -> (B, h/k, w/k, k²·C). "internvl": row (I, J) is the k x k block's rows
    concatenated row-major (offset (l, m) at channel block l·k + m) and the rows are listed
    row-major; "column": the block column-major (the --shuffle-order control); "v1": row-major
    blocks but the rows listed J-major (ps_version "v1")."""
    B, h, w, C = x.shape
    x = x.reshape(B, h // k, k, w // k, k, C)  # (B, I, l, J, m, C)
    if order == "internvl":
        x = x.permute(0, 1, 3, 2, 4, 5)  # (B, I, J, l, m, C)
    elif order == "column":
        x = x.permute(0, 1, 3, 4, 2, 5)  # (B, I, J, m, l, C)
    elif order == "v1":
        x = x.permute(0, 3, 1, 2, 4, 5)  # (B, J, I, l, m, C)
    else:
        raise ValueError(order)
    return x.reshape(B, x.shape[1], x.shape[2], k * k * C)


def pixel_shuffle_transcribed(vision_features, scale_factor=0.5, v2=True):
    """transformers' InternVLModel.pixel_shuffle (= InternVL's, ps_version "v2"), statement by
    statement: only for --check-shuffle."""
    batch_size, width, height, channels = vision_features.size()
    vision_features = vision_features.view(batch_size, width, int(height * scale_factor), int(channels / scale_factor))
    vision_features = vision_features.permute(0, 2, 1, 3).contiguous()
    vision_features = vision_features.view(
        batch_size, int(height * scale_factor), int(width * scale_factor), int(channels / (scale_factor**2)))
    if v2:
        vision_features = vision_features.permute(0, 2, 1, 3).contiguous()
    return vision_features


def image_features(W, P, pix, flags):
    """get_image_features on (B, 3, S, S) tiles: (B·(g/k)², d)."""
    h = embeddings(W, P, pix)
    states = [h]
    for i in range(P.vc["num_hidden_layers"]):
        h = vision_layer(h, W, P, i, flags)
        states.append(h)
    if P.feature_layer == -1:
        f = h
        if not P.vc.get("use_mean_pooling", True):  # InternVLVisionModel.layernorm (Identity otherwise)
            f = F.layer_norm(f, (f.shape[-1],), W["vision_tower.layernorm.weight"], W["vision_tower.layernorm.bias"],
                             P.vc.get("layer_norm_eps", 1e-6))
    else:
        f = states[P.feature_layer]
    f = f[:, :-1] if flags.keep_cls else f[:, 1:]
    B, n, dv = f.shape
    g = math.isqrt(n)
    assert g * g == n and g % P.k == 0, f"{n} patch rows"
    order = "column" if flags.shuffle_order else "v1" if P.ps_v1 else "internvl"
    f = pixel_shuffle(f.reshape(B, g, g, dv), P.k, order).reshape(B, -1, P.k * P.k * dv)
    m = "multi_modal_projector."
    if not flags.no_projector_norm:
        f = F.layer_norm(f, (f.shape[-1],), W[m + "layer_norm.weight"], W[m + "layer_norm.bias"], 1e-5)
    f = lin(ACT[P.proj_act](lin(f, W, m + "linear_1")), W, m + "linear_2")
    return f.reshape(-1, f.shape[-1])


# ---------------------------------------------------------------- decoder and model


def qwen2(W, P, x):
    """Qwen2Model + lm_head on (T, d) input embeddings: (T, V) logits."""
    tc = P.tc
    T, d = x.shape
    H = tc["num_attention_heads"]
    Hkv = tc.get("num_key_value_heads", H)
    hd = tc.get("head_dim") or d // H
    eps = tc.get("rms_norm_eps", 1e-6)
    theta, block = rope_settings(tc)
    kind = rope_type_of(block)
    if kind == "dynamic" and T > tc.get("max_position_embeddings", 32768):
        raise SystemExit("hf_internvl_ref.py: dynamic NTK RoPE beyond max_position_embeddings is not implemented")
    if kind not in ("default", "dynamic"):
        raise SystemExit(f"hf_internvl_ref.py: rope_type {kind!r} is not implemented")
    inv_freq = default_inv_freq(hd, theta)  # float32, as Qwen2RotaryEmbedding
    freqs = torch.arange(T).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype)[None, None], emb.sin().to(x.dtype)[None, None]
    mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    x = x[None]
    for i in range(tc["num_hidden_layers"]):
        p = f"language_model.layers.{i}."
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = lin(h, W, p + "self_attn.q_proj").view(1, T, H, hd).transpose(1, 2)
        k = lin(h, W, p + "self_attn.k_proj").view(1, T, Hkv, hd).transpose(1, 2)
        v = lin(h, W, p + "self_attn.v_proj").view(1, T, Hkv, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
        w = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5 + mask
        w = F.softmax(w, dim=-1, dtype=upcast(q.dtype)).to(q.dtype)
        a = torch.matmul(w, v).transpose(1, 2).reshape(1, T, H * hd)
        x = x + lin(a, W, p + "self_attn.o_proj")
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        x = x + lin(F.silu(lin(h, W, p + "mlp.gate_proj")) * lin(h, W, p + "mlp.up_proj"), W, p + "mlp.down_proj")
    x = rms_norm(x, W["language_model.norm.weight"], eps)
    head = W["language_model.embed_tokens.weight"] if P.tied else W["lm_head.weight"]
    return F.linear(x, head)[0]


def forward(P, ids, pix, flags):
    """InternVLForConditionalGeneration.forward: (T, V) logits."""
    W = P.params()
    embed = W["language_model.embed_tokens.weight"]
    ids_t = torch.tensor(ids)
    x = embed[ids_t]
    if pix is not None:
        feats = image_features(W, P, pix.to(embed.dtype), flags)
        mask = ids_t == P.image_token_id
        if int(mask.sum()) != feats.shape[0]:
            raise SystemExit(f"hf_internvl_ref.py: {int(mask.sum())} image tokens, {feats.shape[0]} feature rows")
        x = x.masked_scatter(mask[:, None].expand_as(x), feats)
    return qwen2(W, P, x)


def loss_of(logits, targets):
    return F.cross_entropy(logits, torch.tensor(targets), ignore_index=-1)


def load_tiles(P, inp, base):
    tiles = []
    for t in inp.get("tiles", []):
        with open(os.path.join(base, t["pixels"]), "rb") as f:
            tiles.append(tile_pixels(P, f.read()))
    return torch.stack(tiles) if tiles else None


# ---------------------------------------------------------------- InternVL's tiling


def find_closest_aspect_ratio(aspect_ratio, target_ratios, width, height, image_size):
    """InternVL's: the grid whose columns/rows is nearest the image's width/height; on a tie
    the later grid (more tiles) wins while the image's area exceeds half the grid's."""
    best_ratio_diff = float("inf")
    best_ratio = (1, 1)
    area = width * height
    for ratio in target_ratios:
        target_aspect_ratio = ratio[0] / ratio[1]
        ratio_diff = abs(aspect_ratio - target_aspect_ratio)
        if ratio_diff < best_ratio_diff:
            best_ratio_diff = ratio_diff
            best_ratio = ratio
        elif ratio_diff == best_ratio_diff:
            if area > 0.5 * image_size * image_size * ratio[0] * ratio[1]:
                best_ratio = ratio
    return best_ratio


def target_grid(orig_width, orig_height, min_num, max_num, image_size):
    """dynamic_preprocess's choice: (columns, rows)."""
    aspect_ratio = orig_width / orig_height
    target_ratios = set(
        (i, j) for n in range(min_num, max_num + 1) for i in range(1, n + 1) for j in range(1, n + 1) if
        i * j <= max_num and i * j >= min_num)
    target_ratios = sorted(target_ratios, key=lambda x: x[0] * x[1])  # a set's order, then stable by area
    return find_closest_aspect_ratio(aspect_ratio, target_ratios, orig_width, orig_height, image_size)


def dynamic_preprocess(image, min_num=1, max_num=12, image_size=448, use_thumbnail=False):
    """InternVL's dynamic_preprocess: the image resized to (columns·S, rows·S) and cut into S x S
    tiles, row-major, then (use_thumbnail, more than one tile) the whole image resized to S x S.
    Image.resize's default filter is BICUBIC for RGB images (Pillow >= 7): given explicitly."""
    from PIL import Image
    orig_width, orig_height = image.size
    target_aspect_ratio = target_grid(orig_width, orig_height, min_num, max_num, image_size)
    target_width = image_size * target_aspect_ratio[0]
    target_height = image_size * target_aspect_ratio[1]
    blocks = target_aspect_ratio[0] * target_aspect_ratio[1]
    resized_img = image.resize((target_width, target_height), Image.BICUBIC)
    processed_images = []
    for i in range(blocks):
        box = (
            (i % (target_width // image_size)) * image_size,
            (i // (target_width // image_size)) * image_size,
            ((i % (target_width // image_size)) + 1) * image_size,
            ((i // (target_width // image_size)) + 1) * image_size
        )
        processed_images.append(resized_img.crop(box))
    assert len(processed_images) == blocks
    if use_thumbnail and len(processed_images) != 1:
        processed_images.append(image.resize((image_size, image_size), Image.BICUBIC))
    return processed_images


def tiles_of(a):
    from PIL import Image
    image = Image.open(a.tiles_of).convert("RGB")  # load_image
    cols, rows = target_grid(image.size[0], image.size[1], a.min_num, a.max_num, a.image_size)
    tiles = dynamic_preprocess(image, a.min_num, a.max_num, a.image_size, not a.no_thumbnail)
    files = []
    if a.tiles_out:
        os.makedirs(a.tiles_out, exist_ok=True)
        for i, t in enumerate(tiles):
            assert t.size == (a.image_size, a.image_size) and t.mode == "RGB"
            files.append(f"tile_{i}.rgb")
            with open(os.path.join(a.tiles_out, files[-1]), "wb") as f:
                f.write(t.tobytes())
    info = {"width": image.size[0], "height": image.size[1], "grid": [cols, rows], "tiles": len(tiles),
            "thumbnail": len(tiles) > cols * rows, "image_size": a.image_size, "files": files}
    if a.tiles_out:
        with open(os.path.join(a.tiles_out, "tiles.json"), "w") as f:
            json.dump(info, f)
    print(json.dumps(info))


# ---------------------------------------------------------------- checks of this file


def fd_check(P, inp, pix, flags):
    """Autograd against central differences, everything in float64."""
    for k in P.state:
        P.state[k] = P.state[k].double().detach().requires_grad_(True)
    pix = pix.double() if pix is not None else None
    loss = loss_of(forward(P, inp["tokens"], pix, flags), inp["targets"])
    loss.backward()
    gen = torch.Generator().manual_seed(0)
    names = [n for n in sorted(P.state) if P.state[n].grad is not None]
    # the tower's k_proj bias (and the k third of a fused qkv bias) shifts every logit of a
    # query's softmax by the same amount: its gradient is zero up to rounding (~1e-19)
    zero = [n for n in names if P.state[n].grad.abs().max() < 1e-12]
    names = [n for n in names if n not in zero]
    kinds = ("cls_token", "class_embedding", "position_embedding", "patch_embedding", "layer.0.attention.q_proj.weight",
             "layer.1.attention.k_proj.weight", "layer.2.attention.v_proj.weight", "layers.1.attn.qkv.weight",
             "layers.2.attn.qkv.bias", "projection_layer.bias", "attn.proj.weight", "layer.0.lambda_1",
             "layer.2.lambda_2", "layers.0.ls1", "layers.2.ls2", "layernorm_before.weight", "layernorm_after.bias",
             "norm1.weight", "norm2.bias", "q_norm", "k_norm", "vision_tower.layernorm", "mlp.fc1.weight",
             "mlp.fc2.bias", "multi_modal_projector.layer_norm", "linear_1.weight", "linear_2.bias", "mlp1.0.",
             "mlp1.1.weight", "mlp1.3.bias", "embed_tokens", "layers.0.self_attn.q_proj.bias",
             "layers.1.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.bias", "layers.1.self_attn.o_proj",
             "layers.0.mlp.down_proj", "layers.1.post_attention_layernorm", "language_model.norm",
             "language_model.model.norm", "lm_head")
    picks = [n for n in names if any(s in n for s in kinds)]
    worst = 0.0
    eps = 1e-4  # the loss (~6) is good to ~1e-14 and its third derivatives are O(1): both errors ~1e-8
    with torch.no_grad():
        for n in picks:
            t = P.state[n]
            g = t.grad.flatten()
            nz = torch.nonzero(g.abs() > 0.1 * g.abs().max()).squeeze(1)
            for j in nz[torch.randperm(len(nz), generator=gen)[:3]].tolist():
                flat = t.view(-1)
                old = flat[j].item()
                flat[j] = old + eps
                lp = loss_of(forward(P, inp["tokens"], pix, flags), inp["targets"]).item()
                flat[j] = old - eps
                lm = loss_of(forward(P, inp["tokens"], pix, flags), inp["targets"]).item()
                flat[j] = old
                fd = (lp - lm) / (2 * eps)
                rel = abs(fd - g[j].item()) / max(abs(fd), abs(g[j].item()), 1e-12)
                worst = max(worst, rel)
                print(f"fd {n}[{j}]: autograd {g[j].item():+.9e} central {fd:+.9e} rel {rel:.1e}")
    print(f"fd-check: {len(picks)} tensors, worst relative difference {worst:.2e}; zero gradient "
          f"(as it must be): {', '.join(zero) or 'none'}")
    return worst


CONTROLS = ("shuffle_order", "no_layer_scale", "keep_cls", "no_projector_norm", "qk_norm_per_head")


def check_controls(P, inp, pix, flags):
    """Each control's largest logit change relative to the largest logit; the smallest ratio."""
    with torch.no_grad():
        base = forward(P, inp["tokens"], pix, flags)
        scale = base.abs().max().item()
        worst = float("inf")
        for c in CONTROLS:
            f = argparse.Namespace(**{**vars(flags), **{x: x == c for x in CONTROLS}})
            d = (forward(P, inp["tokens"], pix, f) - base).abs().max().item()
            worst = min(worst, d / scale)
            print(f"--{c.replace('_', '-')}: max |logit change| {d:.4e}, / max |logit| {scale:.4e} = {d / scale:.3e}")
    return worst


def check_shuffle():
    """The pixel shuffle against the transcription, on random (B, g, g, C) for several g and C;
    and the derived order on a labelled grid."""
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    for g, C in ((2, 1), (4, 3), (8, 5), (16, 32)):
        x = torch.randn(2, g, g, C, generator=gen)
        worst = max(worst, (pixel_shuffle(x, 2, "internvl") - pixel_shuffle_transcribed(x)).abs().max().item())
        worst = max(worst, (pixel_shuffle(x, 2, "v1") - pixel_shuffle_transcribed(x, v2=False)).abs().max().item())
    lab = torch.tensor([[[10 * r + c] for c in range(4)] for r in range(4)], dtype=torch.float32)[None]
    rows = pixel_shuffle_transcribed(lab).reshape(-1, 4).int().tolist()
    print(f"pixel shuffle of a 4x4 grid labelled 10·row + col (transformers' statements): rows {rows}")
    print(f"check-shuffle: largest difference from the transcription {worst:.1e}")
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt", nargs="?")
    ap.add_argument("input", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--image-token", type=int)
    ap.add_argument("--shuffle-order", action="store_true")
    ap.add_argument("--no-layer-scale", action="store_true")
    ap.add_argument("--keep-cls", action="store_true")
    ap.add_argument("--no-projector-norm", action="store_true")
    ap.add_argument("--qk-norm-per-head", action="store_true")
    ap.add_argument("--fd-check", action="store_true")
    ap.add_argument("--check-controls", action="store_true")
    ap.add_argument("--check-shuffle", action="store_true")
    ap.add_argument("--compare-with")
    ap.add_argument("--tiles-of")
    ap.add_argument("--max-num", type=int, default=12)
    ap.add_argument("--min-num", type=int, default=1)
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--no-thumbnail", action="store_true")
    ap.add_argument("--tiles-out")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    if a.tiles_of:
        return tiles_of(a)
    if a.check_shuffle:
        raise SystemExit(0 if check_shuffle() == 0.0 else 1)
    if not (a.ckpt and a.input and (a.out or a.fd_check or a.check_controls or a.compare_with)):
        ap.error("CHECKPOINT_DIR INPUT.json OUT_DIR are needed")
    P = InternVL(a.ckpt, a.image_token)
    inp = load_json(a.input)
    assert len(inp["tokens"]) == len(inp["targets"]), "tokens and targets differ in length"
    base = os.path.dirname(os.path.abspath(a.input))
    pix = load_tiles(P, inp, base)
    if a.fd_check:
        raise SystemExit(0 if fd_check(P, inp, pix, a) < 1e-5 else 1)
    if a.check_controls:
        raise SystemExit(0 if check_controls(P, inp, pix, a) > 1e-2 else 1)
    if a.compare_with:
        Q = InternVL(a.compare_with, a.image_token)
        with torch.no_grad():
            x = forward(P, inp["tokens"], pix, a)
            y = forward(Q, inp["tokens"], load_tiles(Q, inp, base), a)
        d = (x - y).abs().max().item()
        print(f"compare-with: {P.layout} vs {Q.layout} layout, max |logit difference| {d:.3e} "
              f"(max |logit| {x.abs().max().item():.3e})")
        raise SystemExit(0 if d <= 1e-5 * x.abs().max().item() else 1)
    for t in P.state.values():
        t.requires_grad_(True)
    logits = forward(P, inp["tokens"], pix, a)
    loss = loss_of(logits, inp["targets"])
    loss.backward()
    write_results(a.out, loss, logits, P.state)


if __name__ == "__main__":
    main()
