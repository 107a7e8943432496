#!/usr/bin/python3
"""The cost model's error per group, broken down by ring degree and by piece size.

Reads metrics files written by `dhp train` (log.metrics): every step's line carries
`group_costs`, each group's predicted time (the cost model the plan was made with, i.e. refitted
on the steps before it) and its measured time (its slowest member's busy time). Prints, per ring
degree and per size class of the busiest member's tokens, the number of groups, the median and
90th percentile of |predicted - measured| / measured, and the median signed error (predicted
over measured minus one: positive = the model overprices).

    scripts/cost_error.py [--warm N] [--by degree,size,images,seqs] [--json OUT] metrics.jsonl...
"""
import argparse
import json
import sys

import numpy as np

SIZES = [(0, 256, "<256"), (256, 1024, "256-1k"), (1024, 4096, "1k-4k"), (4096, 1 << 62, ">=4k")]


def size_class(piece):
    for lo, hi, name in SIZES:
        if lo <= piece < hi:
            return name
    return SIZES[-1][2]


def keys_of(g, by):
    out = []
    for b in by:
        if b == "degree":
            out.append(f"d={g['d']}")
        elif b == "size":
            out.append(size_class(g["piece"]))
        elif b == "images":
            out.append("images" if g["images"] > 0 else "text only")
        elif b == "seqs":
            out.append("1 seq" if g["seqs"] == 1 else "2-4 seqs" if g["seqs"] <= 4 else "5+ seqs")
        elif b == "groups":
            out.append(f"{g['step_groups']}{'+' if g['step_groups'] == 4 else ''} groups in the step")
    return tuple(out)


def read(paths, warm):
    groups = []
    for p in paths:
        try:
            lines = [json.loads(l) for l in open(p) if l.strip()]
        except (OSError, json.JSONDecodeError) as e:
            sys.exit(f"cost_error.py: cannot read {p}: {e}")
        steps = [r for r in lines if "eval" not in r and "group_costs" in r]
        for r in steps[warm:]:
            n = len(r["group_costs"])
            for g in r["group_costs"]:
                if g["meas"] <= 0:
                    continue
                g = dict(g)
                g["step_groups"] = min(n, 4)
                g["err"] = g["pred"] / g["meas"] - 1
                groups.append(g)
    return groups


def table(groups, by):
    rows = {}
    for g in groups:
        rows.setdefault(keys_of(g, by), []).append(g)
    out = []
    for k in sorted(rows, key=lambda k: [(len(x), x) for x in k]):
        e = np.array([g["err"] for g in rows[k]])
        a = np.abs(e)
        out.append({"key": " ".join(k), "n": int(len(e)), "median": float(np.median(a)),
                    "p90": float(np.percentile(a, 90)), "bias": float(np.median(e)),
                    "share": float(sum(g["meas"] for g in rows[k]))})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("metrics", nargs="+")
    ap.add_argument("--warm", type=int, default=3, help="steps left out at the start of each file")
    ap.add_argument("--by", default="degree;degree,size",
                    help="breakdowns, ';'-separated, each a ','-list of degree,size,images,seqs,groups")
    ap.add_argument("--json", help="also write the tables as JSON here")
    a = ap.parse_args()
    groups = read(a.metrics, a.warm)
    if not groups:
        sys.exit("cost_error.py: no group_costs in the metrics (written by dhp train since the per-group record)")
    total = sum(g["meas"] for g in groups)
    result = {}
    for spec in a.by.split(";"):
        by = [b.strip() for b in spec.split(",") if b.strip()]
        for b in by:
            if b not in ("degree", "size", "images", "seqs", "groups"):
                sys.exit(f"cost_error.py: --by {b}: not one of degree, size, images, seqs, groups")
        rows = table(groups, by)
        result[",".join(by)] = rows
        print(f"\nby {', '.join(by)}  ({len(groups)} groups; |error| = |predicted - measured| / measured)")
        print(f"{'':<22} {'groups':>7} {'time %':>7} {'median':>8} {'p90':>8} {'bias':>8}")
        for r in rows:
            print(f"{r['key']:<22} {r['n']:>7} {100 * r['share'] / total:>6.1f}% {100 * r['median']:>7.1f}% "
                  f"{100 * r['p90']:>7.1f}% {100 * r['bias']:>+7.1f}%")
    allerr = np.abs([g["err"] for g in groups])
    print(f"\nall groups: median {100 * np.median(allerr):.1f}%, p90 {100 * np.percentile(allerr, 90):.1f}%")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
