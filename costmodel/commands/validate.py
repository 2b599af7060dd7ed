"""`costmodel validate`: predicted vs measured on random packed micro-batches (GPU)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from costmodel.commands.common import add_settle_argument, comma_ints
from costmodel.interrupts import signals_interrupt


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate",
        help="compare a cost model with measurements on random micro-batches (GPU)",
        description=(
            "Run random packed micro-batches (RL-like long-tailed lengths, several token caps) "
            "through real layers + the LM head on this GPU and print predicted vs measured: "
            "MAPE, worst error and Spearman rank correlation, next to tokens x best scale and "
            "analytic FLOPs x best scale, for all micro-batches and those of >= 1k tokens. "
            "The result is stored in the file (atomically) unless --no-save."
        ),
    )
    p.add_argument("path", help="cost model file from `costmodel calibrate` (or, with --no-save, a "
                   "shipped profile such as h200/qwen3-8b)")
    p.add_argument("--count", type=int, default=150,
                   help="micro-batches per mode, 4..10,000 (default 150)")
    p.add_argument("--layers", type=int, default=None,
                   help="layers in the timed stack, at most the model's (default 4, or the "
                   "model's layers where fewer)")
    p.add_argument("--caps", default=None,
                   help="token caps of the micro-batches (default 768,2048,4096,8192,16384, "
                   "those up to the largest micro-batch the file measured)")
    p.add_argument("--modes", default=None, help="passes to validate (default: all in the file)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random micro-batches (default 0); stored with them")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs of each micro-batch, the median kept (default 3)")
    add_settle_argument(p)
    p.add_argument("--time-limit-s", type=float, default=None,
                   help="stop starting new micro-batches after this many seconds and report "
                   "those measured (default: no limit)")
    p.add_argument("--timing", choices=("graph", "eager"), default=None,
                   help="time the micro-batches as CUDA-graph replays or plain calls (default: "
                   "as the file was calibrated; eager where a workload cannot be captured)")
    p.add_argument("--allow-other-gpu", action="store_true",
                   help="validate on a GPU other than the one the file was calibrated on")
    p.add_argument("--no-save", action="store_true",
                   help="do not store the result in the file (needed to validate a shipped "
                   "profile by name, e.g. h200/qwen3-8b)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from costmodel.calibration.device import device_fingerprint, require_cuda, settle_gpu
    from costmodel.calibration.progress import ProgressLine
    from costmodel.calibration.software import model_drift
    from costmodel.calibration.validate import (
        DEFAULT_CAPS,
        MAX_COUNT,
        check_stack_layers,
        format_validation,
        largest_calibrated,
        run_validation,
    )
    from costmodel.commands.calibrate import parse_modes, print_peak_memory
    from costmodel.model import load_cost_model
    from costmodel.model_file import check_output_path

    path = Path(args.path)
    if path.is_file() or path.is_dir():  # a folder: load_cost_model names the file in it
        model = load_cost_model(args.path)  # as typed: Path("") is ".", a folder
    elif args.no_save and "/" in args.path and not args.path.endswith(".json"):
        model = load_cost_model(args.path)  # a shipped profile, checked on this GPU, not stored
    else:
        raise FileNotFoundError(f"no cost model file at {path} (a shipped profile such as "
                                "h200/qwen3-8b can be validated with --no-save)")
    if model.is_estimate:
        raise ValueError(f"{args.path} is an estimate; validate a measured file from "
                         "`costmodel calibrate`")
    modes = parse_modes(args.modes) if args.modes else tuple(model.modes)
    largest = largest_calibrated(model)
    # The default caps within the file's range (a file calibrated with a smaller --max-tokens
    # is validated up to what it measured); caps asked for are checked below.
    caps = (comma_ints(args.caps, "--caps") if args.caps is not None
            else [c for c in DEFAULT_CAPS if c <= largest] or [largest])
    if not 4 <= args.count <= MAX_COUNT:  # 10^11 passed here and was drawn after CUDA started
        raise ValueError(f"--count must be 4..{MAX_COUNT:,} micro-batches per mode, got "
                         f"{args.count}")
    # 4 by default, the model's layers where fewer (a stack `revalidate` can judge again).
    args.layers = check_stack_layers(
        model, min(4, model.spec.num_layers) if args.layers is None else args.layers, "--layers")
    if args.seed < 0:  # numpy's generator refuses it, after CUDA started and the clocks settled
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if args.time_limit_s is not None and not args.time_limit_s > 0:
        raise ValueError(f"--time-limit-s must be > 0 seconds, got {args.time_limit_s}")
    # Everything that can be checked without the GPU, before CUDA starts and the clocks settle.
    for mode in modes:
        if mode not in model.modes:
            raise ValueError(f"--modes {mode}: {path} has curves for {', '.join(model.modes)} only")
    shown = ",".join(str(c) for c in caps)
    if max(caps) < 64:
        raise ValueError(f"--caps {shown}: validation needs at least one cap >= 64 tokens")
    if max(caps) > largest:  # else found out of memory on the GPU, after the clocks settled
        raise ValueError(f"--caps {shown}: {path} measured micro-batches of up to "
                         f"{largest:,} tokens, and validation checks it within that range: lower "
                         "--caps, or calibrate with a larger --max-tokens")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    if not args.no_save:
        check_output_path(path, "--no-save not given, so the validation goes into")
    require_cuda()
    # The wrong GPU fails here, before the timer checks the backend and captures graphs.
    fingerprint = device_fingerprint()
    found = fingerprint["name"]
    if found != model.gpu and not args.allow_other_gpu:
        raise ValueError(
            f"{path} was calibrated on {model.gpu!r} but this GPU is {found!r}; validate on the "
            "same GPU, or pass --allow-other-gpu"
        )
    drift = model_drift(model)
    if drift:  # what this run measures then: whether the times moved
        print(f"note: {path} was timed under other software than this process runs "
              f"({', '.join(drift)}): this run measures whether its times moved", file=sys.stderr)
    from costmodel.calibration.workloads import KernelTimer

    kernels = model.extra.get("kernels") or {}
    attention = kernels.get("attention", "torch-varlen")
    # Time micro-batches as the calibration timed its points (files from before the
    # option were timed eagerly), unless asked otherwise.
    timing = args.timing or kernels.get("timing", "eager")
    timer = KernelTimer(model.rank_spec, attention=attention, dtype=kernels.get("dtype", "bf16"),
                        timing=timing, fingerprint=fingerprint)
    timing = timer.timing  # eager where the workload cannot be captured
    settle_gpu(args.settle_s)
    print(f"validating {model.label} with {args.count} micro-batches per mode through "
          f"{args.layers} layers + head ({attention}, {timing} timing)", file=sys.stderr)
    with signals_interrupt():  # `timeout` or a job's time limit: report what was measured
        result = run_validation(
            model, timer, count=args.count, caps=caps, modes=modes, num_layers=args.layers,
            repeats=args.repeats, seed=args.seed, time_limit_s=args.time_limit_s,
            progress=ProgressLine(sys.stderr, "validate"),
        )
        result["timing"] = timing
        print(format_validation(result))
        print_peak_memory()
        if not args.no_save:
            store_validation(path, result)
    # An interrupted run still exits as interrupted (a job script sees it), after reporting.
    return 130 if result.get("interrupted") else 0


def store_validation(path: Path, result: dict) -> None:
    """The validation into the cost model file, atomically; where that write fails (a full
    disk, Ctrl-C), into PATH-stem.validation.json beside it, so the GPU minutes of
    per-micro-batch measurements are not lost, and the error propagates."""
    from costmodel.model_file import read_document, write_json_atomic

    try:
        doc = read_document(path)
        doc["validation"] = result
        write_json_atomic(path, doc)
    except BaseException as err:  # the file changed under us, a full disk, Ctrl-C: keep the points
        aside = path.with_name(path.stem + ".validation.json")
        try:
            write_json_atomic(aside, result)
        except (OSError, ValueError):  # the disk may refuse this too: the first error is the news
            raise err from None
        print(f"could not store the validation in {path} ({type(err).__name__}: {err}); saved "
              f"it to {aside}", file=sys.stderr)
        raise
    print(f"stored the validation in {path}")
    print(f"next: costmodel correct {path} -o {path.with_name(path.stem + '.corrected.json')}  "
          "(scales the parts to fit these runs where that predicts held-out ones better; no "
          "GPU needed)")
