#!/usr/bin/python3
"""Makes tiny random checkpoints in the exact layout of Hugging Face's Llama-family models
(config.json, model.safetensors or shards with model.safetensors.index.json), without
transformers and without network access, for tests/test_hf.cpp.

Usage:
  make_hf_fixture.py OUT [--arch llama|mistral|qwen2] [--hidden 32] [--heads 4] [--kv 2]
      [--layers 2] [--ffn 48] [--vocab 320] [--tied] [--dtype f32|bf16|f16] [--shards N]
      [--eps 1e-5] [--theta 500] [--seed 1] [--std 0.02] [--tokenizer]
      [--drop NAME] [--extra NAME] [--transpose NAME] [--wrong-dtype NAME] [--config KEY=JSON]

Tensor names and shapes follow transformers' LlamaForCausalLM / MistralForCausalLM /
Qwen2ForCausalLM state dicts: model.embed_tokens.weight (V, d), model.layers.{i}.* with
Linear weights (out_features, in_features), q/k/v biases for Qwen2, model.norm.weight,
lm_head.weight unless tie_word_embeddings. --tokenizer trains a SentencePiece model with
Llama's special ids (unk 0, bos 1, eos 2, no pad) and byte fallback.
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


def state_dict(a, gen):
    d, hd = a.hidden, a.hidden // a.heads
    names = [("model.embed_tokens.weight", (a.vocab, d), a.std)]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        names += [
            (p + "input_layernorm.weight", (d,), "norm"),
            (p + "self_attn.q_proj.weight", (a.heads * hd, d), a.std),
            (p + "self_attn.k_proj.weight", (a.kv * hd, d), a.std),
            (p + "self_attn.v_proj.weight", (a.kv * hd, d), a.std),
        ]
        if a.arch == "qwen2":
            names += [
                (p + "self_attn.q_proj.bias", (a.heads * hd,), a.std * 5),
                (p + "self_attn.k_proj.bias", (a.kv * hd,), a.std * 5),
                (p + "self_attn.v_proj.bias", (a.kv * hd,), a.std * 5),
            ]
        names += [
            (p + "self_attn.o_proj.weight", (d, a.heads * hd), a.std),
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
        else:
            t = std * torch.randn(shape, generator=gen)
        out.append((name, t))
    return out


def config_json(a):
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
        "max_position_embeddings": 2048,
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
        c.update({"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1, "head_dim": a.hidden // a.heads})
    if a.arch == "mistral":
        c["sliding_window"] = 4096
    if a.arch == "qwen2":
        c.update({"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": a.layers})
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
    add_decoder_options(ap, ["llama", "mistral", "qwen2"])
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--transpose", action="append", default=[])
    ap.add_argument("--wrong-dtype", action="append", default=[])
    a = ap.parse_args()
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
        json.dump(config_json(a), f, indent=2)
    if a.tokenizer:
        train_tokenizer(a.out)


if __name__ == "__main__":
    main()
