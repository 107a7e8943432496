#!/usr/bin/env python3
"""PyTorch on the shapes our CUDA benches ran, and one table of ours against it.

Reads the JSON lines of bench_cuda and bench_cuda_attention (scripts/gpu_check.sh collects
them), times the same work with PyTorch on the GPU and prints, side by side:
  gemm       ours TFLOP/s | torch.matmul TFLOP/s at the same precision | ours/torch
  attention  bf16 TFLOP/s (forward + backward) of our kernel, cuDNN's fused attention through
             dhp, and PyTorch's, per shape (decoder packed, vision images, long document)
  attention  ours fwd/bwd ms per precision | torch bf16 and fp32 fwd/bwd ms | ours/torch
  train_step tokens/s and MFU as our bench reported them
A ratio above 1 means ours is faster. Packed causal attention over several documents runs
through torch.nn.attention.varlen.varlen_attn (one launch, flash attention) where this PyTorch
has it and it accepts the shape, else scaled_dot_product_attention once per document; the
method column says which. Without any result lines it times a default set of shapes.

usage: gpu_torch_bench.py RESULTS.jsonl [more.jsonl ...]
"""
import inspect
import itertools
import json
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print(f"gpu_torch_bench: no PyTorch in {sys.executable}")
    sys.exit(1)

WARMUP, REPEAT = 3, 20
DOC_KEYS = ("doc_lens", "doc_lengths", "docs_lens", "lengths", "lens", "seqlens")
DEFAULT_GEMMS = [
    {"bench": "gemm", "M": 8192, "N": 8192, "K": 8192, "precision": p} for p in ("bf16", "tf32", "fp32")
]
DEFAULT_ATTENTION = [
    {"bench": "attention", "T": 16384, "docs": d, "Hq": 16, "Hkv": 4, "hd": 128} for d in (1, 8)
]


def median_ms(fn, setup=None):
    """Median of REPEAT timed calls (CUDA events), after WARMUP untimed ones."""
    times = []
    for i in range(WARMUP + REPEAT):
        if setup:
            setup()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= WARMUP:
            times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def torch_precision(p):
    """(dtype, allow_tf32) for our precision name, or None when it names none we know."""
    p = str(p).lower()
    if "bf16" in p or "bfloat16" in p:
        return torch.bfloat16, False
    if "tf32" in p:
        return torch.float32, True
    if p in ("fp32", "f32", "float32", "float"):
        return torch.float32, False
    return None


def gemm_tflops(M, N, K, precision):
    dtype, tf32 = precision
    torch.backends.cuda.matmul.allow_tf32 = tf32
    # Two input sets in turn, so that repeated calls do not time a cache-resident operand.
    sets = [(torch.randn(M, K, device="cuda", dtype=dtype), torch.randn(K, N, device="cuda", dtype=dtype))
            for _ in range(2)]
    c = torch.empty(M, N, device="cuda", dtype=dtype)
    k = [0]

    def run():
        a, b = sets[k[0] % 2]
        k[0] += 1
        torch.matmul(a, b, out=c)

    ms = median_ms(run)
    return 2.0 * M * N * K / (ms * 1e-3) / 1e12


def doc_lengths(r):
    T, docs = int(r["T"]), r.get("docs", 1)
    for key in DOC_KEYS:
        if isinstance(r.get(key), list) and r[key]:
            return [int(x) for x in r[key]], ""
    if isinstance(docs, list):
        return [int(x) for x in docs], ""
    docs = max(1, int(docs))
    lens = [T // docs] * docs
    lens[-1] += T - sum(lens)
    return lens, " (equal split: no document lengths in the result)"


def varlen_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, set()
    return varlen_attn, set(inspect.signature(varlen_attn).parameters)


def attention_ms(lens, Hq, Hkv, hd, dtype, use_varlen, causal=True):
    """(fwd ms, bwd ms, method) for packed attention over documents of `lens`: causal, or
    bidirectional within each (images)."""
    T = sum(lens)
    q = torch.randn(T, Hq, hd, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(T, Hkv, hd, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(T, Hkv, hd, device="cuda", dtype=dtype, requires_grad=True)
    grad = torch.randn(T, Hq, hd, device="cuda", dtype=dtype)
    varlen, params = varlen_fn() if use_varlen else (None, set())

    def by_document():
        outs, s = [], 0
        for n in lens:
            # (1, H, n, hd) views of this document; GQA by the kernel's own head grouping.
            qd = q[s:s + n].transpose(0, 1).unsqueeze(0)
            kd = k[s:s + n].transpose(0, 1).unsqueeze(0)
            vd = v[s:s + n].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, enable_gqa=Hq != Hkv)
            outs.append(o.squeeze(0).transpose(0, 1))
            s += n
        return torch.cat(outs)

    def packed():
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), device="cuda", dtype=torch.int32)
        kw = {}
        if "is_causal" in params:
            kw["is_causal"] = causal
        elif "window_size" in params:
            kw["window_size"] = (-1, 0) if causal else (-1, -1)
        elif causal:
            raise RuntimeError("varlen_attn without a causal option")
        kk, vv = k, v
        if Hq != Hkv:
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                kk, vv = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
        return varlen(q, kk, vv, cu, cu, max(lens), max(lens), **kw)

    method = "sdpa per document"
    forward = by_document
    if varlen is not None and dtype == torch.bfloat16:
        try:
            packed()
            forward, method = packed, "varlen_attn"
        except (RuntimeError, TypeError, ValueError) as e:
            method = f"sdpa per document (varlen_attn: {str(e).splitlines()[0][:40]})"
    with torch.no_grad():
        fwd = median_ms(forward)
    out = [None]

    def setup():
        q.grad = k.grad = v.grad = None
        out[0] = forward()

    bwd = median_ms(lambda: out[0].backward(grad), setup)
    return fwd, bwd, method


def attention_flops(lens, Hq, hd, causal=True):
    """Forward FLOPs (two matrix products over the visible pairs: the lower triangle of each
    causal document, all of each image); backward is 2.5x."""
    return sum(2.0 * 2.0 * (n * (n + 1) / 2.0 if causal else n * n) * hd * Hq for n in lens)


def fmt(x, spec=".1f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def ratio(ours, theirs):
    return fmt(ours / theirs if ours and theirs else None, ".2f")


def main(paths):
    rows = []
    for path in paths:
        try:
            with open(path) as f:
                for line in f:
                    line = line.strip()
                    if line.startswith("{"):
                        try:
                            rows.append(json.loads(line))
                        except ValueError:
                            print(f"skipped a line that is not JSON: {line[:80]}")
        except OSError as e:
            print(f"cannot read {path}: {e}")
    gemms = [r for r in rows if r.get("bench") == "gemm"]
    attns = [r for r in rows if r.get("bench") == "attention"]
    steps = [r for r in rows if r.get("bench") == "train_step"]
    if not gemms:
        print("no gemm results from bench_cuda: PyTorch alone on default shapes")
        gemms = DEFAULT_GEMMS
    if not attns:
        print("no attention results from bench_cuda_attention: PyTorch alone on default shapes")
        attns = DEFAULT_ATTENTION

    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}; median of {REPEAT} "
          f"timed runs after {WARMUP} warm-ups; ratio = ours/torch speed (>1: ours faster)")
    lines = []
    head = f"{'GEMM  M x N x K':<28} {'precision':<10} {'ours TFLOP/s':>13} {'torch TFLOP/s':>14} {'ratio':>7}"
    lines += [head, "-" * len(head)]
    for r in gemms:
        M, N, K = int(r["M"]), int(r["N"]), int(r["K"])
        prec = torch_precision(r.get("precision", ""))
        theirs = gemm_tflops(M, N, K, prec) if prec else None
        ours = r.get("tflops")
        label = f"{M} x {N} x {K}" + (f" {r['op']}" if "op" in r else "")
        lines.append(f"{label:<28} {str(r.get('precision', '?')):<10} {fmt(ours):>13} "
                     f"{fmt(theirs):>14} {ratio(ours, theirs):>7}")
    torch.backends.cuda.matmul.allow_tf32 = False

    # One PyTorch timing per shape, shared by both tables.
    torch_cache = {}

    def torch_times(r, dtype):
        lens, _ = doc_lengths(r)
        causal = r.get("causal", True)
        key = (tuple(lens), int(r["Hq"]), int(r["Hkv"]), int(r["hd"]), causal, str(dtype))
        if key not in torch_cache:
            try:
                torch_cache[key] = attention_ms(lens, int(r["Hq"]), int(r["Hkv"]), int(r["hd"]), dtype,
                                                dtype == torch.bfloat16, causal)
            except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                torch_cache[key] = (None, None, f"failed: {str(e).splitlines()[0][:60]}")
            torch.cuda.empty_cache()
        return torch_cache[key]

    # Own kernel against cuDNN's fused attention against PyTorch's, bf16, forward + backward.
    lines.append("")
    head = (f"{'attention bf16 (kind T docs Hq/Hkv hd)':<40} {'own':>7} {'cuDNN':>7} {'torch':>7} "
            f"{'own/cuDNN':>10} {'own/torch':>10}  torch method")
    lines += [head + "   [TFLOP/s, fwd+bwd]", "-" * len(head)]
    shapes = {}
    for r in attns:
        if r.get("math", "bf16") != "bf16":
            continue
        lens, _ = doc_lengths(r)
        key = (r.get("kind", "decoder packed"), tuple(lens), int(r["Hq"]), int(r["Hkv"]), int(r["hd"]),
               r.get("causal", True))
        shapes.setdefault(key, {})[r.get("impl", "own")] = r
    for (kind, lens, Hq, Hkv, hd, causal), by_impl in shapes.items():
        own, cud = by_impl.get("own", {}).get("tflops"), by_impl.get("cudnn", {}).get("tflops")
        bf, bb, method = torch_times(next(iter(by_impl.values())), torch.bfloat16)
        flops = attention_flops(list(lens), Hq, hd, causal) * 3.5
        theirs = flops / ((bf + bb) * 1e-3) / 1e12 if bf and bb else None
        label = f"{kind} {sum(lens)} {len(lens)} {Hq}/{Hkv} {hd}"
        lines.append(f"{label:<40} {fmt(own):>7} {fmt(cud):>7} {fmt(theirs):>7} {ratio(own, cud):>10} "
                     f"{ratio(own, theirs):>10}  {method}")

    lines.append("")
    head = (f"{'attention T docs Hq/Hkv hd':<28} {'ours fwd':>9} {'bf16 fwd':>9} {'fp32 fwd':>9} "
            f"{'ratio':>6} {'ours bwd':>9} {'bf16 bwd':>9} {'fp32 bwd':>9} {'ratio':>6}  torch method (bf16)")
    lines += [head + "   [ms]", "-" * len(head)]
    notes = []
    for r in attns:
        lens, note = doc_lengths(r)
        Hq, Hkv, hd = int(r["Hq"]), int(r["Hkv"]), int(r["hd"])
        if r.get("impl", "own") != "own":
            continue
        bf, bb, method = torch_times(r, torch.bfloat16)
        ff, fb = (None, None)
        if r.get("math") in ("fp32", "tf32") and r.get("kind") != "long":
            ff, fb, _ = torch_times(r, torch.float32)
        of, ob = r.get("fwd_ms"), r.get("bwd_ms")
        shape = f"{sum(lens)} {len(lens)} {Hq}/{Hkv} {hd}" + (f" {r['math']}" if "math" in r else "")
        lines.append(f"{shape:<28} {fmt(of, '.3f'):>9} {fmt(bf, '.3f'):>9} {fmt(ff, '.3f'):>9} "
                     f"{ratio(bf, of):>6} {fmt(ob, '.3f'):>9} {fmt(bb, '.3f'):>9} {fmt(fb, '.3f'):>9} "
                     f"{ratio(bb, ob):>6}  {method}{note}")
        if bf:
            notes.append(f"  {shape}: torch bf16 "
                         f"{attention_flops(lens, Hq, hd, r.get('causal', True)) / (bf * 1e-3) / 1e12:.0f} "
                         f"TFLOP/s forward (causal FLOPs); ours reported {fmt(r.get('tflops'))} TFLOP/s")
    lines += notes

    lines.append("")
    if steps:
        for r in steps:
            extra = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("bench", "tokens_per_s", "mfu"))
            mfu = r.get("mfu")
            mfu_s = f"{100 * mfu:.1f}%" if isinstance(mfu, (int, float)) and mfu <= 1 else fmt(mfu, ".3g")
            lines.append(f"train step: {fmt(r.get('tokens_per_s'), '.0f')} tokens/s, MFU {mfu_s}"
                         + (f" ({extra})" if extra else ""))
    else:
        lines.append("train step: no result from bench_cuda")
    print("\n".join(lines))


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("gpu_torch_bench: PyTorch sees no CUDA device")
        sys.exit(1)
    main(sys.argv[1:])
