#!/usr/bin/python3
"""Makes tiny random checkpoints in the exact layout of Hugging Face's Llama-family models
(config.json, model.safetensors or shards with model.safetensors.index.json), without
transformers and without network access, for tests/test_hf.cpp.

Usage:
  make_hf_fixture.py OUT [--arch llama|mistral|qwen2|qwen3] [--hidden 32] [--heads 4] [--kv 2]
      [--layers 2] [--ffn 48] [--vocab 320] [--tied] [--dtype f32|bf16|f16] [--shards N]
      [--eps 1e-5] [--theta 500] [--seed 1] [--std 0.02] [--tokenizer]
      [--drop NAME] [--extra NAME] [--transpose NAME] [--wrong-dtype NAME] [--config KEY=JSON]
      [--head-dim N] [--attention-bias] [--max-pos 2048] [--rope-parameters]
      [--rope-scaling none|llama3] [--rope-factor 8] [--rope-low-freq-factor 1]
      [--rope-high-freq-factor 4] [--rope-original-max-pos 64]

Tensor names and shapes follow transformers' LlamaForCausalLM / MistralForCausalLM /
Qwen2ForCausalLM / Qwen3ForCausalLM state dicts: model.embed_tokens.weight (V, d),
model.layers.{i}.* with Linear weights (out_features, in_features), q/k/v biases for Qwen2,
q/k/v/o biases with --attention-bias (llama, qwen3), model.layers.{i}.self_attn.q_norm.weight
and k_norm.weight (head_dim,) for Qwen3, model.norm.weight, lm_head.weight unless
tie_word_embeddings. --head-dim sets head_dim apart from hidden/heads (llama, qwen3).
--rope-scaling llama3 writes Llama-3.1's rope_scaling block (llama only). --rope-parameters
writes the RoPE settings the way transformers 5 does (one "rope_parameters" object holding
rope_theta, rope_type and the scaling keys) instead of rope_theta + rope_scaling.
Fixtures of the new options (qwen3, llama3 RoPE, --rope-parameters) write config.json as
save_pretrained does (sorted keys, trailing newline); the older ones keep their exact bytes.
--tokenizer trains a SentencePiece model with Llama's special ids (unk 0, bos 1, eos 2, no
pad) and byte fallback.
"""
import argparse
import json
import os
import struct

import numpy as np
import torch

DTYPES = {"f32": ("F32", torch.float32), "bf16": ("BF16", torch.bfloat16), "f16": ("F16", torch.float16)}


def tensor_bytes(t, st_dtype):
    """Little-endian bytes of a tensor already in its storage dtype."""
    t = t.contiguous()
    if st_dtype == "BF16":
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, st_dtype, shape, bytes). Header padded to 8 bytes, as the
    reference implementation does."""
    header, offset = {}, 0
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    header["__metadata__"] = metadata or {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, raw in tensors:
            f.write(raw)


def head_dim_of(a):
    """--head-dim, else hidden/heads. getattr: make_hf_llava_fixture.py's namespaces lack it."""
    return getattr(a, "head_dim", None) or a.hidden // a.heads


def rope_scaling_of(a):
    """The rope_scaling block of config.json, None without --rope-scaling llama3.

    The defaults (factor 8, low 1, high 4, as Llama-3.1) keep Meta's factors but shrink
    original_max_position_embeddings from 8192 to 64, else the scaling would be a no-op here:
    llama3 scaling leaves every frequency whose wavelength 2*pi/inv_freq is below
    original/high_freq_factor untouched, and with head_dim 8, theta 500 the wavelengths are
    6.3, 29.7, 140.5 and 664.5 positions, all far below 8192/4. With 64 they straddle both
    bounds (16 and 64): 6.3 stays, 29.7 is smoothed (smooth factor 0.385, inv_freq x0.462), 140.5
    and 664.5 are divided by 8, so every branch of the formula is exercised, and over the tests'
    15 positions the rotation of the 29.7 band moves by up to 1.6 rad.
    """
    if getattr(a, "rope_scaling", "none") != "llama3":
        return None
    return {"factor": a.rope_factor, "high_freq_factor": a.rope_high_freq_factor,
            "low_freq_factor": a.rope_low_freq_factor,
            "original_max_position_embeddings": a.rope_original_max_pos, "rope_type": "llama3"}


def state_dict(a, gen):
    d, hd = a.hidden, head_dim_of(a)
    bias = getattr(a, "attention_bias", False)  # q/k/v/o biases of LlamaAttention/Qwen3Attention
    names = [("model.embed_tokens.weight", (a.vocab, d), a.std)]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        names += [
            (p + "input_layernorm.weight", (d,), "norm"),
            (p + "self_attn.q_proj.weight", (a.heads * hd, d), a.std),
            (p + "self_attn.k_proj.weight", (a.kv * hd, d), a.std),
            (p + "self_attn.v_proj.weight", (a.kv * hd, d), a.std),
        ]
        if a.arch == "qwen2" or bias:
            names += [
                (p + "self_attn.q_proj.bias", (a.heads * hd,), a.std * 5),
                (p + "self_attn.k_proj.bias", (a.kv * hd,), a.std * 5),
                (p + "self_attn.v_proj.bias", (a.kv * hd,), a.std * 5),
            ]
        names.append((p + "self_attn.o_proj.weight", (d, a.heads * hd), a.std))
        if bias:
            names.append((p + "self_attn.o_proj.bias", (d,), a.std * 5))
        if a.arch == "qwen3":
            names += [
                (p + "self_attn.q_norm.weight", (hd,), "qknorm"),
                (p + "self_attn.k_norm.weight", (hd,), "qknorm"),
            ]
        names += [
            (p + "post_attention_layernorm.weight", (d,), "norm"),
            (p + "mlp.gate_proj.weight", (a.ffn, d), a.std),
            (p + "mlp.up_proj.weight", (a.ffn, d), a.std),
            (p + "mlp.down_proj.weight", (d, a.ffn), a.std),
        ]
    names.append(("model.norm.weight", (d,), "norm"))
    if not a.tied:
        names.append(("lm_head.weight", (a.vocab, d), a.std))
    out = []
    for name, shape, std in names:
        if std == "norm":  # norm weights near 1, not exactly: a wrong pairing must show
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif std == "qknorm":  # in [0.5, 2): far from all ones (leaving the norms' weights out
            # shows) and uneven across each head's halves (q-norm after RoPE shows)
            t = 0.5 + 1.5 * torch.rand(shape, generator=gen)
        else:
            t = std * torch.randn(shape, generator=gen)
        out.append((name, t))
    return out


TORCH_DTYPE = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def qwen3_config_json(a):
    """The keys Qwen3Config.save_pretrained writes (transformers 4.51-4.52, the version of the
    published Qwen3 checkpoints): every Qwen3-specific attribute, defaults included, so
    head_dim, rope_theta, rope_scaling (null), attention_bias, sliding_window (null unless
    use_sliding_window), max_window_layers are always there. 4.53+ add "layer_types" (a list of
    "full_attention"/"sliding_attention"); pass it with --config when wanted."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": bool(getattr(a, "attention_bias", False)),
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": head_dim_of(a),
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "intermediate_size": a.ffn,
        "max_position_embeddings": getattr(a, "max_pos", None) or 2048,
        "max_window_layers": a.layers,
        "model_type": "qwen3",
        "num_attention_heads": a.heads,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv,
        "rms_norm_eps": a.eps,
        "rope_scaling": rope_scaling_of(a),
        "rope_theta": a.theta,
        "sliding_window": None,
        "tie_word_embeddings": a.tied,
        "torch_dtype": TORCH_DTYPE[a.dtype],
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": a.vocab,
    }


def config_json(a):
    if a.arch == "qwen3":
        return finish_config(a, qwen3_config_json(a))
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}[a.arch]
    c = {
        "architectures": [arch],
        "model_type": a.arch,
        "hidden_size": a.hidden,
        "intermediate_size": a.ffn,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv,
        "hidden_act": "silu",
        "max_position_embeddings": getattr(a, "max_pos", None) or 2048,
        "initializer_range": 0.02,
        "rms_norm_eps": a.eps,
        "rope_theta": a.theta,
        "rope_scaling": None,
        "tie_word_embeddings": a.tied,
        "vocab_size": a.vocab,
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[a.dtype],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_cache": True,
        "transformers_version": "4.40.0",
    }
    if a.arch == "llama":
        c.update({"attention_bias": bool(getattr(a, "attention_bias", False)), "mlp_bias": False,
                  "pretraining_tp": 1, "head_dim": head_dim_of(a)})
        if rope_scaling_of(a) is not None:  # as Llama-3.1/3.2's config.json
            c.update({"rope_scaling": rope_scaling_of(a), "attention_dropout": 0.0,
                      "transformers_version": "4.45.0"})
    if a.arch == "mistral":
        c["sliding_window"] = 4096
    if a.arch == "qwen2":
        c.update({"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": a.layers})
    return finish_config(a, c)


def finish_config(a, c):
    if getattr(a, "rope_parameters", False):  # transformers 5: rope_theta moves into the block
        block = dict(c.pop("rope_scaling") or {"rope_type": "default"})
        block["rope_theta"] = c.pop("rope_theta")
        c["rope_parameters"] = dict(sorted(block.items()))
    for kv in a.config:
        k, v = kv.split("=", 1)
        c[k] = json.loads(v)
    return c


def train_tokenizer(out):
    import sentencepiece as spm
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "red", "blue", "image", "shows",
             "what", "is", "in", "picture", "there", "are", "two", "birds", "tree", "sky"]
    rng = np.random.default_rng(3)
    lines = [" ".join(rng.choice(words, size=8)) for _ in range(400)]
    corpus = os.path.join(out, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("\n".join(lines) + "\n")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(out, "tokenizer"), vocab_size=300,
        model_type="bpe", byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, num_threads=1)
    os.remove(corpus)
    os.remove(os.path.join(out, "tokenizer.vocab"))


def add_decoder_options(ap, archs):
    """The decoder's options, shared with make_hf_llava_fixture.py."""
    ap.add_argument("--arch", default="llama", choices=archs)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=48)
    ap.add_argument("--vocab", type=int, default=320)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--dtype", default="f32", choices=list(DTYPES))
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--theta", type=float, default=500.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--tokenizer", action="store_true")
    ap.add_argument("--drop", action="append", default=[])
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--config", action="append", default=[])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    add_decoder_options(ap, ["llama", "mistral", "qwen2", "qwen3"])
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--transpose", action="append", default=[])
    ap.add_argument("--wrong-dtype", action="append", default=[])
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--attention-bias", action="store_true")
    ap.add_argument("--max-pos", type=int)
    ap.add_argument("--rope-parameters", action="store_true")
    ap.add_argument("--rope-scaling", default="none", choices=["none", "llama3"])
    ap.add_argument("--rope-factor", type=float, default=8.0)
    ap.add_argument("--rope-low-freq-factor", type=float, default=1.0)
    ap.add_argument("--rope-high-freq-factor", type=float, default=4.0)
    ap.add_argument("--rope-original-max-pos", type=int, default=64)
    a = ap.parse_args()
    if a.arch == "qwen3" and a.rope_scaling != "none":
        ap.error("--rope-scaling llama3 is Llama-3's; Qwen3 checkpoints do not use it")
    if a.attention_bias and a.arch not in ("llama", "qwen3"):
        ap.error("--attention-bias is for llama and qwen3 (qwen2 always has q/k/v biases)")
    if a.head_dim and a.arch not in ("llama", "qwen3"):
        ap.error("--head-dim is for llama and qwen3")
    if a.head_dim and a.head_dim % 2:
        ap.error("--head-dim must be even (RoPE rotates pairs)")
    os.makedirs(a.out, exist_ok=True)
    gen = torch.Generator().manual_seed(a.seed)
    st_dtype, torch_dtype = DTYPES[a.dtype]
    tensors = []
    for name, t in state_dict(a, gen):
        if name in a.drop:
            continue
        if name in a.transpose:
            t = t.t().contiguous()
        if name in a.wrong_dtype:  # the same values as 32-bit integers
            tensors.append((name, "I32", t.shape, t.to(torch.int32).numpy().tobytes()))
            continue
        t = t.to(torch_dtype)
        tensors.append((name, st_dtype, t.shape, tensor_bytes(t, st_dtype)))
    for name in a.extra:
        t = torch.randn(4, generator=gen).to(torch_dtype)
        tensors.append((name, st_dtype, t.shape, tensor_bytes(t, st_dtype)))
    if a.shards == 1:
        write_safetensors(os.path.join(a.out, "model.safetensors"), tensors)
    else:
        per = (len(tensors) + a.shards - 1) // a.shards
        weight_map, total = {}, 0
        for s in range(a.shards):
            part = tensors[s * per:(s + 1) * per]
            fname = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
            write_safetensors(os.path.join(a.out, fname), part)
            for name, _, _, raw in part:
                weight_map[name] = fname
                total += len(raw)
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        if a.arch == "qwen3" or a.rope_scaling != "none" or a.rope_parameters:
            f.write(json.dumps(config_json(a), indent=2, sort_keys=True) + "\n")  # as save_pretrained
        else:
            json.dump(config_json(a), f, indent=2)  # the bytes the older fixtures always had
    if a.tokenizer:
        train_tokenizer(a.out)


if __name__ == "__main__":
    main()
