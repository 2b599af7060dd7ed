"""`costmodel calibrate`: measure attention, the token-linear part and the head on this
GPU, fit cost curves, check them against analytic FLOPs, and write a cost model file."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

_MODES = ("train", "forward")


def parse_modes(text: str) -> tuple[str, ...]:
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    bad = [m for m in modes if m not in _MODES]
    if not modes or bad:
        raise ValueError(f"--modes {text!r}: use a comma-separated subset of {', '.join(_MODES)}")
    return modes


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
    p.add_argument("--gpu", default="auto",
                   help="registry key of the GPU the file is for (h100, h200, a100, ...), checked "
                   "against the device; 'auto' takes the device found (default)")
    p.add_argument("--model", required=True, help="preset name or HF config.json path")
    p.add_argument("--attention", default="torch-varlen",
                   help="attention backend: triton, torch-varlen, sdpa, flash-attn (default torch-varlen)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"), help="compute dtype")
    p.add_argument("--modes", default="train,forward",
                   help="passes to calibrate: train (forward+backward), forward (log-probs)")
    p.add_argument("--max-len", type=int, default=32768, help="longest sequence length measured")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="largest micro-batch measured (default max(max-len, 16384))")
    p.add_argument("--quick", action="store_true", help="a coarser sweep (~30 s on an H200)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="time budget of the sweep in seconds (default 75, --quick 24)")
    p.add_argument("-o", "--output", required=True, help="where to write the cost model (JSON)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from costmodel.calibration.device import require_cuda, resolve_gpu
    from costmodel.calibration.pipeline import calibrate
    from costmodel.calibration.plan import make_plan
    from costmodel.calibration.progress import ProgressLine
    from costmodel.spec import ModelSpec

    modes = parse_modes(args.modes)
    spec = ModelSpec.from_any(args.model)
    if spec.dtype != args.dtype:
        spec = dataclasses.replace(spec, dtype=args.dtype)
    output = Path(args.output)
    if output.is_dir():
        raise ValueError(f"-o {output} is a directory; give a file name such as calibrated.json")
    require_cuda()  # RuntimeError saying what is missing, before any work
    from costmodel.calibration.workloads import CudaTimer

    timer = CudaTimer(spec, attention=args.attention, dtype=args.dtype)
    fingerprint = timer.device_fingerprint()
    gpu_key, info = resolve_gpu(args.gpu, fingerprint)
    plan = make_plan(spec, modes=modes, max_len=args.max_len, max_tokens=args.max_tokens,
                     quick=args.quick, gpu=gpu_key if info else "h200", budget_s=args.budget_s)
    print(f"calibrating {spec.name} on {fingerprint['name']} ({gpu_key}), attention "
          f"{args.attention}, {args.dtype}: {plan.summary()}", file=sys.stderr)
    command = shlex.join(["costmodel", *args.argv])
    model = calibrate(
        spec, timer=timer, plan=plan, gpu_key=gpu_key, gpu_info=info, attention=args.attention,
        dtype=args.dtype, command=command,
        progress=ProgressLine(sys.stderr, "calibrate", estimated_s=plan.estimated_s),
    )
    model.save(output)
    drift = model.provenance["drift_probe"]["relative_change"]
    check = model.extra["flops_check"]
    print(f"wrote {output}: {len(model.extra['measurements'])} points in "
          f"{model.provenance['sweep_seconds']:.0f} s, drift {drift:+.1%}")
    if check.get("max_efficiency") is not None:
        print(f"FLOPs check passed: highest efficiency {check['max_efficiency']:.1%} of "
              f"{check['peak_tflops']:.0f} TFLOP/s")
    for mode, kinds in model.extra["residuals"].items():
        print(f"fit residuals {mode}: " + ", ".join(f"{k} rms {v['rms']:.2%}" for k, v in kinds.items()))
    print(f"next: costmodel validate {output}   and   costmodel report {output} --png plot.png")
    return 0
