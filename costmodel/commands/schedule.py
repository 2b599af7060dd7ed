"""`costmodel schedule`: build one schedule and print its predicted balance.

    costmodel schedule --model qwen3-8b --dist rl --n 4096 --dp 8 --max-tokens 16384 \\
        --cost h200/qwen3-8b [--json out.json]

``--cost`` is ``tokens``, ``flops`` (exact analytic FLOPs of ``--model``), or a cost model:
a file from `costmodel calibrate` or a shipped name such as ``h200/qwen3-8b``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from costmodel.checks import positive_int
from costmodel.curves import MODES
from costmodel.flops import MAX_LENGTH
from costmodel.model_file import is_unknown_name
from costmodel.scheduler.costs import builtin_hint
from costmodel.scheduler.lengths import DISTRIBUTIONS, MAX_GENERATED, generate_lengths, read_lengths

_DRAW_N = 4096  # samples drawn from --dist without --n


def add_batch_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that describe a batch and its scheduling problem (shared with simulate)."""
    p.add_argument("--model", default="qwen3-8b", help="preset name or HF config.json path (default: %(default)s)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--lengths", "--lengths-file",  # train-demo's name for it
        dest="lengths",
        metavar="FILE",
        help="file of sample lengths: one integer per line, or separated by commas or spaces, "
        "# starting a comment (.json and .npy too); a --dist name (rl, bimodal) draws from "
        "that distribution, as in bench-schedule (a file of that name: ./rl)",
    )
    src.add_argument(
        "--dist",
        choices=DISTRIBUTIONS,
        default="rl",
        help="built-in length distribution (rl: prompt 200-1500 + lognormal response, "
        "median 1500; bimodal: 90%% short, 10%% very long) (default: %(default)s)",
    )
    # None when not given: with a lengths file, a given --n or --seed is said to do nothing
    p.add_argument("--n", type=int, default=None, help=f"samples to draw with --dist (default: {_DRAW_N})")
    p.add_argument("--seed", type=int, default=None, help="seed for --dist (default: 0)")
    p.add_argument("--dp", type=int, default=8, help="data-parallel ranks (default: %(default)s)")
    p.add_argument("--max-tokens", "--cap", dest="max_tokens", type=int, default=16384,
                   help="token cap of one micro-batch (bench-schedule's --cap) "
                   "(default: %(default)s)")
    p.add_argument(
        "--align", type=int, default=1, help="micro-batches per rank: a multiple of this (default: %(default)s)"
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default="train",
        help="cost of a training step or of a forward-only (log-prob) pass (default: %(default)s)",
    )
    p.add_argument(
        "--context-parallel", type=int, default=1, metavar="CP",
        help="each micro-batch is split over CP GPUs (--max-tokens is then the whole "
        "micro-batch's cap, CP x one GPU's): a cost model prices what one of them runs "
        "(default: %(default)s)",
    )


def batch_lengths(args: argparse.Namespace) -> tuple[np.ndarray, str]:
    """The lengths the flags describe, and a short description of where they came from;
    ValueError naming the flag (--dp, not build_schedule's dp_size) for a batch that
    cannot be scheduled."""
    dp = positive_int(args.dp, "--dp")
    align = positive_int(args.align, "--align")
    cap = positive_int(args.max_tokens, "--max-tokens")
    if cap > MAX_LENGTH:
        raise ValueError(f"--max-tokens {cap:,} is more than any sample can be long (at most "
                         f"{MAX_LENGTH:,} tokens, 2^31 - 1)")
    # `--lengths ""` (an unset shell variable) is a file name, not a request to draw --dist
    if args.lengths is not None and args.lengths not in DISTRIBUTIONS:
        lengths = read_lengths(args.lengths)
        source = f"{lengths.size} lengths from {args.lengths}"
        more = "add lengths to the file"
        unused = [flag for flag, value in (("--n", args.n), ("--seed", args.seed)) if value is not None]
        if unused:  # they draw from --dist: a file is scheduled whole
            verb = "apply" if len(unused) > 1 else "applies"
            print(f"note: {' and '.join(unused)} only {verb} to --dist; scheduling all "
                  f"{lengths.size:,} lengths of {args.lengths}", file=sys.stderr)
    else:
        dist = args.lengths or args.dist  # "--lengths rl", as bench-schedule takes it
        seed = 0 if args.seed is None else args.seed
        n = positive_int(_DRAW_N if args.n is None else args.n, "--n")
        if n > MAX_GENERATED:
            raise ValueError(f"--n {n} samples is more than this command schedules (at most "
                             f"{MAX_GENERATED:,}; a step of an RL run has thousands to tens of "
                             "thousands)")
        lengths = generate_lengths(n, dist, seed=seed)
        source = f"{n} samples, distribution {dist!r}, seed {seed}"
        more = f"raise --n to {dp * align} or more"
    if lengths.size < dp * align:
        raise ValueError(f"{lengths.size} samples cannot fill --dp {dp} ranks of --align {align} "
                         f"micro-batch(es) each (none may be empty): {more}, or lower --dp or "
                         "--align")
    return lengths, source


def add_allow_other_shape(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cost-model-allow-other-shape", action="store_true",
        help="accept a cost model calibrated for another model shape than --model",
    )


def add_group_size(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--group-size", type=int, default=None, metavar="G",
        help="keep each run of G consecutive samples on one rank (a prompt's G responses, "
        "laid out prompt by prompt as GRPO-style rollouts are; the last run may be shorter)",
    )


def builtin_cost(name: Any) -> str | None:
    """"tokens" or "flops" for those names in any case ("FLOPS" too), else None."""
    text = str(name).strip().lower()
    return text if text in ("tokens", "flops") else None


def resolve_cost(name: str, spec: Any, *, allow_other_shape: bool = False) -> Any:
    """'tokens' and 'flops' (any case) pass through; anything else loads a cost model for
    ``spec``."""
    builtin = builtin_cost(name)
    if builtin is not None:
        return builtin
    from costmodel.model import load_cost_model

    try:
        return load_cost_model(name, spec=spec, allow_other_shape=allow_other_shape)
    except (ValueError, FileNotFoundError) as err:
        if not is_unknown_name(err):
            raise ValueError(f"--cost {name!r}: {err}") from None  # there, but does not fit
        raise ValueError(f"--cost {name!r} is not 'tokens', 'flops'{builtin_hint(name)} or a cost "
                         f"model ({err})") from None


def cost_label(cost: Any) -> str:
    if isinstance(cost, str):
        return cost
    label = getattr(cost, "label", None)
    text = label() if callable(label) else str(label or type(cost).__name__)
    if getattr(cost, "is_estimate", False) and "estimate" not in text.lower():
        text += " (estimate)"
    return text


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "schedule",
        help="pack a batch into micro-batches over DP ranks and show the predicted balance",
        description="Build a cost-balanced, cap-safe schedule for one batch and print each "
        "rank's predicted cost, the max/mean imbalance and the makespan over its lower bound.",
    )
    add_batch_arguments(p)
    p.add_argument(
        "--cost",
        "--cost-model",  # the name simulate, bench-schedule and the training flags use
        dest="cost",
        default="tokens",
        help="what to balance: tokens, flops, or a cost model (calibrated file or shipped "
        "name, e.g. h200/qwen3-8b) (default: tokens)",
    )
    add_allow_other_shape(p)
    add_group_size(p)
    p.add_argument(
        "--order",
        choices=("none", "longest-first", "pipeline"),
        default="none",
        help="run order of the micro-batches inside a rank (default: %(default)s)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the whole schedule as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from costmodel.model_file import check_output_path, write_json_atomic
    from costmodel.scheduler import build_schedule
    from costmodel.spec import ModelSpec

    if args.json is not None:
        check_output_path(args.json, "--json")
    spec = ModelSpec.from_any(args.model)
    lengths, source = batch_lengths(args)
    cp = context_parallel_of(args)
    cost = resolve_cost(args.cost, spec, allow_other_shape=args.cost_model_allow_other_shape)
    if not isinstance(cost, str):  # tokens and FLOPs split evenly: their balance is the same
        cost = cost.for_context_parallel(cp)
    group_ids = group_ids_of(args.group_size, lengths.size, args.dp)
    t0 = time.perf_counter()
    s = build_schedule(
        lengths,
        dp_size=args.dp,
        max_tokens_per_microbatch=args.max_tokens,
        cost=cost,
        spec=spec,
        align=args.align,
        order=args.order,
        mode=args.mode,
        group_ids=group_ids,
    )
    elapsed_ms = (time.perf_counter() - t0) * 1e3
    if args.json is not None:  # before the table: a reader that stops early (| head) loses none
        doc = s.to_dict()
        doc["input"] = {"source": source, "model": spec.name, "cost": cost_label(cost),
                        "context_parallel": args.context_parallel,
                        "group_size": args.group_size}
        write_json_atomic(args.json, doc)
    unit = "ms" if not isinstance(cost, str) else ("tokens" if cost == "tokens" else "FLOP")
    grouped = "" if group_ids is None else f", in groups of {args.group_size} on one rank each"
    print(f"{source}; {int(lengths.sum()):,} tokens{grouped}")
    print(
        f"{spec.name}, dp={args.dp}, cap={args.max_tokens} tokens, cost: {cost_label(cost)}; "
        f"scheduled in {elapsed_ms:.1f} ms"
    )
    print(
        f"micro-batches per rank: {s.num_microbatches} "
        f"(bound from the cap: {s.stats.get('min_microbatches_per_rank', '?')}), "
        f"{s.oversized} sample(s) over the cap alone, cap violations: {s.cap_violations}"
    )
    costs = np.asarray(s.rank_costs)
    tokens = np.array([sum(t) for t in s.microbatch_tokens])
    print(f"{'rank':>5} {'predicted ' + unit:>18} {'tokens':>12} {'vs mean':>9}")
    mean = float(costs.mean())
    fmt = {"ms": ",.1f", "tokens": ",.0f"}.get(unit, ".5e")
    shown = range(args.dp) if args.dp <= 16 else [*range(4), *range(args.dp - 4, args.dp)]
    for r in shown:
        if args.dp > 16 and r == args.dp - 4:
            print(f"{'...':>5}")
        print(f"{r:>5} {costs[r]:>18{fmt}} {tokens[r]:>12,} {costs[r] / mean - 1:>+9.3%}")
    print(
        f"max/mean {s.imbalance:.5f}   makespan {s.makespan:{fmt}} {unit}   "
        f"lower bound {s.lower_bound:{fmt}} {unit}   makespan/lower bound "
        f"{s.makespan_over_lower_bound:.5f}"
    )
    if args.json is not None:
        print(f"wrote {args.json}")
    return 0


def context_parallel_of(args: argparse.Namespace) -> int:
    """--context-parallel, checked: at most --max-tokens GPUs, each holding at least a token
    of a full micro-batch (10^14 was taken, and priced a GPU's share of nothing)."""
    cp = positive_int(args.context_parallel, "--context-parallel")
    if cp > args.max_tokens:
        raise ValueError(f"--context-parallel {cp:,} is more GPUs than --max-tokens "
                         f"{args.max_tokens:,} has tokens: each would hold less than one token "
                         "of a full micro-batch; lower --context-parallel")
    return cp


def group_ids_of(group_size: int | None, n: int, dp: int) -> np.ndarray | None:
    """Each sample's group (runs of ``group_size`` consecutive samples), or None without
    --group-size; ValueError naming the flags where the groups cannot cover the ranks
    (build_schedule would name its own arguments)."""
    if group_size is None:
        return None
    size = positive_int(group_size, "--group-size")
    groups = -(-n // size)
    if groups < dp:
        raise ValueError(f"--group-size {size} makes {groups} group(s) of {n} samples, fewer "
                         f"than --dp {dp} ranks (a group stays on one rank, and no rank may be "
                         "empty): lower --group-size or --dp, or schedule more samples")
    return np.arange(n) // size
