#!/usr/bin/python3
"""An independent implementation of Hugging Face's Llama-family decoders, written from the
definitions in transformers' modeling_llama.py / modeling_qwen2.py (LlamaRMSNorm computing in
fp32, rotate_half RoPE with cos/sin of cat(freqs, freqs), repeat_kv for grouped-query
attention, SiLU-gated MLP, q/k/v biases for Qwen2), not from dhp's C++. It reads a checkpoint
folder with its own safetensors reader, runs one sequence of token ids, and writes the logits,
the mean next-token loss and the gradient of every tensor under its Hugging Face name.

Usage: hf_llama_ref.py CHECKPOINT_DIR TOKENS.json OUT_DIR [--interleaved-rope] [--eps X]
  TOKENS.json: [id, ...], one document; every position but the last predicts the next id.
  OUT_DIR/loss.json {"loss": L}, OUT_DIR/logits.bin (T, V) fp32,
  OUT_DIR/grads.safetensors (F32, Hugging Face names).
--interleaved-rope pairs (x[2i], x[2i+1]) instead (GPT-J / Meta's original layout) and --eps
replaces config.json's rms_norm_eps: negative controls that dhp must not match.
"""
import argparse
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

from make_hf_fixture import write_safetensors

TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = bytearray(data[8 + n + b:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=TORCH[e["dtype"]]).reshape(e["shape"]).float()
    return out


def read_checkpoint(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state = {}
    for f in files:
        state.update(read_safetensors(os.path.join(d, f)))
    return state


class LlamaRMSNorm:
    def __init__(self, weight, eps):
        self.weight, self.eps = weight, eps

    def __call__(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        return self.weight * hidden_states.to(input_dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary_cos_sin(head_dim, theta, positions):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary_pos_emb(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def apply_interleaved(x, head_dim, theta, positions):
    """The pairing HF's checkpoints do not use: (x[2i], x[2i+1]) rotated by frequency i."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    ang = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.flatten(-2)


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def forward(P, c, ids, eps, interleaved, embeds=None):
    """embeds (1, T, d): the input embeddings when given (LLaVA's, with image features
    scattered in), else the rows of ids."""
    d, H = c["hidden_size"], c["num_attention_heads"]
    Hkv = c.get("num_key_value_heads", H)
    hd = c.get("head_dim") or d // H
    theta = c.get("rope_theta", 10000.0)
    T = len(ids)
    positions = torch.arange(T)
    cos, sin = rotary_cos_sin(hd, theta, positions)
    x = P["model.embed_tokens.weight"][torch.tensor(ids)][None] if embeds is None else embeds  # (1, T, d)
    mask = torch.full((T, T), float("-inf")).triu(1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        def lin(t, name):
            y = t @ P[p + name + ".weight"].T
            bias = P.get(p + name + ".bias")
            return y + bias if bias is not None else y
        residual = x
        h = LlamaRMSNorm(P[p + "input_layernorm.weight"], eps)(x)
        q = lin(h, "self_attn.q_proj").view(1, T, H, hd).transpose(1, 2)
        k = lin(h, "self_attn.k_proj").view(1, T, Hkv, hd).transpose(1, 2)
        v = lin(h, "self_attn.v_proj").view(1, T, Hkv, hd).transpose(1, 2)
        if interleaved:
            q = apply_interleaved(q, hd, theta, positions)
            k = apply_interleaved(k, hd, theta, positions)
        else:
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd) + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32)
        a = torch.matmul(w, v).transpose(1, 2).reshape(1, T, H * hd)
        x = residual + a @ P[p + "self_attn.o_proj.weight"].T
        residual = x
        h = LlamaRMSNorm(P[p + "post_attention_layernorm.weight"], eps)(x)
        m = (F.silu(h @ P[p + "mlp.gate_proj.weight"].T) * (h @ P[p + "mlp.up_proj.weight"].T))
        x = residual + m @ P[p + "mlp.down_proj.weight"].T
    x = LlamaRMSNorm(P["model.norm.weight"], eps)(x)
    head = P["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else P["lm_head.weight"]
    return (x @ head.T)[0]  # (T, V)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("tokens")
    ap.add_argument("out")
    ap.add_argument("--interleaved-rope", action="store_true")
    ap.add_argument("--eps", type=float)
    a = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    c = json.load(open(os.path.join(a.ckpt, "config.json")))
    P = {k: v.requires_grad_(True) for k, v in read_checkpoint(a.ckpt).items() if not k.endswith("inv_freq")}
    ids = json.load(open(a.tokens))
    eps = a.eps if a.eps is not None else c.get("rms_norm_eps", 1e-6)
    logits = forward(P, c, ids, eps, a.interleaved_rope)
    loss = F.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    loss.backward()
    os.makedirs(a.out, exist_ok=True)
    json.dump({"loss": loss.item()}, open(os.path.join(a.out, "loss.json"), "w"))
    logits.detach().numpy().astype("float32").tofile(os.path.join(a.out, "logits.bin"))
    grads = [(k, "F32", tuple(v.shape), v.grad.detach().contiguous().numpy().astype("float32").tobytes())
             for k, v in sorted(P.items())]
    write_safetensors(os.path.join(a.out, "grads.safetensors"), grads)


if __name__ == "__main__":
    main()
