"""`costmodel report`: table (and plot) of a cost model file or a shipped/estimated name."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="print a cost model's curves, FLOPs check and validation; optionally plot them",
        description=(
            "Show a cost model: a file from `costmodel calibrate`, or a name such as "
            "h200/qwen3-8b (the shipped measured profile, else the registry estimate, "
            "labelled ESTIMATE). Works without a GPU."
        ),
    )
    p.add_argument("model", metavar="PATH_OR_NAME", help="cost model file, or GPU/MODEL name")
    p.add_argument("--png", default=None, help="also write a plot to this file (.png, or another format matplotlib writes: "
                   ".pdf, .svg ...)")
    p.add_argument("--cost-model-allow-other-shape", "--allow-other-shape", action="store_true",
                   dest="allow_other_shape",
                   help="with --spec, accept a file made for another model shape")
    p.add_argument("--spec", "--model", dest="spec", default=None,
                   help="model preset or config.json the file must match (default: the file's own)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from costmodel.calibration.report import format_report, plot_format, plot_report, pyplot
    from costmodel.model import load_cost_model
    from costmodel.model_file import check_output_path
    from costmodel.spec import ModelSpec

    if args.png is not None:  # before loading and printing, not after
        check_output_path(args.png, "--png")
        plot_format(args.png)
        pyplot()  # matplotlib missing: say so now, not after the whole report
    spec = ModelSpec.from_any(args.spec) if args.spec else None
    model = load_cost_model(args.model, spec=spec, allow_other_shape=args.allow_other_shape)
    print(format_report(model))
    if args.png is not None:
        plot_report(model, args.png)
        print(f"\nwrote {args.png}")
    return 0
