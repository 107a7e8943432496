#!/usr/bin/python3
"""Makes a tiny random Qwen3-VL checkpoint in the exact layout Hugging Face's
Qwen3VLForConditionalGeneration.save_pretrained writes it (transformers 4.57, the version of the
released Qwen/Qwen3-VL-* folders, or 5.x with --rope-key rope_parameters), without transformers
and without network access: config.json, model.safetensors, preprocessor_config.json
(Qwen2VLImageProcessor) and video_preprocessor_config.json (Qwen3VLVideoProcessor). The
reference that runs it is hf_qwen3_vl_ref.py.

Usage:
  make_hf_qwen3_vl_fixture.py OUT [--vhidden 32] [--vheads 4] [--vdepth 3] [--vffn 64]
      [--patch 4] [--temporal 2] [--merge 2] [--num-pos 16] [--deepstack 0,1]
      [--hidden 48] [--heads 4] [--kv 2] [--head-dim 16] [--layers 3] [--ffn 96] [--vocab 512]
      [--tied] [--theta 5000000] [--mrope 4,2,2] [--blocked-config]
      [--rope-key rope_scaling|rope_parameters] [--seed 0] [--std 0.05] [--vstd 0.1]
      [--dtype float32|bfloat16] [--min-pixels N] [--max-pixels N] [--special-ids S,E,I,V]

Special ids, the top four of the tiny vocabulary in the released checkpoints' order
(151652..151656 there, with <|vision_pad|> between end and image): vision_start_token_id
vocab-4, vision_end_token_id vocab-3, image_token_id vocab-2, video_token_id vocab-1; or the
four --special-ids gives (a real tokenizer's).

Tensors (Linear weights (out, in); dv = --vhidden, m = --merge, M = dv·m², d = --hidden):
  model.visual.patch_embed.proj.weight (dv, 3, T, p, p), .bias (dv)      Conv3d, stride = kernel
  model.visual.pos_embed.weight (num_pos, dv)                             a sqrt(num_pos)² grid
  model.visual.blocks.N.{norm1,norm2}.{weight,bias} (dv)                  LayerNorm eps 1e-6
  model.visual.blocks.N.attn.qkv.{weight (3dv, dv), bias (3dv)}, attn.proj.{weight, bias}
  model.visual.blocks.N.mlp.linear_fc1.{weight (vffn, dv), bias}, mlp.linear_fc2.{weight, bias}
  model.visual.merger.norm.{weight,bias} (dv), merger.linear_fc1 (M, M) + bias,
      merger.linear_fc2 (d, M) + bias
  model.visual.deepstack_merger_list.J.norm.{weight,bias} (M), .linear_fc1, .linear_fc2 (as the
      merger's), one per entry J of deepstack_visual_indexes
  model.language_model.embed_tokens.weight (V, d)
  model.language_model.layers.N.{input_layernorm,post_attention_layernorm}.weight (d)
  model.language_model.layers.N.self_attn.{q_proj (H·hd, d), k_proj, v_proj (kv·hd, d),
      o_proj (d, H·hd)}.weight, self_attn.{q_norm,k_norm}.weight (hd)
  model.language_model.layers.N.mlp.{gate_proj, up_proj (ffn, d), down_proj (d, ffn)}.weight
  model.language_model.norm.weight (d), lm_head.weight (V, d) unless --tied
Values: the decoder's matrices normal(--std), the tower's and the mergers' normal(--vstd) (with
0.05 the tower's attention is near uniform and its 2-D RoPE hardly moves the loss), the
position table normal(0.5) (so that positions move the tower's output as much as the patches
do), norm weights 1 + 0.1·N, biases 0.1·N: a norm or bias left out or paired wrongly shows.

config.json: model_type "qwen3_vl", text_config (model_type "qwen3_vl_text") with the RoPE
settings either as the released folders have them, "rope_theta" beside "rope_scaling":
{"mrope_interleaved": true, "mrope_section": [...], "rope_type": "default"} (the default), or
with --rope-key rope_parameters as transformers 5 writes them (one "rope_parameters" object
with rope_theta inside). --blocked-config writes "mrope_interleaved": false: a config to be
read as Qwen2-VL's blocked layout (transformers' Qwen3VLTextRotaryEmbedding itself never reads
the key and always interleaves). tie_word_embeddings is written at both levels, as released.
Image processor sizes (pixels): shortest_edge 4·(p·m)², longest_edge 64·(p·m)² unless given;
the video processor's: 4·(p·m)² and 128·(p·m)².
"""
import argparse
import json
import os

import torch

from make_hf_fixture import tensor_bytes, write_safetensors

DTYPES = {"float32": ("F32", torch.float32), "bfloat16": ("BF16", torch.bfloat16)}


def ints(text):
    return [int(x) for x in text.split(",") if x != ""]


def special_ids(vocab, given=None):
    """The four ids, the top of the vocabulary unless --special-ids names them (a real
    tokenizer's <|vision_start|>, <|vision_end|>, <|image_pad|>, <|video_pad|>)."""
    start, end, image, video = given or (vocab - 4, vocab - 3, vocab - 2, vocab - 1)
    return {"vision_start_token_id": start, "vision_end_token_id": end,
            "image_token_id": image, "video_token_id": video}


def tensors(a, gen):
    """(name, tensor) in save order; every value drawn from gen in this order."""
    dv, p, T, m = a.vhidden, a.patch, a.temporal, a.merge
    M = dv * m * m
    d, hd = a.hidden, a.head_dim
    out = []

    def add(name, shape, kind):
        if kind == "norm":
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif kind == "bias":
            t = 0.1 * torch.randn(shape, generator=gen)
        else:
            t = kind * torch.randn(shape, generator=gen)
        out.append((name, t))

    v = "model.visual."
    add(v + "patch_embed.proj.weight", (dv, 3, T, p, p), a.vstd)
    add(v + "patch_embed.proj.bias", (dv,), "bias")
    add(v + "pos_embed.weight", (a.num_pos, dv), 0.5)
    for i in range(a.vdepth):
        b = f"{v}blocks.{i}."
        add(b + "norm1.weight", (dv,), "norm")
        add(b + "norm1.bias", (dv,), "bias")
        add(b + "attn.qkv.weight", (3 * dv, dv), a.vstd)
        add(b + "attn.qkv.bias", (3 * dv,), "bias")
        add(b + "attn.proj.weight", (dv, dv), a.vstd)
        add(b + "attn.proj.bias", (dv,), "bias")
        add(b + "norm2.weight", (dv,), "norm")
        add(b + "norm2.bias", (dv,), "bias")
        add(b + "mlp.linear_fc1.weight", (a.vffn, dv), a.vstd)
        add(b + "mlp.linear_fc1.bias", (a.vffn,), "bias")
        add(b + "mlp.linear_fc2.weight", (dv, a.vffn), a.vstd)
        add(b + "mlp.linear_fc2.bias", (dv,), "bias")

    def merger(pre, norm_dim):
        add(pre + "norm.weight", (norm_dim,), "norm")
        add(pre + "norm.bias", (norm_dim,), "bias")
        add(pre + "linear_fc1.weight", (M, M), a.vstd)
        add(pre + "linear_fc1.bias", (M,), "bias")
        add(pre + "linear_fc2.weight", (d, M), a.vstd)
        add(pre + "linear_fc2.bias", (d,), "bias")

    merger(v + "merger.", dv)  # LayerNorm before the 2x2 shuffle (use_postshuffle_norm=False)
    for j in range(len(a.deepstack)):
        merger(f"{v}deepstack_merger_list.{j}.", M)  # LayerNorm after it
    lm = "model.language_model."
    add(lm + "embed_tokens.weight", (a.vocab, d), a.std)
    for i in range(a.layers):
        b = f"{lm}layers.{i}."
        add(b + "input_layernorm.weight", (d,), "norm")
        add(b + "self_attn.q_proj.weight", (a.heads * hd, d), a.std)
        add(b + "self_attn.k_proj.weight", (a.kv * hd, d), a.std)
        add(b + "self_attn.v_proj.weight", (a.kv * hd, d), a.std)
        add(b + "self_attn.o_proj.weight", (d, a.heads * hd), a.std)
        add(b + "self_attn.q_norm.weight", (hd,), "norm")
        add(b + "self_attn.k_norm.weight", (hd,), "norm")
        add(b + "post_attention_layernorm.weight", (d,), "norm")
        add(b + "mlp.gate_proj.weight", (a.ffn, d), a.std)
        add(b + "mlp.up_proj.weight", (a.ffn, d), a.std)
        add(b + "mlp.down_proj.weight", (d, a.ffn), a.std)
    add(lm + "norm.weight", (d,), "norm")
    if not a.tied:
        add("lm_head.weight", (a.vocab, d), a.std)
    return out


def config_json(a):
    rope = {"mrope_interleaved": not a.blocked_config, "mrope_section": a.mrope, "rope_type": "default"}
    text = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "dtype": a.dtype,
        "eos_token_id": 1,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "intermediate_size": a.ffn,
        "max_position_embeddings": 4096,
        "model_type": "qwen3_vl_text",
        "num_attention_heads": a.heads,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": a.tied,
        "use_cache": True,
        "vocab_size": a.vocab,
    }
    theta = int(a.theta) if float(a.theta).is_integer() else a.theta
    if a.rope_key == "rope_parameters":  # transformers 5: rope_theta moves into the block
        text["rope_parameters"] = dict(sorted({**rope, "rope_theta": theta}.items()))
    else:
        text["rope_scaling"] = rope
        text["rope_theta"] = theta
    vision = {
        "deepstack_visual_indexes": a.deepstack,
        "depth": a.vdepth,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": a.vhidden,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": a.vffn,
        "model_type": "qwen3_vl",
        "num_heads": a.vheads,
        "num_position_embeddings": a.num_pos,
        "out_hidden_size": a.hidden,
        "patch_size": a.patch,
        "spatial_merge_size": a.merge,
        "temporal_patch_size": a.temporal,
    }
    c = {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "text_config": dict(sorted(text.items())),
        "tie_word_embeddings": a.tied,
        "transformers_version": "5.0.0" if a.rope_key == "rope_parameters" else "4.57.0",
        "vision_config": vision,
    }
    c.update(special_ids(a.vocab, ints(a.special_ids) if a.special_ids else None))
    return c


def preprocessor_config(a):
    """What Qwen2VLImageProcessor.save_pretrained writes for a Qwen3-VL folder."""
    unit = (a.patch * a.merge) ** 2
    lo = a.min_pixels if a.min_pixels is not None else 4 * unit
    hi = a.max_pixels if a.max_pixels is not None else 64 * unit
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Qwen2VLImageProcessor",
        "image_std": [0.5, 0.5, 0.5],
        "max_pixels": hi,
        "merge_size": a.merge,
        "min_pixels": lo,
        "patch_size": a.patch,
        "processor_class": "Qwen3VLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": hi, "shortest_edge": lo},
        "temporal_patch_size": a.temporal,
    }


def video_preprocessor_config(a):
    """What Qwen3VLVideoProcessor.save_pretrained writes (BaseVideoProcessor's attributes plus
    the class defaults of video_processing_qwen3_vl.py)."""
    unit = (a.patch * a.merge) ** 2
    return {
        "crop_size": None,
        "data_format": "channels_first",
        "default_to_square": True,
        "device": None,
        "do_center_crop": None,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "do_sample_frames": True,
        "fps": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "input_data_format": None,
        "max_frames": 768,
        "merge_size": a.merge,
        "min_frames": 4,
        "num_frames": None,
        "pad_size": None,
        "patch_size": a.patch,
        "processor_class": "Qwen3VLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "return_metadata": False,
        "size": {"longest_edge": 128 * unit, "shortest_edge": 4 * unit},
        "temporal_patch_size": a.temporal,
        "video_metadata": None,
        "video_processor_type": "Qwen3VLVideoProcessor",
    }


def dump(path, obj):
    with open(path, "w") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")  # as save_pretrained


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--vhidden", type=int, default=32)
    ap.add_argument("--vheads", type=int, default=4)
    ap.add_argument("--vdepth", type=int, default=3)
    ap.add_argument("--vffn", type=int, default=64)
    ap.add_argument("--patch", type=int, default=4)
    ap.add_argument("--temporal", type=int, default=2)
    ap.add_argument("--merge", type=int, default=2)
    ap.add_argument("--num-pos", type=int, default=16)
    ap.add_argument("--deepstack", type=ints, default=[0, 1])
    ap.add_argument("--hidden", type=int, default=48)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--ffn", type=int, default=96)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--special-ids", default="",
                    help="vision_start,vision_end,image,video ids (default: the top four of the vocabulary)")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--theta", type=float, default=5000000.0)
    ap.add_argument("--mrope", type=ints, default=[4, 2, 2])
    ap.add_argument("--blocked-config", action="store_true")
    ap.add_argument("--rope-key", default="rope_scaling", choices=["rope_scaling", "rope_parameters"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0.05)
    ap.add_argument("--vstd", type=float, default=0.1)
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES))
    ap.add_argument("--min-pixels", type=int)
    ap.add_argument("--max-pixels", type=int)
    a = ap.parse_args()
    if len(a.mrope) != 3 or 2 * sum(a.mrope) != a.head_dim:
        ap.error(f"--mrope needs three sections summing to head_dim / 2 = {a.head_dim // 2}")
    if a.vhidden % a.vheads or (a.vhidden // a.vheads) % 4:
        ap.error("--vhidden / --vheads must be a multiple of 4 (the tower's 2-D RoPE halves it twice)")
    if int(round(a.num_pos ** 0.5)) ** 2 != a.num_pos:
        ap.error("--num-pos must be a square")
    if any(not 0 <= j < a.vdepth for j in a.deepstack) or a.deepstack != sorted(set(a.deepstack)):
        ap.error("--deepstack: increasing tower layers below --vdepth")
    if len(a.deepstack) > a.layers:
        ap.error("more DeepStack features than decoder layers")
    os.makedirs(a.out, exist_ok=True)
    gen = torch.Generator().manual_seed(a.seed)
    st_dtype, torch_dtype = DTYPES[a.dtype]
    out = []
    for name, t in sorted(tensors(a, gen), key=lambda nt: nt[0]):  # safetensors' (sorted) order
        t = t.to(torch_dtype)
        out.append((name, st_dtype, tuple(t.shape), tensor_bytes(t, st_dtype)))
    write_safetensors(os.path.join(a.out, "model.safetensors"), out)
    dump(os.path.join(a.out, "config.json"), config_json(a))
    dump(os.path.join(a.out, "preprocessor_config.json"), preprocessor_config(a))
    dump(os.path.join(a.out, "video_preprocessor_config.json"), video_preprocessor_config(a))


if __name__ == "__main__":
    main()
