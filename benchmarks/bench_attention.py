"""Causal varlen attention throughput: the Triton kernel against torch varlen_attn.

Packs of equal sequences of length L (n = total_tokens // L of them, at least one),
GQA 32 query / 8 KV heads, head dim 128, bf16; forward and forward+backward timed with
triton.testing.do_bench (median of reps, L2 flushed between reps, CUDA events; launch gaps
included). Prints a table, optionally writes JSON with provenance.

    python benchmarks/bench_attention.py --json benchmarks/results/bench_attention_h200.json
    python benchmarks/bench_attention.py --quick          # 3 lengths, shorter reps
    python benchmarks/bench_attention.py --tune           # time candidate kernel configs
    python benchmarks/bench_attention.py --tune-first     # tune the backward at L=8k, then
                                                          # benchmark with the fastest configs
    python benchmarks/bench_attention.py --aot            # no GPU: compile for sm_90a,
                                                          # report smem and spills

Needs a CUDA GPU: on CPU it exits with status 2 and says so. Targets (issue 4): Triton
forward >= torch-varlen for L >= 4k, forward+backward >= 0.8x torch-varlen.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import itertools
import json
import math
import os
import platform
import re
import shlex
import sys
from pathlib import Path
from typing import Any

DEFAULT_LENGTHS = [512, 1024, 2048, 4096, 8192, 16384, 32768]
QUICK_LENGTHS = [1024, 4096, 16384]

# Configs `--tune` times against each other (per kernel, the others at their defaults).
# Tuples are (BLOCK_M, BLOCK_N, num_warps, num_stages[, FUSE_DQ[, MASK_BLOCK[, SPLIT_GROUP]]]):
# FUSE_DQ 1 = dq by atomics inside the dk/dv kernel (no dq kernel); MASK_BLOCK (default 16)
# is the step across the diagonal block (MASK_BLOCK_M of dk/dv, MASK_BLOCK_N of dq);
# SPLIT_GROUP 1 = a dk/dv program per query head (no loop over the GQA group). See
# triton_attention_configs.CONFIGS.
TUNE_CANDIDATES: dict[str, dict[int, list[tuple[int, ...]]]] = {
    "fwd": {
        64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3)],
        128: [(128, 64, 8, 3), (128, 64, 8, 2), (128, 32, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)],
    },
    "dkdv": {
        # d=64: the first choice with a program per query head (SPLIT_GROUP) comes second:
        # 134 registers instead of 233 (sm_90a, triton 3.6), and a 64-row one (196, no spill).
        64: [(32, 128, 8, 2), (32, 128, 8, 2, 0, 16, 1), (64, 128, 8, 2, 0, 16, 1),
             (64, 128, 8, 2), (32, 64, 4, 2), (64, 64, 4, 2), (32, 128, 4, 3)],
        # d=128, from an sm_90a AOT build (triton 3.6, `--aot`, which reports each build's
        # smallest wgmma instruction N and its spills): the current first choice, 32x64 with
        # 8 warps, splits its 64-row Sᵀ and dPᵀ tiles over 2 warpgroups along N, so both run
        # as m64n16 wgmmas (n8 across the diagonal) — narrow instructions that keep tensor
        # cores far below peak. These give N >= 32 (BLOCK_N = 128 rows: one warpgroup per
        # 64 rows, N = BLOCK_M) with stack frames of 0-224 B, and a diagonal step of 32-64;
        # the fifth fuses dq (5 matmuls to 7, as flash-attention 2; a FUSE_DQ build at
        # 32x128 falls back to mma.sync for dq). Timed early so that a step cut short by its
        # timeout has them: a program per query head (SPLIT_GROUP) instead of a loop over
        # the GQA group, which was what held every dk/dv build at 254-255 registers: the
        # first choice's tile drops to 162, and the 128-row tiles (nearly) stop spilling
        # (32x128 with 3 stages: 250 registers, no stack, was 88 B; 64x128 with n64
        # wgmmas: 8 B, was 200 B), at the cost of per-query-head dk/dv (bf16, as
        # flash-attention 2) summed over the group (written and read again: ~1 GB at 32k
        # tokens and 32 heads, ~0.2 ms at the H200's 4.8 TB/s, estimated).
        # (The 64x128 one-stage tiles without it, 40-64 B of stack, are no longer timed.)
        128: [(32, 64, 8, 2), (32, 64, 8, 2, 0, 16, 1), (32, 128, 8, 3, 0, 32, 1),
              (64, 128, 8, 2, 0, 64, 1), (64, 128, 8, 1, 1, 64), (32, 128, 8, 1, 0, 32),
              (32, 128, 8, 2, 0, 32), (64, 128, 8, 2, 0, 64)],
    },
    "dq": {
        64: [(128, 32, 8, 3), (128, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 3)],
        # d=128: the first choice's diagonal step (16) runs n16 wgmmas; wider ones, and
        # 128-row tiles over 2 warpgroups (N = BLOCK_N = 64), no spills; last, the Triton
        # tutorial's backward dq tile (128 x 32; 8 warps: with its 4 a triton 3.9 build
        # spills 160 B, with 8 none), at 3 stages and at its own 5 (a deeper load pipeline:
        # 144 KB of smem, 183 registers, no spills in a triton 3.6 sm_90a build).
        128: [(64, 64, 4, 2), (64, 64, 4, 2, 0, 32), (128, 64, 8, 2, 0, 64),
              (128, 64, 8, 3, 0, 64), (128, 128, 8, 2, 0, 64), (128, 32, 8, 3, 0, 32),
              (128, 32, 8, 5, 0, 32)],
    },
}


# Lengths `--tune` times the candidates at (`--tune-first` runs quick).
TUNE_LENGTHS = {"quick": [8192], "full": [4096, 16384]}


def _config(kernel: str, cand: tuple[int, ...]) -> dict[str, int]:
    block_m, block_n, warps, stages = cand[:4]
    cfg = dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
    mask_block = cand[5] if len(cand) > 5 else 16
    if kernel == "dkdv":
        cfg["MASK_BLOCK_M"] = mask_block
        if len(cand) > 4 and cand[4]:
            cfg["FUSE_DQ"] = 1
        if len(cand) > 6 and cand[6]:
            cfg["SPLIT_GROUP"] = 1
    elif kernel == "dq":
        cfg["MASK_BLOCK_N"] = mask_block
    return cfg


# fwd + bwd hardware FLOPs, in units of the forward: a flash backward recomputes QKᵀ and
# runs 4 more matmuls (dV, dP, dQ, dK) = 5 vs the forward's 2, i.e. 2.5 × forward.
FWD_BWD_FLOPS_FACTOR = 1.0 + 2.5
# Tuning compares each candidate's output and gradients with the first-choice configs'
# (bf16 inputs, fp32 accumulation in both: a correct candidate differs by rounding only,
# ~1e-3); above this it is recorded as wrong and never chosen.
MAX_TUNE_REL_ERR = 1e-2
# Before that, each candidate runs on a small varlen pack (a 1-token sequence, lengths no
# block divides) into NaN-filled buffers, against the float64 reference, row by row: the
# training-shape pack above has only full blocks, and one skipped 64-row block of one head
# moves its whole-tensor error by under 1e-2. A row's error is its distance over the larger
# of its own norm and the mean row norm: bf16 rounding keeps that near 1e-2, a skipped or
# stale row (NaN here) is 1 or more. They sum to 2,880, a multiple of 16 as the training
# pack's token count is: Triton specialises integer arguments on divisibility by 16, so the
# gate and the timing share each candidate's one compile (not two of ~1 s each).
GATE_LENGTHS = [1, 77, 300, 1000, 1502]
MAX_GATE_ROW_ERR = 0.25
_TUNE_DEVICE = "cuda"


def attention_flops(
    lengths: list[int], num_heads: int, num_kv_heads: int, head_dim: int, mode: str
) -> float:
    """FLOPs of one causal attention call over a pack of sequences (all heads).

    Forward: costmodel.flops.attention_core_flops = L(L+1)/2 pairs × 2·H·(d_qk + d_v)
    (QKᵀ and AV, 2 FLOPs per multiply-add), summed over sequences. Forward+backward:
    FWD_BWD_FLOPS_FACTOR × forward (the flash-attention convention, recompute included).
    """
    from costmodel.flops import attention_core_flops
    from costmodel.spec import ModelSpec

    spec = dataclasses.replace(
        ModelSpec.from_preset("qwen3-8b"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
    fwd = float(attention_core_flops(lengths, spec).sum())
    return fwd if mode == "fwd" else fwd * FWD_BWD_FLOPS_FACTOR


def _provenance(argv: list[str]) -> dict:
    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv[:1], *argv]),
        "timer": "triton.testing.do_bench, median, L2 flushed per rep",
        "flops": "fwd = L(L+1)/2 · 2·H·(d_qk+d_v) per sequence; fwd+bwd = 3.5 × fwd",
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=None,
        help=f"sequence lengths (default {DEFAULT_LENGTHS})",
    )
    p.add_argument(
        "--total-tokens",
        type=int,
        default=32768,
        help="tokens per pack; n = total // L sequences of length L (default 32768)",
    )
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128, choices=[64, 128])
    p.add_argument("--backends", nargs="+", default=["triton", "torch-varlen"])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--warmup", type=float, default=25.0, help="do_bench warmup, ms")
    p.add_argument("--rep", type=float, default=100.0, help="do_bench repetition time, ms")
    p.add_argument(
        "--quick", action="store_true", help=f"lengths {QUICK_LENGTHS}, warmup 10 ms, rep 40 ms"
    )
    p.add_argument("--json", type=Path, default=None, help="write results + provenance here")
    p.add_argument(
        "--tune",
        action="store_true",
        help="instead: time TUNE_CANDIDATES per kernel at L=4k and 16k, print the fastest",
    )
    p.add_argument(
        "--tune-first",
        action="store_true",
        help="time the backward kernels' TUNE_CANDIDATES at L=8k first, then benchmark the "
        "triton backend with the fastest (recorded as tuned_configs in the JSON)",
    )
    p.add_argument(
        "--aot",
        action="store_true",
        help="instead (no GPU needed): compile every config for sm_90a and report shared "
        "memory, stack (register spill) bytes per thread and the wgmma instruction widths",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.lengths = args.lengths or QUICK_LENGTHS
        args.warmup, args.rep = 10.0, 40.0
    args.lengths = args.lengths or DEFAULT_LENGTHS
    return args


def run(
    args: argparse.Namespace, argv: list[str], triton_configs: dict | None = None
) -> dict:
    """The benchmark table; `triton_configs` overrides the Triton kernels' configs."""
    import torch
    from triton.testing import do_bench

    from costmodel.kernels import attention as attn

    if not torch.cuda.is_available():
        raise RuntimeError("bench_attention needs a CUDA GPU; none is visible here")
    device = torch.device("cuda")
    backends = {}
    unavailable = {}
    for name in args.backends:
        try:
            backends[name] = attn.get_attention(name)
        except RuntimeError as exc:  # say so in the table and JSON; never a silent NaN
            unavailable[name] = str(exc)
    if triton_configs and "triton" in backends:
        backends["triton"] = functools.partial(backends["triton"], configs=triton_configs)
    rows: list[dict] = []
    errors: list[dict] = []  # a backend failing at one L is recorded and skipped, never fatal
    h, hkv, d = args.num_heads, args.num_kv_heads, args.head_dim
    interrupted = False
    try:
        for L in args.lengths:
            _time_length(rows, errors, args, backends, L, device, do_bench)
    except KeyboardInterrupt:  # the GPU session's step timeout: keep the rows timed
        print("interrupted during the table: keeping the rows timed so far", file=sys.stderr)
        interrupted = True
    gqa_check = None
    if (not interrupted and "torch-varlen" in backends
            and attn.torch_varlen_gqa_mode() == "expanded" and hkv < h):
        # After the table, on its own: a kernel that mishandled fewer KV heads could leave
        # the device unusable, and the table is what this benchmark is for.
        gqa_check = _kv_as_given(args, backends["torch-varlen"], device, rows, errors, do_bench)
    result: dict[str, Any] = {
        "provenance": _provenance(argv),
        "unavailable": unavailable,
        "errors": errors,
        "rows": rows,
        "shape": {
            "num_heads": h,
            "num_kv_heads": hkv,
            "head_dim": d,
            "dtype": "bf16",
            "total_tokens": args.total_tokens,
        },
    }
    if interrupted:
        result["interrupted"] = True
    if "torch-varlen" in backends:
        # torch 2.10/2.11 varlen_attn has no GQA switch: the adapter expands KV heads, and
        # that copy is inside the torch-varlen times.
        result["torch_varlen_gqa"] = attn.torch_varlen_gqa_mode()
        if result["torch_varlen_gqa"] == "expanded" and hkv < h:
            result["torch_varlen_kv_as_given"] = gqa_check
    if "triton" in backends:
        from costmodel.kernels.triton_attention import chosen_configs

        result["triton_configs"] = chosen_configs()
        if triton_configs:
            result["tuned_configs"] = triton_configs
    return result


def _time_length(rows: list, errors: list, args, backends: dict, L: int, device, do_bench) -> None:
    """Time every backend on one pack of length-``L`` sequences, appending to ``rows``; a
    backend that fails is recorded in ``errors`` and skipped, never fatal."""
    import torch

    lengths, cu, q, k, v, do = _packed(L, args.total_tokens, args.num_heads,
                                       args.num_kv_heads, args.head_dim, device)
    outs = {}
    for name, fn in backends.items():
        try:
            with torch.no_grad():
                outs[name] = fn(q, k, v, cu, L)  # validates once; timed calls skip the sync
            _time_modes(rows, args, name, fn, (q, k, v, cu, L), do, lengths, do_bench)
        except Exception as exc:  # recorded in the table and the JSON, never fatal
            errors.append(_failure(L, name, exc))
            outs.pop(name, None)
    if "triton" in outs and len(outs) > 1:
        ref = next(o for b, o in outs.items() if b != "triton").float()
        err = ((outs["triton"].float() - ref).norm() / ref.norm()).item()
        for row in rows:
            if row["L"] == L and row["backend"] == "triton":
                row["fwd_rel_err_vs_baseline"] = err
    del q, k, v, do, outs
    torch.cuda.empty_cache()


def _time_modes(rows: list, args, name: str, fn, ins: tuple, do, lengths: list[int], do_bench) -> None:
    """Append one row per mode (fwd, fwd+bwd) of ``fn`` on ``ins`` = (q, k, v, cu_seqlens,
    L) to ``rows``, each as it is timed: a backward that fails keeps the forward's row."""
    timed = functools.partial(fn, check_values=False)  # inputs validated by the first call
    for mode in args.modes:
        step = _bench_step(timed, ins, do, mode)
        ms = do_bench(step, warmup=args.warmup, rep=args.rep, return_mode="median")
        flops = attention_flops(lengths, args.num_heads, args.num_kv_heads, args.head_dim, mode)
        rows.append({"L": ins[4], "num_seqs": len(lengths), "backend": name, "mode": mode,
                     "ms": ms, "tflops": flops / ms / 1e9, "flops": flops})


def _bench_step(fn, ins: tuple, do, mode: str):
    """What `do_bench` times: ``fn(*ins)`` without autograd ("fwd"), or forward and the
    backward into q, k and v with output gradient ``do`` ("fwd+bwd")."""
    import torch

    if mode == "fwd":

        def step():
            with torch.no_grad():
                fn(*ins)
    else:

        def step():
            torch.autograd.grad(fn(*ins), ins[:3], do)

    return step


def _failure(L: int, name: str, exc: Exception) -> dict:
    first = str(exc).splitlines()[0] if str(exc) else ""
    print(f"note: {name} failed at L={L}: {type(exc).__name__}: {first}", file=sys.stderr)
    return {"L": L, "backend": name, "error": f"{type(exc).__name__}: {first}"}


# The torch-varlen adapter on a torch without enable_gqa, KV heads passed as they are.
KV_AS_GIVEN = "varlen-kv-as-is"


def _kv_as_given(args, fn, device, rows: list, errors: list, do_bench) -> dict:
    """Whether this torch's varlen_attn (no `enable_gqa`) computes GQA from the KV heads as
    they are, checked against the adapter's expanded call at every L; where it does, its
    timings join the table as KV_AS_GIVEN: what the expansion in torch-varlen's costs."""
    import torch

    native = functools.partial(fn, kv_as_given=True)
    h, hkv, d = args.num_heads, args.num_kv_heads, args.head_dim
    worst = 0.0
    for L in args.lengths:
        try:
            lengths, cu, q, k, v, do = _packed(L, args.total_tokens, h, hkv, d, device)
            with torch.no_grad():
                err = _rel_err(native(q, k, v, cu, L), fn(q, k, v, cu, L))
            worst = max(worst, err)
            if not err <= MAX_TUNE_REL_ERR:
                return {"same_as_expanded": False, "L": L, "rel_err": err}
            _time_modes(rows, args, KV_AS_GIVEN, native, (q, k, v, cu, L), do, lengths, do_bench)
        except Exception as exc:  # noted; the table above stands
            errors.append(_failure(L, KV_AS_GIVEN, exc))
            return {"same_as_expanded": None, "L": L, "error": errors[-1]["error"]}
        except KeyboardInterrupt:  # the step's timeout: keep the table and what was timed
            return {"same_as_expanded": None, "L": L, "interrupted": True}
        finally:
            torch.cuda.empty_cache()
    return {"same_as_expanded": True, "max_rel_err": worst}


def _packed(L: int, total_tokens: int, h: int, hkv: int, d: int, device):
    """`total_tokens // L` sequences of length L (at least one), bf16, seeded by L."""
    import torch

    lengths = [L] * max(1, total_tokens // L)
    return (lengths, *_random_pack(lengths, h, hkv, d, device, torch.bfloat16, seed=L))


def _random_pack(lengths: list[int], h: int, hkv: int, d: int, device, dtype, seed: int):
    """cu_seqlens and random q, k, v (requiring grad) and dout for a pack of `lengths`."""
    import torch

    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(sum(lengths), heads, d, device=device, generator=gen).to(dtype)
                   for heads in (h, hkv, hkv, h))
    return cu, q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do


def tune(
    args: argparse.Namespace, argv: list[str], kernels: tuple[str, ...] = ("fwd", "dkdv", "dq")
) -> dict:
    """Time each candidate config of each of `kernels` (the others at their defaults).

    With both backward kernels: the fastest split dk/dv candidate together with the
    fastest dq candidate is timed too, and the backward keeps whichever is faster: that
    pair or the fastest dk/dv candidate on its own (a FUSE_DQ one needs no dq kernel).
    """
    import torch
    from triton.testing import do_bench

    from costmodel.kernels.triton_attention import flash_attn_varlen, nan_filled_outputs

    if not torch.cuda.is_available():
        raise RuntimeError("bench_attention --tune needs a CUDA GPU; none is visible here")
    h, hkv, d = args.num_heads, args.num_kv_heads, args.head_dim
    rows: list[dict] = []

    def results(ins, do, configs):
        out = flash_attn_varlen(*ins, configs=configs)
        return (out.detach(), *torch.autograd.grad(out, ins[:3], do))

    gate: tuple = ()  # the gate's inputs and float64 reference, set up in the try below

    def gate_error(configs) -> float:
        gate_ins, gate_do, gate_want = gate
        with nan_filled_outputs():
            got = results(gate_ins, gate_do, configs)
        return max(map(_row_err, got, gate_want))

    def time_configs(L, lengths, ins, do, kernel, cand, configs):
        mode = "fwd" if kernel == "fwd" else "fwd+bwd"
        try:  # a fast but wrong config must never win: checked against float64 and the
            row_err = gate_error(configs)  # first choices
            err = max(map(_rel_err, results(ins, do, configs), reference))
            why = (f"wrong results: row error {row_err:.1e} against float64 on a varlen pack"
                   if row_err > MAX_GATE_ROW_ERR else None)
            if why is None and err > MAX_TUNE_REL_ERR:
                why = f"wrong results: relative error {err:.1e}"
        except Exception as exc:  # OutOfResources & co: recorded, not hidden
            why = f"{type(exc).__name__}: {exc}"
        if why is not None:
            rows.append({"L": L, "kernel": kernel, "config": cand, "error": why})
            print(f"tune L={L} {kernel} {cand}: {why}", file=sys.stderr, flush=True)
            return
        step = _bench_step(functools.partial(flash_attn_varlen, configs=configs), ins, do, mode)
        try:
            ms = do_bench(step, warmup=args.warmup, rep=args.rep, return_mode="median")
        except Exception as exc:  # OutOfResources & co: recorded, not hidden
            rows.append({"L": L, "kernel": kernel, "config": cand, "error": str(exc)})
            print(f"tune L={L} {kernel} {cand}: error {exc}", file=sys.stderr, flush=True)
            return
        flops = attention_flops(lengths, h, hkv, d, mode)
        rows.append({"L": L, "kernel": kernel, "config": cand, "mode": mode, "ms": ms,
                     "tflops": flops / ms / 1e9, "rel_err": err, "gate_row_err": row_err})
        # As it goes: a session cut short by its timeout still logs what was timed.
        print(f"tune L={L} {kernel} {cand}: {ms:.3f} ms {mode}", file=sys.stderr, flush=True)

    first_choice_gate = None
    interrupted, failure = False, None
    try:
        gate = _gate_inputs(h, hkv, d)
        first_choice_gate = gate_error(None)  # compiles the first choices too
        for L in TUNE_LENGTHS["quick" if args.quick else "full"]:
            lengths, cu, q, k, v, do = _packed(L, args.total_tokens, h, hkv, d, _TUNE_DEVICE)
            ins = (q, k, v, cu, L)
            reference = results(ins, do, None)
            for kernel in kernels:
                for cand in TUNE_CANDIDATES[kernel][d]:
                    time_configs(L, lengths, ins, do, kernel, cand,
                                 {kernel: _config(kernel, cand)})
            if "dkdv" in kernels and "dq" in kernels:
                split = _fastest(rows, "dkdv", L, lambda c: len(c) < 5 or not c[4])
                dq = _fastest(rows, "dq", L)
                if split is not None and dq is not None:
                    pair = {"dkdv": _config("dkdv", split), "dq": _config("dq", dq)}
                    time_configs(L, lengths, ins, do, "dkdv+dq", [list(split), list(dq)], pair)
            del q, k, v, do, ins
            torch.cuda.empty_cache()
    except KeyboardInterrupt:
        # The GPU session's step timeout (SIGINT): what was timed is still the result.
        print("interrupted during the tuning: keeping the candidates timed so far",
              file=sys.stderr)
        interrupted = True
    except Exception as exc:  # noqa: BLE001  the first choices fail to build or run
        # (a triton CompilationError is no RuntimeError): no reference to judge candidates
        # by, but the table, torch-varlen's rows above all, can still be measured.
        failure = f"{type(exc).__name__}: {exc}"
        print(f"tuning stopped: {failure}", file=sys.stderr, flush=True)
    result: dict[str, Any] = {"provenance": _provenance(argv), "tune_rows": rows, "best": choose_best(rows),
              "gate_row_err_first_choice": first_choice_gate}
    if interrupted:
        result["interrupted"] = True
    if failure is not None:
        result["tune_error"] = failure
    return result


def _gate_inputs(h: int, hkv: int, d: int):
    """The varlen pack of the tuning gate, and its float64 reference (output, dq, dk, dv)."""
    import torch

    from costmodel.kernels.attention import attention_reference

    lengths = GATE_LENGTHS
    dtype = torch.bfloat16 if _TUNE_DEVICE == "cuda" else torch.float32  # the interpreter: fp32
    cu, q, k, v, do = _random_pack(lengths, h, hkv, d, _TUNE_DEVICE, dtype, seed=12345)
    ins = (q, k, v, cu, max(lengths))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in ins[:3])
    out = attention_reference(q64, k64, v64, cu)
    want = (out.detach(), *torch.autograd.grad(out, (q64, k64, v64), do.double()))
    return ins, do, want


def _row_err(got, want) -> float:
    """Largest error of a (token, head) row, over the larger of that row's norm and the mean
    row norm (inf on a NaN or inf)."""
    import torch

    diff = (got.double() - want).norm(dim=-1)
    norm = want.norm(dim=-1)
    err = float((diff / torch.maximum(norm, norm.mean().clamp_min(1e-30))).max())
    return err if math.isfinite(err) else math.inf


def _rel_err(got, want) -> float:
    """‖got − want‖ / ‖want‖ in float32 (inf when got has a NaN or inf)."""
    got, want = got.float(), want.float()
    err = float((got - want).norm() / want.norm().clamp_min(1e-30))
    return err if math.isfinite(err) else math.inf


def choose_best(rows: list[dict]) -> dict[str, dict[str, int]]:
    """The fastest config per kernel (ms summed over lengths); for the backward, the timed
    split pair when it beats every dk/dv candidate alone."""
    best = {}
    for kernel in TUNE_CANDIDATES:
        totals = _totals(rows, kernel)
        if totals:
            best[kernel] = _config(kernel, min(totals, key=totals.__getitem__))
    pairs = _totals(rows, "dkdv+dq")
    if pairs and "dkdv" in best:
        pair = min(pairs, key=pairs.__getitem__)
        if pairs[pair] < min(_totals(rows, "dkdv").values()):
            best["dkdv"], best["dq"] = _config("dkdv", pair[0]), _config("dq", pair[1])
    return best


def _totals(rows: list[dict], kernel: str) -> dict[tuple, float]:
    """ms summed over lengths per candidate of `kernel` (candidates timed at every L)."""
    ok = [r for r in rows if r["kernel"] == kernel and "ms" in r]
    n_lengths = len({r["L"] for r in ok})
    totals: dict[tuple, float] = {}
    counts: dict[tuple, int] = {}
    for r in ok:
        key = tuple(tuple(c) if isinstance(c, list) else c for c in r["config"])
        totals[key] = totals.get(key, 0.0) + r["ms"]
        counts[key] = counts.get(key, 0) + 1
    return {key: t for key, t in totals.items() if counts[key] == n_lengths}


def _fastest(rows: list[dict], kernel: str, L: int, keep=lambda cand: True) -> tuple | None:
    ok = [r for r in rows if r["kernel"] == kernel and r["L"] == L and "ms" in r
          and keep(tuple(r["config"]))]
    return tuple(min(ok, key=lambda r: r["ms"])["config"]) if ok else None


def aot_report(head_dims: list[int]) -> list[dict]:
    """Compile each config of `CONFIGS` and `TUNE_CANDIDATES` for sm_90a, without a GPU.

    Reports shared memory, the stack frame (≈ register spill bytes per thread, from
    cuobjdump) and the instruction widths of the tensor-core dots of bf16 kernels: "wgmma_n",
    the N of each Hopper wgmma (m64nNk16; narrow N runs far below peak), and "mma_v2" when a
    dot fell back to the pre-Hopper mma.sync. Uses triton.compile(ASTSource(...)) (triton >= 3.2 API);
    run it with TRITON_INTERPRET unset.
    """
    import inspect
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from costmodel.kernels.triton_attention_bwd import attn_bwd_dkdv, attn_bwd_dq
    from costmodel.kernels.triton_attention_configs import CONFIGS
    from costmodel.kernels.triton_attention_fwd import attn_fwd

    if type(attn_fwd).__name__ == "InterpretedFunction":
        raise RuntimeError("--aot compiles real kernels: unset TRITON_INTERPRET")
    kernels = {"fwd": attn_fwd, "dkdv": attn_bwd_dkdv, "dq": attn_bwd_dq}
    ptr_types = {n: "*bf16" for n in ("Q", "K", "V", "Out", "DO", "DK", "DV", "DQ")}
    ptr_types.update(LSE="*fp32", Delta="*fp32", cu_seqlens="*i32")
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    rows = []
    for d in head_dims:
        for name, kernel in kernels.items():
            configs = [dict(c) for c in CONFIGS[name][d]]
            configs += [_config(name, c) for c in TUNE_CANDIDATES[name][d]]
            seen = set()
            for cfg in configs:
                key = tuple(sorted(cfg.items()))
                if key in seen:
                    continue
                seen.add(key)
                consts = {k: v for k, v in cfg.items() if k.isupper()}
                consts["HEAD_DIM"] = d
                if name == "dkdv":
                    consts.setdefault("FUSE_DQ", 0)
                    consts.setdefault("SPLIT_GROUP", 0)
                types = dict(ptr_types, DQ="*fp32") if consts.get("FUSE_DQ") else ptr_types
                params = list(inspect.signature(kernel.fn).parameters)
                sig = {
                    p: "constexpr"
                    if p in consts
                    else types.get(p, "fp32" if p.endswith("scale") else "i32")
                    for p in params
                }
                # What the JIT specialises at run time: pointers and token/head strides are
                # multiples of 16 (bytes / elements) at training shapes. Without these hints
                # no load is vectorised, so none is pipelined (cp.async) and the build is
                # not the one that runs.
                attrs = {
                    (i,): [["tt.divisibility", 16]]
                    for i, p in enumerate(params)
                    if p not in consts and (sig[p].startswith("*") or p.startswith("stride"))
                }
                compiled = triton.compile(
                    ASTSource(kernel, sig, constexprs=consts, attrs=attrs),
                    target=GPUTarget("cuda", 90, 32),
                    options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]},
                )
                row = {
                    "head_dim": d,
                    "kernel": name,
                    "config": cfg,
                    "shared_bytes": compiled.metadata.shared,
                    "default": cfg in CONFIGS[name][d][:1],
                    **_dot_shapes(compiled.asm["ttgir"]),
                }
                if cuobjdump.exists():
                    with tempfile.TemporaryDirectory() as tmp:
                        cubin = Path(tmp) / "k.cubin"
                        cubin.write_bytes(compiled.asm["cubin"])
                        out = subprocess.run(
                            [str(cuobjdump), "--dump-resource-usage", str(cubin)],
                            capture_output=True,
                            text=True,
                        ).stdout
                    for tok in out.split():
                        if tok.startswith(("REG:", "STACK:")):
                            row[tok.split(":")[0].lower()] = int(tok.split(":")[1])
                rows.append(row)
    return rows


def _dot_shapes(ttgir: str) -> dict:
    """The tensor-core instruction shapes in a kernel's TritonGPU IR: the N of each wgmma
    (`#ttg.nvidia_mma<{versionMajor = 3, ..., instrShape = [16, N, 16]}>`), and whether a
    dot uses mma v2 (mma.sync, the pre-Hopper path)."""
    shapes = re.findall(r"nvidia_mma<\{versionMajor = (\d)[^}]*instrShape = \[([\d, ]+)\]", ttgir)
    wgmma_n = sorted({int(shape.split(",")[1]) for major, shape in shapes if major == "3"})
    return {"wgmma_n": wgmma_n, "mma_v2": any(major == "2" for major, _ in shapes)}


def _table(result: dict) -> str:
    rows = result["rows"]
    times = {(r["L"], r["backend"], r["mode"]): r["ms"] for r in rows}
    lines = [
        f"{'L':>6} {'seqs':>5} {'backend':<15} {'mode':<8} {'ms':>9} {'TFLOP/s':>8} "
        f"{'vs torch-varlen':>15}"
    ]
    for r in rows:
        base = times.get((r["L"], "torch-varlen", r["mode"]))
        speedup = f"{base / r['ms']:.2f}x" if base and r["backend"] != "torch-varlen" else ""
        lines.append(
            f"{r['L']:>6} {r['num_seqs']:>5} {r['backend']:<15} {r['mode']:<8} "
            f"{r['ms']:>9.3f} {r['tflops']:>8.1f} {speedup:>15}"
        )
    for name, why in result["unavailable"].items():
        lines.append(f"{name}: not measured: {why}")
    for e in result.get("errors", []):
        lines.append(f"{e['backend']} at L={e['L']}: FAILED: {e['error']}")
    if result.get("torch_varlen_gqa") == "expanded":
        lines.append("torch-varlen: this torch has no enable_gqa; KV heads expanded per call")
        check = result.get("torch_varlen_kv_as_given") or {}
        if check.get("same_as_expanded"):
            lines.append(f"{KV_AS_GIVEN}: the same varlen_attn given the KV heads as they are: "
                         f"same output (rel err <= {check['max_rel_err']:.1e}); its rows show "
                         "what the expansion costs")
        elif check.get("same_as_expanded") is False:
            lines.append(f"{KV_AS_GIVEN}: given the KV heads as they are, varlen_attn differs "
                         f"(rel err {check['rel_err']:.2e} at L={check['L']}): the expansion "
                         "is needed")
    return "\n".join(lines)


def _print_tuning(result: dict) -> None:
    for r in sorted(result["tune_rows"], key=lambda r: (r["L"], r["kernel"], r.get("ms", 1e30))):
        timing = f"{r['ms']:9.3f} ms {r['tflops']:7.1f} TFLOP/s" if "ms" in r else r["error"]
        print(f"L={r['L']:>6} {r['kernel']:<5} {str(tuple(r['config'])):<20} {timing}")
    print("fastest (summed over L):", json.dumps(result["best"]))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    try:
        if args.aot:
            rows = aot_report([args.head_dim])
            for r in rows:
                mark = "*" if r["default"] else " "
                print(
                    f"{mark} d={r['head_dim']} {r['kernel']:<5} {r['config']} "
                    f"smem={r['shared_bytes']} regs={r.get('reg')} stack={r.get('stack')} "
                    f"wgmma_n={r['wgmma_n']}{' +mma_v2' if r['mma_v2'] else ''}"
                )
            print("* = first choice in triton_attention_configs.CONFIGS")
            return 0
        if args.tune:
            result = tune(args, argv)
        elif args.tune_first:
            tuning = tune(argparse.Namespace(**{**vars(args), "quick": True}), argv, ("dkdv", "dq"))
            _print_tuning(tuning)
            table = None
            if not tuning.get("interrupted"):  # else the step's time is up: no table
                try:
                    table = run(args, argv, triton_configs=tuning["best"])
                except KeyboardInterrupt:  # the step's timeout (SIGINT) during the table
                    print("interrupted during the table: writing the tuning only",
                          file=sys.stderr)
            # without a table, keep the tuning, what that step is for, rather than nothing
            result = table if table is not None else {"provenance": tuning["provenance"], "rows": [], "unavailable": {},
                          "tuned_configs": tuning["best"], "interrupted": True}
            result["tune_rows"] = tuning["tune_rows"]
            result["gate_row_err_first_choice"] = tuning["gate_row_err_first_choice"]
            if "tune_error" in tuning:
                result["tune_error"] = tuning["tune_error"]
        else:
            result = run(args, argv)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prov = result["provenance"]
    print(f"# {prov['gpu']}  torch {prov['torch']}  triton {prov['triton']}  {prov['date']}")
    if args.tune:
        _print_tuning(result)
    else:
        print(_table(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(tmp, args.json)
        print(f"wrote {args.json}")
    # --tune's whole result is the tuning: one that failed is a failure, not an empty best
    return 1 if result.get("errors") or (args.tune and result.get("tune_error")) else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
