#!/usr/bin/python3
"""Self-check of make_hf_fixture.py and hf_llama_ref.py (Qwen3 and Llama-3 RoPE scaling).

  (a) the older fixtures (Llama, Mistral, Qwen2, LLaVA decoders) come out byte for byte as the
      scripts of --orig-rev wrote them, and the reference's outputs on them (default flags,
      --interleaved-rope, --eps) are bitwise those of the reference of --orig-rev; the new
      negative-control flags change nothing there;
  (b) on Qwen3 and Llama-3 fixtures every negative control moves the loss by more than 10x 1e-5
      relative and the last position's logits by more than 10x 1e-4 (max |diff| / max |ref|,
      as tests/test_hf.cpp measures), printed; the transformers-5 config form gives the same
      outputs; q_norm/k_norm get gradients; Qwen3's sliding window acts only when it is shorter
      than the sequence;
  (c) hand checks: the llama3 inv_freq of the fixture from a separate float64 formula (all
      three branches hit), and q_norm on one head at one position, taken before RoPE.

Usage: check_hf_decoder_refs.py [--orig-rev REV | --orig DIR] [--work DIR]  (~2 min, 2 cores)
  REV (default: the newest commit whose make_hf_fixture.py has no qwen3) gives the original
  scripts via git show; DIR holds copies of them instead. Exit 0 when every check passes.
"""
import argparse
import filecmp
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_llama_ref as ref  # noqa: E402

PY = "/usr/bin/python3"


def default_orig_rev():
    """The newest commit whose make_hf_fixture.py knows no Qwen3: the scripts as they were
    before Qwen3 and Llama-3 RoPE scaling (40ade65 in this history), found again after the new
    scripts are committed. None outside a git checkout."""
    r = subprocess.run(["git", "-C", HERE, "log", "--format=%H", "--", "make_hf_fixture.py"],
                       capture_output=True, text=True)
    for rev in r.stdout.split() if r.returncode == 0 else []:
        old = subprocess.run(["git", "-C", HERE, "show", f"{rev}:tests/reference/make_hf_fixture.py"],
                             capture_output=True, text=True)
        if old.returncode == 0 and "qwen3" not in old.stdout:
            return rev
    return None
TOKENS = [1, 5, 9, 33, 200, 17, 3, 99, 250, 7, 64, 12, 301, 45, 2]  # tests/test_hf.cpp's kTokens
LOSS_TOL, LOGITS_TOL = 1e-5, 1e-4

# The older fixtures: tests/test_hf.cpp, tests/mpi_hf_llava*.sh.
OLD_FIXTURES = {
    "mha": "--heads 4 --kv 4",
    "gqa_tied_bf16": "--kv 2 --tied --dtype bf16",
    "qwen2": "--arch qwen2 --kv 2",
    "sharded": "--kv 2 --shards 3 --dtype f16",
    "mistral": "--arch mistral --kv 1 --layers 3",
    "mha_transposed": "--heads 4 --kv 4 --transpose model.layers.0.self_attn.q_proj.weight",
    "extra": "--heads 4 --kv 4 --extra model.layers.0.mlp.extra.weight --drop model.layers.1.mlp.up_proj.weight",
    "wrong": "--heads 4 --kv 4 --wrong-dtype model.norm.weight --config max_position_embeddings=4096",
    "qwen2_mpi": "--arch qwen2 --hidden 64 --heads 4 --kv 2 --layers 2 --ffn 128 --vocab 300 --eps 1e-5 --dtype bf16 --seed 7",
}
OLD_RUNS = [("mha", ""), ("gqa_tied_bf16", ""), ("qwen2", ""), ("sharded", ""), ("mistral", ""),
            ("gqa_tied_bf16", "--interleaved-rope"), ("mha", "--eps 1e-6")]
NOOP_FLAGS = ["--no-qk-norm", "--qk-norm-after-rope", "--no-rope-scaling"]
LLAVA_FIXTURES = {"llava_hf_clip": "llava_hf --tower clip",
                  "llava_new_siglip": "llava_new --tower siglip --feature-layer -1 --vlayers 2"}

# Qwen3: head_dim 16 != 32/4 and tied (as Qwen3-0.6B); GQA 4:1, bf16, 3 layers, theta 1e6 (as
# the published checkpoints); q/k/v/o biases with head_dim 12.
# --std above 0.02 where needed: with 0.02 the logits are tiny and the loss stays near log(V)
# whatever the model does (the llama3 control then moves it by 7e-7 only, the q/k-norm ones by
# 1e-5 with biases); the seeds matter too, so the tests should use these arguments as they are.
NEW_FIXTURES = {
    "qwen3_hd16_tied": ("--arch qwen3 --head-dim 16 --tied --std 0.05",
                        ["--no-qk-norm", "--qk-norm-after-rope", "--interleaved-rope"]),
    "qwen3_gqa_bf16_theta1e6": ("--arch qwen3 --kv 1 --layers 3 --dtype bf16 --theta 1000000",
                                ["--no-qk-norm", "--qk-norm-after-rope", "--interleaved-rope"]),
    "qwen3_bias_hd12": ("--arch qwen3 --attention-bias --head-dim 12 --kv 2 --std 0.08",
                        ["--no-qk-norm", "--qk-norm-after-rope"]),
    "llama31": ("--rope-scaling llama3 --std 0.1", ["--no-rope-scaling", "--interleaved-rope"]),
    "llama32_tied_bf16": ("--rope-scaling llama3 --rope-factor 32 --std 0.15 --tied --dtype bf16 --hidden 64 --heads 4 --ffn 96",
                          ["--no-rope-scaling", "--interleaved-rope"]),
}
# The same checkpoints with config.json in transformers 5's form: identical outputs expected.
V5_TWINS = {"qwen3_hd16_tied_v5": "qwen3_hd16_tied", "llama31_v5": "llama31"}

failures = []


def check(ok, what):
    print(("  ok   " if ok else "  FAIL ") + what)
    if not ok:
        failures.append(what)


def run(cmd):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {cmd}\n{r.stdout}{r.stderr}")


def same_tree(a, b):
    """Every file of the two folders, byte for byte."""
    fa, fb = sorted(os.listdir(a)), sorted(os.listdir(b))
    return fa == fb and all(filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False) for f in fa)


def outputs(d):
    loss = json.load(open(os.path.join(d, "loss.json")))["loss"]
    logits = np.fromfile(os.path.join(d, "logits.bin"), dtype=np.float32).reshape(len(TOKENS), -1)
    return loss, logits


def reference(script_dir, ckpt, out, flags="", in_process=True):
    """Runs hf_llama_ref.py of script_dir; this folder's in this process unless told not to."""
    tokens = os.path.join(os.path.dirname(out), "tokens.json")
    if script_dir == HERE and in_process:
        argv = sys.argv
        sys.argv = ["hf_llama_ref.py", ckpt, tokens, out] + flags.split()
        try:
            ref.main()
        finally:
            sys.argv = argv
    else:
        run(f"{PY} {script_dir}/hf_llama_ref.py {ckpt} {tokens} {out} {flags}")
    return out


def original_scripts(a, work):
    d = os.path.join(work, "orig")
    os.makedirs(d)
    if a.orig:
        for f in ("hf_llama_ref.py", "make_hf_fixture.py"):
            shutil.copy(os.path.join(a.orig, f), d)
    elif a.orig_rev:
        for f in ("hf_llama_ref.py", "make_hf_fixture.py"):
            r = subprocess.run(["git", "-C", HERE, "show", f"{a.orig_rev}:tests/reference/{f}"],
                               capture_output=True)
            if r.returncode != 0:
                return None
            open(os.path.join(d, f), "wb").write(r.stdout)
    else:
        return None
    shutil.copy(os.path.join(HERE, "make_hf_llava_fixture.py"), d)  # unchanged; uses its neighbour
    return d


def part_a(a, work):
    print("(a) older fixtures and reference outputs against the original scripts")
    orig = original_scripts(a, work)
    if orig is None:
        print(f"  SKIPPED: no original scripts (git show {a.orig_rev} failed, or no commit before Qwen3 "
              "support was found); pass --orig DIR with copies of them")
        return
    for name, args in OLD_FIXTURES.items():
        for side, d in (("old", orig), ("new", HERE)):
            run(f"{PY} {d}/make_hf_fixture.py {work}/{side}/{name} {args}")
        check(same_tree(f"{work}/old/{name}", f"{work}/new/{name}"), f"fixture {name}: same bytes")
    for name, args in LLAVA_FIXTURES.items():
        for side, d in (("old", orig), ("new", HERE)):
            run(f"{PY} {d}/make_hf_llava_fixture.py {work}/{side}/{name} {args}")
        check(same_tree(f"{work}/old/{name}", f"{work}/new/{name}"), f"llava fixture {name}: same bytes")
    for i, (name, flags) in enumerate(OLD_RUNS):
        o_old = reference(orig, f"{work}/new/{name}", f"{work}/runs/old{i}", flags)
        o_new = reference(HERE, f"{work}/new/{name}", f"{work}/runs/new{i}", flags, in_process=False)
        check(same_tree(o_old, o_new), f"reference on {name} {flags or '(default)'}: bitwise equal outputs")
    for i, flag in enumerate(NOOP_FLAGS):
        o = reference(HERE, f"{work}/new/qwen2", f"{work}/runs/noop{i}", flag, in_process=False)
        check(same_tree(o, f"{work}/runs/new2"), f"{flag} is a no-op on qwen2")


def part_b(work):
    print("(b) negative controls on Qwen3 / Llama-3 fixtures "
          f"(need loss > {10 * LOSS_TOL:g}, last-position logits > {10 * LOGITS_TOL:g})")
    for name, (args, controls) in NEW_FIXTURES.items():
        ck = f"{work}/new/{name}"
        run(f"{PY} {HERE}/make_hf_fixture.py {ck} {args}")
        base = reference(HERE, ck, f"{work}/runs/{name}")
        loss, logits = outputs(base)
        grads = ref.read_safetensors(os.path.join(base, "grads.safetensors"))
        tensors = ref.read_checkpoint(ck)
        check(sorted(grads) == sorted(tensors), f"{name}: a gradient for each of its {len(tensors)} tensors")
        norms = [k for k in grads if k.endswith(("q_norm.weight", "k_norm.weight"))]
        if "qwen3" in name:
            check(len(norms) == 2 * json.load(open(f"{ck}/config.json"))["num_hidden_layers"]
                  and all(grads[k].abs().max() > 0 for k in norms), f"{name}: q_norm/k_norm have nonzero gradients")
        print(f"  {name}: loss {loss:.6f}   [{args}]")
        for flag in controls:
            l2, g2 = outputs(reference(HERE, ck, f"{work}/runs/{name}{flag}", flag))
            dl = abs(l2 - loss) / abs(loss)
            dg = float(np.abs(g2[-1] - logits[-1]).max() / np.abs(logits[-1]).max())
            check(dl > 10 * LOSS_TOL and dg > 10 * LOGITS_TOL,
                  f"{name} {flag}: loss {dl:.3e} ({dl / LOSS_TOL:.0f}x tol), logits {dg:.3e} ({dg / LOGITS_TOL:.0f}x tol)")
        inert = ["--no-rope-scaling"] if "qwen3" in name else ["--no-qk-norm", "--qk-norm-after-rope"]
        for flag in inert:
            o = reference(HERE, ck, f"{work}/runs/{name}{flag}", flag)
            check(same_tree(o, base), f"{name} {flag}: no-op, as it should be")
    # q_norm/k_norm weights all ones: what a loader that drops them would compute.
    ck, ones = f"{work}/new/qwen3_hd16_tied", f"{work}/new/qwen3_ones"
    t = ref.read_checkpoint(ck)
    from make_hf_fixture import write_safetensors
    write_safetensors(os.path.join(os.makedirs(ones) or ones, "model.safetensors"),
                      [(k, "F32", tuple(v.shape), (torch.ones_like(v) if k.endswith("_norm.weight") and "self_attn" in k
                                                   else v).contiguous().numpy().tobytes()) for k, v in t.items()])
    shutil.copy(f"{ck}/config.json", ones)
    l2, g2 = outputs(reference(HERE, ones, f"{work}/runs/qwen3_ones"))
    loss, logits = outputs(f"{work}/runs/qwen3_hd16_tied")
    dl, dg = abs(l2 - loss) / loss, float(np.abs(g2[-1] - logits[-1]).max() / np.abs(logits[-1]).max())
    check(dl > 10 * LOSS_TOL and dg > 10 * LOGITS_TOL,
          f"qwen3_hd16_tied with q_norm/k_norm weights = 1: loss {dl:.3e}, logits {dg:.3e}")
    # Qwen3's sliding window (off in every published checkpoint): a window past the sequence
    # changes nothing, a window of 4 on the layers from max_window_layers on changes the loss.
    base = f"{work}/runs/qwen3_hd16_tied"
    for window, moves in ((100, False), (4, True)):
        ck = f"{work}/new/qwen3_swa{window}"
        run(f"{PY} {HERE}/make_hf_fixture.py {ck} {NEW_FIXTURES['qwen3_hd16_tied'][0]} --config use_sliding_window=true "
            f"--config sliding_window={window} --config max_window_layers=1")
        l2, _ = outputs(reference(HERE, ck, f"{work}/runs/qwen3_swa{window}"))
        dl = abs(l2 - outputs(base)[0]) / outputs(base)[0]
        check((dl > 10 * LOSS_TOL) if moves else dl == 0, f"sliding window {window} on layer 1: loss moves by {dl:.3e}")
    for twin, of in V5_TWINS.items():
        ck = f"{work}/new/{twin}"
        run(f"{PY} {HERE}/make_hf_fixture.py {ck} {NEW_FIXTURES[of][0]} --rope-parameters")
        c = json.load(open(f"{ck}/config.json"))
        check("rope_parameters" in c and "rope_theta" not in c and "rope_scaling" not in c,
              f"{twin}: config has rope_parameters only ({json.dumps(c['rope_parameters'])})")
        check(same_tree(reference(HERE, ck, f"{work}/runs/{twin}"), f"{work}/runs/{of}"),
              f"{twin}: outputs bitwise equal to {of}'s")


def part_c(work):
    print("(c) hand checks")
    # llama3 inv_freq, float64, written from Meta's description, not from hf_llama_ref.py.
    for name in ("llama31", "llama32_tied_bf16"):
        c = json.load(open(f"{work}/new/{name}/config.json"))
        s, theta, hd = c["rope_scaling"], c["rope_theta"], c["head_dim"]
        got = ref.rope_inv_freq(c, hd).double().tolist()
        branches = set()
        for i, g in enumerate(got):
            f = theta ** (-2.0 * i / hd)
            lam = 2 * math.pi / f  # the wavelength, in positions
            if lam < s["original_max_position_embeddings"] / s["high_freq_factor"]:
                want, b = f, "kept"
            elif lam > s["original_max_position_embeddings"] / s["low_freq_factor"]:
                want, b = f / s["factor"], "divided"
            else:
                mu = (s["original_max_position_embeddings"] / lam - s["low_freq_factor"]) / (
                    s["high_freq_factor"] - s["low_freq_factor"])
                want, b = (1 - mu) * f / s["factor"] + mu * f, "smoothed"
            branches.add(b)
            check(abs(g - want) <= 2e-7 * want, f"{name} inv_freq[{i}] = {g:.8g} (hand {want:.8g}, {b}, wavelength {lam:.1f})")
        check(branches == {"kept", "smoothed", "divided"}, f"{name}: all three llama3 branches hit")
        plain = ref.rope_inv_freq(c, hd, scaling=False)
        check(int((plain != ref.rope_inv_freq(c, hd)).sum()) >= 2, f"{name}: --no-rope-scaling changes inv_freq")
    # q_norm on one head: record the first call of the RMSNorm with layer 0's q_norm weight.
    ck = f"{work}/new/qwen3_hd16_tied"
    c = json.load(open(f"{ck}/config.json"))
    P = ref.read_checkpoint(ck)
    seen = []
    call = ref.LlamaRMSNorm.__call__

    def spy(self, x):
        y = call(self, x)
        if self.weight is P["model.layers.0.self_attn.q_norm.weight"] and not seen:
            seen.append((x.detach(), y.detach()))
        return y
    ref.LlamaRMSNorm.__call__ = spy
    try:
        ref.forward(P, c, TOKENS, c["rms_norm_eps"], False)
    finally:
        ref.LlamaRMSNorm.__call__ = call
    x_in, y = seen[0]
    H, hd, d, eps = c["num_attention_heads"], c["head_dim"], c["hidden_size"], c["rms_norm_eps"]
    check(tuple(x_in.shape) == (1, len(TOKENS), H, hd) and hd != d // H,
          f"q_norm input is (1, T, heads, head_dim) = {tuple(x_in.shape)}, head_dim {hd} != hidden/heads {d // H}")
    # the q_norm input by hand: q_proj of input_layernorm(embedding), before any rotation
    t, head = 5, 2
    e = P["model.embed_tokens.weight"][TOKENS[t]].double().tolist()
    r = math.sqrt(sum(v * v for v in e) / d + eps)
    h = [e[j] / r * float(P["model.layers.0.input_layernorm.weight"][j]) for j in range(d)]
    Wq = P["model.layers.0.self_attn.q_proj.weight"].double()
    q = [sum(float(Wq[head * hd + o, j]) * h[j] for j in range(d)) for o in range(hd)]
    check(max(abs(q[o] - float(x_in[0, t, head, o])) for o in range(hd)) < 1e-5 * max(map(abs, q)),
          f"q_norm input at position {t}, head {head} is q_proj's output, unrotated (position {t} != 0)")
    rq = math.sqrt(sum(v * v for v in q) / hd + eps)
    w = P["model.layers.0.self_attn.q_norm.weight"].double().tolist()
    want = [w[o] * q[o] / rq for o in range(hd)]
    err = max(abs(want[o] - float(y[0, t, head, o])) for o in range(hd))
    check(err < 1e-5 * max(map(abs, want)), f"q_norm(head {head}, position {t}) by hand: max error {err:.2e}")
    check(max(abs(v - 1) for v in w) > 0.1, f"q_norm weights are not all ones (range {min(w):.3f}..{max(w):.3f})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orig-rev")
    ap.add_argument("--orig")
    ap.add_argument("--work")
    a = ap.parse_args()
    if not a.orig and not a.orig_rev:
        a.orig_rev = default_orig_rev()
    if a.work:
        os.makedirs(a.work, exist_ok=True)
    work = tempfile.mkdtemp(prefix="check_hf_decoder_refs_", dir=a.work)  # kept when --work is given
    os.makedirs(f"{work}/runs", exist_ok=True)
    json.dump(TOKENS, open(f"{work}/runs/tokens.json", "w"))
    try:
        part_a(a, work)
        part_b(work)
        part_c(work)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{len(failures)} failure(s)" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
