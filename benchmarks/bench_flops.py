"""Time exact analytic FLOPs over a million sequence lengths, per preset.

Baseline in the same run: the same count done one sequence at a time in Python (what a
per-sample FLOPs helper in a training loop does). Prints a table; `--json PATH` writes it.

    PYTHONPATH=. python benchmarks/bench_flops.py [--n 1000000] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_scheduler import best_time  # noqa: E402
from costmodel.flops import (  # noqa: E402
    attention_flops_per_pair,
    attention_projection_flops_per_token,
    calculate_fwd_flops,
    lm_head_flops_per_token,
    mlp_flops_per_token,
    sequence_fwd_flops,
)
from costmodel.spec import PRESETS, ModelSpec  # noqa: E402


def python_loop_flops(lengths: list[int], spec: ModelSpec) -> int:
    """One sequence at a time with Python ints (no sliding windows among the presets)."""
    per_token = (
        spec.num_layers * attention_projection_flops_per_token(spec)
        + spec.num_dense_layers * sum(mlp_flops_per_token(spec, moe=False).values())
        + spec.num_moe_layers * sum(mlp_flops_per_token(spec, moe=True).values())
        + lm_head_flops_per_token(spec)
    )
    per_pair = spec.num_layers * attention_flops_per_pair(spec)
    total = 0
    for n in lengths:
        total += n * per_token + per_pair * (n * (n + 1) // 2)
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000, help="sequence lengths per preset")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    lengths = np.random.default_rng(0).integers(1, 32769, args.n)
    as_list = lengths.tolist()
    rows = []
    print(f"{'preset':<16} {'exact ms':>9} {'per-seq ms':>10} {'python ms':>10} {'speed-up':>9}")
    for name, spec in PRESETS.items():
        exact_ms, total = best_time(functools.partial(calculate_fwd_flops, lengths, spec), 3)
        vec_ms, _ = best_time(functools.partial(sequence_fwd_flops, lengths, spec), 3)
        loop_ms, loop_total = best_time(functools.partial(python_loop_flops, as_list, spec), 1)
        if loop_total != total:
            raise SystemExit(f"{name}: the Python loop disagrees with calculate_fwd_flops")
        rows.append(
            dict(
                preset=name,
                exact_ms=exact_ms,
                per_sequence_ms=vec_ms,
                python_loop_ms=loop_ms,
                speedup=loop_ms / exact_ms,
            )
        )
        print(
            f"{name:<16} {exact_ms:>9.1f} {vec_ms:>10.1f} {loop_ms:>10.1f} "
            f"{loop_ms / exact_ms:>8.1f}x"
        )
    if args.json:
        meta = dict(
            date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            n=args.n,
            python=platform.python_version(),
            numpy=np.__version__,
            machine=platform.processor() or platform.machine(),
        )
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
