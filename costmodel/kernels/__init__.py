"""Benchmarked kernels: varlen attention backends, SwiGLU/MoE MLP, one transformer layer.

Import-light on purpose: nothing here imports torch or triton at package import time, so
`import costmodel.kernels` works on a numpy-only install. Import the submodules
(`costmodel.kernels.attention`, ...) to get the torch-backed code.
"""

__all__ = ["attention", "layer", "mlp"]
