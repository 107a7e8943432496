#!/usr/bin/python3
"""An independent implementation of Hugging Face's Llama-family decoders, written from the
definitions in transformers' modeling_llama.py / modeling_qwen2.py / modeling_qwen3.py and
modeling_rope_utils.py (LlamaRMSNorm computing in fp32, rotate_half RoPE with cos/sin of
cat(freqs, freqs), repeat_kv for grouped-query attention, SiLU-gated MLP, q/k/v biases for
Qwen2, Qwen3's per-head q_norm/k_norm before RoPE, Llama-3.1's "llama3" inv_freq scaling), not
from dhp's C++. It reads a checkpoint folder with its own safetensors reader, runs one sequence
of token ids, and writes the logits, the mean next-token loss and the gradient of every tensor
under its Hugging Face name. The family comes from config.json (model_type / architectures).

Usage: hf_llama_ref.py CHECKPOINT_DIR TOKENS.json OUT_DIR [--interleaved-rope] [--eps X]
          [--no-qk-norm] [--qk-norm-after-rope] [--no-rope-scaling]
  TOKENS.json: [id, ...], one document; every position but the last predicts the next id.
  OUT_DIR/loss.json {"loss": L}, OUT_DIR/logits.bin (T, V) fp32,
  OUT_DIR/grads.safetensors (F32, Hugging Face names; a tensor a negative control leaves
  unused gets zeros).
--interleaved-rope pairs (x[2i], x[2i+1]) instead (GPT-J / Meta's original layout), --eps
replaces config.json's rms_norm_eps (every norm, q_norm/k_norm included), --no-qk-norm leaves
Qwen3's q_norm/k_norm out, --qk-norm-after-rope applies them after RoPE instead of before, and
--no-rope-scaling ignores rope_scaling (plain inv_freq): negative controls dhp must not match.

RoPE: rope_theta + rope_scaling (transformers 4) or one rope_parameters object (transformers 5);
rope_type "default" and "llama3" only (attention_scaling 1 for both); any other type (yarn,
linear, dynamic, longrope) is refused rather than computed wrongly. Qwen3's sliding-window
layers (use_sliding_window, max_window_layers, or layer_types) follow transformers >= 4.53:
key j is seen from query i iff i - sliding_window < j <= i. Mistral's and Qwen2's windows are
ignored, as before (the fixtures' 4096 exceeds any test sequence).
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


def is_qwen3(c):
    return c.get("model_type") == "qwen3" or "Qwen3ForCausalLM" in c.get("architectures", [])


def rope_settings(c):
    """(rope_theta, the scaling block or None) from either config.json generation."""
    block = c.get("rope_parameters")
    if block is not None:  # transformers 5
        return block.get("rope_theta", c.get("rope_theta", 10000.0)), block
    return c.get("rope_theta", 10000.0), c.get("rope_scaling")


def rope_type_of(block):
    if not block:
        return "default"
    return block.get("rope_type", block.get("type", "default"))  # "type": the older spelling


def default_inv_freq(head_dim, theta):
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def llama3_inv_freq(inv_freq, block):
    """Llama-3.1's frequency-dependent scaling (transformers' _compute_llama3_parameters):
    with wavelen = 2*pi/f, lo_wl = original/low_freq_factor, hi_wl = original/high_freq_factor,
    f stays where wavelen < hi_wl, becomes f/factor where wavelen > lo_wl, and in between
    (1 - s) * f / factor + s * f with s = (original/wavelen - low_freq_factor) /
    (high_freq_factor - low_freq_factor). The cos/sin scale (attention_scaling) is 1."""
    factor = block["factor"]
    low, high = block["low_freq_factor"], block["high_freq_factor"]
    original = block["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    long_wave = wavelen > original / low
    short_wave = wavelen < original / high
    scaled = torch.where(long_wave, inv_freq / factor, inv_freq)
    s = (original / wavelen - low) / (high - low)
    blended = (1 - s) * scaled / factor + s * scaled
    return torch.where(~short_wave & ~long_wave, blended, scaled)


def rope_inv_freq(c, head_dim, scaling=True):
    """inv_freq (head_dim/2,) as the model's rotary embedding computes it."""
    theta, block = rope_settings(c)
    inv_freq = default_inv_freq(head_dim, theta)
    kind = rope_type_of(block)
    if kind == "default" or not scaling:
        return inv_freq
    if kind == "llama3":
        return llama3_inv_freq(inv_freq, block)
    raise SystemExit(f"hf_llama_ref.py: rope_type '{kind}' is not implemented (default and llama3 are)")


def rotary_cos_sin(head_dim, theta, positions, inv_freq=None):
    if inv_freq is None:
        inv_freq = default_inv_freq(head_dim, theta)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()  # attention_scaling 1 (default and llama3)


def apply_rotary_pos_emb(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def apply_interleaved(x, head_dim, theta, positions, inv_freq=None):
    """The pairing HF's checkpoints do not use: (x[2i], x[2i+1]) rotated by frequency i."""
    if inv_freq is None:
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


def head_dim_of(c):
    if is_qwen3(c):  # Qwen3Attention reads config.head_dim; Qwen3Config's default is 128
        return c.get("head_dim", 128)
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def sliding_layers(c):
    """The layers with a sliding window (Qwen3 only), as transformers >= 4.53 picks them."""
    # Qwen3Config keeps sliding_window only with use_sliding_window (default 4096 when absent)
    window = c.get("sliding_window", 4096) if c.get("use_sliding_window", False) else None
    if not is_qwen3(c) or window is None:
        return set()
    if c.get("layer_types"):
        return {i for i, t in enumerate(c["layer_types"]) if t == "sliding_attention"}
    return {i for i in range(c["num_hidden_layers"]) if i >= c.get("max_window_layers", 28)}


def forward(P, c, ids, eps, interleaved, embeds=None, qk_norm="before", rope_scaling=True):
    """embeds (1, T, d): the input embeddings when given (LLaVA's, with image features
    scattered in), else the rows of ids. qk_norm "before" (HF), "after" RoPE or "none", and
    rope_scaling False are negative controls; both only act on Qwen3 / scaled-RoPE configs."""
    d, H = c["hidden_size"], c["num_attention_heads"]
    Hkv = c.get("num_key_value_heads", H)
    hd = head_dim_of(c)
    theta, _ = rope_settings(c)
    qwen3 = is_qwen3(c)
    bias_o = bool(c.get("attention_bias", False))  # LlamaAttention/Qwen3Attention: o_proj too
    if qwen3 and not bias_o and any(k.endswith("_proj.bias") for k in P):
        raise SystemExit("hf_llama_ref.py: Qwen3 with attention_bias false has no projection biases")
    T = len(ids)
    positions = torch.arange(T)
    inv_freq = rope_inv_freq(c, hd, rope_scaling)
    cos, sin = rotary_cos_sin(hd, theta, positions, inv_freq)
    x = P["model.embed_tokens.weight"][torch.tensor(ids)][None] if embeds is None else embeds  # (1, T, d)
    mask = torch.full((T, T), float("-inf")).triu(1)
    sliding = sliding_layers(c)
    if sliding:
        window = c.get("sliding_window", 4096)
        qi, kj = torch.arange(T)[:, None], torch.arange(T)[None, :]
        sliding_mask = mask.masked_fill(kj <= qi - window, float("-inf"))
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        def lin(t, name):
            y = t @ P[p + name + ".weight"].T
            bias = P.get(p + name + ".bias")
            return y + bias if bias is not None else y
        residual = x
        h = LlamaRMSNorm(P[p + "input_layernorm.weight"], eps)(x)
        q = lin(h, "self_attn.q_proj").view(1, T, H, hd)
        k = lin(h, "self_attn.k_proj").view(1, T, Hkv, hd)
        v = lin(h, "self_attn.v_proj").view(1, T, Hkv, hd).transpose(1, 2)
        q_norm = k_norm = None
        if qwen3 and qk_norm != "none":  # RMSNorm over each head's head_dim, rms_norm_eps
            q_norm = LlamaRMSNorm(P[p + "self_attn.q_norm.weight"], eps)
            k_norm = LlamaRMSNorm(P[p + "self_attn.k_norm.weight"], eps)
        if q_norm is not None and qk_norm == "before":
            q, k = q_norm(q), k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        if interleaved:
            q = apply_interleaved(q, hd, theta, positions, inv_freq)
            k = apply_interleaved(k, hd, theta, positions, inv_freq)
        else:
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if q_norm is not None and qk_norm == "after":
            q, k = q_norm(q), k_norm(k)
        k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd) + (sliding_mask if i in sliding else mask)
        w = F.softmax(w, dim=-1, dtype=torch.float32)
        a = torch.matmul(w, v).transpose(1, 2).reshape(1, T, H * hd)
        o = a @ P[p + "self_attn.o_proj.weight"].T
        x = residual + (o + P[p + "self_attn.o_proj.bias"] if bias_o else o)
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
    ap.add_argument("--no-qk-norm", action="store_true")
    ap.add_argument("--qk-norm-after-rope", action="store_true")
    ap.add_argument("--no-rope-scaling", action="store_true")
    a = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    c = json.load(open(os.path.join(a.ckpt, "config.json")))
    P = {k: v.requires_grad_(True) for k, v in read_checkpoint(a.ckpt).items() if not k.endswith("inv_freq")}
    ids = json.load(open(a.tokens))
    eps = a.eps if a.eps is not None else c.get("rms_norm_eps", 1e-6)
    qk_norm = "none" if a.no_qk_norm else "after" if a.qk_norm_after_rope else "before"
    logits = forward(P, c, ids, eps, a.interleaved_rope, qk_norm=qk_norm, rope_scaling=not a.no_rope_scaling)
    loss = F.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    loss.backward()
    os.makedirs(a.out, exist_ok=True)
    json.dump({"loss": loss.item()}, open(os.path.join(a.out, "loss.json"), "w"))
    logits.detach().numpy().astype("float32").tofile(os.path.join(a.out, "logits.bin"))
    def grad(v):  # None only for a tensor a negative control left out
        g = v.grad if v.grad is not None else torch.zeros_like(v)
        return g.detach().contiguous().numpy().astype("float32").tobytes()
    grads = [(k, "F32", tuple(v.shape), grad(v)) for k, v in sorted(P.items())]
    write_safetensors(os.path.join(a.out, "grads.safetensors"), grads)


if __name__ == "__main__":
    main()
