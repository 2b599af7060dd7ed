"""GPU registry: exact device names -> peak dense bf16 FLOP/s, HBM bandwidth, SM count.

Every number carries its source. Peaks are *dense* tensor-core rates (NVIDIA's datasheets
print the 2:4-sparsity figure first; dense is half of it) for bf16 inputs with fp32
accumulation, at boost clock. They are the ceiling the FLOPs check in
`costmodel.calibration.check` holds measurements to: a point above the peak is a broken
measurement.

`estimate_cost_model(spec, gpu)` turns these rates into a `CostModel` for GPUs that have
no measured profile: peak rates times efficiency curves, plus fixed launch costs. It is
labelled an estimate (`is_estimate=True`) everywhere it is shown.

Numpy only: nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from costmodel.model import CostModel
    from costmodel.spec import ModelSpec

__all__ = [
    "GPUS",
    "GpuInfo",
    "estimate_cost_model",
    "find_gpu_by_device_name",
    "gpu_keys",
    "lookup_gpu",
]

_H100_DATASHEET = (
    "NVIDIA H100 Tensor Core GPU datasheet, "
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet; "
    "SM counts: NVIDIA H100 Tensor Core GPU Architecture whitepaper (132 SMs SXM5, 114 PCIe)"
)
_H200_PAGE = (
    "NVIDIA H200 Tensor Core GPU product page/datasheet, "
    "https://www.nvidia.com/en-us/data-center/h200/ (1,979 TFLOPS bf16 with sparsity); "
    "132 SMs as GH100 SXM5"
)
_A100_DATASHEET = (
    "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
    "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; "
    "108 SMs: NVIDIA A100 Tensor Core GPU Architecture whitepaper"
)


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    """One GPU model as the registry knows it."""

    key: str
    """Short name used on the command line and in profile paths ("h200")."""
    names: tuple[str, ...]
    """Exact names as `torch.cuda.get_device_name()` reports them."""
    peak_bf16_flops: float
    """Peak dense bf16 tensor-core FLOP/s (fp32 accumulate), no sparsity."""
    hbm_bandwidth: float
    """Peak memory bandwidth in bytes/s."""
    sm_count: int
    source: str
    """Where the numbers come from (datasheet title and URL)."""

    @property
    def name(self) -> str:
        return self.names[0]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["names"] = list(self.names)
        return d


GPUS: dict[str, GpuInfo] = {
    g.key: g
    for g in (
        GpuInfo(key="h100", names=("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"),
                peak_bf16_flops=989.4e12, hbm_bandwidth=3.35e12, sm_count=132,
                source=_H100_DATASHEET + " (H100 SXM: 1,979 TFLOPS bf16 sparse, 3.35 TB/s)"),
        GpuInfo(key="h100-pcie", names=("NVIDIA H100 PCIe",),
                peak_bf16_flops=756.5e12, hbm_bandwidth=2.0e12, sm_count=114,
                source=_H100_DATASHEET + " (H100 PCIe: 1,513 TFLOPS bf16 sparse, 2 TB/s)"),
        GpuInfo(key="h100-nvl", names=("NVIDIA H100 NVL",),
                peak_bf16_flops=835.5e12, hbm_bandwidth=3.9e12, sm_count=132,
                source=_H100_DATASHEET + " (H100 NVL: 1,671 TFLOPS bf16 sparse, 3.9 TB/s)"),
        # torch reports an H200 SXM as "NVIDIA H200"; some stacks add the memory size. An
        # H200 NVL may also report plain "NVIDIA H200": the fingerprint's power limit (700 W
        # SXM, 600 W NVL) tells them apart, and the SXM peak stays an upper bound for both.
        GpuInfo(key="h200", names=("NVIDIA H200", "NVIDIA H200 141GB HBM3e"),
                peak_bf16_flops=989.4e12, hbm_bandwidth=4.8e12, sm_count=132,
                source=_H200_PAGE + " (H200 SXM: 4.8 TB/s)"),
        GpuInfo(key="h200-nvl", names=("NVIDIA H200 NVL",),
                peak_bf16_flops=835.5e12, hbm_bandwidth=4.8e12, sm_count=132,
                source=_H200_PAGE + " (H200 NVL: 1,671 TFLOPS bf16 sparse, 4.8 TB/s)"),
        GpuInfo(key="gh200", names=("NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e"),
                peak_bf16_flops=989.4e12, hbm_bandwidth=4.0e12, sm_count=132,
                source="NVIDIA GH200 Grace Hopper Superchip datasheet, "
                "https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip "
                "(990 TFLOPS bf16 dense, 4 TB/s HBM3 version)"),
        GpuInfo(key="h20", names=("NVIDIA H20",),
                peak_bf16_flops=148e12, hbm_bandwidth=4.0e12, sm_count=78,
                source="NVIDIA HGX H20 product brief (not publicly posted); figures as reported by "
                "third parties, e.g. https://willitrunai.com/gpus/h20-96gb: 148 TFLOPS "
                "fp16/bf16 dense, 96 GB HBM3 at 4.0 TB/s; 78 SMs per Geekbench 6 listings"),
        GpuInfo(key="b200", names=("NVIDIA B200",),
                peak_bf16_flops=2.25e15, hbm_bandwidth=8.0e12, sm_count=148,
                source="NVIDIA Blackwell (HGX/DGX B200) datasheet, "
                "https://resources.nvidia.com/en-us-blackwell-architecture/datasheet "
                "(HGX B200: 36 PFLOPS fp16/bf16 sparse for 8 GPUs -> 2.25 dense each, 8 TB/s); "
                "148 SMs as reported by the CUDA driver"),
        GpuInfo(key="a100", names=("NVIDIA A100-SXM4-80GB",),
                peak_bf16_flops=312e12, hbm_bandwidth=2.039e12, sm_count=108,
                source=_A100_DATASHEET + " (A100 80GB SXM: 312 TFLOPS bf16 dense, 2,039 GB/s)"),
        GpuInfo(key="a100-40gb", names=("NVIDIA A100-SXM4-40GB",),
                peak_bf16_flops=312e12, hbm_bandwidth=1.555e12, sm_count=108,
                source=_A100_DATASHEET + " (A100 40GB SXM: 312 TFLOPS bf16 dense, 1,555 GB/s)"),
        GpuInfo(key="a100-pcie", names=("NVIDIA A100 80GB PCIe",),
                peak_bf16_flops=312e12, hbm_bandwidth=1.935e12, sm_count=108,
                source=_A100_DATASHEET + " (A100 80GB PCIe: 312 TFLOPS bf16 dense, 1,935 GB/s)"),
        GpuInfo(key="a100-pcie-40gb", names=("NVIDIA A100-PCIE-40GB",),
                peak_bf16_flops=312e12, hbm_bandwidth=1.555e12, sm_count=108,
                source=_A100_DATASHEET + " (A100 40GB PCIe: 312 TFLOPS bf16 dense, 1,555 GB/s)"),
        GpuInfo(key="l40s", names=("NVIDIA L40S",),
                peak_bf16_flops=362.05e12, hbm_bandwidth=864e9, sm_count=142,
                source="NVIDIA L40S datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet "
                "(733 TFLOPS bf16 sparse, 864 GB/s GDDR6, 142 RT cores = SMs)"),
        GpuInfo(key="a10", names=("NVIDIA A10",),
                peak_bf16_flops=125e12, hbm_bandwidth=600e9, sm_count=72,
                source="NVIDIA A10 Tensor Core GPU datasheet, "
                "https://www.nvidia.com/en-us/data-center/products/a10-gpu/ "
                "(125 TFLOPS bf16 dense, 600 GB/s, 72 SMs)"),
        GpuInfo(key="a10g", names=("NVIDIA A10G",),
                peak_bf16_flops=70e12, hbm_bandwidth=600e9, sm_count=80,
                source="AWS EC2 G5 (A10G) specifications as compared in "
                "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/ "
                "(70 TFLOPS bf16 tensor, 600 GB/s, 80 SMs; NVIDIA publishes no A10G datasheet)"),
        GpuInfo(key="rtx4090", names=("NVIDIA GeForce RTX 4090",),
                peak_bf16_flops=165.2e12, hbm_bandwidth=1008e9, sm_count=128,
                source="NVIDIA Ada Lovelace GPU Architecture whitepaper v2.1, "
                "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/"
                "nvidia-ada-gpu-architecture.pdf (RTX 4090: 165.2 TFLOPS bf16 dense with fp32 "
                "accumulate, 1,008 GB/s, 128 SMs)"),
    )
}


def gpu_keys() -> list[str]:
    return list(GPUS)


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip()).lower()


def find_gpu_by_device_name(device_name: str, *, allow_suffix: bool = False) -> GpuInfo | None:
    """The registry entry whose exact names include `device_name` (case/space-insensitive).

    With `allow_suffix`, a name no entry has exactly may also be a registered name plus
    words ("NVIDIA H200 144GB" -> h200; the longest such name wins; "NVIDIA H20" never
    matches "NVIDIA H200", whole words only). Callers should say when that happened.
    """
    wanted = _normalise(device_name)
    for info in GPUS.values():
        if any(_normalise(n) == wanted for n in info.names):
            return info
    if allow_suffix:
        prefixes = [(len(n), info) for info in GPUS.values() for n in map(_normalise, info.names)
                    if wanted.startswith(n + " ")]
        if prefixes:
            return max(prefixes, key=lambda p: p[0])[1]
    return None


def lookup_gpu(name_or_key: str | GpuInfo) -> GpuInfo:
    """A registry entry by short key ("h200") or exact device name ("NVIDIA H200")."""
    if isinstance(name_or_key, GpuInfo):
        return name_or_key
    key = _normalise(str(name_or_key))
    if key in GPUS:
        return GPUS[key]
    info = find_gpu_by_device_name(str(name_or_key))
    if info is not None:
        return info
    known = ", ".join(f"{g.key} ({' / '.join(g.names)})" for g in GPUS.values())
    raise ValueError(f"unknown GPU {name_or_key!r}; known GPUs: {known}")


# ---- the estimate ---------------------------------------------------------------------------
# Assumptions, not measurements. They encode what calibrations on Hopper show in shape:
# eager PyTorch training launches ~100 kernels per layer (forward ~35), so a layer has a
# launch-bound floor of roughly 0.45 ms forward / 1.35 ms forward+backward that the GPU
# work hides only above ~1k tokens on an H100/H200-class part (a Qwen3-8B layer at 500
# tokens then costs about what it costs at 100). GEMMs reach ~72% of peak at large token
# counts and half of that at ~96 tokens (one 128-row tile); flash-style attention reaches
# ~55% of peak forward at long lengths and half of it at 768 tokens; its backward takes
# 2.5x the forward time.
_LAYER_FLOOR_MS = {"forward": 0.45, "train": 1.35}
_HEAD_FLOOR_MS = {"forward": 0.10, "train": 0.30}
_MICROBATCH_MS = {"forward": 0.30, "train": 0.90}  # embedding, loss, launch gaps
_ATTN_CALL_MS = {"forward": 0.015, "train": 0.045}  # one varlen attention call per layer
_GEMM_EFF_MAX, _GEMM_HALF_TOKENS = 0.72, 96.0
_ATTN_EFF_MAX, _ATTN_HALF_LEN = 0.55, 768.0
_ATTN_TRAIN_TIME_FACTOR = 3.5  # forward + backward (2.5x forward) in time units
_BW_EFF = 0.85
_SOFTMAX_P = 4.0  # smooth max of launch floor and GPU time
_TOKEN_GRID = np.unique(np.round(np.geomspace(16, 262144, 8 * 14 + 1)).astype(np.int64))
_LENGTH_GRID = np.unique(np.round(np.geomspace(16, 131072, 4 * 13 + 1)).astype(np.int64))


def _smooth_max(a: np.ndarray | float, b: np.ndarray) -> np.ndarray:
    return (np.asarray(a) ** _SOFTMAX_P + b**_SOFTMAX_P) ** (1.0 / _SOFTMAX_P)


def _gemm_efficiency(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    return _GEMM_EFF_MAX * rows / (rows + _GEMM_HALF_TOKENS)


def _estimate_linear_ms(
    spec: ModelSpec, gpu: GpuInfo, tokens: np.ndarray, *, moe: bool, mode: str
) -> np.ndarray:
    from costmodel import flops

    t = tokens.astype(np.float64)
    passes = 3.0 if mode == "train" else 1.0
    bytes_per = 2 if spec.dtype in ("bf16", "fp16") else 4
    proj = flops.attention_projection_flops_per_token(spec)
    proj_ms = passes * t * proj / (gpu.peak_bf16_flops * _gemm_efficiency(t)) * 1e3
    proj_bytes = proj / 2 * bytes_per
    if not moe:
        mlp = sum(flops.mlp_flops_per_token(spec, moe=False).values())
        mlp_ms = passes * t * mlp / (gpu.peak_bf16_flops * _gemm_efficiency(t)) * 1e3
        mlp_bytes = mlp / 2 * bytes_per
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
    from costmodel import flops

    t = tokens.astype(np.float64)
    passes = 3.0 if mode == "train" else 1.0
    per_token = flops.lm_head_flops_per_token(spec)
    mm_ms = passes * t * per_token / (gpu.peak_bf16_flops * _gemm_efficiency(t)) * 1e3
    # Logits: bf16 written, read as fp32 by the softmax / cross-entropy (and again backward).
    logit_bytes = t * spec.vocab_size * (10.0 if mode == "forward" else 20.0)
    mem_ms = logit_bytes / (gpu.hbm_bandwidth * _BW_EFF) * 1e3
    return _smooth_max(_HEAD_FLOOR_MS[mode], mm_ms + mem_ms)


def _estimate_attention_ms(spec: ModelSpec, gpu: GpuInfo, lengths: np.ndarray, *, mode: str):
    from costmodel import flops

    L = lengths.astype(np.float64)
    eff = _ATTN_EFF_MAX * L / (L + _ATTN_HALF_LEN)
    fwd_ms = flops.attention_core_flops(lengths, spec) / (gpu.peak_bf16_flops * eff) * 1e3
    return fwd_ms * (_ATTN_TRAIN_TIME_FACTOR if mode == "train" else 1.0)


def estimate_cost_model(spec: ModelSpec, gpu: str | GpuInfo) -> CostModel:
    """A CostModel from the registry's peak rates times assumed efficiency curves.

    Same curves and file format as a measured model (the estimate is sampled on the same
    kind of grid a calibration measures), but `is_estimate=True` and the provenance says
    what it was built from. Use `costmodel calibrate` on the GPU for a measured one.
    """
    from costmodel.model import AttentionCurve, CostModel, ModeCurves, TokenCurve

    info = lookup_gpu(gpu)
    curves = {}
    for mode in ("train", "forward"):
        linear = {}
        if spec.num_dense_layers:
            linear["dense"] = TokenCurve(
                _TOKEN_GRID, _estimate_linear_ms(spec, info, _TOKEN_GRID, moe=False, mode=mode)
            )
        if spec.num_moe_layers:
            linear["moe"] = TokenCurve(
                _TOKEN_GRID, _estimate_linear_ms(spec, info, _TOKEN_GRID, moe=True, mode=mode)
            )
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
            "curves and launch floors (costmodel/gpus.py); not measured. Run `costmodel "
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
        spec=spec,
        gpu=info.name,
        gpu_key=info.key,
        curves=curves,
        is_estimate=True,
        provenance=provenance,
    )

