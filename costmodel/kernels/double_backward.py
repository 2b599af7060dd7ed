"""A guard for autograd Functions whose backward is a kernel that is not differentiable."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch


def first_order_backward(what: str) -> Callable:
    """Decorate a `torch.autograd.Function.backward` that is a kernel with no graph of its own.
    The decorated function takes ``(ctx, saved_tensors, *grads)``.

    Under ``create_graph=True`` the gradients it returns still flow (a caller that only
    needed the graph elsewhere is served), but differentiating them again raises, naming
    the kernel: without a guard they had no graph, so a loss built on them (a gradient
    penalty) silently lost that term. `once_differentiable` guards only when the incoming
    gradient itself requires grad, which the first backward's usually does not.
    """
    message = (f"{what}: double backward (a gradient of this kernel's gradients) is not "
               "supported; use a differentiable backend (e.g. attention 'sdpa', or the unfused "
               "SwiGLU)").encode()

    def wrap(backward: Callable) -> Callable:
        @functools.wraps(backward)
        def guarded(ctx: Any, *grads: Any) -> Any:
            # Read once and handed to the backward: a non-reentrant checkpoint allows one
            # unpacking of each saved tensor.
            saved_all = ctx.saved_tensors
            with torch.no_grad():
                out = backward(ctx, saved_all, *grads)
            if not torch.is_grad_enabled():  # a plain backward: nothing to guard
                return out
            outs = out if isinstance(out, tuple) else (out,)
            # Each gradient gets a node that raises if anything backpropagates through it
            # (as once_differentiable builds it: the node needs inputs that require grad).
            # The forward's saved inputs and the incoming gradients go in too, so that a
            # gradient taken with respect to either (autograd.grad; a jvp differentiates
            # with respect to the incoming gradient) reaches the node instead of finding no
            # path and reading as zero.
            grads_in = [o.detach().requires_grad_() for o in outs if isinstance(o, torch.Tensor)]
            saved = [t for t in (*saved_all, *grads)
                     if isinstance(t, torch.Tensor) and t.requires_grad]
            delayed = getattr(getattr(torch._C, "_functions", None), "DelayedError", None)
            if delayed is None:  # a torch without it (private API): refuse now, never silently
                raise RuntimeError(message.decode())
            raised = delayed(message, len(grads_in) + len(saved))(*grads_in, *saved)
            raising = iter((raised,) if isinstance(raised, torch.Tensor) else raised)
            wrapped = tuple(next(raising) if isinstance(o, torch.Tensor) else o for o in outs)
            return wrapped if isinstance(out, tuple) else wrapped[0]

        return guarded

    return wrap
