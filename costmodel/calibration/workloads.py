"""The GPU workloads behind each sweep point, and the `Timer` that times them.

`KernelTimer(spec, attention=..., dtype=..., timing=...)` implements the `Timer` protocol on
a CUDA device: for each `SweepPoint` it builds the workload from `costmodel.kernels` and
times one call with `costmodel.calibration.timer.time_cuda`, replaying a CUDA graph of it
(timing="graph", the GPU's own time) or calling it eagerly (timing="eager", with this
Python stack's launch overhead). With `device="cpu"` the same
workloads run on the CPU, timed by `time_cpu`: a dry run of the GPU code path (shapes,
dtypes, arguments) for tests and for checking a change before a GPU session.

- "attention": the backend alone (`get_attention(name)`) on a pack of n equal sequences;
  forward under no_grad, or forward + backward against a fixed output gradient.
- "linear": `TransformerLayer(spec, attention="none")`: norms, fused QKV, q/k norms,
  rotary, o-proj, residuals, MLP or MoE experts, without the attention core.
- "head": `LMHead` (final norm, vocab projection, fp32 cross-entropy).
- "layer": the whole `TransformerLayer` with the chosen backend (per-layer overhead).
- "stack": `num_layers` distinct layers + head (what `validate` compares against).

"forward" runs under `torch.no_grad()` (log-prob passes); "train" runs forward then
backward, accumulating parameter gradients as gradient accumulation does (but not the
inputs' gradients, which in a model flow on to the previous layer): `packed_pass`, which
`bench-schedule`'s `LayerTimer` runs too. Modules are built once and cached; inputs are
built per point (outside the timed region). Only imported when timing (it imports torch
through costmodel.kernels).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import costmodel
from costmodel.calibration.device import device_fingerprint, require_cuda
from costmodel.calibration.plan import SweepPoint
from costmodel.calibration.timer import (
    GraphCaptureError,
    Measurement,
    capture_cuda_graph,
    time_cpu,
    time_cuda,
    timing_for,
)
from costmodel.curves import checked_mode
from costmodel.spec import ModelSpec

__all__ = ["KernelTimer", "packed_pass"]

logger = logging.getLogger(__name__)

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class KernelTimer:
    """Times sweep points with the kernels of `costmodel.kernels` on the current CUDA
    device (CUDA events), or with `device="cpu"` on the CPU (a dry run, wall clock)."""

    def __init__(self, spec: ModelSpec, *, attention: str = "torch-varlen", dtype: str = "bf16",
                 device: str = "cuda", seed: int = 0, timing: str = "graph",
                 fingerprint: dict[str, Any] | None = None):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype {dtype!r}; allowed: {', '.join(_DTYPES)}")
        self.timing = timing_for(timing, attention)
        if device not in ("cuda", "cpu"):
            raise ValueError(f"device {device!r}; allowed: cuda, cpu (a dry run)")
        if device == "cuda":
            torch = require_cuda()
            self.device = torch.device("cuda", torch.cuda.current_device())
            # The caller's, when it already read it (nvidia-smi is a subprocess).
            self._fingerprint = dict(fingerprint or device_fingerprint(self.device.index))
        else:
            import platform

            import torch

            self.device = torch.device("cpu")
            self._fingerprint = {"name": f"CPU dry run ({platform.processor() or platform.machine()})",
                                 "dry_run": True, "torch": torch.__version__,
                                 "costmodel": costmodel.__version__}
        from costmodel.kernels.attention import get_attention
        from costmodel.kernels.layer import check_attention_support

        self.torch = torch
        self.spec = spec
        self.attention = attention
        self.dtype = getattr(torch, _DTYPES[dtype])
        # What a layer would refuse when first built: minutes into an eager sweep.
        check_attention_support(attention, self.dtype, spec.qk_head_dim)
        self.attn_fn = get_attention(attention)  # RuntimeError if unavailable here
        self._check_attention()
        self.l2_bytes = int(self._fingerprint.get("l2_cache_bytes") or 0)
        self._modules: dict[tuple, Any] = {}
        torch.manual_seed(seed)
        if self.device.type == "cuda" and self.timing == "graph":
            self._capture_or_time_eagerly()

    def device_fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)

    # ---- modules --------------------------------------------------------------------------
    def _layer(self, attention: str, moe: bool, index: int = 0):
        key = ("layer", attention, moe, index)
        if key not in self._modules:
            from costmodel.kernels.layer import TransformerLayer

            layer = TransformerLayer(self.spec, attention=attention, moe=moe,
                                     device=self.device, dtype=self.dtype)
            layer.check_values = False
            self._modules[key] = layer
        return self._modules[key]

    def _head(self):
        if "head" not in self._modules:
            from costmodel.kernels.layer import LMHead

            head = LMHead(self.spec, device=self.device, dtype=self.dtype)
            head.check_values = False  # random_targets are in range; the check is a device sync
            self._modules["head"] = head
        return self._modules["head"]

    def _check_attention(self) -> None:
        """Raise RuntimeError unless the backend computes causal GQA attention on a tiny pack.

        Timing a backend that silently does something else (a torch release whose causal
        switch the adapter misreads computes full attention: twice the work) would ship a
        wrong cost model; this costs one tiny call against the float64 reference.
        """
        from costmodel.kernels.attention import attention_reference

        torch, spec = self.torch, self.spec
        lengths = [1, 37, 130]
        cu = torch.tensor([0, 1, 38, 168], dtype=torch.int32, device=self.device)
        gen = torch.Generator(device="cpu").manual_seed(1)
        q, k, v = (
            torch.randn(sum(lengths), h, spec.qk_head_dim, generator=gen).to(self.device, self.dtype)
            for h in (spec.num_heads, spec.num_kv_heads, spec.num_kv_heads)
        )
        with torch.no_grad():
            got = self.attn_fn(q, k, v, cu, max(lengths)).double()
        want = attention_reference(q, k, v, cu)
        err = float((got - want).norm() / want.norm())
        tol = 1e-4 if self.dtype == torch.float32 else 2e-2
        if not err <= tol:  # also catches NaN
            raise RuntimeError(
                f"attention backend {self.attention!r} is wrong on this machine (relative error "
                f"{err:.2e} against the float64 causal reference, tolerance {tol:.0e}); timing "
                "it would calibrate something else. Use another --attention backend and report "
                "this torch/triton version"
            )

    def _check_capture(self) -> None:
        """Capture every kind of workload once at a tiny and a mid size (a second or two), so
        that one a CUDA graph cannot hold (an MoE expert loop reading counts on the host, say)
        fails here, with the fix, instead of minutes into a sweep. The mid size because
        kernels choose their paths by size (split-KV attention, the sort behind MoE routing
        above a few thousand keys)."""
        points = [SweepPoint("head", "train", (128,))]
        for lengths in ((64, 64), (4096,)):
            points.append(SweepPoint("attention", "train", lengths))
            # Only the layer kinds the model has (an all-MoE spec may have no dense MLP).
            if self.spec.num_dense_layers:
                points.append(SweepPoint("stack", "train", lengths, num_layers=1))
            if self.spec.num_moe_layers:
                points.append(SweepPoint("stack", "train", lengths, moe=True, num_layers=1))
        for point in points:
            fn, _ = self._build(point)
            capture_cuda_graph(fn, warmup=1)

    def _capture_or_time_eagerly(self) -> None:
        """The start-up capture check; where it fails, time eagerly (with a warning, and the
        results say so) rather than lose a sweep for want of a graph."""
        try:
            self._check_capture()
        except GraphCaptureError as exc:
            logger.warning("this workload cannot be captured into a CUDA graph (%s): timing "
                           "eagerly (recorded as such in the results)", exc.reason)
            self.timing = "eager"

    @staticmethod
    def _param_bytes(*modules) -> int:
        return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())

    # ---- workloads ------------------------------------------------------------------------
    def _build(self, point: SweepPoint) -> tuple[Callable[[], Any], int]:
        """(fn, working-set bytes) for one point; fn runs one forward or forward+backward."""
        torch = self.torch
        train = point.mode == "train"
        spec = self.spec
        if point.kind == "attention":
            T, d_qk = point.tokens, spec.qk_head_dim
            mk = lambda h, d: torch.randn(T, h, d, device=self.device, dtype=self.dtype,
                                          requires_grad=train)
            q, k = mk(spec.num_heads, d_qk), mk(spec.num_kv_heads, d_qk)
            v = mk(spec.num_kv_heads, d_qk)  # one head dim for q, k, v (MLA: padded v, as the layer)
            cu = torch.tensor([i * point.length for i in range(point.n + 1)], dtype=torch.int32,
                              device=self.device)
            attn, L = self.attn_fn, point.length
            ws = (2 * q.numel() + k.numel() + v.numel()) * q.element_size()
            if train:
                gout = torch.randn_like(q)
                inputs = (q, k, v)

                def fn():
                    # autograd.grad, not backward(): accumulating into q/k/v.grad would add
                    # three elementwise passes a layer never does (its grads flow on).
                    torch.autograd.grad(attn(q, k, v, cu, L, check_values=False), inputs, gout)
            else:
                def fn():
                    with torch.no_grad():
                        attn(q, k, v, cu, L, check_values=False)
            return fn, ws

        if point.kind == "head":
            head = self._head()
            x = torch.randn(point.tokens, spec.hidden_size, device=self.device, dtype=self.dtype,
                            requires_grad=train)
            targets = head.random_targets(point.tokens)
            ws = self._param_bytes(head) + point.tokens * spec.vocab_size * 6
            if train:
                def fn():
                    x.grad = None  # the input's gradient flows on in a model; no accumulation
                    head(x, targets).backward()
            else:
                def fn():
                    with torch.no_grad():
                        head(x, targets)
            return fn, ws

        if point.kind in ("linear", "layer", "stack"):
            attention = "none" if point.kind == "linear" else self.attention
            count = point.num_layers if point.kind == "stack" else 1
            layers = [self._layer(attention, point.moe, i) for i in range(count)]
            head = self._head() if point.kind == "stack" else None
            fn, x = packed_pass(layers, point.lengths, spec, mode=point.mode, device=self.device,
                                dtype=self.dtype, head=head)
            ws = self._param_bytes(*layers) + 16 * x.numel() * x.element_size()
            return fn, ws
        raise ValueError(f"unknown sweep point kind {point.kind!r}")

    def measure(self, point: SweepPoint, *, repeats: int, warmup: int) -> Measurement:
        try:
            fn, ws = self._build(point)
            if self.device.type == "cpu":
                return time_cpu(fn, repeats=repeats, warmup=warmup)
            return time_cuda(fn, repeats=repeats, warmup=warmup, working_set_bytes=ws,
                             l2_bytes=self.l2_bytes, graph=self.timing == "graph")
        except self.torch.cuda.OutOfMemoryError:
            free, total = self.torch.cuda.mem_get_info(self.device)
            raise RuntimeError(
                f"out of GPU memory timing {point.describe()} ({free / 2**30:.1f} of "
                f"{total / 2**30:.1f} GiB free after the failure); lower --max-len / --max-tokens"
            ) from None


def packed_pass(layers: Sequence[Any], lengths: Sequence[int], spec: ModelSpec, *, mode: str,
                device: Any, dtype: Any, head: Any = None) -> tuple[Callable[[], None], Any]:
    """One pass of a micro-batch of fresh random inputs through ``layers`` (then ``head``),
    as a callable, and its packed input ``x``.

    "forward" runs under `torch.no_grad()` (a log-prob pass); "train" runs forward then
    backward, parameter gradients accumulating (gradient accumulation) while x's gradient
    is written fresh each call (in a model it flows on to the previous layer). The sweep's
    "linear", "layer" and "stack" points time this, and so does `bench-schedule`'s
    `LayerTimer`: the micro-batches it measures run the pass the curves were fitted on.
    """
    import torch

    from costmodel.kernels.layer import packed_inputs

    train = checked_mode(mode) == "train"
    x, cu, max_len = packed_inputs([int(n) for n in lengths], spec, device=device, dtype=dtype,
                                   requires_grad=train)
    targets = head.random_targets(x.shape[0]) if head is not None else None

    def run():
        h = x
        for layer in layers:
            h = layer(h, cu, max_len)
        return head(h, targets) if head is not None else h

    if train:
        gout = None if head is not None else torch.randn_like(x)

        def fn() -> None:
            x.grad = None  # parameter grads accumulate (gradient accumulation); x's not
            run().backward(gout)
    else:
        def fn() -> None:
            with torch.no_grad():
                run()
    return fn, x
