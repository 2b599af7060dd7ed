"""Digests of 1,200 random schedules, to show a scheduler change keeps its schedules.

Run it at two commits and compare the files (identical unless a schedule changed):

    git worktree add /tmp/before HEAD~1
    (cd /tmp/before && PYTHONPATH=. python /path/to/scripts/schedule_digests.py /tmp/a.json)
    PYTHONPATH=. python scripts/schedule_digests.py /tmp/b.json && cmp /tmp/a.json /tmp/b.json

Cases: 700 ungrouped (rl / bimodal lengths, n 16..4096, dp 1..64, caps 4k..32k, costs
tokens, flops, the shipped H200 profile, the H100 estimate, an additive cost with a fixed
part, a Python callable; some with align 2, min_num_microbatches 3, the pipeline order) and
500 grouped (groups of 1..16, ids as ints or strings). Each case records the schedule's
digest, makespan and lower bound, or the error's first 80 characters.
"""

from __future__ import annotations

import argparse
import json
import logging

import numpy as np

from costmodel.model import load_cost_model
from costmodel.scheduler import build_schedule, generate_lengths
from costmodel.scheduler.costs import AdditiveCost


def _costs() -> dict:
    def callable_cost(lengths):
        return 3.0 + float(np.sum(lengths + lengths.astype(float) ** 2 / 4096)) + 0.001 * len(lengths) ** 2

    return {
        "tokens": "tokens",
        "flops": "flops",
        "profile": load_cost_model("h200/qwen3-8b"),
        "estimate": load_cost_model("h100/qwen3-8b"),
        "fixed": AdditiveCost("1e6 L + L^2 + fixed", lambda L: L * 1e6 + L.astype(float) ** 2, fixed=5e9),
        "callable": callable_cost,
    }


def _record(lengths, **kw) -> list:
    try:
        s = build_schedule(lengths, spec="qwen3-8b", **kw)
    except ValueError as exc:
        return ["error", str(exc)[:80]]
    return [s.digest(), s.makespan, s.lower_bound]


def main(out: str) -> None:
    logging.disable(logging.WARNING)  # the over-cap and estimate notes, once per case
    costs = _costs()
    names = list(costs)
    rng = np.random.default_rng(0)
    ungrouped = {}
    for case in range(700):
        n, dp = int(rng.choice([16, 64, 256, 1024, 4096])), int(rng.choice([1, 2, 8, 16, 64]))
        cap = int(rng.choice([4096, 8192, 16384, 32768]))
        lengths = np.minimum(generate_lengths(max(n, 4 * dp), ["rl", "bimodal"][case % 2], seed=case),
                             2 * cap)
        kw = dict(dp_size=dp, max_tokens_per_microbatch=cap, cost=costs[names[case % len(names)]])
        if case % 7 == 0:
            kw["group_ids"] = [i // 4 for i in range(lengths.size)]
        if case % 11 == 0:
            kw["align"] = 2
        if case % 13 == 0:
            kw["min_num_microbatches"] = 3
        if case % 5 == 1:
            kw["order"] = "pipeline"
        ungrouped[case] = _record(lengths, **kw)
    grouped = {}
    for case in range(500):
        dp = int(rng.choice([1, 2, 4, 8, 32]))
        n = max(int(rng.choice([8, 32, 128, 512, 2048])), 2 * dp)
        cap, size = int(rng.choice([2048, 8192, 32768])), int(rng.choice([1, 2, 4, 8, 16]))
        lengths = np.minimum(generate_lengths(n, ["rl", "bimodal"][case % 2], seed=1000 + case), cap)
        ids = ([i // size for i in range(n)] if case % 3 else
               [str(i % (n // size + 1)) for i in range(n)])
        kw = dict(dp_size=dp, max_tokens_per_microbatch=cap, cost=costs[names[case % 5]], group_ids=ids)
        if case % 4 == 0:
            kw["min_num_microbatches"] = int(rng.choice([1, 2, 4]))
        grouped[case] = _record(lengths, **kw)
    with open(out, "w") as f:
        json.dump({"ungrouped": ungrouped, "grouped": grouped}, f)
    errors = sum(v[0] == "error" for d in (ungrouped, grouped) for v in d.values())
    print(f"wrote {out}: {len(ungrouped) + len(grouped)} cases, {errors} refused")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the JSON file of digests to write")
    main(parser.parse_args().out)
