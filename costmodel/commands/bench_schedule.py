"""`costmodel bench-schedule`: measured step-time balance of each scheduling policy (GPU).

    PYTHONPATH=. python -m costmodel bench-schedule --model qwen3-8b --lengths rl \\
        --cap 16384 --dp 8,16,64 --cost-model h200/qwen3-8b -o bench_schedule.json

Builds schedules by token balance, analytic-FLOPs balance, the common baseline (first-fit
by tokens, then Karmarkar-Karp over FLOPs) and the calibrated cost model, then times each
simulated rank's micro-batches through one real layer on this GPU, the policies
interleaved micro-batch by micro-batch (a second round in reverse order, against drift).
Prints measured makespan, measured max/mean, the speed-up over token balance and the
cost model's per-rank error; writes everything (with provenance) as JSON.

--mode forward times forward-only passes under no_grad (RL log-probs), as calibration timed
the cost model's forward curves, and every policy balances that pass; --align N makes every
policy's micro-batches per rank a multiple of N (Megatron's interleaved pipeline), as
`costmodel simulate --mode forward --align 2` predicts them.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.calibration.timer import timing_for
from costmodel.checks import did_you_mean, positive_int
from costmodel.commands.common import add_settle_argument, comma_ints
from costmodel.curves import MODES
from costmodel.kernels import check_attention

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench-schedule",
        help="measure on the GPU the step-time balance each scheduling policy achieves",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="qwen3-8b", help="preset name or HF config.json (default: qwen3-8b)")
    p.add_argument(
        "--lengths", default="rl", metavar="NAME_OR_FILE",
        help="a built-in RL-like distribution of costmodel.scheduler.generate_lengths (rl: "
        "prompt 200-1500 + lognormal response, median 1500, sigma 1; bimodal: 90%% short, "
        "10%% near the length limit; default: rl) or a file of lengths (whole numbers "
        "separated by newlines, commas or spaces, or .json/.npy)",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--samples-per-rank", type=int, default=16,
        help="batch size = this x DP size, drawn per DP size (default: 16)",
    )
    size.add_argument(
        "--samples", type=int, default=None,
        help="one batch of this many samples for every DP size (a lengths file: its first N; "
        "default for a file: all of it)",
    )
    p.add_argument("--cap", "--max-tokens", dest="cap", type=int, default=16384, help="token cap per micro-batch (default: 16384)")
    p.add_argument("--dp", default="8,16,64", help="comma-separated DP sizes (default: 8,16,64)")
    p.add_argument(
        "--policies", default="tokens,flops,baseline,calibrated",
        help="comma-separated subset of tokens,flops,baseline,calibrated",
    )
    p.add_argument(
        "--cost-model", default="auto", metavar="PATH_OR_NAME",
        help="cost model for the calibrated policy: a file or a name like h200/qwen3-8b "
        "(default auto: <this GPU>/<model>)",
    )
    p.add_argument(
        "--cost-model-allow-other-shape", action="store_true",
        help="accept a cost model calibrated for another model shape",
    )
    # No argparse choices: a bad --mode is then a one-line error, as the other bad flags are.
    p.add_argument(
        "--mode", default="train", metavar="{train,forward}",
        help="the pass timed and balanced: train (forward+backward, default) or forward "
        "(forward only under no_grad, as RL log-probs run; needs the cost model's forward "
        "curves)",
    )
    p.add_argument(
        "--align", type=int, default=1,
        help="micro-batches per rank: a multiple of this, for every policy (Megatron's "
        "interleaved pipeline; default: %(default)s)",
    )
    p.add_argument("--attention", default="torch-varlen", help="attention backend of the layer")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"), help="layer dtype")
    p.add_argument(
        "--timing", default="eager", choices=("eager", "graph"),
        help="eager (default): plain calls, as a training step runs them (at the sizes a token "
        "cap packs, the GPU is the bottleneck and launch overhead hides behind it); graph: "
        "replays of a CUDA graph of each micro-batch, the GPU's own time (6 GPU passes per "
        "micro-batch instead of 1: 2 warm-up, 1 upload, 3 timed replays)",
    )
    p.add_argument(
        "--repeats", type=int, default=None,
        help="timing rounds per micro-batch, median (default 2 eager; 1 with graph timing, "
        "whose rounds already take the median of 3 replays)",
    )
    p.add_argument("--warmup", type=int, default=2, help="warm-up micro-batches at each end of the size range")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic lengths")
    p.add_argument(
        "--time-limit-s", type=float, default=None,
        help="stop measuring after this many seconds (counted from the start) and report the "
        "(dp, policy) schedules measured in full so far; Ctrl-C / SIGINT does the same "
        "(default: no limit)",
    )
    add_settle_argument(p)
    p.add_argument("--per-rank", action="store_true", help="also print predicted vs measured per rank")
    p.add_argument("-o", "--output", default=None, metavar="JSON", help="write the results here")
    p.set_defaults(func=run)


def _calibration_timing(cost_model) -> str | None:
    """How the cost model's sweep was timed ("graph" or "eager"), where its file says."""
    if cost_model is None:
        return None
    return (cost_model.extra.get("kernels") or {}).get("timing")


def _detected_gpu_key() -> str | None:
    from costmodel.calibration.device import current_gpu_name
    from costmodel.gpus import find_gpu_by_device_name

    name = current_gpu_name()  # a memory-size suffix is that GPU, as calibrate reads it
    info = find_gpu_by_device_name(name, allow_suffix=True) if name else None
    return info.key if info else None


def run(args: argparse.Namespace, *, measure=None) -> int:
    """Run the benchmark; ``measure(lengths) -> ms`` replaces the GPU timer (for tests)."""
    started = time.perf_counter()
    from costmodel.model import load_cost_model
    from costmodel.model_file import check_output_path, write_json_atomic
    from costmodel.scheduler.lengths import (
        DISTRIBUTIONS,
        MAX_GENERATED,
        generate_lengths,
        read_lengths,
    )
    from costmodel.spec import ModelSpec
    from costmodel.training import bench, bench_report
    from costmodel.training.microbatch_timer import PASSES, LayerTimer

    if args.output is not None:  # before minutes of measuring, not after
        check_output_path(args.output, "-o")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in bench.POLICIES]
    if bad or not policies:
        what = f"unknown {', '.join(bad)}" if bad else "empty"
        raise ValueError(f"--policies {args.policies!r}: {what}; give a comma-separated subset "
                         f"of {', '.join(bench.POLICIES)}")
    dp_sizes = comma_ints(args.dp, "--dp")
    if args.mode not in MODES:
        raise ValueError(f"--mode {args.mode!r}: {did_you_mean(args.mode, MODES)}give "
                         f"{' or '.join(MODES)}")
    mode = args.mode
    align = positive_int(args.align, "--align")
    if args.cap < 1:
        raise ValueError(f"--cap must be a positive number of tokens, got {args.cap}")
    check_attention(args.attention)
    args.timing = timing_for(args.timing, args.attention)  # sdpa: eager, before the GPU
    if args.repeats is None:
        args.repeats = 1 if args.timing == "graph" else 2
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    if args.time_limit_s is not None and not args.time_limit_s > 0:
        raise ValueError(f"--time-limit-s must be > 0 seconds, got {args.time_limit_s}")
    if args.warmup < 0 or args.seed < 0:
        raise ValueError(f"--warmup and --seed must be >= 0, got {args.warmup} and {args.seed}")
    deadline = None if args.time_limit_s is None else started + args.time_limit_s
    spec = ModelSpec.from_any(args.model)

    # Lengths: a file is one batch; a distribution is drawn per DP size (samples per rank).
    if args.samples is not None and not 1 <= args.samples <= MAX_GENERATED:
        raise ValueError(f"--samples must be in 1..{MAX_GENERATED:,}, got {args.samples}")
    fixed_batch = args.samples is not None or args.lengths not in DISTRIBUTIONS
    if args.lengths not in DISTRIBUTIONS:
        if not Path(args.lengths).exists():
            raise FileNotFoundError(
                f"--lengths {args.lengths!r} is neither a built-in distribution "
                f"({', '.join(DISTRIBUTIONS)}) nor an existing lengths file"
            )
        fixed = read_lengths(args.lengths)
        if args.samples is not None and args.samples > fixed.size:
            raise ValueError(
                f"--samples {args.samples} but {args.lengths} holds {fixed.size} lengths; "
                "lower --samples or add lengths"
            )
        batch = fixed if args.samples is None else fixed[: args.samples]
        lengths_for_dp = lambda dp: batch  # noqa: E731
    elif args.samples is not None:
        batch = generate_lengths(args.samples, args.lengths, seed=args.seed)
        lengths_for_dp = lambda dp: batch  # noqa: E731
    else:
        per_rank = args.samples_per_rank
        if per_rank < 1:
            raise ValueError(f"--samples-per-rank must be at least 1, got {per_rank}")
        if per_rank * max(dp_sizes) > MAX_GENERATED:  # a huge --dp read as a bad per-rank count
            raise ValueError(f"--samples-per-rank {per_rank} x the largest --dp "
                             f"{max(dp_sizes):,} is more than the {MAX_GENERATED:,} samples "
                             "drawn at most: lower --dp or --samples-per-rank")
        cache: dict[int, np.ndarray] = {}

        def lengths_for_dp(dp: int) -> np.ndarray:
            if dp not in cache:
                cache[dp] = generate_lengths(per_rank * dp, args.lengths, seed=args.seed)
            return cache[dp]

    longest = max(int(lengths_for_dp(dp).max()) for dp in dp_sizes)
    if longest > args.cap:  # every policy would run it alone, over the cap: nothing to compare
        raise ValueError(f"--cap {args.cap} is below the longest sample ({longest} tokens); "
                         f"raise --cap to at least {longest} or give shorter --lengths")
    cost_model = None
    if "calibrated" in policies:
        name = args.cost_model
        if name == "auto":  # this GPU's profile of the model's shape, whatever its name
            name = _detected_gpu_key() or "h200"
        cost_model = load_cost_model(
            name, spec=spec, allow_other_shape=args.cost_model_allow_other_shape
        )
        if mode not in cost_model.modes:  # else KeyError deep in the scheduler
            other = [m for m in cost_model.modes if m != mode]
            raise ValueError(
                f"cost model {name} has curves for {', '.join(cost_model.modes)} only; "
                f"--mode {mode} times {PASSES[mode]} and balances by the {mode} curves: "
                f"calibrate with --modes {mode} (or --modes train,forward)"
                + "".join(f", pick --mode {m}" for m in other)
                + ", or drop calibrated from --policies"
            )
        if cost_model.is_estimate:
            print(
                f"note: cost model {name} is an ESTIMATE from the GPU registry, not a measured "
                "profile; run `costmodel calibrate` for a measured one",
                file=sys.stderr,
            )
    # Every schedule is built and checked before the GPU is touched: a bad --cap, --dp or
    # batch fails in a second, not after the timer's start-up and the clocks' settling.
    planned = bench.plan_benchmark(
        lengths_for_dp(dp_sizes[0]), spec=spec, cap=args.cap, dp_sizes=dp_sizes,
        cost_model=cost_model, policies=policies, lengths_for_dp=lengths_for_dp, mode=mode,
        align=align,
    )
    device: dict[str, Any]
    if measure is None:
        # A cost model of one tensor-parallel rank's shard is judged on that shard's layer.
        rank = spec
        # (experts split at TP 1 too: --expert-tensor-parallel alone makes a shard)
        if cost_model is not None and cost_model.rank_spec is not cost_model.spec:
            rank = cost_model.rank_spec
            print(f"timing one rank's shard{cost_model.parallel_label}, as the cost model "
                  "was calibrated", file=sys.stderr)
        timer = LayerTimer(rank, attention=args.attention, dtype=args.dtype,
                           timing=args.timing, mode=mode)  # RuntimeError without a GPU
        measure = timer
        device = timer.describe()
        from costmodel.calibration.device import settle_gpu

        settle_gpu(args.settle_s)
        if cost_model is not None:
            from costmodel.integrations.args import _same_gpu

            if not _same_gpu(str(cost_model.gpu), device["gpu"]):
                print(
                    f"warning: the cost model was measured on {cost_model.gpu} but this GPU is "
                    f"{device['gpu']}",
                    file=sys.stderr,
                )
    else:
        device = {"measurer": getattr(measure, "__name__", type(measure).__name__) + " (injected)",
                  "timing": getattr(measure, "timing", None)}
    model_timing = _calibration_timing(cost_model)
    if model_timing is not None and device.get("timing") not in (None, model_timing):
        print(
            f"note: the cost model was calibrated with {model_timing} timing and this "
            f"benchmark times {device['timing']}: predicted vs measured per rank includes "
            "that difference (launch overhead is in eager times, not in graph ones); every "
            "policy's makespan is measured the same way",
            file=sys.stderr,
        )

    progress = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    failure = None
    try:
        runs = bench.measure_benchmark(
            planned, measure=measure, spec=spec, cost_model=cost_model, repeats=args.repeats,
            warmup=args.warmup, progress=progress, deadline=deadline, mode=mode,
        )
    except bench.MeasurementFailed as err:  # report and write what was measured before it
        runs, failure = err.runs, str(err)
    measured = {(r.dp_size, r.policy) for r in runs}
    unmeasured = [[dp, p] for dp in dp_sizes for p in policies if (dp, p) not in measured]
    if not runs:
        raise RuntimeError(
            failure or "stopped before any schedule was measured in full: raise "
            "--time-limit-s, or measure less (--dp, --samples-per-rank, --policies, --repeats 1)"
        )
    if unmeasured:
        print(
            "warning: stopped early; not measured: "
            + ", ".join(f"dp {dp} {p}" for dp, p in unmeasured),
            file=sys.stderr,
        )
    # Which pass and alignment the numbers are of: a forward run's table reads like a train one.
    print(f"{spec.name}: one layer, mode {mode} ({PASSES[mode]}), align {align}, "
          f"cap {args.cap}")
    print(bench_report.format_report(runs, per_rank=args.per_rank, mode=mode))
    checks = bench_report.target_checks(runs)
    for c in checks:
        parts = [f"dp {c['dp_size']}: calibrated max/mean {c['calibrated_max_over_mean']:.3f}"]
        if "makespan_cut_vs_tokens" in c:
            cut = c["makespan_cut_vs_tokens"] * 100
            parts.append(f"makespan {abs(cut):.1f}% {'below' if cut >= 0 else 'ABOVE'} tokens "
                         f"(a perfect balance of tokens' work: {100 * c['tokens_balance_headroom']:.1f}%)")
        if "no_worse_than_flops" in c:
            parts.append("no worse than flops" if c["no_worse_than_flops"] else "WORSE than flops")
        print("; ".join(parts))
    if args.output is not None:
        base = bench_report.token_makespans(runs)
        doc = {
            "schema": "costmodel-bench-schedule/1",
            "provenance": bench_report.provenance(),
            "device": device,
            "model": spec.to_dict(),
            "cost_model": None if cost_model is None else {
                "label": cost_model.label,
                "gpu": cost_model.gpu,
                "is_estimate": cost_model.is_estimate,
                "timing": model_timing,
                "provenance": cost_model.provenance,
            },
            "config": {
                "lengths": args.lengths, "seed": args.seed, "cap": args.cap, "dp_sizes": dp_sizes,
                "mode": mode, "align": align,
                "policies": policies, "repeats": args.repeats, "warmup": args.warmup,
                "samples": args.samples,
                "samples_per_rank": None if fixed_batch else args.samples_per_rank,
                "attention": args.attention, "dtype": args.dtype,
                "time_limit_s": args.time_limit_s,
            },
            "elapsed_s": round(time.perf_counter() - started, 1),
            "error": failure,
            "unmeasured": unmeasured,
            "batches": {
                str(dp): _summary(lengths_for_dp(dp)) for dp in dp_sizes
            },
            "runs": [r.to_dict(base.get(r.dp_size)) for r in runs],
            "targets": checks,
        }
        path = write_json_atomic(args.output, doc)
        print(f"wrote {path}")
    if failure is not None:
        print(f"costmodel bench-schedule: error: {failure} (the schedules above were "
              "measured in full before it)", file=sys.stderr)
        return 2
    return 0


def _summary(lengths: np.ndarray) -> dict[str, Any]:
    return {
        "samples": int(lengths.size),
        "tokens": int(lengths.sum()),
        "mean": float(lengths.mean()),
        "p50": float(np.percentile(lengths, 50)),
        "p99": float(np.percentile(lengths, 99)),
        "max": int(lengths.max()),
    }
