"""GPU registry: exact device names -> peak dense bf16 FLOP/s, HBM bandwidth, SM count.

Every number carries its source. Peaks are *dense* tensor-core rates (NVIDIA's datasheets
print the 2:4-sparsity figure first; dense is half of it) for bf16 inputs with fp32
accumulation, at boost clock. They are the ceiling the FLOPs check in
`costmodel.calibration.check` holds measurements to: a point above the peak is a broken
measurement.

The registry estimate built from these rates (for GPUs with no measured profile) is
`costmodel.estimate.estimate_cost_model`.

Standard library only: nothing here imports numpy or torch.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from costmodel.checks import did_you_mean

__all__ = [
    "GPUS",
    "GpuInfo",
    "find_gpu_by_device_name",
    "gpu_keys",
    "lookup_gpu",
    "registry_entry",
    "same_gpu_words",
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
        # H800 and A800: the export variants of H100 SXM and A100 SXM; same silicon, clocks
        # and HBM, only NVLink cut to 400 GB/s, which a single-GPU cost model never sees.
        GpuInfo(key="h800", names=("NVIDIA H800",),
                peak_bf16_flops=989.4e12, hbm_bandwidth=3.35e12, sm_count=132,
                source=_H100_DATASHEET + " (as H100 SXM; NVIDIA publishes no H800 SXM "
                "datasheet: the H800 is the H100 SXM with NVLink capped at 400 GB/s, e.g. "
                "https://github.com/ai-dynamo/aiconfigurator/pull/968)"),
        GpuInfo(key="h800-pcie", names=("NVIDIA H800 PCIe",),
                peak_bf16_flops=756.5e12, hbm_bandwidth=2.0e12, sm_count=114,
                source=_H100_DATASHEET + " (as H100 PCIe, the H800 PCIe's silicon and clocks)"),
        GpuInfo(key="a800", names=("NVIDIA A800-SXM4-80GB",),
                peak_bf16_flops=312e12, hbm_bandwidth=2.039e12, sm_count=108,
                source=_A100_DATASHEET + " (as A100 80GB SXM; the A800 is the A100 with NVLink "
                "capped at 400 GB/s)"),
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


# Words a device name may carry after a registered name and still be that GPU: its memory
# size and kind ("141GB", "48G", "HBM3e", "DDR5") and the "PG" board tag. Any other word
# may name another SKU of the same chip with fewer SMs or lower clocks ("NVIDIA GeForce
# RTX 4090 D" has 114 SMs to the 4090's 128, a "... RTX 4090 Laptop GPU" is another chip,
# "... MIG 1g.10gb" a slice): such a name is not in the registry, and gets no peak.
_SAME_GPU_WORD = re.compile(r"\d+(?:\.\d+)?(?:g|gb|t|tb)|hbm\d*e?|g?ddr\d*x?|pg")


def same_gpu_words(words: str) -> bool:
    """Whether the words a device name has beyond a GPU's name leave it that GPU (memory
    size and kind only, as `_SAME_GPU_WORD` says); "" is."""
    return all(_SAME_GPU_WORD.fullmatch(w) for w in _normalise(words).split())


def find_gpu_by_device_name(device_name: str, *, allow_suffix: bool = False) -> GpuInfo | None:
    """The registry entry whose exact names include `device_name` (case/space-insensitive).

    With `allow_suffix`, a name no entry has exactly may also be a registered name plus
    memory-size or memory-kind words ("NVIDIA H200 144GB" -> h200; "NVIDIA GeForce RTX
    4090 48G DDR5" -> rtx4090; the longest such name wins; "NVIDIA H20" never matches
    "NVIDIA H200", whole words only). Other words make it another GPU ("NVIDIA GeForce RTX
    4090 D", "... Laptop GPU", a MIG slice): None. Callers should say when a suffix was
    taken.
    """
    if not isinstance(device_name, str):
        raise ValueError(f"a GPU's device name is a string, got {device_name!r}")
    wanted = _normalise(device_name)
    for info in GPUS.values():
        if any(_normalise(n) == wanted for n in info.names):
            return info
    if allow_suffix:
        prefixes = [(len(n), info) for info in GPUS.values() for n in map(_normalise, info.names)
                    if wanted.startswith(n + " ") and same_gpu_words(wanted[len(n):])]
        if prefixes:
            return max(prefixes, key=lambda p: p[0])[1]
    return None


def registry_entry(key: str | None, device_name: str) -> GpuInfo | None:
    """The entry of the GPU a cost model was made for: by its registry ``key``, else (files
    from before the key, or a key this registry lacks) by its exact ``device_name``; None
    where neither is registered (no peak to show or check against)."""
    if key:
        try:
            return lookup_gpu(key)
        except ValueError:
            pass
    return find_gpu_by_device_name(device_name)


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
    raise ValueError(f"unknown GPU {name_or_key!r}; {did_you_mean(key, GPUS)}known GPUs: {known}")
