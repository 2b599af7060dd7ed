"""A guard for autograd Functions whose backward is a kernel that is not differentiable."""

from __future__ import annotations

import torch


def refuse_double_backward(what: str) -> None:
    """Raise when a backward runs with ``create_graph=True`` (grad mode on inside it).

    Without this, the gradients such a backward returns have no graph: a loss built on
    them (a gradient penalty) silently loses that term. `once_differentiable` does not
    help there: it only objects when the incoming gradient itself requires grad.
    """
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{what}: double backward (create_graph=True) is not supported by this kernel; "
            "use a differentiable backend (e.g. attention 'sdpa', or the unfused SwiGLU)"
        )
