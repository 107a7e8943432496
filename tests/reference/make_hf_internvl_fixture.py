#!/usr/bin/python3
"""Makes a tiny random InternVL3 checkpoint without transformers and without network access,
in either of the two layouts InternVL3 is published in. The reference that runs it is
hf_internvl_ref.py.

  --layout hf (default): what InternVLForConditionalGeneration.save_pretrained writes in
    transformers >= 4.52 (the OpenGVLab/InternVL3-*-hf folders): config.json (model_type
    "internvl", a Qwen2 text_config, an "internvl_vision" vision_config), model.safetensors and
    preprocessor_config.json (GotOcr2ImageProcessorFast's, as the conversion script writes it).
  --layout original: OpenGVLab's remote-code layout (the OpenGVLab/InternVL3-* folders,
    InternVLChatModel): config.json with vision_config / llm_config, model.safetensors under
    the remote-code names, and added_tokens.json (where that layout keeps the <IMG_CONTEXT> id:
    InternVLChatModel takes img_context_token_id from the tokenizer, not from its config).
The same --seed gives the same values in both layouts (drawn in the hf layout's order).

Usage:
  make_hf_internvl_fixture.py OUT [--vhidden 32] [--vheads 4] [--vlayers 3] [--vffn 64]
      [--patch 4] [--image-size 16] [--hidden 48] [--heads 4] [--kv 2] [--layers 2]
      [--ffn 96] [--vocab 512] [--tied] [--theta 1000000] [--seed 0] [--std 0.05] [--vstd 0.1]
      [--dtype float32|bfloat16] [--layout hf|original] [--image-token ID]
      [--vnorm layer_norm|rms_norm] [--qk-norm] [--no-attention-bias] [--no-mean-pooling]
The last four give the InternViT-6B variant (RMSNorm, q/k RMSNorm, no qkv bias: InternVL3-38B
and -78B) and the tower's final LayerNorm; the defaults are InternViT-300M's (InternVL3-1B..14B).

Tensors, hf layout (Linear weights (out, in); dv = --vhidden, g0 = image_size / patch,
d = --hidden, hd = d / heads, M = 4·dv: downsample_ratio 0.5 folds 2x2 rows into one):
  model.vision_tower.embeddings.cls_token (1, 1, dv)
  model.vision_tower.embeddings.patch_embeddings.projection.weight (dv, 3, p, p), .bias (dv)
  model.vision_tower.embeddings.position_embeddings (1, 1 + g0², dv)   class row first
  model.vision_tower.encoder.layer.N.attention.{q_proj,k_proj,v_proj}.weight (dv, dv), .bias (dv)
  model.vision_tower.encoder.layer.N.attention.{q_norm,k_norm}.weight (dv)      --qk-norm only
  model.vision_tower.encoder.layer.N.attention.projection_layer.weight (dv, dv), .bias (dv)
  model.vision_tower.encoder.layer.N.lambda_1 (dv), .lambda_2 (dv)      the layer scales
  model.vision_tower.encoder.layer.N.{layernorm_before,layernorm_after}.weight (dv), .bias (dv)
      (no bias with --vnorm rms_norm)
  model.vision_tower.encoder.layer.N.mlp.fc1.weight (vffn, dv), .bias; mlp.fc2.weight (dv, vffn), .bias
  model.vision_tower.layernorm.{weight,bias} (dv)   only with --no-mean-pooling: InternVLVisionModel
      holds an nn.Identity there when use_mean_pooling (every released config), so no tensor
  model.multi_modal_projector.layer_norm.{weight,bias} (M)
  model.multi_modal_projector.linear_1.weight (d, M), .bias (d); linear_2.weight (d, d), .bias (d)
  model.language_model.embed_tokens.weight (V, d)
  model.language_model.layers.N.{input_layernorm,post_attention_layernorm}.weight (d)
  model.language_model.layers.N.self_attn.q_proj.weight (H·hd, d), .bias; k_proj, v_proj
      (kv·hd, d) + bias; o_proj.weight (d, H·hd) (Qwen2: q/k/v biases, none on o_proj)
  model.language_model.layers.N.mlp.{gate_proj,up_proj}.weight (ffn, d), down_proj.weight (d, ffn)
  model.language_model.norm.weight (d); lm_head.weight (V, d) unless --tied

Original layout, name by name (the inverse of transformers' convert_internvl_weights_to_hf.py and
of InternVL's internvl_custom2hf.py):
  vision_model.embeddings.class_embedding          <- model.vision_tower.embeddings.cls_token
  vision_model.embeddings.patch_embedding.{w,b}    <- ...embeddings.patch_embeddings.projection.{w,b}
  vision_model.embeddings.position_embedding       <- ...embeddings.position_embeddings
  vision_model.encoder.layers.N.attn.qkv.weight (3dv, dv), .bias (3dv)
                                                   <- cat(q_proj, k_proj, v_proj) along dim 0
  vision_model.encoder.layers.N.attn.{q_norm,k_norm}.weight <- ...attention.{q_norm,k_norm}.weight
  vision_model.encoder.layers.N.attn.proj.{w,b}    <- ...attention.projection_layer.{w,b}
  vision_model.encoder.layers.N.ls1, .ls2          <- ...lambda_1, lambda_2
  vision_model.encoder.layers.N.norm1, norm2       <- ...layernorm_before, layernorm_after
  vision_model.encoder.layers.N.mlp.fc1, mlp.fc2   <- ...mlp.fc1, mlp.fc2
  mlp1.0.{w,b} (LayerNorm), mlp1.1.{w,b}, mlp1.3.{w,b}
                                                   <- multi_modal_projector.layer_norm, linear_1, linear_2
                                                      (mlp1.2 is the parameterless nn.GELU)
  language_model.model.X                           <- model.language_model.X
  language_model.lm_head.weight                    <- lm_head.weight (absent when tied)

Values: the decoder's matrices normal(--std), the tower's and the projector's normal(--vstd),
the class embedding and the position table normal(0.5) (so that keeping the class row or
misplacing a position shows as much as the patches do), lambda_1/lambda_2 uniform in
[0.1, 1) (far from 1 and uneven: leaving the layer scale out shows), norm weights 1 + 0.1·N,
biases 0.1·N. The token embedding of the image token is drawn like any other (the model
overwrites it).

config.json (hf): as save_pretrained writes it (sorted keys): architectures
["InternVLForConditionalGeneration"], downsample_ratio 0.5, image_seq_length (g0/2)²,
image_token_id (vocab - 1 unless --image-token), model_type "internvl", projector_hidden_act
"gelu", vision_feature_layer -1, vision_feature_select_strategy "default", tie_word_embeddings
at both levels (transformers 4.x ties on text_config's, 5.x on the top level's, whose default
is true), text_config a Qwen2Config (rope_theta --theta, rope_scaling null), vision_config as
InternVL's converters write InternViT-300M's (image_size and patch_size as [S, S] and [p, p],
hidden_act "gelu", layer_norm_eps 1e-6, layer_scale_init_value 0.1, use_mean_pooling true, ...).
preprocessor_config.json: GotOcr2ImageProcessorFast with size {height: S, width: S},
min_patches 1, max_patches 12, crop_to_patches false (the image processor's own default, which
the conversion script leaves; InternVLProcessor passes crop_to_patches=True at call time),
ImageNet mean/std, rescale_factor 1/255, resample 3 (bicubic).
config.json (original): InternVLChatConfig: architectures ["InternVLChatModel"], model_type
"internvl_chat", downsample_ratio 0.5, select_layer -1, ps_version "v2", template
"internvl2_5", force_image_size S, dynamic_image_size true, use_thumbnail true,
min/max_dynamic_patch 1/12, vision_config (model_type "intern_vit_6b", image_size S, patch_size p,
qkv_bias, qk_normalization, norm_type, initializer_factor 0.1 = the ls1/ls2 init), llm_config
(a Qwen2 config with architectures ["Qwen2ForCausalLM"]).
"""
import argparse
import json
import os
import re

import torch

from make_hf_fixture import tensor_bytes, write_safetensors

DTYPES = {"float32": ("F32", torch.float32), "bfloat16": ("BF16", torch.bfloat16)}
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


def tensors(a, gen):
    """(hf name, tensor) in draw order; every value drawn from gen in this order."""
    dv, p, d = a.vhidden, a.patch, a.hidden
    g0 = a.image_size // p
    M = 4 * dv
    hd = d // a.heads
    out = []

    def add(name, shape, kind):
        if kind == "norm":
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif kind == "bias":
            t = 0.1 * torch.randn(shape, generator=gen)
        elif kind == "scale":
            t = 0.1 + 0.9 * torch.rand(shape, generator=gen)
        else:
            t = kind * torch.randn(shape, generator=gen)
        out.append((name, t))

    def norm(name, dim):
        add(name + ".weight", (dim,), "norm")
        if a.vnorm == "layer_norm":
            add(name + ".bias", (dim,), "bias")

    v = "model.vision_tower."
    add(v + "embeddings.cls_token", (1, 1, dv), 0.5)
    add(v + "embeddings.patch_embeddings.projection.weight", (dv, 3, p, p), a.vstd)
    add(v + "embeddings.patch_embeddings.projection.bias", (dv,), "bias")
    add(v + "embeddings.position_embeddings", (1, 1 + g0 * g0, dv), 0.5)
    for i in range(a.vlayers):
        b = f"{v}encoder.layer.{i}."
        for proj in ("q_proj", "k_proj", "v_proj"):
            add(b + f"attention.{proj}.weight", (dv, dv), a.vstd)
            if not a.no_attention_bias:
                add(b + f"attention.{proj}.bias", (dv,), "bias")
        if a.qk_norm:
            add(b + "attention.q_norm.weight", (dv,), "norm")
            add(b + "attention.k_norm.weight", (dv,), "norm")
        add(b + "attention.projection_layer.weight", (dv, dv), a.vstd)
        add(b + "attention.projection_layer.bias", (dv,), "bias")
        add(b + "lambda_1", (dv,), "scale")
        add(b + "lambda_2", (dv,), "scale")
        norm(b + "layernorm_before", dv)
        norm(b + "layernorm_after", dv)
        add(b + "mlp.fc1.weight", (a.vffn, dv), a.vstd)
        add(b + "mlp.fc1.bias", (a.vffn,), "bias")
        add(b + "mlp.fc2.weight", (dv, a.vffn), a.vstd)
        add(b + "mlp.fc2.bias", (dv,), "bias")
    if a.no_mean_pooling:  # InternVLVisionModel.layernorm: always nn.LayerNorm, whatever norm_type
        add(v + "layernorm.weight", (dv,), "norm")
        add(v + "layernorm.bias", (dv,), "bias")
    m = "model.multi_modal_projector."
    add(m + "layer_norm.weight", (M,), "norm")
    add(m + "layer_norm.bias", (M,), "bias")
    add(m + "linear_1.weight", (d, M), a.vstd)
    add(m + "linear_1.bias", (d,), "bias")
    add(m + "linear_2.weight", (d, d), a.vstd)
    add(m + "linear_2.bias", (d,), "bias")
    lm = "model.language_model."
    add(lm + "embed_tokens.weight", (a.vocab, d), a.std)
    for i in range(a.layers):
        b = f"{lm}layers.{i}."
        add(b + "input_layernorm.weight", (d,), "norm")
        add(b + "self_attn.q_proj.weight", (a.heads * hd, d), a.std)
        add(b + "self_attn.q_proj.bias", (a.heads * hd,), "bias")
        add(b + "self_attn.k_proj.weight", (a.kv * hd, d), a.std)
        add(b + "self_attn.k_proj.bias", (a.kv * hd,), "bias")
        add(b + "self_attn.v_proj.weight", (a.kv * hd, d), a.std)
        add(b + "self_attn.v_proj.bias", (a.kv * hd,), "bias")
        add(b + "self_attn.o_proj.weight", (d, a.heads * hd), a.std)
        add(b + "post_attention_layernorm.weight", (d,), "norm")
        add(b + "mlp.gate_proj.weight", (a.ffn, d), a.std)
        add(b + "mlp.up_proj.weight", (a.ffn, d), a.std)
        add(b + "mlp.down_proj.weight", (d, a.ffn), a.std)
    add(lm + "norm.weight", (d,), "norm")
    if not a.tied:
        add("lm_head.weight", (a.vocab, d), a.std)
    return out


# hf name -> original name (the fused q/k/v are handled apart): the reverse of the converters'
# renames, applied in order to the name without its leading "model."
TO_ORIGINAL = [
    (r"^vision_tower\.", "vision_model."),
    (r"\.encoder\.layer\.", ".encoder.layers."),
    (r"\.embeddings\.cls_token$", ".embeddings.class_embedding"),
    (r"\.embeddings\.position_embeddings$", ".embeddings.position_embedding"),
    (r"\.embeddings\.patch_embeddings\.projection\.", ".embeddings.patch_embedding."),
    (r"\.lambda_(\d)$", r".ls\1"),
    (r"\.attention\.projection_layer\.", ".attn.proj."),
    (r"\.attention\.", ".attn."),
    (r"\.layernorm_before\.", ".norm1."),
    (r"\.layernorm_after\.", ".norm2."),
    (r"^multi_modal_projector\.layer_norm\.", "mlp1.0."),
    (r"^multi_modal_projector\.linear_1\.", "mlp1.1."),
    (r"^multi_modal_projector\.linear_2\.", "mlp1.3."),
    (r"^language_model\.", "language_model.model."),
]


def original_name(name):
    if name == "lm_head.weight":
        return "language_model.lm_head.weight"
    assert name.startswith("model."), name
    name = name[len("model."):]
    for pattern, repl in TO_ORIGINAL:
        name = re.sub(pattern, repl, name)
    return name


def to_original(named):
    """hf (name, tensor) list -> original (name, tensor) list: q/k/v fused into attn.qkv."""
    out, qkv = [], {}
    for name, t in named:
        mo = re.match(r"^model\.vision_tower\.encoder\.layer\.(\d+)\.attention\.([qkv])_proj\.(weight|bias)$", name)
        if mo:
            qkv.setdefault((int(mo.group(1)), mo.group(3)), {})[mo.group(2)] = t
            continue
        out.append((original_name(name), t))
    for (i, kind), parts in sorted(qkv.items()):
        fused = torch.cat([parts["q"], parts["k"], parts["v"]])
        out.append((f"vision_model.encoder.layers.{i}.attn.qkv.{kind}", fused))
    return out


def qwen2_config(a):
    """Qwen2Config's keys as save_pretrained writes them inside text_config / llm_config."""
    return {
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "intermediate_size": a.ffn,
        "max_position_embeddings": 4096,
        "max_window_layers": a.layers,
        "model_type": "qwen2",
        "num_attention_heads": a.heads,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": int(a.theta) if float(a.theta).is_integer() else a.theta,
        "sliding_window": None,
        "tie_word_embeddings": a.tied,
        "torch_dtype": a.dtype,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": a.vocab,
    }


def image_token(a):
    return a.image_token if a.image_token is not None else a.vocab - 1


def hf_config(a):
    g = a.image_size // a.patch // 2
    vision = {
        "architectures": ["InternVisionModel"],
        "attention_bias": not a.no_attention_bias,
        "attention_dropout": 0.0,
        "dropout": 0.0,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "hidden_size": a.vhidden,
        "image_size": [a.image_size, a.image_size],
        "initializer_factor": 0.1,
        "initializer_range": 1e-10,
        "intermediate_size": a.vffn,
        "layer_norm_eps": 1e-06,
        "layer_scale_init_value": 0.1,
        "model_type": "internvl_vision",
        "norm_type": a.vnorm,
        "num_attention_heads": a.vheads,
        "num_channels": 3,
        "num_hidden_layers": a.vlayers,
        "patch_size": [a.patch, a.patch],
        "projection_dropout": 0.0,
        "torch_dtype": a.dtype,
        "use_absolute_position_embeddings": True,
        "use_mask_token": False,
        "use_mean_pooling": not a.no_mean_pooling,
        "use_qk_norm": a.qk_norm,
    }
    text = dict(qwen2_config(a), architectures=["Qwen2ForCausalLM"])
    return {
        "architectures": ["InternVLForConditionalGeneration"],
        "downsample_ratio": 0.5,
        "image_seq_length": g * g,
        "image_token_id": image_token(a),
        "model_type": "internvl",
        "projector_hidden_act": "gelu",
        "text_config": dict(sorted(text.items())),
        "tie_word_embeddings": a.tied,
        "torch_dtype": a.dtype,
        "transformers_version": "4.52.0",
        "vision_config": vision,
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
    }


def original_config(a):
    vision = {
        "architectures": ["InternVisionModel"],
        "attention_dropout": 0.0,
        "drop_path_rate": 0.0,
        "dropout": 0.0,
        "hidden_act": "gelu",
        "hidden_size": a.vhidden,
        "image_size": a.image_size,
        "initializer_factor": 0.1,
        "initializer_range": 1e-10,
        "intermediate_size": a.vffn,
        "layer_norm_eps": 1e-06,
        "model_type": "intern_vit_6b",
        "norm_type": a.vnorm,
        "num_attention_heads": a.vheads,
        "num_channels": 3,
        "num_hidden_layers": a.vlayers,
        "patch_size": a.patch,
        "qk_normalization": a.qk_norm,
        "qkv_bias": not a.no_attention_bias,
        "torch_dtype": a.dtype,
        "use_flash_attn": False,
    }
    llm = dict(qwen2_config(a), architectures=["Qwen2ForCausalLM"])
    return {
        "architectures": ["InternVLChatModel"],
        "auto_map": {
            "AutoConfig": "configuration_internvl_chat.InternVLChatConfig",
            "AutoModel": "modeling_internvl_chat.InternVLChatModel",
            "AutoModelForCausalLM": "modeling_internvl_chat.InternVLChatModel",
        },
        "downsample_ratio": 0.5,
        "dynamic_image_size": True,
        "force_image_size": a.image_size,
        "llm_config": dict(sorted(llm.items())),
        "max_dynamic_patch": 12,
        "min_dynamic_patch": 1,
        "model_type": "internvl_chat",
        "pad2square": False,
        "ps_version": "v2",
        "select_layer": -1,
        "template": "internvl2_5",
        "tie_word_embeddings": a.tied,
        "torch_dtype": a.dtype,
        "transformers_version": None,
        "use_backbone_lora": 0,
        "use_llm_lora": 0,
        "use_thumbnail": True,
        "vision_config": vision,
    }


def preprocessor_config(a):
    """What GotOcr2ImageProcessorFast.save_pretrained writes for an InternVL3-hf folder."""
    return {
        "crop_size": None,
        "crop_to_patches": False,
        "data_format": "channels_first",
        "default_to_square": True,
        "device": None,
        "do_center_crop": None,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": IMAGENET_MEAN,
        "image_processor_type": "GotOcr2ImageProcessorFast",
        "image_std": IMAGENET_STD,
        "input_data_format": None,
        "max_patches": 12,
        "min_patches": 1,
        "processor_class": "InternVLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "return_tensors": None,
        "size": {"height": a.image_size, "width": a.image_size},
    }


def dump(path, obj):
    with open(path, "w") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")  # as save_pretrained


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--vhidden", type=int, default=32)
    ap.add_argument("--vheads", type=int, default=4)
    ap.add_argument("--vlayers", type=int, default=3)
    ap.add_argument("--vffn", type=int, default=64)
    ap.add_argument("--patch", type=int, default=4)
    ap.add_argument("--image-size", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=48)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=96)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--theta", type=float, default=1000000.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0.05)
    ap.add_argument("--vstd", type=float, default=0.1)
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES))
    ap.add_argument("--layout", default="hf", choices=["hf", "original"])
    ap.add_argument("--image-token", type=int)
    ap.add_argument("--vnorm", default="layer_norm", choices=["layer_norm", "rms_norm"])
    ap.add_argument("--qk-norm", action="store_true")
    ap.add_argument("--no-attention-bias", action="store_true")
    ap.add_argument("--no-mean-pooling", action="store_true")
    a = ap.parse_args()
    if a.image_size % a.patch or (a.image_size // a.patch) % 2:
        ap.error("--image-size / --patch must be an even number of patches (downsample_ratio 0.5)")
    if a.vhidden % a.vheads or a.hidden % a.heads or a.heads % a.kv or (a.hidden // a.heads) % 2:
        ap.error("heads must divide the widths, --kv the heads, and the decoder's head_dim must be even")
    if not 0 <= image_token(a) < a.vocab:
        ap.error("--image-token must lie in the vocabulary")
    if a.layout == "original" and a.no_mean_pooling:
        ap.error("--no-mean-pooling: InternVisionModel (original layout) has no final norm")
    os.makedirs(a.out, exist_ok=True)
    gen = torch.Generator().manual_seed(a.seed)
    named = tensors(a, gen)
    if a.layout == "original":
        named = to_original(named)
    st_dtype, torch_dtype = DTYPES[a.dtype]
    out = []
    for name, t in sorted(named, key=lambda nt: nt[0]):  # safetensors' (sorted) order
        t = t.to(torch_dtype)
        out.append((name, st_dtype, tuple(t.shape), tensor_bytes(t, st_dtype)))
    write_safetensors(os.path.join(a.out, "model.safetensors"), out)
    if a.layout == "hf":
        dump(os.path.join(a.out, "config.json"), hf_config(a))
        dump(os.path.join(a.out, "preprocessor_config.json"), preprocessor_config(a))
    else:
        dump(os.path.join(a.out, "config.json"), original_config(a))
        dump(os.path.join(a.out, "added_tokens.json"), {"<IMG_CONTEXT>": image_token(a)})


if __name__ == "__main__":
    main()
