#!/usr/bin/python3
"""An independent implementation of Hugging Face's Qwen3-VL, written from the definitions in
transformers' modeling_qwen3_vl.py (Qwen3VLVisionModel with its patch embedding, position
interpolation, 2-D RoPE, blocks, patch merger and DeepStack mergers; Qwen3VLTextModel with
q_norm/k_norm attention, interleaved M-RoPE and the DeepStack additions; Qwen3VLModel's
get_rope_index, feature scatter and Qwen3VLForConditionalGeneration's head),
image_processing_qwen2_vl.py and video_processing_qwen3_vl.py (rescale, normalise, patch
flattening), not from dhp's C++. It reads a Qwen3VLForConditionalGeneration folder with its own
safetensors reader (hf_llama_ref.py's), turns each image or video into pixel_values as the
processor does (no resize: H and W are multiples of patch·merge), runs the tower and the
decoder on one sequence (batch 1, no padding, full causal attention), and writes the logits,
the mean loss, the 3-row position ids and the gradient of every tensor that receives one,
under the folder's names. Everything is float32, as transformers computes it.

What is computed (transformers' names):
  pixels: x (uint8) -> (x - mean/rescale_factor) / (std/rescale_factor) in float32 (the
    torchvision processors' fused rescale+normalise: Qwen2VLImageProcessor(Fast) for images,
    with preprocessor_config.json's mean and std, Qwen3VLVideoProcessor for videos, with
    video_preprocessor_config.json's; the PIL/numpy image processor's float32(x/255) then
    (. - mean)/std differs by an ulp); an image repeated to temporal_patch_size frames, a video
    padded with its last frame to a multiple of it; (F, C, H, W) viewed as (F/T, T, C, H/p/m,
    m, p, W/p/m, m, p), permuted to (F/T, H/p/m, W/p/m, m, m, C, T, p, p): one row of C·T·p·p
    values a patch, the patches in merge-block order (each m x m block's patches row-major,
    the blocks row-major, the frame groups in time order).
  tower: Conv3d patch embedding (kernel = stride = (T, p, p), bias) + positions from the
    sqrt(N) x sqrt(N) table by fast_pos_embed_interpolate (bilinear over linspace(0, n-1, h)
    and linspace(0, n-1, w) in float32, four corners floor/ceil), repeated per frame group and
    put in merge-block order; each block x + attn(LN1(x)), x + MLP(LN2(x)) (LayerNorm eps
    1e-6, fused qkv with bias, 2-D RoPE rotate_half with cos/sin of cat(r, r), r = cat(row ·
    inv_freq, col · inv_freq), inv_freq = 1/10000^(arange(0, hd/2, 2)/(hd/2)), attention
    within each frame group of each item only, MLP with hidden_act); after each block listed
    in deepstack_visual_indexes, its DeepStack merger (LayerNorm over the m² rows concatenated,
    Linear, erf GELU, Linear); after the last block the merger (LayerNorm over each row, then
    the m² rows concatenated, Linear, erf GELU, Linear).
  decoder: image features placed at the image_token_id positions in order, video features at
    video_token_id positions; Qwen3 layers (RMSNorm eps rms_norm_eps, q_norm/k_norm per head
    before RoPE, GQA, SiLU-gated MLP); after decoder layer k < number of DeepStack features,
    feature k (both modalities' rows in sequence order) added at the visual positions; final
    RMSNorm; lm_head (embed_tokens when tied). RoPE: inv_freq = 1/theta^(arange(0, hd, 2)/hd);
    the three position rows' angles merged by apply_interleaved_mrope (slot j < 3·section[1]
    with j % 3 == 1 from the height row, j < 3·section[2] with j % 3 == 2 from the width row,
    every other from the temporal row), then rotate_half with cat(f, f). A text_config whose
    rope block says "mrope_interleaved": false gets Qwen2-VL's blocked layout instead (chunks
    of section·2 over cat(f, f), chunk i from row i % 3); transformers' Qwen3VL module itself
    ignores the key and always interleaves.
  positions (get_rope_index): video_grid_thw split into one (1, h, w) entry per frame group;
    walking the tokens, text counts on from the last position + 1 (0 at the start); each
    image or frame group, found at the next image/video pad token, takes st + (0, row, col)
    over its (h/m) x (w/m) merged grid where st is where its text run ended, i.e. the
    temporal row stays at st for the whole grid; the text after it counts on from the largest
    position used + 1. A video's time is only in the timestamp text between its groups.

Usage: hf_qwen3_vl_ref.py CHECKPOINT_DIR INPUT.json OUT_DIR [controls] [--fd-check]
          [--check-video]
  INPUT.json {"tokens": [...], "targets": [...],
              "items": [{"kind": "image"|"video", "height": H, "width": W, "frames": F,
                         "pixels": "FILE"}]}
    tokens: the ids as the processor writes them: an image is <vision_start>, (H/p/m)·(W/p/m)
    image_token_id, <vision_end>; a video of F frames (F a multiple of temporal_patch_size) is
    F/T groups, each the caller's timestamp ids, <vision_start>, (H/p/m)·(W/p/m)
    video_token_id, <vision_end>. items: in order within each kind (images and videos may
    interleave); frames defaults to 1. targets: the id each position predicts or -1 (no
    loss), not shifted; loss = mean cross-entropy over targets >= 0. FILE (beside
    INPUT.json): F·H·W·3 RGB uint8 bytes, frames in order, each row by row, HWC.
  OUT_DIR/loss.json {"loss": L}, OUT_DIR/logits.bin (T, V) fp32,
  OUT_DIR/positions.json {"position_ids": [[t...], [h...], [w...]]} (the ids RoPE used),
  OUT_DIR/grads.safetensors (F32, the folder's names, only tensors that get a gradient; with
  tied embeddings the head's gradient is in embed_tokens).
Negative controls (dhp must not match them): --rope-1d (every position row arange(T), plain
1-D RoPE), --blocked (the blocked [TTT..HHH..WWW] M-RoPE layout instead of interleaved),
--no-deepstack (the DeepStack features not added), --bicubic (positions resized from the table
by F.interpolate bicubic, align_corners=False, instead of fast_pos_embed_interpolate),
--no-vision-rope (the tower's attention without 2-D RoPE).
Checks of this file (nothing written): --fd-check runs the model in float64 and compares the
gradients of a few entries of several tensors with central differences; --check-video encodes
each video whole and frame group by frame group as separate items and compares the features.
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F

from hf_llama_ref import default_inv_freq, read_checkpoint, repeat_kv, rope_settings, rotate_half
from hf_llava_ref import ACT, load_json, write_results

VISION_THETA = 10000.0  # Qwen3VLVisionRotaryEmbedding's default, not in the config


def upcast(dtype):
    """transformers' float32 for norms and softmax; float64 stays float64 (--fd-check)."""
    return torch.promote_types(dtype, torch.float32)


def rms_norm(x, weight, eps):
    """Qwen3VLTextRMSNorm: mean of squares over the last dim, in float32."""
    h = x.to(upcast(x.dtype))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class Qwen3VL:
    """The folder: tensors under their names, the three configs, the two processors'."""

    def __init__(self, d):
        self.state = {k: v for k, v in read_checkpoint(d).items() if v.is_floating_point()}
        self.c = load_json(os.path.join(d, "config.json"))
        self.tc, self.vc = self.c["text_config"], self.c["vision_config"]
        self.pre = load_json(os.path.join(d, "preprocessor_config.json"))
        vpath = os.path.join(d, "video_preprocessor_config.json")
        self.vpre = load_json(vpath) if os.path.exists(vpath) else self.pre
        self.tied = bool(self.c.get("tie_word_embeddings", False) or self.tc.get("tie_word_embeddings", False))
        if not self.tied and "lm_head.weight" not in self.state:
            raise SystemExit("hf_qwen3_vl_ref.py: no lm_head.weight and tie_word_embeddings is false")
        theta, block = rope_settings(self.tc)
        block = block or {}
        if block.get("rope_type", block.get("type", "default")) != "default":
            raise SystemExit(f"hf_qwen3_vl_ref.py: rope_type {block.get('rope_type')} is not implemented")
        self.theta = theta
        self.section = list(block.get("mrope_section", [24, 20, 20]))
        self.interleaved = bool(block.get("mrope_interleaved", True))

    def v(self, name):
        return self.state["model.visual." + name]

    def t(self, name):
        return self.state["model.language_model." + name]

    def ids(self):
        c = self.c
        return c["image_token_id"], c["video_token_id"], c["vision_start_token_id"]


# ---------------------------------------------------------------- processor


def pixel_values(pre, raw, frames, H, W, vc):
    """(F·H·W·3 uint8 bytes) -> (grid_t·gh·gw, C·T·p·p) float32 and its grid (t, gh, gw)."""
    p, T, m = vc["patch_size"], vc["temporal_patch_size"], vc["spatial_merge_size"]
    assert H % (p * m) == 0 and W % (p * m) == 0, f"{H}x{W} is not a multiple of patch·merge {p * m}"
    assert len(raw) == frames * H * W * 3, f"{len(raw)} bytes for {frames}x{H}x{W}x3"
    x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(frames, H, W, 3).permute(0, 3, 1, 2)
    x = x.to(torch.float32)
    C = x.shape[1]
    if pre.get("do_rescale", True) and pre.get("do_normalize", True):  # fused, as the torchvision processors
        mean = torch.tensor(pre["image_mean"]) * (1.0 / pre["rescale_factor"])
        std = torch.tensor(pre["image_std"]) * (1.0 / pre["rescale_factor"])
        x = (x - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
    elif pre.get("do_normalize", True):
        x = (x - torch.tensor(pre["image_mean"]).view(-1, 1, 1)) / torch.tensor(pre["image_std"]).view(-1, 1, 1)
    elif pre.get("do_rescale", True):
        x = x * pre["rescale_factor"]
    if x.shape[0] % T:  # an image (1 frame) or an odd video: the last frame repeated
        x = torch.cat([x, x[-1:].expand(T - x.shape[0] % T, -1, -1, -1)])
    gt, gh, gw = x.shape[0] // T, H // p, W // p
    x = x.reshape(gt, T, C, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, C * T * p * p), (gt, gh, gw)


# ---------------------------------------------------------------- tower


def merge_order(rows, t, h, w, m):
    """(h·w, ...) row-major patches -> repeated for t frame groups, in merge-block order."""
    rows = rows.repeat(t, 1)
    return rows.view(t, h // m, m, w // m, m, -1).permute(0, 1, 3, 2, 4, 5).flatten(0, 4)


def interpolated_positions(P, grids, bicubic):
    """fast_pos_embed_interpolate: per item (t, h, w) the table's bilinear resize to h x w."""
    table = P.v("pos_embed.weight")
    n = int(P.vc["num_position_embeddings"] ** 0.5)
    m = P.vc["spatial_merge_size"]
    out = []
    for t, h, w in grids:
        if bicubic:  # negative control
            g = table.view(n, n, -1).permute(2, 0, 1)[None]
            g = F.interpolate(g, size=(h, w), mode="bicubic", align_corners=False)
            emb = g[0].permute(1, 2, 0).reshape(h * w, -1)
        else:
            hs, ws = torch.linspace(0, n - 1, h), torch.linspace(0, n - 1, w)  # float32, as transformers
            h0, w0 = hs.int(), ws.int()
            h1, w1 = (h0 + 1).clip(max=n - 1), (w0 + 1).clip(max=n - 1)
            dh, dw = hs - h0, ws - w0
            corners = [(h0, w0, (1 - dh)[:, None] * (1 - dw)[None]), (h0, w1, (1 - dh)[:, None] * dw[None]),
                       (h1, w0, dh[:, None] * (1 - dw)[None]), (h1, w1, dh[:, None] * dw[None])]
            emb = None
            for hi, wi, wt in corners:
                idx = (hi[:, None] * n + wi[None]).flatten().long()
                term = table[idx] * wt.flatten().to(table.dtype)[:, None]
                emb = term if emb is None else emb + term
        out.append(merge_order(emb, t, h, w, m))
    return torch.cat(out)


def vision_rope(grids, head_dim, m, dtype):
    """rot_pos_emb: (rows, head_dim) cos and sin of each patch's (row, col) 2-D rotation."""
    dim = head_dim // 2
    inv_freq = 1.0 / (VISION_THETA ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    inv_freq = inv_freq.to(dtype)
    max_hw = max(max(h, w) for _, h, w in grids)
    table = torch.outer(torch.arange(max_hw, dtype=dtype), inv_freq)  # (max_hw, head_dim / 4)
    coords = []
    for t, h, w in grids:
        rows = torch.arange(h).view(h, 1).expand(h, w)
        cols = torch.arange(w).view(1, w).expand(h, w)
        rc = torch.stack([rows, cols], dim=-1).reshape(h * w, 2)
        coords.append(merge_order(rc, t, h, w, m))
    r = table[torch.cat(coords)].flatten(1)  # (rows, head_dim / 2): row angles, then column angles
    emb = torch.cat((r, r), dim=-1)
    return emb.cos(), emb.sin()


def layer_norm(x, P, name, eps=1e-6):
    return F.layer_norm(x, (x.shape[-1],), P.v(name + ".weight"), P.v(name + ".bias"), eps)


def linear(x, P, name):
    return F.linear(x, P.v(name + ".weight"), P.v(name + ".bias"))


def vision_block(x, P, i, cos, sin, lengths, rope):
    b = f"blocks.{i}."
    L, dv = x.shape
    nh = P.vc["num_heads"]
    hd = dv // nh
    h = layer_norm(x, P, b + "norm1")
    q, k, v = linear(h, P, b + "attn.qkv").reshape(L, 3, nh, hd).permute(1, 0, 2, 3).unbind(0)
    if rope:  # apply_rotary_pos_emb_vision
        c, s = cos[:, None, :], sin[:, None, :]
        q, k = q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
    q, k, v = (z.transpose(0, 1)[None] for z in (q, k, v))  # (1, nh, L, hd)
    outs = []
    for qs, ks, vs in zip(q.split(lengths, 2), k.split(lengths, 2), v.split(lengths, 2)):
        w = F.softmax(torch.matmul(qs, ks.transpose(2, 3)) * hd ** -0.5, dim=-1, dtype=upcast(qs.dtype)).to(qs.dtype)
        outs.append(torch.matmul(w, vs).transpose(1, 2))
    a = torch.cat(outs, dim=1).reshape(L, dv)
    x = x + linear(a, P, b + "attn.proj")
    h = layer_norm(x, P, b + "norm2")
    act = ACT[P.vc.get("hidden_act", "gelu_pytorch_tanh")]
    return x + linear(act(linear(h, P, b + "mlp.linear_fc1")), P, b + "mlp.linear_fc2")


def patch_merger(x, P, pre, postshuffle):
    """Qwen3VLVisionPatchMerger: LayerNorm (eps 1e-6) before (merger) or after (DeepStack) the
    m² consecutive rows are concatenated, then Linear, nn.GELU() (erf), Linear."""
    M = x.shape[-1] * P.vc["spatial_merge_size"] ** 2
    x = layer_norm(x.reshape(-1, M), P, pre + "norm") if postshuffle else layer_norm(x, P, pre + "norm").reshape(-1, M)
    return linear(F.gelu(linear(x, P, pre + "linear_fc1")), P, pre + "linear_fc2")


def vision_model(P, pv, grids, flags):
    """Qwen3VLVisionModel.forward on the items of one kind: (merged rows, [DeepStack rows])."""
    vc = P.vc
    C, T, p, m = vc.get("in_channels", 3), vc["temporal_patch_size"], vc["patch_size"], vc["spatial_merge_size"]
    dv = vc["hidden_size"]
    x = F.conv3d(pv.view(-1, C, T, p, p), P.v("patch_embed.proj.weight"), P.v("patch_embed.proj.bias"),
                 stride=(T, p, p)).view(-1, dv)
    x = x + interpolated_positions(P, grids, flags.bicubic)
    cos, sin = vision_rope(grids, dv // vc["num_heads"], m, x.dtype)
    lengths = [h * w for t, h, w in grids for _ in range(t)]  # cu_seqlens: one frame group each
    ds = list(vc.get("deepstack_visual_indexes", []))
    deep = []
    for i in range(vc["depth"]):
        x = vision_block(x, P, i, cos, sin, lengths, not flags.no_vision_rope)
        if i in ds:
            deep.append(patch_merger(x, P, f"deepstack_merger_list.{ds.index(i)}.", True))
    return patch_merger(x, P, "merger.", False), deep


# ---------------------------------------------------------------- positions and decoder


def rope_index(ids, P, image_grids, video_grids):
    """get_rope_index for one unpadded sequence: (3, T) int64."""
    image_id, video_id, start_id = P.ids()
    m = P.vc["spatial_merge_size"]
    groups = [(1, h, w) for t, h, w in video_grids for _ in range(t)]  # one entry per frame group
    if not image_grids and not groups:
        return torch.arange(len(ids)).view(1, -1).expand(3, -1).clone()
    x = torch.tensor(ids)
    after_start = x[torch.argwhere(x == start_id).squeeze(1) + 1]
    n_images, n_videos = int((after_start == image_id).sum()), int((after_start == video_id).sum())
    parts, st, ii, vi = [], 0, 0, 0
    next_pos = 0
    for _ in range(n_images + n_videos):
        ed_image = ids.index(image_id, st) if ii < n_images and image_id in ids else len(ids) + 1
        ed_video = ids.index(video_id, st) if vi < n_videos and video_id in ids else len(ids) + 1
        if ed_image < ed_video:
            t, h, w = image_grids[ii]
            ii, ed = ii + 1, ed_image
        else:
            t, h, w = groups[vi]
            vi, ed = vi + 1, ed_video
        gh, gw = h // m, w // m
        text = torch.arange(ed - st).view(1, -1).expand(3, -1) + next_pos
        base = next_pos + (ed - st)
        ti = torch.arange(t).view(-1, 1).expand(-1, gh * gw).flatten()
        hi = torch.arange(gh).view(1, -1, 1).expand(t, -1, gw).flatten()
        wi = torch.arange(gw).view(1, 1, -1).expand(t, gh, -1).flatten()
        grid = torch.stack([ti, hi, wi]) + base
        parts += [text, grid]
        next_pos = int(grid.max()) + 1
        st = ed + t * gh * gw
    if st < len(ids):
        parts.append(torch.arange(len(ids) - st).view(1, -1).expand(3, -1) + next_pos)
    return torch.cat(parts, dim=1)


def text_cos_sin(P, pos, head_dim, layout):
    """Qwen3VLTextRotaryEmbedding in float32: (T, head_dim) cos and sin."""
    inv_freq = default_inv_freq(head_dim, P.theta)
    freqs = pos.float()[:, :, None] * inv_freq[None, None, :]  # (3, T, head_dim / 2)
    s = P.section
    if layout == "interleaved":  # apply_interleaved_mrope
        f = freqs[0].clone()
        f[..., 1:3 * s[1]:3] = freqs[1, ..., 1:3 * s[1]:3]
        f[..., 2:3 * s[2]:3] = freqs[2, ..., 2:3 * s[2]:3]
        emb = torch.cat((f, f), dim=-1)
        return emb.cos(), emb.sin()
    emb = torch.cat((freqs, freqs), dim=-1)  # Qwen2-VL's apply_multimodal_rotary_pos_emb
    cos, sin = emb.cos(), emb.sin()
    pick = lambda z: torch.cat([c[i % 3] for i, c in enumerate(z.split(s * 2, dim=-1))], dim=-1)
    return pick(cos), pick(sin)


def decoder(P, x, cos, sin, visual, deep):
    """Qwen3VLTextModel on (T, d) embeddings; deep[k] (rows, d) added at visual after layer k."""
    tc = P.tc
    T = x.shape[0]
    H = tc["num_attention_heads"]
    Hkv = tc.get("num_key_value_heads", H)
    hd = tc.get("head_dim", 128)
    eps = tc.get("rms_norm_eps", 1e-6)
    cos, sin = cos.to(x.dtype)[None, None], sin.to(x.dtype)[None, None]
    mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    x = x[None]
    pre = "model.language_model."  # q/k/v/o biases only with attention_bias
    for i in range(tc["num_hidden_layers"]):
        p = f"layers.{i}."
        lin = lambda z, name: F.linear(z, P.t(p + name + ".weight"), P.state.get(pre + p + name + ".bias"))
        residual = x
        h = rms_norm(x, P.t(p + "input_layernorm.weight"), eps)
        q = rms_norm(lin(h, "self_attn.q_proj").view(1, T, H, hd), P.t(p + "self_attn.q_norm.weight"), eps)
        k = rms_norm(lin(h, "self_attn.k_proj").view(1, T, Hkv, hd), P.t(p + "self_attn.k_norm.weight"), eps)
        v = lin(h, "self_attn.v_proj").view(1, T, Hkv, hd).transpose(1, 2)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
        w = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5 + mask
        w = F.softmax(w, dim=-1, dtype=upcast(q.dtype)).to(q.dtype)
        a = torch.matmul(w, v).transpose(1, 2).reshape(1, T, H * hd)
        x = residual + lin(a, "self_attn.o_proj")
        residual = x
        h = rms_norm(x, P.t(p + "post_attention_layernorm.weight"), eps)
        x = residual + lin(F.silu(lin(h, "mlp.gate_proj")) * lin(h, "mlp.up_proj"), "mlp.down_proj")
        if deep is not None and i < len(deep):  # _deepstack_process
            x = x.clone()
            x[0, visual] = x[0, visual] + deep[i]
    x = rms_norm(x, P.t("norm.weight"), eps)
    head = P.t("embed_tokens.weight") if P.tied else P.state["lm_head.weight"]
    return F.linear(x, head)[0]


# ---------------------------------------------------------------- the model


def load_items(P, inp, base):
    """pixel_values, pixel_values_videos and their grids, from INPUT.json's items."""
    pix = {"image": [], "video": []}
    grids = {"image": [], "video": []}
    for it in inp.get("items", []):
        kind = it["kind"]
        with open(os.path.join(base, it["pixels"]), "rb") as f:
            raw = f.read()
        frames = it.get("frames", 1)
        if kind == "video" and frames % P.vc["temporal_patch_size"]:
            raise SystemExit(f"hf_qwen3_vl_ref.py: a video of {frames} frames (temporal_patch_size "
                             f"{P.vc['temporal_patch_size']})")
        pv, g = pixel_values(P.pre if kind == "image" else P.vpre, raw, frames, it["height"], it["width"], P.vc)
        pix[kind].append(pv)
        grids[kind].append(g)
    return pix, grids


def forward(P, ids, pix, grids, flags):
    """Qwen3VLForConditionalGeneration.forward: (logits (T, V), position ids (3, T))."""
    image_id, video_id, _ = P.ids()
    dtype = P.t("embed_tokens.weight").dtype
    ids_t = torch.tensor(ids)
    x = P.t("embed_tokens.weight")[ids_t]
    masks, deeps = {}, {}
    for kind, tok in (("image", image_id), ("video", video_id)):
        if not pix[kind]:
            continue
        feats, deep = vision_model(P, torch.cat(pix[kind]).to(dtype), grids[kind], flags)
        mask = ids_t == tok
        if int(mask.sum()) != feats.shape[0]:
            raise SystemExit(f"hf_qwen3_vl_ref.py: {int(mask.sum())} {kind} tokens, {feats.shape[0]} feature rows")
        x = x.masked_scatter(mask[:, None].expand_as(x), feats)
        masks[kind], deeps[kind] = mask, deep
    visual, deep = None, None
    if masks:  # the DeepStack rows of both kinds, in sequence order
        visual = torch.zeros_like(ids_t, dtype=torch.bool)
        for mask in masks.values():
            visual = visual | mask
        deep = []
        for k in range(len(next(iter(deeps.values())))):
            joint = x.new_zeros(int(visual.sum()), x.shape[1])
            for kind, mask in masks.items():
                joint = joint.masked_scatter(mask[visual][:, None].expand_as(joint), deeps[kind][k])
            deep.append(joint)
        visual = torch.nonzero(visual).squeeze(1)
    if flags.no_deepstack:
        deep = None
    if flags.rope_1d:
        pos = torch.arange(len(ids)).view(1, -1).expand(3, -1).clone()
    else:
        pos = rope_index(ids, P, grids["image"], grids["video"])
    layout = "blocked" if flags.blocked or not P.interleaved else "interleaved"
    cos, sin = text_cos_sin(P, pos, P.tc.get("head_dim", 128), layout)
    return decoder(P, x, cos, sin, visual, deep), pos


def loss_of(logits, targets):
    return F.cross_entropy(logits, torch.tensor(targets), ignore_index=-1)


# ---------------------------------------------------------------- checks of this file


def fd_check(P, inp, pix, grids, flags):
    """Autograd against central differences, everything in float64."""
    for k in P.state:
        P.state[k] = P.state[k].double().detach().requires_grad_(True)
    loss = loss_of(forward(P, inp["tokens"], pix, grids, flags)[0], inp["targets"])
    loss.backward()
    gen = torch.Generator().manual_seed(0)
    names = [n for n in sorted(P.state) if P.state[n].grad is not None and P.state[n].grad.abs().max() > 0]
    picks = [n for n in names if any(s in n for s in (
        "patch_embed.proj.weight", "pos_embed", "blocks.0.attn.qkv.weight", "blocks.1.norm1.bias",
        "merger.norm.weight", "merger.linear_fc2.bias", "deepstack_merger_list.0.linear_fc1.weight",
        "deepstack_merger_list.1.norm.bias", "embed_tokens", "layers.0.self_attn.q_norm",
        "layers.0.self_attn.k_proj", "layers.1.mlp.down_proj", "layers.2.self_attn.o_proj",
        "language_model.norm", "lm_head"))]
    worst = 0.0
    eps = 1e-6
    with torch.no_grad():
        for n in picks:
            t = P.state[n]
            g = t.grad.flatten()
            nz = torch.nonzero(g.abs() > 1e-3 * g.abs().max()).squeeze(1)
            for j in nz[torch.randperm(len(nz), generator=gen)[:3]].tolist():
                flat = t.view(-1)
                old = flat[j].item()
                flat[j] = old + eps
                lp = loss_of(forward(P, inp["tokens"], pix, grids, flags)[0], inp["targets"]).item()
                flat[j] = old - eps
                lm = loss_of(forward(P, inp["tokens"], pix, grids, flags)[0], inp["targets"]).item()
                flat[j] = old
                fd = (lp - lm) / (2 * eps)
                rel = abs(fd - g[j].item()) / max(abs(fd), abs(g[j].item()), 1e-12)
                worst = max(worst, rel)
                print(f"fd {n}[{j}]: autograd {g[j].item():+.9e} central {fd:+.9e} rel {rel:.1e}")
    print(f"fd-check: {len(picks)} tensors, worst relative difference {worst:.2e}")
    return worst


def check_video(P, pix, grids, flags):
    """A video of t frame groups against its groups encoded as t separate items, in float32
    and in float64: the largest difference relative to the largest feature."""
    worst = 0.0
    T = P.vc["temporal_patch_size"]
    for dtype in (torch.float32, torch.float64):
        for k in P.state:
            P.state[k] = P.state[k].to(dtype)
        for pv, (t, h, w) in zip(pix["video"], grids["video"]):
            pv = pv.to(dtype)
            with torch.no_grad():
                whole, deep = vision_model(P, pv, [(t, h, w)], flags)
                rows = pv.shape[0] // t
                parts = [vision_model(P, pv[g * rows:(g + 1) * rows], [(1, h, w)], flags) for g in range(t)]
            pairs = [(whole, torch.cat([f for f, _ in parts]))]
            pairs += [(deep[k], torch.cat([dk[k] for _, dk in parts])) for k in range(len(deep))]
            rel = max(((a - b).abs().max() / a.abs().max()).item() for a, b in pairs)
            if dtype == torch.float64:
                worst = max(worst, rel)
            print(f"video {t * T} frames {h}x{w} patches, {str(dtype)[6:]}: whole vs {t} items of {T} frames, "
                  f"max |diff| / max |feature| {rel:.2e} over {whole.shape[0]} rows and {len(deep)} DeepStack sets")
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("input")
    ap.add_argument("out")
    ap.add_argument("--rope-1d", action="store_true")
    ap.add_argument("--blocked", action="store_true")
    ap.add_argument("--no-deepstack", action="store_true")
    ap.add_argument("--bicubic", action="store_true")
    ap.add_argument("--no-vision-rope", action="store_true")
    ap.add_argument("--fd-check", action="store_true")
    ap.add_argument("--check-video", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    P = Qwen3VL(a.ckpt)
    inp = load_json(a.input)
    assert len(inp["tokens"]) == len(inp["targets"]), "tokens and targets differ in length"
    pix, grids = load_items(P, inp, os.path.dirname(os.path.abspath(a.input)))
    if a.check_video:
        worst = check_video(P, pix, grids, a)
        raise SystemExit(0 if worst <= 1e-12 else 1)
    if a.fd_check:
        raise SystemExit(0 if fd_check(P, inp, pix, grids, a) < 1e-5 else 1)
    for t in P.state.values():
        t.requires_grad_(True)
    logits, pos = forward(P, inp["tokens"], pix, grids, a)
    loss = loss_of(logits, inp["targets"])
    loss.backward()
    write_results(a.out, loss, logits, P.state)
    json.dump({"position_ids": pos.tolist()}, open(os.path.join(a.out, "positions.json"), "w"))


if __name__ == "__main__":
    main()
