"""Launch configs of the Triton attention kernels (`triton_attention`): per kernel and head
dim, a first choice and fallbacks; their checks; and the launch that moves on to the next
config when one does not fit the GPU, remembering which one ran (`chosen_configs`).

Configs are fixed per head dim (no autotune keyed on the sequence length: a calibration
sweep over many lengths would re-tune at each one). Importing this module imports triton
(never CUDA).
"""

from __future__ import annotations

import logging

try:  # triton >= 2.1 (checked against 3.6 and 3.9)
    from triton.runtime.errors import OutOfResources
except ImportError:  # older layouts re-export it from triton.runtime
    from triton.runtime import OutOfResources

__all__ = ["CONFIGS", "check_configs", "chosen_configs", "dkdv_switch", "kernel_configs", "launch"]

logger = logging.getLogger(__name__)

# First entry of each list: the choice for Hopper (H100/H200, 227 KB smem per block); later
# entries are smaller fallbacks, tried in order when a config does not fit (OutOfResources;
# e.g. fp32 inputs at d=128 need 256 KB for the first fwd config).
# Chosen without a GPU, from `python benchmarks/bench_attention.py --aot` (compiles every
# config for sm_90a with triton 3.6, bf16, with the divisibility hints the JIT gives
# 16-aligned pointers and strides, and reads the per-thread stack frame, which is mostly
# register spills): none of the first choices spills; the tutorial's dk/dv tile, 32x128
# with 4 warps, spills 816 B at d=128, the same tile with 8 warps 16 B.
# Measured on the H200 (benchmarks/results/bench_attention_h200.json): with these first
# choices the backward takes 6.3-7.0x the forward for L >= 4k (flash attention's FLOPs
# say 2.5x, torch's varlen kernel takes 2.5-2.7x): the dk/dv and dq tiles come first.
# A likely cause, seen in the AOT build (`--aot` prints each build's wgmma widths): the d=128
# dk/dv first choice runs its Sᵀ and dPᵀ dots as m64n16 wgmmas (8 warps over a 64x32 tile),
# n8 across the diagonal; the tuning candidates with 128-row K/V blocks run n32-n64.
# Another: the dk/dv kernel's loop over the GQA group holds every d=128 build at 254-255
# registers, so those larger tiles spill; SPLIT_GROUP=1 (a program per query head) builds
# the first choice's tile in 162 and the 128-row ones (nearly) without spills.
# TO TUNE on the H200: `python benchmarks/bench_attention.py --tune` times the candidates in
# bench_attention.TUNE_CANDIDATES at L=4k and 16k and prints the fastest per kernel;
# `--tune-first` tunes the backward at L=8k, then benchmarks with the winners. A winner goes
# first in its list as it is; a FUSE_DQ or SPLIT_GROUP dk/dv one decides for its fallbacks
# (`dkdv_switch`).
CONFIGS: dict[str, dict[int, list[dict[str, int]]]] = {
    "fwd": {
        64: [
            dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
            dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2),
        ],
        128: [
            dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
            dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
            dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1),
        ],
    },
    # BLOCK_N: the K/V block a program owns; BLOCK_M: query step below the diagonal;
    # MASK_BLOCK_M: the (smaller) query step across the diagonal block.
    "dkdv": {
        64: [
            dict(BLOCK_M=32, BLOCK_N=128, MASK_BLOCK_M=16, num_warps=8, num_stages=2),
            dict(BLOCK_M=32, BLOCK_N=64, MASK_BLOCK_M=16, num_warps=4, num_stages=1),
        ],
        128: [
            dict(BLOCK_M=32, BLOCK_N=64, MASK_BLOCK_M=16, num_warps=8, num_stages=2),
            dict(BLOCK_M=16, BLOCK_N=64, MASK_BLOCK_M=16, num_warps=4, num_stages=1),
        ],
    },
    # BLOCK_M: the query block a program owns; BLOCK_N: key step left of the diagonal;
    # MASK_BLOCK_N: the key step across the diagonal block.
    "dq": {
        64: [
            dict(BLOCK_M=128, BLOCK_N=32, MASK_BLOCK_N=16, num_warps=8, num_stages=3),
            dict(BLOCK_M=64, BLOCK_N=32, MASK_BLOCK_N=16, num_warps=4, num_stages=1),
        ],
        128: [
            dict(BLOCK_M=64, BLOCK_N=64, MASK_BLOCK_N=16, num_warps=4, num_stages=2),
            dict(BLOCK_M=64, BLOCK_N=16, MASK_BLOCK_N=16, num_warps=4, num_stages=1),
        ],
    },
}

# (kernel, head_dim, dtype, device index) -> index into the config list that last worked.
_chosen: dict[tuple[str, int, str, int], int] = {}


def kernel_configs(head_dim: int) -> dict[str, list[dict[str, int]]]:
    """The config lists (first choice, then fallbacks) of each kernel for `head_dim`."""
    if head_dim not in CONFIGS["fwd"]:
        raise ValueError(f"head_dim {head_dim} not supported; allowed: {sorted(CONFIGS['fwd'])}")
    return {name: [dict(c) for c in by_dim[head_dim]] for name, by_dim in CONFIGS.items()}


def chosen_configs() -> dict[str, dict[str, int]]:
    """The config each kernel ran with so far, keyed "kernel/d<head_dim>/<dtype>/dev<i>";
    a dk/dv fallback with the switches it ran with (the first choice's, `dkdv_switch`)."""
    out = {}
    for (kernel, d, dtype, dev), i in _chosen.items():
        cfg = dict(CONFIGS[kernel][d][i])
        if kernel == "dkdv":
            for switch in _DKDV_SWITCHES:
                cfg.pop(switch, None)
                if dkdv_switch(None, d, switch):
                    cfg[switch] = 1
        out[f"{kernel}/d{d}/{dtype}/dev{dev}"] = cfg
    return out


# Block keys each kernel needs (constexprs of the kernel) and keys it may take besides.
_BLOCK_KEYS = {
    "fwd": ("BLOCK_M", "BLOCK_N"),
    "dkdv": ("BLOCK_M", "BLOCK_N", "MASK_BLOCK_M"),
    "dq": ("BLOCK_M", "BLOCK_N", "MASK_BLOCK_N"),
}
# Switches of the whole backward, set by the dk/dv config that decides (`dkdv_switch`).
_DKDV_SWITCHES = ("FUSE_DQ", "SPLIT_GROUP")
_OPTIONAL_KEYS = {"fwd": ("num_warps", "num_stages"),
                  "dkdv": ("num_warps", "num_stages", *_DKDV_SWITCHES),
                  "dq": ("num_warps", "num_stages")}


_MIN_BLOCK = 16


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config(kernel: str, cfg: dict[str, int]) -> None:
    """ValueError naming the kernel and the key for a config the launch would mishandle: a
    missing key was a KeyError, BLOCK_M=0 a ZeroDivisionError, a block that is not a power of
    2 an InterpreterError/compile error inside tl.arange, an unknown key silently dropped."""
    if kernel not in _BLOCK_KEYS:
        raise ValueError(f"configs has an unknown kernel {kernel!r}; kernels: {list(_BLOCK_KEYS)}")
    if not isinstance(cfg, dict):
        raise ValueError(f"{kernel} config must be a dict of ints, got {type(cfg).__name__}")
    allowed = _BLOCK_KEYS[kernel] + _OPTIONAL_KEYS[kernel]
    for key in cfg:
        if key not in allowed:
            raise ValueError(f"{kernel} config has an unknown key {key!r}; allowed: {list(allowed)}")
    for key in _BLOCK_KEYS[kernel]:
        if key not in cfg:
            raise ValueError(f"{kernel} config is missing {key!r}; it needs {list(_BLOCK_KEYS[kernel])}")
        _check_power_of_2(kernel, key, cfg[key])  # tl.arange wants a power of 2
        if cfg[key] < _MIN_BLOCK:  # the interpreter runs 8, a GPU build does not
            raise ValueError(f"{kernel} config key {key!r} must be at least {_MIN_BLOCK} (the "
                             f"tensor-core dots need K >= 16), got {cfg[key]}")
    if "num_warps" in cfg:
        _check_power_of_2(kernel, "num_warps", cfg["num_warps"])
    if "num_stages" in cfg and not (_is_int(cfg["num_stages"]) and cfg["num_stages"] >= 1):
        raise ValueError(f"{kernel} config key 'num_stages' must be an int >= 1, got "
                         f"{cfg['num_stages']!r}")
    for switch in _DKDV_SWITCHES:
        if switch in cfg and cfg[switch] not in (0, 1):
            raise ValueError(f"{kernel} config key {switch!r} must be 0 or 1, got {cfg[switch]!r}")
    if kernel == "fwd" and cfg["BLOCK_M"] % cfg["BLOCK_N"]:
        raise ValueError(f"fwd config needs BLOCK_M % BLOCK_N == 0, got {cfg}")
    if kernel == "dkdv" and cfg["BLOCK_N"] % cfg["MASK_BLOCK_M"]:
        raise ValueError(f"dkdv config needs BLOCK_N % MASK_BLOCK_M == 0, got {cfg}")
    if kernel == "dq" and (cfg["BLOCK_M"] % cfg["BLOCK_N"] or cfg["BLOCK_M"] % cfg["MASK_BLOCK_N"]):
        raise ValueError(
            f"dq config needs BLOCK_M divisible by BLOCK_N and MASK_BLOCK_N, got {cfg}"
        )


def _check_power_of_2(kernel: str, key: str, value) -> None:
    if not (_is_int(value) and value >= 1 and value & (value - 1) == 0):
        raise ValueError(f"{kernel} config key {key!r} must be an int power of 2 (1, 2, 4, ...), "
                         f"got {value!r}")


def check_configs(configs) -> dict[str, dict[str, int]]:
    """Every override of a ``configs`` argument checked up front (the backward's too, so a
    bad one fails before the forward runs); a copy, so later edits by the caller do not
    change what the backward launches."""
    if configs is None:
        return {}
    if not isinstance(configs, dict):
        raise ValueError(f"configs must be a dict of kernel name -> config dict, got "
                         f"{type(configs).__name__}")
    for kernel, cfg in configs.items():
        check_config(kernel, cfg)
    return {kernel: dict(cfg) for kernel, cfg in configs.items()}


def _launch_args(config: dict[str, int]) -> tuple[dict[str, int], int, int]:
    """A config split into the kernel's block sizes, num_warps and num_stages. FUSE_DQ is a
    launch argument, not a config key, and so is SPLIT_GROUP: `dkdv_switch` decides each
    for the whole backward."""
    cfg = dict(config)
    warps, stages = cfg.pop("num_warps", 4), cfg.pop("num_stages", 2)
    for switch in _DKDV_SWITCHES:
        cfg.pop(switch, None)
    return cfg, warps, stages


def launch(
    kernel_name: str,
    kernel,
    grid_fn,
    args: tuple,
    head_dim: int,
    dtype,
    device,
    override: dict[str, int] | None,
) -> None:
    """Launch `kernel` with the first config that fits; remember which one worked.
    ``override`` was checked by `flash_attn_varlen` (`check_configs`)."""
    if override is not None:
        cfg, warps, stages = _launch_args(override)
        kernel[grid_fn(cfg)](*args, HEAD_DIM=head_dim, num_warps=warps, num_stages=stages, **cfg)
        return
    configs = CONFIGS[kernel_name][head_dim]
    dev = device.index if device.type == "cuda" and device.index is not None else 0
    key = (kernel_name, head_dim, str(dtype).removeprefix("torch."), dev)
    start = _chosen.get(key, 0)
    for i in range(start, len(configs)):
        cfg, warps, stages = _launch_args(configs[i])
        try:
            kernel[grid_fn(cfg)](
                *args, HEAD_DIM=head_dim, num_warps=warps, num_stages=stages, **cfg
            )
        except OutOfResources as exc:
            if i + 1 == len(configs):
                raise RuntimeError(
                    f"triton attention {kernel_name} kernel: no config fits this GPU for "
                    f"head_dim={head_dim} ({exc}); smallest tried: {configs[i]}"
                ) from exc
            logger.info(
                "%s config %s does not fit (%s); trying %s",
                kernel_name,
                configs[i],
                exc,
                configs[i + 1],
            )
            continue
        _chosen[key] = i
        return


def dkdv_switch(override: dict[str, int] | None, head_dim: int, key: str) -> bool:
    """A dk/dv switch of the whole backward (FUSE_DQ: dq by atomics in the dk/dv kernel;
    SPLIT_GROUP: a program per query head): the override's, else the first choice's, for
    its fallbacks too (buffers and the grid are set before the launch finds which config
    fits), so that a tuned config can go first in `CONFIGS` as it is."""
    cfg = override if override is not None else CONFIGS["dkdv"][head_dim][0]
    return bool(cfg.get(key, 0))
