"""`costmodel simulate`: compare scheduling policies on one batch, under one cost model.

    costmodel simulate --model qwen3-8b --cost-model h200/qwen3-8b --n 4096 --dp 8 \\
        --max-tokens 16384

Each policy builds a schedule its own way; all are then judged by the same cost model's
predicted time: the makespan (the slowest rank, when the step ends), max/mean over ranks,
and the makespan over `costmodel.scheduler.lower_bound` (for a calibrated model: its
sequences' costs, the fewest micro-batches' fixed costs and every token at the curve's
cheapest per-token cost, over dp; or the costliest sample alone if larger). Policies:

- ``tokens``: this scheduler balancing tokens (classic dynamic batching, cap-safe);
- ``flops``: this scheduler balancing exact analytic FLOPs;
- ``baseline``: first-fit packing by tokens, then Karmarkar-Karp over micro-batch FLOPs to
  ranks (slime's ``balance_data``; see `costmodel.scheduler.baselines`);
- ``cost-model``: this scheduler balancing the cost model's predicted time.

With ``--group-size G`` each run of G consecutive samples stays on one rank in the three
policies of this scheduler; the baselines, which place samples, are left out.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from costmodel.commands.schedule import (
    add_allow_other_shape,
    add_batch_arguments,
    add_group_size,
    batch_lengths,
    builtin_cost,
    context_parallel_of,
    cost_label,
    group_ids_of,
)

# Past this many samples `--variant` says it will be slow: its Karmarkar-Karp over samples
# into ~total/cap micro-batches is quadratic (measured 0.8 s at 20,000, 3.9 s at 50,000).
_VARIANT_QUICK_N = 50_000


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="compare token, FLOPs, baseline and cost-model scheduling on one batch",
        description="Build schedules for one batch with several policies and compare their "
        "predicted step time under one cost model.",
    )
    add_batch_arguments(p)
    p.add_argument(
        "--cost-model",
        default=None,
        metavar="PATH_OR_NAME",
        help="cost model that judges every policy (a calibrated file or a shipped name); "
        "default: the H200 one of --model's shape (measured where shipped, else the estimate)",
    )
    add_allow_other_shape(p)
    add_group_size(p)
    p.add_argument(
        "--variant",
        action="store_true",
        help="also run the baseline variant that splits samples into micro-batches by "
        "Karmarkar-Karp over per-sample FLOPs (slime's balance_by_flops; ignores the cap, "
        "and is slow for large batches)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the comparison as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from costmodel.flops import sequence_fwd_flops
    from costmodel.model import load_cost_model
    from costmodel.model_file import check_output_path, write_json_atomic
    from costmodel.scheduler import baseline_microbatches, build_schedule, evaluate_schedule
    from costmodel.spec import ModelSpec

    if args.json is not None:
        check_output_path(args.json, "--json")
    spec = ModelSpec.from_any(args.model)
    lengths, source = batch_lengths(args)
    if builtin_cost(args.cost_model) is not None:
        raise ValueError(f"--cost-model judges every policy in milliseconds: give a cost model "
                         f"file or a name such as h200/{spec.name} ({args.cost_model} balance is "
                         "already a row of the table)")
    # "h200" with the spec: that GPU's profile of this shape, whatever the model's name
    # (a config folder's name may be no valid "gpu/model" name); an empty --cost-model is
    # refused there, not taken as unset
    model = load_cost_model("h200" if args.cost_model is None else args.cost_model, spec=spec,
                            allow_other_shape=args.cost_model_allow_other_shape)
    # What one GPU of a micro-batch split over --context-parallel GPUs runs.
    judge = model.for_context_parallel(context_parallel_of(args))
    common = dict(max_tokens_per_microbatch=args.max_tokens, mode=args.mode)
    flops = sequence_fwd_flops(lengths, spec)
    group_ids = group_ids_of(args.group_size, lengths.size, args.dp)

    def ours(cost):
        return lambda: build_schedule(
            lengths, dp_size=args.dp, cost=cost, spec=spec, align=args.align,
            group_ids=group_ids, **common
        )

    def baseline(variant):
        return lambda: baseline_microbatches(
            lengths,
            dp_size=args.dp,
            max_tokens_per_microbatch=args.max_tokens,
            sample_flops=flops,
            variant=variant,
            align=args.align,
        )

    policies = [("tokens", ours("tokens")), ("flops", ours("flops"))]
    if group_ids is None:  # the baselines place samples, not groups
        policies.append(("baseline", baseline("first-fit")))
    if args.variant and group_ids is None:
        if lengths.size > _VARIANT_QUICK_N:  # one line, not a silent minute
            print(f"note: --variant's kk-samples baseline takes time quadratic in the number "
                  f"of samples: {lengths.size:,} can take minutes", file=sys.stderr)
        policies.append(("baseline kk-samples", baseline("kk-samples")))
    policies.append(("cost-model", ours(judge)))

    rows: list[dict[str, Any]] = []
    for name, build in policies:
        t0 = time.perf_counter()
        built = build()
        elapsed = (time.perf_counter() - t0) * 1e3
        mbs = built.microbatches if hasattr(built, "microbatches") else built
        judged = evaluate_schedule(mbs, lengths, cost=judge, spec=spec, **common)
        counts = sorted({len(r) for r in mbs})
        rows.append(
            {
                "policy": name,
                "makespan_ms": judged.makespan,
                "imbalance": judged.imbalance,
                "makespan_over_lower_bound": judged.makespan_over_lower_bound,
                "microbatches_per_rank": counts[0] if len(counts) == 1 else counts,
                "cap_violations": judged.cap_violations,
                "oversized": judged.oversized,
                "schedule_ms": elapsed,
            }
        )
    base = next(r["makespan_ms"] for r in rows if r["policy"] == "tokens")
    grouped = "" if group_ids is None else f"; groups of {args.group_size} on one rank each"
    print(f"{source}; {int(lengths.sum()):,} tokens; dp={args.dp}, cap={args.max_tokens}{grouped}")
    print(f"judged by: {cost_label(judge)} ({args.mode})")
    summary = model.validation_summary(args.mode)
    if summary:
        print(summary)
    head = (
        f"{'policy':<20} {'makespan ms':>13} {'vs tokens':>10} {'max/mean':>9} "
        f"{'/ lower bd':>10} {'mb/rank':>8} {'cap viol':>8} {'sched ms':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        mb = r["microbatches_per_rank"]
        mb_text = str(mb) if isinstance(mb, int) else f"{mb[0]}-{mb[-1]}"
        print(
            f"{r['policy']:<20} {r['makespan_ms']:>13,.1f} {r['makespan_ms'] / base - 1:>+10.2%} "
            f"{r['imbalance']:>9.4f} {r['makespan_over_lower_bound']:>10.4f} {mb_text:>8} "
            f"{r['cap_violations']:>8} {r['schedule_ms']:>9.1f}"
        )
    if group_ids is not None:
        print("the baselines are not run with --group-size: they place samples, not groups")
    alone = int((lengths > args.max_tokens).sum())
    if alone:
        print(f"{alone} sample(s) longer than the cap run alone in micro-batches over it, in "
              "every policy ('cap viol' counts micro-batches of several samples over the cap)")
    if args.json is not None:
        doc = {
            "input": {
                "source": source,
                "model": spec.name,
                "dp": args.dp,
                "max_tokens": args.max_tokens,
                "context_parallel": args.context_parallel,
                "cost_model": cost_label(judge),
                "mode": args.mode,
                "group_size": args.group_size,
            },
            "policies": rows,
        }
        write_json_atomic(args.json, doc)
        print(f"wrote {args.json}")
    return 0
