"""What the tests/mpi_*.sh scripts compare: the metrics and the exported weights of runs of the
same training on different numbers of ranks, plans or settings."""
import json
import struct

import numpy as np


def steps(run_dir):
    """The step records of RUN_DIR/metrics.jsonl (evaluations left out)."""
    return [r for r in map(json.loads, open(run_dir + "/metrics.jsonl")) if "eval" not in r]


def safetensors(path, dtype=np.float32):
    """{name: (dtype, shape, raw bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: (t["dtype"], t["shape"], data[t["data_offsets"][0]:t["data_offsets"][1]])
            for k, t in header.items() if k != "__metadata__"}


def weights(run_dir):
    """RUN_DIR/model.safetensors (a dhp export: F32) as flat arrays by name."""
    return {k: np.frombuffer(raw, dtype=np.float32)
            for k, (_, _, raw) in safetensors(run_dir + "/model.safetensors").items()}


def same_losses(one, other, label, n_steps):
    """Every step's loss within fp32 rounding of the one-rank run's."""
    assert len(one) == n_steps, (label, "1 rank", len(one))
    assert len(other) == n_steps, (label, len(other))
    for i, (a, b) in enumerate(zip(one, other), 1):
        x, y = a["loss"], b["loss"]
        # The first step's loss is a sum in another order (fp32, ~1e-6 relative); Adam
        # amplifies the gradients' rounding differences slightly over the later steps.
        tol = 1e-5 if i == 1 else 1e-4
        assert abs(x - y) <= tol * abs(x), f"{label}, step {i}: 1 rank {x}, here {y}"


def compare_runs(one_dir, specs, n_steps, all_steps_within=None):
    """Each run "STRATEGY:RANKS:DIR" of SPECS against the one-rank run in ONE_DIR: the same
    losses (same_losses; with ALL_STEPS_WITHIN, every step's within that, relative) and weights
    (same_weights). Prints a line per run; returns how many put a sample on a ring."""
    one, w_one = steps(one_dir), weights(one_dir)
    rings = 0
    for spec in specs:
        strategy, n, d = spec.split(":", 2)
        label = f"{strategy} on {n} ranks"
        other = steps(d)
        same_losses(one, other, label, n_steps)
        worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(one, other))
        if all_steps_within is not None:
            assert worst <= all_steps_within, f"{label}: a loss {worst:.2e} (relative) from one rank's"
        same_weights(w_one, weights(d), label)
        widest = max(r["max_degree"] for r in other)
        rings += widest > 1
        print(f"{label}: losses {', '.join('%.5f' % r['loss'] for r in other)} "
              f"(at most {worst:.1e} from one rank's); widest ring {widest}")
    return rings


def same_weights(w_one, w, label, skip=lambda name: False):
    """After a few optimizer steps the weights agree within 1e-4 of each tensor's scale."""
    assert w.keys() == w_one.keys(), label
    for name, ref in w_one.items():
        if skip(name):
            continue
        err = float(np.max(np.abs(w[name] - ref)))
        scale = float(np.max(np.abs(ref))) or 1.0
        assert err <= 1e-4 * scale, f"{label}: {name} differs by {err} (scale {scale})"


def resumed_bit_for_bit(straight_dir, resumed_dir, label, resumed_at):
    """A run resumed after step RESUMED_AT (RESUMED_DIR) against the run it continues
    (STRAIGHT_DIR): the same later steps' losses and the same final weights, bit for bit.
    Returns how many tensors were compared."""
    straight, resumed = steps(straight_dir), steps(resumed_dir)
    assert [r["step"] for r in resumed] == [r["step"] for r in straight[resumed_at:]], [r["step"] for r in resumed]
    for a, b in zip(straight[resumed_at:], resumed):
        assert a["loss"] == b["loss"], f"{label}, step {a['step']}: loss {b['loss']} against {a['loss']}"
    w0, w1 = weights(straight_dir), weights(resumed_dir)
    assert w0.keys() == w1.keys()
    for k in w0:
        assert np.array_equal(w0[k], w1[k]), f"{label}: {k} differs"
    return len(w0)
