#!/usr/bin/python3
"""Charts from the metrics JSONL files that `dhp train` writes (log.metrics).

    scripts/plot_metrics.py runs/a/metrics.jsonl [runs/b/metrics.jsonl ...] -o charts/

Writes loss.png (training loss and held-out loss per step, with images and blanked),
throughput.png (tokens/s and samples/s), imbalance.png (the slowest rank's compute time over
the mean rank's, and the share of each step spent waiting on data) and cost_model.png (each
step's makespan as the planner predicted it and as measured, the plan's schedule replayed with
the measured group times, and the cost model's relative error). One line per run, labelled
by the run's folder.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_run(path):
    steps, evals = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not JSON ({e})")
            (evals if "eval" in rec else steps).append(rec)
    return steps, evals


def smooth(values, window):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def finish(fig, labelled, path):
    """Labels each (axes, y label) pair and writes the figure."""
    for ax, ylabel in labelled:
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+", help="metrics.jsonl files")
    ap.add_argument("-o", "--out", default="charts", help="output folder")
    ap.add_argument("--smooth", type=int, default=10, help="moving-average window in steps")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    runs = []
    for p in args.metrics:
        steps, evals = read_run(p)
        if not steps:
            raise SystemExit(f"{p}: no step records")
        runs.append((os.path.basename(os.path.dirname(os.path.abspath(p))) or p, steps, evals))

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, steps, evals in runs:
        x = [s["step"] for s in steps]
        ax.plot(x, smooth([s["loss"] for s in steps], args.smooth), label=f"{name} train")
        if evals:
            ax.plot([e["step"] for e in evals], [e["loss"] for e in evals], "o--", label=f"{name} held-out")
            if any("blank_loss" in e for e in evals):
                ax.plot([e["step"] for e in evals if "blank_loss" in e],
                        [e["blank_loss"] for e in evals if "blank_loss" in e], "x:",
                        label=f"{name} held-out, images blanked")
    ax.set_yscale("log")
    finish(fig, [(ax, "loss")], os.path.join(args.out, "loss.png"))

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, steps, _ in runs:
        x = [s["step"] for s in steps]
        axes[0].plot(x, smooth([s["tokens_per_s"] for s in steps], args.smooth), label=name)
        axes[1].plot(x, smooth([s["samples_per_s"] for s in steps], args.smooth), label=name)
    finish(fig, [(axes[0], "tokens / s"), (axes[1], "samples / s")], os.path.join(args.out, "throughput.png"))

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, steps, _ in runs:
        x = [s["step"] for s in steps]
        ax.plot(x, smooth([s.get("imbalance", 1.0) for s in steps], args.smooth),
                label=f"{name} slowest rank / mean rank")
        ax.plot(x, smooth([1.0 + s.get("loader_wait_s", 0.0) / max(s.get("step_s", 1e-12), 1e-12)
                           for s in steps], args.smooth), "--", label=f"{name} 1 + data-wait fraction")
    finish(fig, [(ax, "ratio")], os.path.join(args.out, "imbalance.png"))

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, steps, _ in runs:
        rows = [s for s in steps if "predicted_s" in s and "measured_s" in s]
        x = [s["step"] for s in rows]
        axes[0].plot(x, [s["predicted_s"] for s in rows], label=f"{name} predicted")
        axes[0].plot(x, [s["measured_s"] for s in rows], "--", label=f"{name} measured")
        axes[1].plot(x, smooth([100 * s.get("cost_error", 0.0) for s in rows], args.smooth), label=name)
    finish(fig, [(axes[0], "step makespan (s)"), (axes[1], "cost model error (%)")],
           os.path.join(args.out, "cost_model.png"))
    print(f"wrote loss.png, throughput.png, imbalance.png, cost_model.png to {args.out}")


if __name__ == "__main__":
    main()
