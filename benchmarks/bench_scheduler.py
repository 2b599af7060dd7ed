"""Scheduler benchmark: this scheduler against today's baseline, on RL-like batches.

    PYTHONPATH=. python benchmarks/bench_scheduler.py [--quick] [--json out.json]

For every distribution (rl, bimodal), n ∈ {256, 1024, 4096, 16384, 65536},
dp ∈ {8, 16, 64} and cap ∈ {16k, 32k}, three schedules of the same batch:

- ``ours``: `costmodel.scheduler.build_schedule` balancing the cost model;
- ``baseline``: first-fit by tokens, then Karmarkar-Karp over micro-batch FLOPs to ranks
  (slime's ``balance_data``; `costmodel.scheduler.baselines`);
- ``kk-samples``: Karmarkar-Karp over per-sample FLOPs into ceil(Σ tokens / cap)
  micro-batches (slime's ``balance_by_flops``), skipped where n × micro-batches is too
  large for it to finish in reasonable time and memory.

All are judged by the same cost: the registry estimate for Qwen3-8B on an H200
(`costmodel.estimate_cost_model`) when this checkout has it, else analytic FLOPs plus a
fixed cost per micro-batch (the script says which), or with ``--cost-model`` a measured
profile such as ``h200/qwen3-8b``. Reported: predicted makespan over
`costmodel.scheduler.lower_bound` (a true bound for both: see its docstring), max/mean of
the rank costs, micro-batches over the cap, wall time (best of a few runs, one process;
the thread count is not pinned) and peak memory (tracemalloc, a separate run), with ours as a
ratio to the baseline. Targets (issue 3), where there are at least 32 samples per rank:
max/mean <= 1.005, makespan within 1% of the lower bound, no cap violation; n=8192 with
dp=64 under 10 ms and n=65536 under 100 ms (an extra n=8192 row is timed for that).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import math
import os
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from costmodel.estimate import estimate_cost_model  # noqa: E402
from costmodel.flops import sequence_fwd_flops  # noqa: E402
from costmodel.model import CostModel, load_cost_model  # noqa: E402
from costmodel.scheduler import (  # noqa: E402
    baseline_microbatches,
    build_schedule,
    evaluate_schedule,
    generate_lengths,
)
from costmodel.spec import ModelSpec  # noqa: E402

T = TypeVar("T")

SIZES = (256, 1024, 4096, 16384, 65536)
DPS = (8, 16, 64)
CAPS = (16384, 32768)
DISTS = ("rl", "bimodal")
# kk-samples keeps a k-array per partial solution: skip it beyond this n × k.
VARIANT_LIMIT = 1.5e7


def make_cost(spec: ModelSpec, cost_model: str | None = None) -> tuple[CostModel, str]:
    """The cost to judge by: a measured profile if named (what users balance with), else
    the registry's H200 estimate."""
    if cost_model is not None:
        model = load_cost_model(cost_model, spec=spec)
        return model, f"{cost_model}: {model.label}, ms"
    model = estimate_cost_model(spec, "h200")
    return model, f"estimate_cost_model({spec.name}, h200): {model.label}, ms"


def best_time(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """The best of `repeats` (at least one) wall times of fn() in ms, and its last result."""
    best = math.inf
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3, out


def peak_memory(fn) -> float:
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_cases(path, rows: list[dict], **meta) -> None:
    """``rows`` as JSON under ``cases``, after the date, this machine's CPU, Python and numpy
    and ``meta`` (the layout of the grouped and one-rank benchmarks' results)."""
    doc = dict(date=dt.date.today().isoformat(), cpu=cpu_name(),
               python=platform.python_version(), numpy=np.__version__, **meta, cases=rows)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


def run_case(dist, n, dp, cap, spec, cost, repeats, measure_memory):
    lengths = generate_lengths(n, dist, seed=n + dp + cap)
    flops = sequence_fwd_flops(lengths, spec)
    per_rank = n / dp
    row = {"dist": dist, "n": n, "dp": dp, "cap": cap, "samples_per_rank": per_rank}

    def ours():
        return build_schedule(lengths, dp_size=dp, max_tokens_per_microbatch=cap, cost=cost)

    def base(variant):
        return lambda: baseline_microbatches(
            lengths, dp_size=dp, max_tokens_per_microbatch=cap, sample_flops=flops, variant=variant
        )

    policies = [
        ("ours", ours, repeats),
        ("baseline", base("first-fit"), 1 if n > 4096 else repeats),
    ]
    k_variant = -(-int(lengths.sum()) // cap)
    if n * k_variant <= VARIANT_LIMIT:
        policies.append(("kk-samples", base("kk-samples"), 1))
    else:
        row["kk-samples"] = {
            "skipped": f"n x micro-batches = {n * k_variant:.1e} > {VARIANT_LIMIT:.0e}"
        }
    for name, fn, reps in policies:
        try:
            ms, built = best_time(fn, reps)
        except ValueError as err:  # the baseline cannot always align its micro-batches
            row[name] = {"failed": str(err)}
            continue
        mbs = built.microbatches if hasattr(built, "microbatches") else built
        judged = evaluate_schedule(mbs, lengths, max_tokens_per_microbatch=cap, cost=cost)
        entry = {
            "makespan": judged.makespan,
            "lower_bound": judged.lower_bound,
            "makespan_over_lower_bound": judged.makespan_over_lower_bound,
            "max_over_mean": judged.imbalance,
            "cap_violations": judged.cap_violations,
            "microbatches_per_rank": max(len(r) for r in mbs),
            "wall_ms": ms,
        }
        if measure_memory:
            entry["peak_mib"] = peak_memory(fn)
        row[name] = entry
    o = row["ours"]
    if per_rank >= 32:
        o["meets_targets"] = bool(
            o["max_over_mean"] <= 1.005
            and o["makespan_over_lower_bound"] <= 1.01
            and o["cap_violations"] == 0
        )
    b = row.get("baseline", {})
    if "makespan" in b:
        row["ours_vs_baseline"] = {
            "makespan": o["makespan"] / b["makespan"],
            "wall_time": o["wall_ms"] / b["wall_ms"],
            **({"peak_memory": o["peak_mib"] / b["peak_mib"]} if measure_memory else {}),
        }
    return row


def fmt(entry, key, spec):
    if not isinstance(entry, dict) or key not in entry:
        return "-"
    return format(entry[key], spec)


def print_table(rows):
    head = (
        f"{'dist':<7} {'n':>6} {'dp':>3} {'cap':>6} | {'ours mk/lb':>10} {'max/mean':>9} "
        f"{'ms':>7} {'MiB':>6} | {'base mk/lb':>10} {'max/mean':>9} {'ms':>8} | "
        f"{'kk-s mk/lb':>10} {'over cap':>8} | {'mk vs base':>10} {'ok':>3}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        o, b, v = r["ours"], r.get("baseline", {}), r.get("kk-samples", {})
        ratio = r.get("ours_vs_baseline", {}).get("makespan")
        ok = {True: "yes", False: "NO"}.get(o.get("meets_targets"), "")
        print(
            f"{r['dist']:<7} {r['n']:>6} {r['dp']:>3} {r['cap']:>6} | "
            f"{fmt(o, 'makespan_over_lower_bound', '.4f'):>10} {fmt(o, 'max_over_mean', '.4f'):>9} "
            f"{fmt(o, 'wall_ms', '.1f'):>7} {fmt(o, 'peak_mib', '.1f'):>6} | "
            f"{fmt(b, 'makespan_over_lower_bound', '.4f'):>10} {fmt(b, 'max_over_mean', '.4f'):>9} "
            f"{fmt(b, 'wall_ms', '.1f'):>8} | "
            f"{fmt(v, 'makespan_over_lower_bound', '.4f'):>10} {fmt(v, 'cap_violations', 'd'):>8} | "
            f"{(format(ratio - 1, '+.2%') if ratio else '-'):>10} {ok:>3}"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a few small cases (smoke test)")
    p.add_argument("--json", metavar="PATH", help="write all results as JSON")
    p.add_argument("--model", default="qwen3-8b", help="preset whose FLOPs and cost model to use")
    p.add_argument("--repeats", type=int, default=3, help="timing runs per case (best is kept)")
    p.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    p.add_argument("--cost-model", metavar="NAME_OR_PATH",
                   help="judge by this cost model (e.g. the measured h200/qwen3-8b) instead of "
                   "the registry estimate")
    args = p.parse_args(argv)

    spec = ModelSpec.from_any(args.model)
    cost, cost_text = make_cost(spec, args.cost_model)
    sizes: tuple[int, ...] = SIZES
    dps: tuple[int, ...] = DPS
    caps: tuple[int, ...] = CAPS
    dists = DISTS
    if args.quick:
        sizes, dps, caps = (256, 4096), (8, 64), (16384,)
    print(f"cost: {cost_text}")
    print(f"cpu: {cpu_name()}; python {platform.python_version()}, numpy {np.__version__}")
    # Warm-up: imports, caches of the cost model.
    build_schedule(generate_lengths(512), dp_size=8, max_tokens_per_microbatch=16384, cost=cost)

    rows = []
    for dist in dists:
        for n in sizes:
            for dp in dps:
                for cap in caps:
                    if n < dp:
                        continue
                    rows.append(
                        run_case(dist, n, dp, cap, spec, cost, args.repeats, not args.no_memory)
                    )
    print_table(rows)

    # The wall-time targets, timed on their own (dp=64 at n=8192; n=65536 at every dp), in
    # rounds over all of them: on this shared 2-core VM a slow spell lasts seconds, and the
    # best of 5 runs in a row of one case read 9-10 ms where it reads 4.5 ms alone.
    targets = [(dist, n, dp) for dist in dists
               for n, dp in ((8192, 64),) + (() if args.quick else tuple((65536, d) for d in DPS))]
    calls = [functools.partial(build_schedule, generate_lengths(n, dist, seed=1), dp_size=dp,
                               max_tokens_per_microbatch=16384, cost=cost)
             for dist, n, dp in targets]
    best = [math.inf] * len(calls)
    for _ in range(3 * max(args.repeats, 5)):
        for i, call in enumerate(calls):
            best[i] = min(best[i], best_time(call, 1)[0])
    timing = []
    for (dist, n, dp), ms in zip(targets, best):
        limit = 10.0 if n == 8192 else 100.0
        timing.append(
            {"dist": dist, "n": n, "dp": dp, "cap": 16384, "wall_ms": ms, "limit_ms": limit}
        )
        print(f"timing: {dist:<7} n={n:<6} dp={dp:<3} {ms:7.1f} ms (target < {limit:.0f} ms)")

    gated = [r for r in rows if "meets_targets" in r["ours"]]
    met = sum(r["ours"]["meets_targets"] for r in gated)
    print(f"balance targets met in {met}/{len(gated)} cases with >= 32 samples per rank")
    if args.json:
        doc = {
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "cpu": cpu_name(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "platform": platform.platform(),
            "cost": cost_text,
            "model": spec.name,
            "quick": args.quick,
            "cases": rows,
            "timing": timing,
            "targets_met": f"{met}/{len(gated)}",
        }
        Path(args.json).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
