"""`costmodel correct`: scale a cost model's parts to fit runs measured end to end.

    costmodel correct calibrated.json -o corrected.json             # its validation's runs
    costmodel correct calibrated.json --runs runs.jsonl -o corrected.json

What is corrected and how it is judged: `costmodel.calibration.correct`. Needs no GPU.
Exit status 1, and nothing written, when no pass's correction passes its checks.
"""

from __future__ import annotations

import argparse
import shlex


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "correct",
        help="scale a cost model's parts to fit runs of the whole stack (its validation, or "
        "a training run's per-rank times)",
        description=(
            "Fit one factor per part (overhead, attention, linear, head) and pass to runs "
            "measured end to end, check it by cross-validation, and write the model with its "
            "curves scaled. Without --runs, the runs are the file's own `costmodel validate` "
            "micro-batches. Works without a GPU."
        ),
    )
    p.add_argument("model", metavar="PATH_OR_NAME",
                   help="cost model file, or a name such as h200/qwen3-8b (the shipped profile, "
                   "else the registry estimate: runs of a training job correct it too)")
    p.add_argument("--runs", default=None, nargs="+", metavar="FILE",
                   help='measured runs, JSON lines like {"mode": "train", "microbatches": '
                   '[[1200, 350], [4096]], "ms": 812.5}: the whole model running those '
                   "micro-batches one after another (a rank's compute time in a step); "
                   "several files (one per rank) together")
    p.add_argument("--folds", type=int, default=5,
                   help="micro-batch size ranges the runs are cut into, each predicted by "
                   "factors fitted to the others, to judge the correction (default: 5)")
    p.add_argument("-o", "--output", required=True, help="where to write the corrected model")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from costmodel.calibration.correct import (
        apply_correction,
        check_folds,
        fit_correction,
        read_runs,
        validation_runs,
    )
    from costmodel.model import load_cost_model
    from costmodel.model_file import check_output_path

    output = check_output_path(args.output, "-o")
    check_folds(args.folds, "--folds")  # before the model and the runs are read
    model = load_cost_model(args.model)
    runs = [r for path in args.runs for r in read_runs(path)] if args.runs else validation_runs(model)
    source = ", ".join(args.runs) if args.runs else f"{args.model} (its validation)"
    correction = fit_correction(model, runs, folds=args.folds)
    print(format_correction(correction, source))
    if not correction.scales:
        print(f"no pass corrected: nothing written to {output}; {args.model} stands as it is")
        return 1
    corrected = apply_correction(model, correction, source=source,
                                 command=shlex.join(["costmodel", *args.argv]))
    corrected.save(output)
    print(f"wrote {output}")
    return 0


def format_correction(correction, source: str) -> str:
    """A table of each pass's errors: the model as it is, corrected (held out), and the
    token and FLOPs yardsticks; then the factors, and why a pass kept its curves."""
    from costmodel.calibration.correct import format_factors
    from costmodel.calibration.validate import SPLIT_TOKENS

    lines = [f"correction from {source}:",
             f"  {'pass':8} {'runs':>12} {'model':>7} {'held-out':>9} {'worst':>7} "
             f"{'tokens':>7} {'flops':>7}"]
    for mode, fig in correction.figures.items():
        for split, label in (("all", "all"), (f">={SPLIT_TOKENS}", ">= 1k mb")):
            row, base = fig["by_size"].get(split), fig["baselines"].get(split)
            if row is None:
                continue
            lines.append(
                f"  {mode if split == 'all' else '':8} {row['before']['count']:4d} {label:>7} "
                f"{row['before']['mape']:7.2%} {row['held_out']['mape']:9.2%} "
                f"{row['held_out']['worst']:7.2%} {base['tokens']['mape']:7.2%} "
                f"{base['flops']['mape']:7.2%}")
        lines.append("    factors: " + format_factors(fig["scales"])
                     + ("" if fig["adopted"] else f"; not adopted: {fig['why_not']}"))
    folds = next(iter(correction.figures.values()))["folds"]
    lines.append("  (mean absolute error of each run's time; held-out: the runs cut into "
                 f"{folds} ranges of micro-batch size, each predicted by factors fitted to the "
                 "others; tokens, flops: each times its best single scale; >= 1k mb: runs whose "
                 "micro-batches hold 1k tokens or more on average)")
    return "\n".join(lines)
