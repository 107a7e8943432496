#!/usr/bin/python3
"""Makes tiny random vision towers and LLaVA-1.5 checkpoints in the exact layout Hugging Face
and the original LLaVA code save them, without transformers and without network access, for
tests/test_hf_llava.cpp and tests/mpi_hf_llava.sh.

Usage:
  make_hf_llava_fixture.py OUT KIND [--tower clip|siglip] [--no-tower] [--vhidden 32]
      [--vheads 4] [--vlayers 3] [--vffn 64] [--patch 4] [--image-size 16] [--veps X]
      [--image-mean a,b,c] [--image-std a,b,c] [--aspect pad|square] [--feature-layer -2]
      [--position-ids] [decoder options of make_hf_fixture.py: --hidden --heads --kv --layers
      --ffn --vocab --tied --dtype --eps --theta --seed --std --tokenizer --arch]
      [--drop NAME] [--extra NAME] [--config KEY=JSON] [--vision-config KEY=JSON]

KIND:
  clip_vision   transformers' CLIPVisionModel: vision_model.* (class_embedding, conv patch
                embedding without bias, position_embedding (g0²+1, dv), pre_layrnorm,
                encoder.layers.*, post_layernorm), config model_type clip_vision_model.
  clip          CLIPModel: the above plus text_model.*, visual_projection, text_projection and
                logit_scale, config model_type clip with text_config and vision_config.
  siglip_vision SiglipVisionModel: patch embedding with bias, position_embedding (g0², dv), no
                class token or pre-norm, post_layernorm and the attention-pooling head.*.
  siglip        SiglipModel: the above plus text_model.* (with its head), logit_scale, logit_bias.
  llava_orig    haotian-liu/LLaVA's LlavaLlamaForCausalLM: model.embed_tokens, model.layers.*,
                model.norm, lm_head, model.mm_projector.{0,2}.*, and (unless --no-tower)
                model.vision_tower.vision_tower.vision_model.*; a Llama config with mm_* keys.
  llava_hf      llava-hf's LlavaForConditionalGeneration (transformers < 4.52):
                language_model.model.*, language_model.lm_head.weight, vision_tower.vision_model.*,
                multi_modal_projector.linear_{1,2}.*; config model_type llava with text_config and
                vision_config.
  llava_new     the same model as transformers >= 4.52 saves it: model.language_model.*,
                model.vision_tower.vision_model.*, model.multi_modal_projector.*, lm_head.weight.
Every folder but llava_orig's gets preprocessor_config.json (image_mean / image_std, crop_size
or size) as the tower's image processor writes it; LLaVA folders with --tokenizer get tokenizer.model (Llama's
ids) and, for the llava-hf layouts, added_tokens.json with <image> and <pad> after its pieces.
"""
import argparse
import json
import os

import torch

import make_hf_fixture as dec

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def floats(text):
    return [float(x) for x in text.split(",")]


def vision_tensors(a, tower, gen):
    """(name under vision_model., tensor) of a CLIP or SigLIP vision transformer. Scales are
    large enough that every part (positions, class token, each layer) moves the output."""
    dv, F, p = a.vhidden, a.vffn, a.patch
    g0 = a.image_size // p
    clip = tower == "clip"
    out = []

    def add(name, shape, kind):
        if kind == "norm":
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif kind == "bias":
            t = 0.1 * torch.randn(shape, generator=gen)
        else:
            t = kind * torch.randn(shape, generator=gen)
        out.append((name, t))

    if clip:
        add("embeddings.class_embedding", (dv,), 0.5)
    add("embeddings.patch_embedding.weight", (dv, 3, p, p), 0.1)
    if not clip:
        add("embeddings.patch_embedding.bias", (dv,), "bias")
    add("embeddings.position_embedding.weight", (g0 * g0 + (1 if clip else 0), dv), 0.5)
    if clip:
        add("pre_layrnorm.weight", (dv,), "norm")
        add("pre_layrnorm.bias", (dv,), "bias")
    for i in range(a.vlayers):
        q = f"encoder.layers.{i}."
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            add(q + f"self_attn.{proj}.weight", (dv, dv), 0.15)
            add(q + f"self_attn.{proj}.bias", (dv,), "bias")
        add(q + "layer_norm1.weight", (dv,), "norm")
        add(q + "layer_norm1.bias", (dv,), "bias")
        add(q + "mlp.fc1.weight", (F, dv), 0.15)
        add(q + "mlp.fc1.bias", (F,), "bias")
        add(q + "mlp.fc2.weight", (dv, F), 0.15)
        add(q + "mlp.fc2.bias", (dv,), "bias")
        add(q + "layer_norm2.weight", (dv,), "norm")
        add(q + "layer_norm2.bias", (dv,), "bias")
    add("post_layernorm.weight", (dv,), "norm")
    add("post_layernorm.bias", (dv,), "bias")
    if not clip:  # SiglipMultiheadAttentionPoolingHead
        add("head.probe", (1, 1, dv), 0.1)
        add("head.attention.in_proj_weight", (3 * dv, dv), 0.1)
        add("head.attention.in_proj_bias", (3 * dv,), "bias")
        add("head.attention.out_proj.weight", (dv, dv), 0.1)
        add("head.attention.out_proj.bias", (dv,), "bias")
        add("head.layernorm.weight", (dv,), "norm")
        add("head.layernorm.bias", (dv,), "bias")
        add("head.mlp.fc1.weight", (F, dv), 0.1)
        add("head.mlp.fc1.bias", (F,), "bias")
        add("head.mlp.fc2.weight", (dv, F), 0.1)
        add("head.mlp.fc2.bias", (dv,), "bias")
    return out


def text_tower_tensors(tower, gen):
    """A one-layer text transformer as CLIPModel / SiglipModel hold it (dhp ignores these)."""
    td, tv, tp = 16, 50, 8
    out = [("text_model.embeddings.token_embedding.weight", torch.randn(tv, td, generator=gen)),
           ("text_model.embeddings.position_embedding.weight", torch.randn(tp, td, generator=gen))]
    q = "text_model.encoder.layers.0."
    for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
        out += [(q + f"self_attn.{proj}.weight", torch.randn(td, td, generator=gen)),
                (q + f"self_attn.{proj}.bias", torch.randn(td, generator=gen))]
    for n in ("layer_norm1", "layer_norm2"):
        out += [(q + n + ".weight", torch.ones(td)), (q + n + ".bias", torch.zeros(td))]
    out += [(q + "mlp.fc1.weight", torch.randn(2 * td, td, generator=gen)),
            (q + "mlp.fc1.bias", torch.randn(2 * td, generator=gen)),
            (q + "mlp.fc2.weight", torch.randn(td, 2 * td, generator=gen)),
            (q + "mlp.fc2.bias", torch.randn(td, generator=gen)),
            ("text_model.final_layer_norm.weight", torch.ones(td)),
            ("text_model.final_layer_norm.bias", torch.zeros(td))]
    return out, td, tv, tp


def vision_config(a, tower, nested):
    c = {
        "hidden_size": a.vhidden,
        "intermediate_size": a.vffn,
        "num_attention_heads": a.vheads,
        "num_hidden_layers": a.vlayers,
        "image_size": a.image_size,
        "patch_size": a.patch,
        "num_channels": 3,
        "attention_dropout": 0.0,
    }
    if tower == "clip":
        c.update({"model_type": "clip_vision_model", "hidden_act": "quick_gelu",
                  "layer_norm_eps": a.veps if a.veps is not None else 1e-5, "projection_dim": 16,
                  "initializer_factor": 1.0, "initializer_range": 0.02})
    else:
        c.update({"model_type": "siglip_vision_model", "hidden_act": "gelu_pytorch_tanh",
                  "layer_norm_eps": a.veps if a.veps is not None else 1e-6, "vision_use_head": True})
    if not nested:
        c["architectures"] = ["CLIPVisionModel" if tower == "clip" else "SiglipVisionModel"]
        c["torch_dtype"] = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[a.dtype]
        c["transformers_version"] = "4.40.0"
    for kv in a.vision_config:
        k, v = kv.split("=", 1)
        c[k] = json.loads(v)
    return c


def preprocessor_config(a, tower):
    mean = a.image_mean or (CLIP_MEAN if tower == "clip" else [0.5, 0.5, 0.5])
    std = a.image_std or (CLIP_STD if tower == "clip" else [0.5, 0.5, 0.5])
    if tower == "clip":
        return {"crop_size": {"height": a.image_size, "width": a.image_size}, "do_center_crop": True,
                "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
                "image_mean": mean, "image_std": std, "image_processor_type": "CLIPImageProcessor",
                "resample": 3, "rescale_factor": 1 / 255, "size": {"shortest_edge": a.image_size}}
    return {"do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": mean,
            "image_std": std, "image_processor_type": "SiglipImageProcessor", "resample": 3,
            "rescale_factor": 1 / 255, "size": {"height": a.image_size, "width": a.image_size}}


def write_folder(a, tensors, config, preprocessor):
    os.makedirs(a.out, exist_ok=True)
    st_dtype, torch_dtype = dec.DTYPES[a.dtype]
    out = []
    for name, t in tensors:
        if name in a.drop:
            continue
        if t.dtype == torch.int64:  # a buffer (position_ids)
            out.append((name, "I64", tuple(t.shape), t.contiguous().numpy().tobytes()))
            continue
        t = t.to(torch_dtype)
        out.append((name, st_dtype, tuple(t.shape), dec.tensor_bytes(t, st_dtype)))
    gen = torch.Generator().manual_seed(a.seed + 99)
    for name in a.extra:
        t = torch.randn(4, generator=gen).to(torch_dtype)
        out.append((name, st_dtype, (4,), dec.tensor_bytes(t, st_dtype)))
    dec.write_safetensors(os.path.join(a.out, "model.safetensors"), out)
    for kv in a.config:
        k, v = kv.split("=", 1)
        config[k] = json.loads(v)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if preprocessor:
        with open(os.path.join(a.out, "preprocessor_config.json"), "w") as f:
            json.dump(preprocessor, f, indent=2)


def tower_folder(a, gen):
    tower = "clip" if a.kind.startswith("clip") else "siglip"
    tensors = [("vision_model." + n, t) for n, t in vision_tensors(a, tower, gen)]
    if a.position_ids and tower == "clip":  # saved as a persistent buffer before transformers 4.31
        g0 = a.image_size // a.patch
        tensors.append(("vision_model.embeddings.position_ids", torch.arange(g0 * g0 + 1)[None]))
    if a.kind.endswith("_vision"):
        return write_folder(a, tensors, vision_config(a, tower, nested=False), preprocessor_config(a, tower))
    text, td, tv, tp = text_tower_tensors(tower, gen)
    tensors += text
    text_cfg = {"hidden_size": td, "intermediate_size": 2 * td, "num_attention_heads": 2,
                "num_hidden_layers": 1, "vocab_size": tv, "max_position_embeddings": tp}
    if tower == "clip":
        tensors += [("visual_projection.weight", torch.randn(16, a.vhidden, generator=gen)),
                    ("text_projection.weight", torch.randn(16, td, generator=gen)),
                    ("logit_scale", torch.tensor(2.6592))]
        text_cfg.update({"model_type": "clip_text_model", "hidden_act": "quick_gelu", "projection_dim": 16})
        cfg = {"architectures": ["CLIPModel"], "model_type": "clip", "projection_dim": 16,
               "logit_scale_init_value": 2.6592, "initializer_factor": 1.0}
    else:
        tensors += [("text_model.head.weight", torch.randn(td, td, generator=gen)),
                    ("text_model.head.bias", torch.randn(td, generator=gen)),
                    ("logit_scale", torch.tensor([2.3])), ("logit_bias", torch.tensor([-10.0]))]
        text_cfg.update({"model_type": "siglip_text_model", "hidden_act": "gelu_pytorch_tanh"})
        cfg = {"architectures": ["SiglipModel"], "model_type": "siglip"}
    cfg.update({"text_config": text_cfg, "vision_config": vision_config(a, tower, nested=True),
                "torch_dtype": {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[a.dtype],
                "transformers_version": "4.40.0"})
    write_folder(a, tensors, cfg, preprocessor_config(a, tower))


def llava_folder(a, gen):
    tower = a.tower
    decoder = dec.state_dict(a, gen)
    vision = [] if a.no_tower else vision_tensors(a, tower, gen)
    if vision and a.position_ids and tower == "clip":  # a buffer older transformers saved
        g0 = a.image_size // a.patch
        vision.append(("embeddings.position_ids", torch.arange(g0 * g0 + 1)[None]))
    d, dv = a.hidden, a.vhidden
    projector = [(0, "weight", 0.1 * torch.randn(d, dv, generator=gen)), (0, "bias", 0.1 * torch.randn(d, generator=gen)),
                 (2, "weight", 0.1 * torch.randn(d, d, generator=gen)), (2, "bias", 0.1 * torch.randn(d, generator=gen))]
    tensors = []
    llama = dec.config_json(argparse.Namespace(**{**vars(a), "config": []}))  # --config is top level
    if a.kind == "llava_orig":
        tensors += decoder
        tensors += [(f"model.mm_projector.{i}.{w}", t) for i, w, t in projector]
        tensors += [("model.vision_tower.vision_tower.vision_model." + n, t) for n, t in vision]
        cfg = dict(llama)
        cfg.update({
            "architectures": ["LlavaLlamaForCausalLM"], "model_type": "llava",
            "mm_hidden_size": dv, "mm_projector_type": "mlp2x_gelu", "mm_vision_select_layer": a.feature_layer,
            "mm_vision_select_feature": "patch", "mm_vision_tower": "openai/clip-vit-large-patch14-336",
            "mm_patch_merge_type": "flat", "mm_use_im_start_end": False, "mm_use_im_patch_token": False,
            "image_aspect_ratio": a.aspect, "freeze_mm_mlp_adapter": False, "tune_mm_mlp_adapter": False,
            "use_mm_proj": True, "tokenizer_padding_side": "right", "tokenizer_model_max_length": 2048})
    else:
        new = a.kind == "llava_new"
        for n, t in decoder:
            if n == "lm_head.weight":
                tensors.append(("lm_head.weight" if new else "language_model.lm_head.weight", t))
            else:  # model.X
                tensors.append((("model.language_model." + n[len("model."):]) if new else "language_model." + n, t))
        pre = "model." if new else ""
        tensors += [(pre + f"multi_modal_projector.linear_{1 if i == 0 else 2}.{w}", t) for i, w, t in projector]
        tensors += [(pre + "vision_tower.vision_model." + n, t) for n, t in vision]
        text = dict(llama)
        del text["architectures"]
        cfg = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "ignore_index": -100,
               "image_token_index": a.image_token, "projector_hidden_act": "gelu",
               "vision_feature_layer": a.feature_layer,
               "vision_feature_select_strategy": "default" if tower == "clip" else "full",
               "image_seq_length": (a.image_size // a.patch) ** 2, "multimodal_projector_bias": True,
               "tie_word_embeddings": a.tied, "text_config": text,
               "vision_config": vision_config(a, tower, nested=True), "torch_dtype": llama["torch_dtype"],
               "transformers_version": "4.52.0" if new else "4.40.0"}
    # The original layout keeps no image processor: it is the tower's (model.vision.init).
    write_folder(a, tensors, cfg, None if a.kind == "llava_orig" else preprocessor_config(a, tower))
    if a.tokenizer:
        dec.train_tokenizer(a.out)
        if a.kind != "llava_orig":  # llava-hf appends <image> and <pad> to Llama's pieces
            with open(os.path.join(a.out, "added_tokens.json"), "w") as f:
                json.dump({"<image>": a.image_token, "<pad>": a.image_token + 1}, f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("kind", choices=["clip_vision", "clip", "siglip_vision", "siglip", "llava_orig", "llava_hf",
                                     "llava_new"])
    ap.add_argument("--tower", default="clip", choices=["clip", "siglip"])
    ap.add_argument("--no-tower", action="store_true")
    ap.add_argument("--vhidden", type=int, default=32)
    ap.add_argument("--vheads", type=int, default=4)
    ap.add_argument("--vlayers", type=int, default=3)
    ap.add_argument("--vffn", type=int, default=64)
    ap.add_argument("--patch", type=int, default=4)
    ap.add_argument("--image-size", type=int, default=16)
    ap.add_argument("--veps", type=float)
    ap.add_argument("--image-mean", type=floats)
    ap.add_argument("--image-std", type=floats)
    ap.add_argument("--aspect", default="pad", choices=["pad", "square"])
    ap.add_argument("--feature-layer", type=int, default=-2)
    ap.add_argument("--image-token", type=int, default=300)
    ap.add_argument("--position-ids", action="store_true")
    ap.add_argument("--vision-config", action="append", default=[])
    # The decoder's options, as make_hf_fixture.py names them.
    dec.add_decoder_options(ap, ["llama", "mistral"])
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(a.seed)
    if a.kind.startswith("llava"):
        llava_folder(a, gen)
    else:
        tower_folder(a, gen)


if __name__ == "__main__":
    main()
