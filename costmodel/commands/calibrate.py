"""`costmodel calibrate`: measure attention, the token-linear part and the head on this
GPU, fit cost curves, check them against analytic FLOPs, and write a cost model file."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shlex
import sys
from pathlib import Path

from costmodel.commands.common import add_settle_argument, count, positive_seconds
from costmodel.curves import MODES
from costmodel.interrupts import signals_interrupt
from costmodel.kernels import check_attention


def parse_modes(text: str) -> tuple[str, ...]:
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    bad = [m for m in modes if m not in MODES]
    if not modes or bad:
        raise ValueError(f"--modes {text!r}: use a comma-separated subset of {', '.join(MODES)}")
    return modes


# The defaults of the flags that shape a sweep (what --refit, which measures nothing, needs
# to see left alone).
_SWEEP_DEFAULTS = {
    "gpu": "auto", "attention": "torch-varlen", "dtype": "bf16", "modes": "train,forward",
    "max_len": 32768, "max_tokens": None, "quick": False, "timing": "graph", "budget_s": None,
    "settle_s": None, "tensor_parallel": 1, "expert_tensor_parallel": None, "retakes": 2,
}


def _rounds(text: str) -> int:
    """argparse type: retake rounds, 0..10 (each takes a round of the points chosen)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 10:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to 10, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="measure cost curves on this GPU and write a cost model file",
        description=(
            "Time attention (forward and forward+backward, packs of equal sequences on a log "
            "grid of lengths), the token-linear part of a layer on a fine token grid and the LM "
            "head on the GPU, fit monotone cost curves, check every point against analytic "
            "FLOPs and the GPU's peak, and write the cost model atomically. The default sweep "
            "takes about 90 s on an H200, --quick about 30 s."
        ),
    )
    p.add_argument("--gpu", default=_SWEEP_DEFAULTS["gpu"],
                   help="registry key of the GPU the file is for (h100, h200, a100, ...), checked "
                   "against the device; 'auto' takes the device found (default)")
    p.add_argument("--model", help="preset name or HF config.json path (required unless --refit)")
    p.add_argument("--attention", default=_SWEEP_DEFAULTS["attention"],
                   help="attention backend: triton, torch-varlen, sdpa, flash-attn (default torch-varlen)")
    p.add_argument("--dtype", default=_SWEEP_DEFAULTS["dtype"], choices=("bf16", "fp16"),
                   help="compute dtype (default bf16)")
    p.add_argument("--modes", default=_SWEEP_DEFAULTS["modes"],
                   help="passes to calibrate: train (forward+backward), forward (log-probs) "
                   "(default train,forward)")
    p.add_argument("--max-len", type=int, default=_SWEEP_DEFAULTS["max_len"],
                   help="longest sequence length measured (default 32768)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="largest micro-batch measured (default max(max-len, 16384))")
    p.add_argument("--tensor-parallel", type=count, default=_SWEEP_DEFAULTS["tensor_parallel"],
                   metavar="TP",
                   help="time one rank's shard of the model under TP-way tensor parallelism, as "
                   "Megatron splits it (heads, MLP and expert widths, vocabulary divided by TP): "
                   "the curves a run with --tensor-model-parallel-size TP needs. The ranks' "
                   "communication is not timed (default 1: the whole layer)")
    p.add_argument("--expert-tensor-parallel", type=count,
                   default=_SWEEP_DEFAULTS["expert_tensor_parallel"], metavar="ETP",
                   help="a MoE model's routed experts split ETP ways (Megatron's "
                   "--expert-tensor-parallel-size; 1 keeps them whole, as runs with expert "
                   "parallelism often do) (default: the --tensor-parallel size)")
    p.add_argument("--quick", action="store_true", help="a coarser sweep (~30 s on an H200)")
    p.add_argument("--timing", default=_SWEEP_DEFAULTS["timing"], choices=("graph", "eager"),
                   help="graph (default): time replays of a CUDA graph of each workload, the "
                   "GPU's own time without Python launch overhead; eager: time plain calls, "
                   "with this process's launch overhead. A workload that cannot be captured "
                   "(--attention sdpa reads lengths on the host) is timed eagerly, with a "
                   "warning, and the file says so")
    p.add_argument("--budget-s", type=positive_seconds, default=None,
                   help="time budget of the sweep in seconds (default 75, --quick 24)")
    p.add_argument("--retakes", type=_rounds, default=_SWEEP_DEFAULTS["retakes"], metavar="N",
                   help="after the sweep, measure the whole-layer probes and the token-curve "
                   "points over 1%% off their monotone fit N more times, round by round, within "
                   "40%% more of the sweep's time and before its deadline; the fit takes each "
                   "point's median (a point's repeats run back to back and miss the noise "
                   "between runs). 0: never (default 2)")
    add_settle_argument(p, default="10, --quick 3")
    p.add_argument("-o", "--output", required=True,
                   help="where to write the cost model (JSON). If the run fails or is interrupted "
                   "after measuring, what was measured goes to OUTPUT-stem.partial.json")
    p.add_argument("--refit", metavar="FILE", default=None,
                   help="no measuring: fit again from the measurements in FILE (a calibrated or "
                   ".partial.json file, or a shipped profile's name; no GPU needed) and write -o")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from costmodel.calibration.device import device_fingerprint, require_cuda, resolve_gpu
    from costmodel.calibration.pipeline import calibrate
    from costmodel.calibration.plan import check_sweep_sizes, make_plan
    from costmodel.calibration.progress import ProgressLine
    from costmodel.gpus import lookup_gpu
    from costmodel.model_file import check_output_path, write_json_atomic
    from costmodel.spec import ModelSpec

    output = check_output_path(args.output, "-o")
    command = shlex.join(["costmodel", *args.argv])
    if args.refit is not None:  # `--refit ''` too: "--model is required ... unless --refit" misled
        if args.model:
            raise ValueError("--refit fits FILE's measurements for the model they were taken "
                             "on; drop --model (calibrate again to measure another model)")
        measuring = _sweep_flags_given(args)
        if measuring:  # they would be ignored: the file's sweep and GPU stand
            raise ValueError(f"--refit measures nothing, so {', '.join(measuring)} would be "
                             "ignored: drop them (the file keeps its own GPU and sweep)")
        return _refit(args.refit, output, command)
    if not args.model:
        raise ValueError("--model is required (a preset name or a HF config.json path), unless --refit")
    check_sweep_sizes(args.max_len, args.max_tokens, names=("--max-len", "--max-tokens"))
    modes = parse_modes(args.modes)
    spec = ModelSpec.from_any(args.model)
    if spec.dtype != args.dtype:
        spec = dataclasses.replace(spec, dtype=args.dtype)
    # What this GPU times: sizes the model does not split by fail here.
    rank = spec.shard(args.tensor_parallel, args.expert_tensor_parallel)
    check_attention(args.attention)

    def plan_for(gpu: str, timing: str):
        return make_plan(rank, modes=modes, max_len=args.max_len, max_tokens=args.max_tokens,
                         quick=args.quick, gpu=gpu, budget_s=args.budget_s, timing=timing,
                         retakes=args.retakes)

    # The flags that need no GPU are checked before CUDA starts: a known --gpu name, and
    # the sweep's (the plan is made again below for the GPU found).
    plan_for(lookup_gpu(args.gpu).key if args.gpu.strip().lower() != "auto" else "h200",
             args.timing)
    require_cuda()  # RuntimeError saying what is missing, before any work
    # A wrong --gpu fails here, before the timer checks the backend and captures graphs.
    fingerprint = device_fingerprint()
    gpu_key, info = resolve_gpu(args.gpu, fingerprint)
    from costmodel.calibration.workloads import KernelTimer

    timer = KernelTimer(rank, attention=args.attention, dtype=args.dtype, timing=args.timing,
                        fingerprint=fingerprint)
    plan = plan_for(gpu_key, timer.timing)  # outside the registry: planned with H200 rates, noted in the plan
    print(f"calibrating {rank.name} on {fingerprint['name']} ({gpu_key}), attention "
          f"{args.attention}, {args.dtype}, {timer.timing} timing: {plan.summary()}", file=sys.stderr)
    for note in plan.notes:  # also kept in the file's provenance
        print(f"note: {note}", file=sys.stderr)
    partial = output.with_name(output.stem + ".partial.json")
    from costmodel.calibration.device import settle_gpu

    settle_gpu(args.settle_s if args.settle_s is not None else (3.0 if args.quick else 10.0))

    def save_partial(doc: dict) -> None:
        write_json_atomic(partial, doc)
        print(f"saved {len(doc['measurements'])} measurements to {partial} ({doc['error']}); "
              f"fit them later with: costmodel calibrate --refit {partial} -o {output}",
              file=sys.stderr)

    with signals_interrupt():
        model = calibrate(
            spec, timer=timer, plan=plan, gpu_key=gpu_key, gpu_info=info, attention=args.attention,
            dtype=args.dtype, command=command, save_partial=save_partial,
            tensor_parallel=args.tensor_parallel, expert_tensor_parallel=args.expert_tensor_parallel,
            progress=ProgressLine(sys.stderr, "calibrate"),
        )
        try:
            model.save(output)
        except BaseException as err:  # a full disk or Ctrl-C while writing: keep the points
            with contextlib.suppress(OSError, ValueError):  # the disk may refuse this too
                save_partial(dict(model.to_dict(), error=f"{type(err).__name__}: {err}"))
            raise
    prov = model.provenance
    skipped = f", {prov['skipped_points']} refinement points skipped" if prov.get("skipped_points") else ""
    retaken = prov.get("retaken") or {}
    # sweep_seconds includes the retakes; the plan's estimate is of the sweep's points alone
    again, again_s = retaken.get("measurements", 0), retaken.get("seconds", 0.0)
    measured_again = (f", {again} measured again in {again_s:.0f} s ({retaken['points']} points: "
                      "the whole-layer probes and those off the monotone fit)"
                      ) if retaken.get("points") else ""
    print(f"wrote {output}: {len(model.extra['measurements']) - again} points in "
          f"{prov['sweep_seconds'] - again_s:.0f} s (plan estimate {plan.estimated_s:.0f} s){measured_again}{skipped}, "
          f"drift {prov['drift_probe']['relative_change']:+.1%}")
    print_peak_memory()
    _print_summary(model)
    print(f"next: costmodel validate {output}   and   costmodel report {output} --png plot.png")
    return 0


def _sweep_flags_given(args: argparse.Namespace) -> list[str]:
    """The flags that shape a sweep and are set to other than their defaults."""
    return ["--" + dest.replace("_", "-") for dest, default in _SWEEP_DEFAULTS.items()
            if getattr(args, dest) != default]


def _refit(source: str, output: Path, command: str) -> int:
    from costmodel.calibration.pipeline import refit
    from costmodel.model_file import read_document
    from costmodel.profiles import profile_path

    if not source.strip():
        raise ValueError("--refit is empty: give a calibrated or .partial.json file, or a "
                         "shipped profile's name such as h200/qwen3-8b")
    path = Path(source)
    gpu, _, model_name = source.strip().partition("/")
    shipped = profile_path(gpu, model_name) if model_name and not path.exists() else None
    if shipped is not None:
        path = shipped  # a shipped profile by name, as report takes it
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "no such file"
        raise FileNotFoundError(f"--refit {source}: {what}; give a calibrated or .partial.json "
                                "file, or a shipped profile's name such as h200/qwen3-8b")
    model = refit(read_document(path), source=str(path), command=command)
    model.save(output)
    print(f"wrote {output}: refitted from {len(model.extra['measurements'])} measurements in {path}")
    _print_summary(model)
    if model.extra.get("validation"):
        from costmodel.calibration.validate import format_validation

        print("the stored validation's measured times, judged by the refitted curves:")
        print(format_validation(model.extra["validation"]))
    return 0


def print_peak_memory() -> None:
    import torch

    if torch.cuda.is_available():
        print(f"peak GPU memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB "
              f"of {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB", file=sys.stderr)


def _print_summary(model) -> None:
    check = model.extra["flops_check"]
    if check.get("max_efficiency") is not None:
        print(f"FLOPs check passed: highest efficiency {check['max_efficiency']:.1%} of "
              f"{check['peak_tflops']:.0f} TFLOP/s")
    for mode, err in (model.provenance.get("dropped_modes") or {}).items():
        print(f"mode {mode} NOT in the file (its fit failed: {err})")
    for mode, kinds in model.extra["residuals"].items():
        print(f"fit residuals {mode}: " + ", ".join(f"{k} rms {v['rms']:.2%}" for k, v in kinds.items()))
