"""SwiGLU MLP on a GPU: cuBLAS GEMMs and the fused Triton activation vs unfused torch ops.

For Qwen3-8B shapes (hidden 4096, ffn 12288) over token counts, in bf16:
- the whole MLP (gate/up GEMM, activation, down GEMM) forward and forward+backward, with the
  Triton and with the torch activation: time and TFLOP/s (FLOPs:
  `costmodel.kernels.mlp.mlp_flops`, 6·T·H·F forward, 3× with backward);
- the activation alone, fused Triton ``swiglu_fused`` vs torch ``F.silu(g) * u`` on the
  halves of one (T, 2F) tensor: time, the speed-up (target >= 1.5x) and the fused kernel's
  effective bandwidth (minimum traffic / time).

Timer: ``triton.testing.do_bench`` (CUDA events, L2 flushed between reps, median), so
per-call launch gaps count: at small token counts the activation is launch-bound (the
Python autograd.Function and two Triton launches against torch's C++ ops) and the speed-up
shrinks. Gradients are reset to None outside the timed region. The activation is also
timed as GPU time, ``triton.testing.do_bench_cudagraph`` (calls unrolled into one CUDA
graph, replayed; no launch overhead, no L2 flush): the kernels against the kernels, which
is what a layer sees when its GEMMs keep the GPU busy (columns ``gpu``; ``--no-graph``
skips them).

    python benchmarks/bench_mlp.py [--quick] [--tokens 512 4096 ...] [--json PATH]

Prints a table and writes JSON with provenance (GPU, versions, date, command). Needs a
CUDA GPU; on a machine without one it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(_ROOT))

FULL_TOKENS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
QUICK_TOKENS = (1024, 8192, 32768)
DEFAULT_JSON = _ROOT / "benchmarks" / "results" / "bench_mlp.json"
SPEEDUP_TARGET = 1.5

Timer = Callable[..., float]  # timer(fn, grad_to_none=[...]) -> milliseconds


def activation_bytes(tokens: int, ffn: int, elem: int, *, backward: bool) -> int:
    """Minimum HBM traffic of the fused activation: read g, u, write out (forward); plus
    read dout, g, u, write dg, du (backward)."""
    passes = 3 + (5 if backward else 0)
    return passes * tokens * ffn * elem


def _device_provenance(device, argv: list[str]) -> dict:
    import torch
    import triton

    props = torch.cuda.get_device_properties(device)
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/bench_mlp.py", *argv]),
    }


def _do_bench_timer(warmup: int, rep: int) -> Timer:
    from triton.testing import do_bench

    def timer(fn, grad_to_none=None):
        return float(do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none,
                              return_mode="median"))

    return timer


def _graph_timer(rep: int) -> Timer:
    """GPU time: `rep` ms of calls unrolled into one CUDA graph, replayed 10 times. Kept
    short: capturing thousands of tiny backward calls costs host time per call."""
    from triton.testing import do_bench_cudagraph

    def timer(fn, grad_to_none=None):
        return float(do_bench_cudagraph(fn, rep=rep, grad_to_none=grad_to_none,
                                        return_mode="median"))

    return timer


def measure(tokens: int, hidden: int, ffn: int, *, device, dtype, timer: Timer,
            gpu_timer: Timer | None = None) -> dict:
    """Time every case at one token count; returns one result row (times in ms).
    `gpu_timer` also times the activation alone as GPU time (``*_gpu_*`` keys)."""
    import torch

    from costmodel.kernels.mlp import mlp_flops, swiglu_activation, swiglu_mlp

    gen = torch.Generator(device=device).manual_seed(tokens)
    kw = {"device": device, "dtype": dtype}

    def randn(*shape, std=1.0, grad=False):
        t = torch.randn(shape, generator=gen, **kw) * std
        return t.requires_grad_(grad)

    x = randn(tokens, hidden, grad=True)
    w_gu = randn(2 * ffn, hidden, std=0.02, grad=True)
    w_d = randn(hidden, ffn, std=0.02, grad=True)
    dy = randn(tokens, hidden)
    h = randn(tokens, 2 * ffn, grad=True)
    da = randn(tokens, ffn)
    mlp_params = [x, w_gu, w_d]

    def mlp_fwd(act):
        def fn():
            with torch.no_grad():
                swiglu_mlp(x, w_gu, w_d, act)
        return fn

    def mlp_fwdbwd(act):
        return lambda: swiglu_mlp(x, w_gu, w_d, act).backward(dy)

    def act_fwd(act):
        def fn():
            with torch.no_grad():
                swiglu_activation(h, act)
        return fn

    def act_fwdbwd(act):
        return lambda: swiglu_activation(h, act).backward(da)

    # Correctness first: the fused kernel against torch on this very input.
    with torch.no_grad():
        ref = swiglu_activation(h, "torch").float()
        got = swiglu_activation(h, "triton").float()
        act_rel_err = ((got - ref).norm() / ref.norm()).item()

    row: dict = {"tokens": tokens, "act_rel_err": act_rel_err}
    for act in ("triton", "torch"):
        row[f"mlp_fwd_ms[{act}]"] = timer(mlp_fwd(act))
        row[f"mlp_fwdbwd_ms[{act}]"] = timer(mlp_fwdbwd(act), grad_to_none=mlp_params)
        row[f"act_fwd_ms[{act}]"] = timer(act_fwd(act))
        row[f"act_fwdbwd_ms[{act}]"] = timer(act_fwdbwd(act), grad_to_none=[h])

    row["mlp_fwd_tflops"] = mlp_flops(tokens, hidden, ffn) / row["mlp_fwd_ms[triton]"] / 1e9
    row["mlp_fwdbwd_tflops"] = (
        mlp_flops(tokens, hidden, ffn, backward=True) / row["mlp_fwdbwd_ms[triton]"] / 1e9
    )
    row["act_fwd_speedup"] = row["act_fwd_ms[torch]"] / row["act_fwd_ms[triton]"]
    row["act_fwdbwd_speedup"] = row["act_fwdbwd_ms[torch]"] / row["act_fwdbwd_ms[triton]"]
    if gpu_timer is not None:
        try:
            for act in ("triton", "torch"):
                row[f"act_fwd_gpu_ms[{act}]"] = gpu_timer(act_fwd(act))
                row[f"act_fwdbwd_gpu_ms[{act}]"] = gpu_timer(act_fwdbwd(act), grad_to_none=[h])
        except Exception as exc:  # a capture failure keeps the eager row; recorded
            row["act_gpu_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        else:
            for mode in ("fwd", "fwdbwd"):
                row[f"act_{mode}_gpu_speedup"] = (
                    row[f"act_{mode}_gpu_ms[torch]"] / row[f"act_{mode}_gpu_ms[triton]"]
                )
    elem = torch.empty((), dtype=dtype).element_size()
    row["act_fwd_gbps[triton]"] = (
        activation_bytes(tokens, ffn, elem, backward=False) / row["act_fwd_ms[triton]"] / 1e6
    )
    row["act_fwdbwd_gbps[triton]"] = (
        activation_bytes(tokens, ffn, elem, backward=True) / row["act_fwdbwd_ms[triton]"] / 1e6
    )
    return row


def measure_rows(
    tokens: list[int], measure_one: Callable[[int, Timer | None], dict], gpu_timer: Timer | None
) -> tuple[list[dict], list[dict]]:
    """A row per token count, and an error entry for each that failed (printed, never fatal;
    an interrupt ends the loop with the rows so far). After a failed capture no more are
    tried: it can leave the caching allocator's capture state behind (torch skips releasing
    the pool), under every later measurement."""
    rows, errors = [], []
    for t in tokens:
        try:
            rows.append(measure_one(t, gpu_timer))
        except KeyboardInterrupt:  # the GPU session's step timeout: keep the rows so far
            errors.append({"tokens": t, "error": "interrupted (the step's time ran out)"})
            print(f"note: interrupted at {t} tokens: keeping {len(rows)} rows", file=sys.stderr)
            break
        except Exception as exc:  # recorded in the JSON and printed
            first = str(exc).splitlines()[0] if str(exc) else ""
            errors.append({"tokens": t, "error": f"{type(exc).__name__}: {first}"})
            print(f"note: {t} tokens failed: {type(exc).__name__}: {first}", file=sys.stderr)
            continue
        if "act_gpu_error" in rows[-1]:
            gpu_timer = None
    return rows, errors


_COLUMNS = [
    ("tokens", "tokens", "{:d}"),
    ("mlp_fwd_ms[triton]", "mlp fwd ms", "{:.3f}"),
    ("mlp_fwd_tflops", "TFLOP/s", "{:.0f}"),
    ("mlp_fwdbwd_ms[triton]", "mlp f+b ms", "{:.3f}"),
    ("mlp_fwdbwd_tflops", "TFLOP/s", "{:.0f}"),
    ("mlp_fwdbwd_ms[torch]", "f+b ms (torch act)", "{:.3f}"),
    ("act_fwd_ms[triton]", "act fwd triton", "{:.4f}"),
    ("act_fwd_ms[torch]", "act fwd torch", "{:.4f}"),
    ("act_fwd_speedup", "speed-up", "{:.2f}x"),
    ("act_fwdbwd_ms[triton]", "act f+b triton", "{:.4f}"),
    ("act_fwdbwd_ms[torch]", "act f+b torch", "{:.4f}"),
    ("act_fwdbwd_speedup", "speed-up", "{:.2f}x"),
    ("act_fwdbwd_gbps[triton]", "fused GB/s", "{:.0f}"),
    ("act_fwd_gpu_speedup", "gpu fwd speed-up", "{:.2f}x"),
    ("act_fwdbwd_gpu_speedup", "gpu f+b speed-up", "{:.2f}x"),
]


def format_table(rows: list[dict]) -> str:
    """A fixed-width table of the result rows."""
    cells = [[title for _, title, _ in _COLUMNS]]
    cells += [[fmt.format(row[key]) if key in row else "-" for key, _, fmt in _COLUMNS]
              for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(payload, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"token counts {list(QUICK_TOKENS)} and shorter reps")
    parser.add_argument("--tokens", type=int, nargs="+", help="token counts to time")
    parser.add_argument("--hidden", type=int, default=4096, help="hidden size (Qwen3-8B: 4096)")
    parser.add_argument("--ffn", type=int, default=12288, help="MLP width (Qwen3-8B: 12288)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write results")
    parser.add_argument("--no-json", action="store_true", help="print the table only")
    parser.add_argument("--no-graph", action="store_true",
                        help="skip the GPU-time (CUDA graph) timings of the activation")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("bench_mlp.py needs a CUDA GPU (torch.cuda.is_available() is False here); "
              "run it on a GPU machine", file=sys.stderr)
        return 2
    tokens = list(args.tokens or (QUICK_TOKENS if args.quick else FULL_TOKENS))
    if min(tokens) < 1 or args.hidden < 1 or args.ffn < 1:
        parser.error("token counts, --hidden and --ffn must be positive")
    warmup, rep = (10, 30) if args.quick else (25, 100)
    timer = _do_bench_timer(warmup, rep)
    gpu_timer = _graph_timer(5)
    device = torch.device("cuda", torch.cuda.current_device())

    from costmodel.kernels import triton_swiglu

    def measure_one(t: int, gpu: Timer | None) -> dict:
        try:
            return measure(t, args.hidden, args.ffn, device=device, dtype=torch.bfloat16,
                           timer=timer, gpu_timer=gpu)
        finally:
            torch.cuda.empty_cache()

    rows, errors = measure_rows(tokens, measure_one, None if args.no_graph else gpu_timer)
    prov = _device_provenance(device, argv)
    print(f"SwiGLU MLP, hidden {args.hidden}, ffn {args.ffn}, bf16 on {prov['gpu']} "
          f"(torch {prov['torch']}, triton {prov['triton']}); times are medians in ms")
    if rows:
        print(format_table(rows))
        large = [r for r in rows if r["tokens"] >= 4096] or rows
        worst = min(min(r["act_fwd_speedup"], r["act_fwdbwd_speedup"]) for r in large)
        verdict = "meets" if worst >= SPEEDUP_TARGET else "MISSES"
        print(f"fused activation speed-up at >= 4096 tokens: worst {worst:.2f}x ({verdict} the "
              f"{SPEEDUP_TARGET}x target); max activation rel err "
              f"{max(r['act_rel_err'] for r in rows):.1e}")
        gpu = [min(r["act_fwd_gpu_speedup"], r["act_fwdbwd_gpu_speedup"])
               for r in rows if "act_fwd_gpu_speedup" in r]
        if gpu:
            verdict = "meets" if min(gpu) >= SPEEDUP_TARGET else "MISSES"
            print(f"fused activation speed-up in GPU time (CUDA graphs) at every token count: "
                  f"worst {min(gpu):.2f}x ({verdict} the {SPEEDUP_TARGET}x target)")
        for r in rows:
            if "act_gpu_error" in r:
                print(f"{r['tokens']} tokens: GPU-time timing failed: {r['act_gpu_error']}")
    for e in errors:
        print(f"{e['tokens']} tokens: FAILED: {e['error']}")
    if not args.no_json:
        payload = {
            "benchmark": "bench_mlp",
            "provenance": prov,
            "config": {
                "hidden": args.hidden, "ffn": args.ffn, "dtype": "bf16", "tokens": list(tokens),
                "timer": f"triton.testing.do_bench(warmup={warmup}, rep={rep}, median)",
                "gpu_timer": None if args.no_graph else
                "triton.testing.do_bench_cudagraph(rep=5, median)",
                "swiglu_kernel": {"tile_elems": triton_swiglu._TILE_ELEMS,
                                  "max_block_n": triton_swiglu._MAX_BLOCK_N,
                                  "num_warps": triton_swiglu._NUM_WARPS},
                "flops": "mlp fwd = 6*T*H*F; fwd+bwd = 3x",
            },
            "speedup_target": SPEEDUP_TARGET,
            "rows": rows,
            "errors": errors,
        }
        _write_json(args.json, payload)
        print(f"wrote {args.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
