"""Benchmarked kernels: varlen attention backends, SwiGLU/MoE MLP, one transformer layer.

Import-light on purpose: nothing here imports torch or triton at package import time, so
`import costmodel.kernels` works on a numpy-only install. Import the submodules
(`costmodel.kernels.attention`, ...) to get the torch-backed code.
"""

__all__ = ["ATTENTION_BACKENDS", "HOST_READING_BACKENDS", "TRITON_VARIANT_LENGTHS", "attention",
           "check_attention", "layer", "mlp"]

# The attention backends by name (`attention.get_attention`); here, torch-free, so commands
# can check an --attention flag before they import torch or touch the GPU.
ATTENTION_BACKENDS: tuple[str, ...] = ("triton", "torch-varlen", "sdpa", "flash-attn")
# Backends that read the sequence offsets on the host (sdpa loops over the sequences): a
# CUDA graph cannot hold that read, so they are timed eagerly.
HOST_READING_BACKENDS: frozenset[str] = frozenset({"sdpa"})
# Micro-batches (sequence lengths) whose token counts cover the classes Triton compiles an
# integer argument for (divisible by 16, not, and 1): run once untimed, every variant a
# later micro-batch may need is built before any timing.
TRITON_VARIANT_LENGTHS: tuple[list[int], ...] = ([64], [65], [1])


def check_attention(name: str, flag: str = "--attention") -> str:
    """``name`` if it is a known attention backend, else a ValueError listing them (checked
    before torch is imported or the GPU touched; whether it runs here is checked later)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"{flag} {name!r} is not an attention backend; known: "
                         f"{', '.join(ATTENTION_BACKENDS)}")
    return name
