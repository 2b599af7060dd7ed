"""The registry estimate: a `CostModel` for a GPU that has no measured profile.

`estimate_cost_model(spec, gpu)` turns the peak rates of `costmodel.gpus` into cost curves:
peak rates times assumed efficiency curves, plus fixed launch costs. It is labelled an
estimate (`is_estimate=True`) everywhere it is shown. `costmodel calibrate` on the GPU
replaces it with a measured model.

Numpy only: nothing here imports torch.
"""

from __future__ import annotations

import numpy as np

from costmodel import flops, portable
from costmodel.curves import MODES, AttentionCurve, ModeCurves, TokenCurve
from costmodel.gpus import GpuInfo, lookup_gpu
from costmodel.model import CostModel
from costmodel.spec import ModelSpec, as_spec

__all__ = ["estimate_cost_model"]

# Assumptions, not measurements of the GPU at hand. They encode what calibrations on
# Hopper show in shape: eager PyTorch training launches ~100 kernels per layer (forward
# ~35), so a layer has a launch-bound floor of roughly 0.45 ms forward / 1.35 ms
# forward+backward that the GPU work hides only above ~1k tokens on an H100/H200-class
# part (a Qwen3-8B layer at 500 tokens then costs about what it costs at 100).
# The large-size rates are those the H200 session of 2026-11-30 measured for Qwen3-8B
# (costmodel/profiles/h200/qwen3-8b.json, GPU-bound there, so timing mode does not
# matter): a layer's token-linear part (GEMMs with the norms, rotary and activations
# between them) ran at 55-60% of peak from 4k tokens (half of that at ~96 tokens, one
# 128-row tile, is still assumed: below ~2k tokens that session was launch-bound);
# torch-varlen attention (calibrate's default backend, flash-attention-2 class) at 35% of
# peak forward from 16k, half of it at 600-950 tokens, and its forward+backward took
# 3.6-3.8x the forward time from 4k. With the earlier, higher guesses (72%, 55%, 3.5x)
# this estimate predicted that session's measured micro-batches 22-23% too fast (>= 1k
# tokens); see `test_estimate_is_close_to_the_measured_h200_stack`.
_LAYER_FLOOR_MS = {"forward": 0.45, "train": 1.35}
_HEAD_FLOOR_MS = {"forward": 0.10, "train": 0.30}
_MICROBATCH_MS = {"forward": 0.30, "train": 0.90}  # embedding, loss, launch gaps
_ATTN_CALL_MS = {"forward": 0.015, "train": 0.045}  # one varlen attention call per layer
_GEMM_EFF_MAX, _GEMM_HALF_TOKENS = 0.58, 96.0
_ATTN_EFF_MAX, _ATTN_HALF_LEN = 0.36, 768.0
_ATTN_TRAIN_TIME_FACTOR = 3.7  # forward + backward, in forward times
_BW_EFF = 0.85
_SOFTMAX_P = 4.0  # smooth max of launch floor and GPU time
# The grids and powers are `portable`'s: the same bits on every CPU (every rank prices a
# sample alike; numpy's own differ in the last bit between AVX-512 and other CPUs).
_TOKEN_GRID = np.unique(np.round(portable.geomspace(16, 262144, 8 * 14 + 1)).astype(np.int64))
_LENGTH_GRID = np.unique(np.round(portable.geomspace(16, 131072, 4 * 13 + 1)).astype(np.int64))


def _smooth_max(a: float, b: np.ndarray) -> np.ndarray:
    p = _SOFTMAX_P
    return portable.power(a ** p + portable.power(b, p), 1.0 / p)


def _gemm_efficiency(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    return _GEMM_EFF_MAX * rows / (rows + _GEMM_HALF_TOKENS)


def _estimate_linear_ms(
    spec: ModelSpec, gpu: GpuInfo, tokens: np.ndarray, *, moe: bool, mode: str
) -> np.ndarray:
    t = tokens.astype(np.float64)
    passes = flops.pass_factor(mode)
    bytes_per = 2 if spec.dtype in ("bf16", "fp16") else 4
    proj = flops.attention_projection_flops_per_token(spec)
    proj_ms = passes * t * proj / (gpu.peak_bf16_flops * _gemm_efficiency(t)) * 1e3
    proj_bytes = proj / 2 * bytes_per
    if not moe:
        mlp = sum(flops.mlp_flops_per_token(spec, moe=False).values())
        mlp_ms = passes * t * mlp / (gpu.peak_bf16_flops * _gemm_efficiency(t)) * 1e3
        mlp_bytes: float | np.ndarray = mlp / 2 * bytes_per  # MoE: per token count (below)
    else:
        parts = flops.mlp_flops_per_token(spec, moe=True)
        e, k = spec.num_experts, spec.num_experts_per_tok
        per_expert_rows = t * k / e  # tokens each expert sees under balanced routing
        routed = parts["moe_experts"]
        shared = parts["moe_shared_experts"] + parts["moe_router"]
        mlp_ms = passes * 1e3 * (
            t * routed / (gpu.peak_bf16_flops * _gemm_efficiency(per_expert_rows))
            + t * shared / (gpu.peak_bf16_flops * _gemm_efficiency(t))
        )
        touched = np.minimum(e, t * k) / e  # fraction of experts whose weights are read
        expert_bytes = 6 * spec.hidden_size * spec.moe_intermediate_size / 2 * bytes_per
        mlp_bytes = touched * e * expert_bytes + shared / 2 * bytes_per
    # Weights are read once forward and twice backward (input and weight gradients).
    mem_ms = passes * (proj_bytes + mlp_bytes) / (gpu.hbm_bandwidth * _BW_EFF) * 1e3
    gpu_ms = np.maximum(proj_ms + mlp_ms, mem_ms)
    return _smooth_max(_LAYER_FLOOR_MS[mode], gpu_ms)


def _estimate_head_ms(spec: ModelSpec, gpu: GpuInfo, tokens: np.ndarray, *, mode: str) -> np.ndarray:
    t = tokens.astype(np.float64)
    passes = flops.pass_factor(mode)
    per_token = flops.lm_head_flops_per_token(spec)
    mm_ms = passes * t * per_token / (gpu.peak_bf16_flops * _gemm_efficiency(t)) * 1e3
    # Logits: bf16 written, read as fp32 by the softmax / cross-entropy (and again backward).
    logit_bytes = t * spec.vocab_size * (10.0 if mode == "forward" else 20.0)
    mem_ms = logit_bytes / (gpu.hbm_bandwidth * _BW_EFF) * 1e3
    return _smooth_max(_HEAD_FLOOR_MS[mode], mm_ms + mem_ms)


def _estimate_attention_ms(spec: ModelSpec, gpu: GpuInfo, lengths: np.ndarray, *, mode: str):
    L = lengths.astype(np.float64)
    eff = _ATTN_EFF_MAX * L / (L + _ATTN_HALF_LEN)
    fwd_ms = flops.attention_core_flops(lengths, spec) / (gpu.peak_bf16_flops * eff) * 1e3
    return fwd_ms * (_ATTN_TRAIN_TIME_FACTOR if mode == "train" else 1.0)


def estimate_cost_model(
    spec: ModelSpec | str, gpu: str | GpuInfo, *, tensor_parallel: int = 1,
    expert_tensor_parallel: int | None = None,
) -> CostModel:
    """A CostModel from the registry's peak rates times assumed efficiency curves.

    Same curves and file format as a measured model (the estimate is sampled on the same
    kind of grid a calibration measures), but `is_estimate=True` and the provenance says
    what it was built from. Use `costmodel calibrate` on the GPU for a measured one.
    With `tensor_parallel` > 1 (or `expert_tensor_parallel`) the curves are those of one
    rank's shard (`ModelSpec.shard`).
    """
    model_spec = as_spec(spec)  # a preset name or config.json path too, as everywhere
    spec = model_spec.shard(tensor_parallel, expert_tensor_parallel)  # what one GPU computes
    info = lookup_gpu(gpu)
    curves = {}
    for mode in MODES:
        linear = {
            kind: TokenCurve(_TOKEN_GRID, _estimate_linear_ms(spec, info, _TOKEN_GRID,
                                                              moe=kind == "moe", mode=mode))
            for kind in spec.linear_kinds
        }
        curves[mode] = ModeCurves(
            layer_overhead_ms=_ATTN_CALL_MS[mode],
            microbatch_overhead_ms=_MICROBATCH_MS[mode],
            attention=AttentionCurve(
                _LENGTH_GRID, _estimate_attention_ms(spec, info, _LENGTH_GRID, mode=mode)
            ),
            linear=linear,
            head=TokenCurve(_TOKEN_GRID, _estimate_head_ms(spec, info, _TOKEN_GRID, mode=mode)),
        )
    provenance = {
        "kind": "estimate",
        "note": (
            f"ESTIMATE for {info.name} from registry peak rates times assumed efficiency "
            "curves and launch floors (costmodel/estimate.py); not measured. Run `costmodel "
            "calibrate` on the GPU for a measured cost model."
        ),
        "gpu_source": info.source,
        "assumptions": {
            "layer_floor_ms": _LAYER_FLOOR_MS,
            "head_floor_ms": _HEAD_FLOOR_MS,
            "microbatch_overhead_ms": _MICROBATCH_MS,
            "attention_call_ms": _ATTN_CALL_MS,
            "gemm_efficiency": f"{_GEMM_EFF_MAX} * T / (T + {_GEMM_HALF_TOKENS:g})",
            "attention_efficiency": f"{_ATTN_EFF_MAX} * L / (L + {_ATTN_HALF_LEN:g})",
            "attention_train_time_factor": _ATTN_TRAIN_TIME_FACTOR,
            "bandwidth_efficiency": _BW_EFF,
        },
    }
    return CostModel(
        spec=model_spec,
        gpu=info.name,
        gpu_key=info.key,
        curves=curves,
        is_estimate=True,
        provenance=provenance,
        tensor_parallel=tensor_parallel,
        expert_tensor_parallel=expert_tensor_parallel,
    )

