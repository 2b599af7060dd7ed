"""`costmodel report`: a table and a plot of a cost model (measured or estimate).

The table: provenance (ESTIMATE in capitals when it is one), overheads, the attention
curve per length and the linear curve per token count with TFLOP/s and efficiency against
the registry peak, example micro-batches, the FLOPs check, fit residuals, validation.
The plot (matplotlib, Agg): measured points and fitted curves for attention and the
linear part with the FLOPs-proportional line through the longest point, efficiency vs
length, and the per-token sample cost. CPU only; numpy/scipy/matplotlib.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from costmodel import flops
from costmodel.calibration.validate import format_validation
from costmodel.gpus import registry_entry
from costmodel.model import CostModel
from costmodel.model_file import atomic_output

__all__ = ["format_report", "plot_format", "plot_report", "pyplot"]

PLOT_FORMATS = ("png", "pdf", "svg")


def plot_format(path: str | Path, flag: str = "--png") -> str:
    """The format a plot at ``path`` is written in, by its suffix (none: png); ValueError
    for one matplotlib is not asked to write here."""
    fmt = Path(path).suffix[1:].lower() or "png"
    if fmt not in PLOT_FORMATS:
        raise ValueError(f"{flag} {path}: cannot write a .{fmt} plot; name the file "
                         f".{', .'.join(PLOT_FORMATS)}")
    return fmt

_LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_TOKENS = (16, 128, 512, 1024, 2048, 4096, 8192, 12288, 16384, 32768)


def _label(model: CostModel) -> str:
    tp = f"{model.parallel_label} (one rank's shard)" if model.parallel_label else ""
    if model.is_estimate:
        return f"ESTIMATE (not measured): {model.spec.name}{tp} on {model.gpu}"
    kind = model.provenance.get("kind", "measured")
    return f"{kind}: {model.spec.name}{tp} on {model.gpu}"


def format_report(model: CostModel) -> str:
    info = registry_entry(model.gpu_key, model.gpu)
    peak = info.peak_bf16_flops if info else None
    spec = model.rank_spec  # what the curves time: FLOPs and efficiency are one GPU's
    out = [f"cost model — {_label(model)}"]
    if model.is_estimate:
        out.append(f"  {model.provenance.get('note', '')}")
    for key in ("source", "created", "command"):
        if model.extra.get(key):
            out.append(f"  {key}: {model.extra[key]}")
    _optional(out, "provenance.refit", lambda: _refit_lines(model.provenance))
    _optional(out, "provenance.correction", lambda: _correction_lines(model.provenance))
    dev = model.extra.get("device") or {}
    if dev:  # an object (checked on load)
        out.append(
            "  device: " + ", ".join(f"{k}={dev[k]}" for k in ("name", "sm_count", "compute_capability",
                                                              "l2_cache_bytes", "driver", "torch", "cuda", "triton",
                                                              "flash_attn", "costmodel")
                                     if dev.get(k) is not None)
        )
    if model.extra.get("kernels"):  # an object (checked on load)
        kernels = model.extra["kernels"]
        out.append(f"  kernels: {kernels}")
        timing = kernels.get("timing", "eager")  # files from before --timing were eager
        out.append("  timing: " + ("CUDA-graph replays (the GPU's own time)" if timing == "graph"
                                   else "eager calls (this process's launch overhead included)"))
    whole = model.spec  # the shape every shape error names; `spec` may be one rank's shard
    out.append(
        f"  model: {whole.name} (shape {whole.fingerprint()}): {whole.num_layers} layers "
        f"({whole.num_dense_layers} dense, {whole.num_moe_layers} MoE, "
        f"{whole.sliding_window_layers} sliding-window), hidden {whole.hidden_size}, vocab "
        f"{whole.vocab_size}"
    )
    if spec is not whole:
        experts = f", experts {spec.moe_intermediate_size}" if spec.is_moe else ""
        out.append(f"  timed per GPU: {spec.name}: {spec.num_heads} query / {spec.num_kv_heads} "
                   f"KV heads, MLP {spec.intermediate_size}{experts}, vocab {spec.vocab_size}")
    if info is not None and peak:  # (a peak comes from info)
        out.append(f"  peak: {peak / 1e12:.0f} TFLOP/s bf16 dense ({info.source})")
    for mode in model.modes:
        c = model.curves[mode]
        passes = flops.pass_factor(mode)
        overhead = spec.num_layers * c.layer_overhead_ms + c.microbatch_overhead_ms
        out.append(f"\n[{mode}] overhead {overhead:.3f} ms per micro-batch "
                   f"({c.layer_overhead_ms:.4f} ms per layer x {spec.num_layers} + "
                   f"{c.microbatch_overhead_ms:.3f} ms)")
        measured_max = c.attention.lengths[-1]
        out.append(f"  attention, one sequence, one layer (knots {int(c.attention.lengths[0])}.."
                   f"{int(measured_max)}; L^2 beyond):")
        out.append(f"    {'L':>7} {'ms':>10} {'TFLOP/s':>8} {'eff':>6}")
        for L in _LENGTHS:
            ms = float(c.attention(np.array([L]))[0])
            tf = passes * float(flops.attention_core_flops([L], spec)[0]) / (ms * 1e-3) / 1e12
            eff = f"{tf * 1e12 / peak:6.1%}" if peak else "     -"
            tail = "  (extrapolated)" if measured_max < L else ""
            out.append(f"    {L:7d} {ms:10.4f} {tf:8.1f} {eff}{tail}")
        _optional(out, f"provenance.fit.{mode}.attention.per_call_ms",
                  functools.partial(_per_call_lines, model.provenance, mode))
        for kind, curve in c.linear.items():
            out.append(f"  linear part of one {kind} layer (knots {int(curve.tokens[0])}.."
                       f"{int(curve.tokens[-1])}):")
            out.append(f"    {'tokens':>7} {'ms':>10} {'us/token':>9} {'TFLOP/s':>8} {'eff':>6}")
            for T in _TOKENS:
                ms = float(curve(T))
                tf = passes * float(flops.layer_linear_flops(T, spec, moe=kind == "moe")) / (ms * 1e-3) / 1e12
                eff = f"{tf * 1e12 / peak:6.1%}" if peak else "     -"
                out.append(f"    {T:7d} {ms:10.4f} {1e3 * ms / T:9.3f} {tf:8.1f} {eff}")
        out.append("  head: " + ", ".join(f"{T}: {float(c.head(T)):.3f} ms" for T in (128, 1024, 8192, 16384)))
        out.append("  micro-batches (ms):")
        for lengths in ([100], [500], [1000], [1000] * 8, [8000], [16000], [4000] * 4, [32000]):
            b = model.breakdown(lengths, mode)
            desc = f"{len(lengths)} x {lengths[0]}" if len(lengths) > 1 else f"1 x {lengths[0]}"
            out.append(
                f"    {desc:>10}: {b['total']:9.2f}  (overhead {b['overhead']:.2f}, attention "
                f"{b['attention']:.2f}, linear {b['linear']:.2f}, head {b['head']:.2f})"
            )
        _optional(out, f"{mode} cheapest fill", functools.partial(_fill_lines, model, mode))
        sc = model.sample_cost(np.array([128, 1024, 4096, 16384]), mode)
        out.append(f"  sample_cost at reference {model.reference_tokens} tokens: " + ", ".join(
            f"L={L}: {v:.3f} ms" for L, v in zip((128, 1024, 4096, 16384), sc)))
    _optional(out, "flops_check", lambda: _flops_check_lines(model.extra.get("flops_check")))
    _optional(out, "residuals", lambda: _residual_lines(model.extra.get("residuals")))
    _optional(out, "provenance.drift_probe", lambda: _drift_lines(model.provenance.get("drift_probe")))
    _optional(out, "provenance.retaken", lambda: _retaken_lines(model.provenance.get("retaken")))
    val = model.extra.get("validation")
    if not val:
        out.append("\nvalidation: none (run `costmodel validate` on the GPU)")
    _optional(out, "validation", lambda: ["\n" + format_validation(val)] if val else [])
    return "\n".join(out)


def _refit_lines(provenance: Any) -> list[str]:
    """When the file was fitted again from stored measurements, and which passes it lost."""
    out = []
    refit = (provenance or {}).get("refit")
    if refit:
        out.append(f"  refit: from {refit.get('from')} at {refit.get('at')} (the measurements "
                   "of the command above, fitted again)")
    for mode, why in ((provenance or {}).get("dropped_modes") or {}).items():
        out.append(f"  dropped mode: {mode} (its fit failed: {why})")
    return out


def _correction_lines(provenance: Any) -> list[str]:
    """The factors `costmodel correct` scaled the curves by, and what they bought."""
    corr = (provenance or {}).get("correction")
    if not corr:
        return []
    if not corr.get("scales"):
        return [f"  correction tried from {corr.get('from')} at {corr.get('at')}: no pass "
                "predicted held-out runs better than chance; the curves are as fitted"]
    from costmodel.calibration.correct import format_factors  # scipy's fit: only when needed

    out = [f"  corrected: from {corr.get('from')} at {corr.get('at')}; the curves below are "
           "the fitted ones times these factors (all corrections so far):"]
    for mode, scales in (corr.get("scales") or {}).items():
        fig = (corr.get("figures") or {}).get(mode) or {}
        errors = (f" (runs' error {fig['before']['mape']:.2%} -> {fig['held_out']['mape']:.2%} "
                  "held out)" if fig.get("adopted") else "")
        out.append(f"    {mode}: {format_factors(scales)}{errors}")
    return out


def _per_call_lines(provenance: Any, mode: str) -> list[str]:
    """The attention call's own cost by length, from the fit: a kernel tail that grows with
    the pack's longest sequence shows as a rising a(L). The model charges one per-layer
    overhead instead; this shows how far a(L) strays from it."""
    per_call = (((provenance or {}).get("fit") or {}).get(mode) or {}).get("attention", {}).get("per_call_ms")
    if not per_call:
        return []
    items = sorted((int(L), float(ms)) for L, ms in per_call.items())
    shown = [items[0]] + [x for x in items if x[0] >= 1024][::2] + [items[-1]]
    shown = sorted(dict(shown).items())
    return ["  attention per-call cost a(L) (packs of n equal sequences: a(L) + n b(L)): "
            + ", ".join(f"{L}: {ms:.3f}" for L, ms in shown) + " ms"]


def _optional(out: list[str], field: str, lines: Callable[[], list[str]]) -> None:
    """Append the report lines of an optional field. The file loaded, so its curves are
    sound; a malformed informational field (hand-edited, or another tool's) is named and
    skipped rather than ending the report."""
    try:
        out.extend(lines())
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as err:
        out.append(f"{field}: malformed in this file, not shown ({type(err).__name__}: {err})")


def _flops_check_lines(check: Any) -> list[str]:
    if not check:
        return []
    eff = check.get("max_efficiency")
    out = [
        f"\nFLOPs check: {'passed' if check.get('checked') else 'not checked'}"
        + (f", highest efficiency {eff:.1%} of peak" if eff is not None else "")
        + (f" ({check['note']})" if check.get("note") else "")
    ]
    for key, rows in (check.get("points") or {}).items():
        effs = [r["efficiency"] for r in rows if "efficiency" in r]
        if effs:
            out.append(f"  {key:22} {len(rows):4d} points, efficiency {min(effs):.1%} .. {max(effs):.1%}")
    return out


def _residual_lines(resid: Any) -> list[str]:
    if not resid:
        return []
    out = ["\nfit residuals (relative):"]
    for mode, kinds in resid.items():
        for kind, r in kinds.items():
            out.append(f"  {mode:8} {kind:12} rms {r['rms']:.2%}  worst {r['max_abs']:.2%}")
    return out


def _drift_lines(drift: Any) -> list[str]:
    if not drift:
        return []
    return [f"drift probe: {drift['relative_change']:+.2%} "
            f"({drift['start_ms']:.4g} -> {drift['end_ms']:.4g} ms)"]


def _fill_lines(model: CostModel, mode: str) -> list[str]:
    """Where a micro-batch is cheapest per token, fixed cost included, under caps of 16k and
    32k: the scheduler fills micro-batches there where that beats its mean fill by 1%
    (`schedule._cheapest_fill_count`). A step is the GPU's only where it stands out of the
    noise between runs ("measured again" below) and a second calibration shows it too."""
    from costmodel.scheduler.bounds import cheapest_fill_below
    from costmodel.scheduler.costs import as_cost

    cost = as_cost(model, None, mode)
    parts = []
    for cap in (16384, 32768):
        fill, cheaper = cheapest_fill_below(cost, cap)
        parts.append(f"{fill:,} tokens under a {cap // 1024}k cap"
                     + (f" ({cheaper:+.1%} per token)" if fill < cap else " (full)"))
    return ["  cheapest per token, fixed cost included: " + ", ".join(parts)]


def _retaken_lines(retaken: Any) -> list[str]:
    if not retaken:
        return []
    if retaken.get("rounds") == 0:
        return ["measured again: nothing (the plan's retakes were 0)"]
    # 'points' counts every whole-layer probe too (all are measured again): they are not
    # off the fit (a retaken H200 sweep: 197 token-curve points and 16 probes, 213)
    lines = [f"measured again: {retaken['points']} points (every whole-layer probe, and the "
             f"token-curve points off the monotone fit by more than "
             f"{retaken['off_by_more_than']:.0%}), {retaken['measurements']} "
             f"measurements in {retaken['seconds']:.1f} s (each count's median is fitted)"]
    if retaken.get("scatter") is not None:
        lines.append(f"  one measurement scatters {retaken['scatter']:.1%} between runs (from "
                     f"{retaken['scatter_pairs']} pairs of measurements not chosen for being "
                     "off): steps smaller than that are not to be trusted")
    return lines


def _measured(model: CostModel, kind: str, mode: str) -> list[Mapping[str, Any]]:
    """The stored measurements of ``kind`` in ``mode`` that carry tokens and ms (a malformed
    entry is left out of the plot; the curves were fitted and checked without it here)."""
    return [
        m for m in (model.extra.get("measurements") or [])
        if isinstance(m, Mapping) and m.get("kind") == kind and m.get("mode") == mode
        and isinstance(m.get("tokens"), (int, float)) and isinstance(m.get("ms"), (int, float))
    ]


def _get(doc: Any, *keys: str) -> Any:
    """doc[k1][k2]..., or None where a level is missing or not an object."""
    for key in keys:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; RuntimeError saying how to install it where it
    is missing (`costmodel report --png` asks before it prints, not after)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("plotting needs matplotlib: pip install 'costmodel[plot]'") from None
    return plt


def plot_report(model: CostModel, path: str) -> str:
    """Write a 2x2 figure to `path`, in the format its suffix names (`plot_format`)."""
    plt = pyplot()
    spec = model.rank_spec  # what the curves time: FLOPs and efficiency are one GPU's
    info = registry_entry(model.gpu_key, model.gpu)
    peak = info.peak_bf16_flops if info else None
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (ax_a, ax_l), (ax_e, ax_s) = axes
    colors = {"train": "C0", "forward": "C1"}
    fitted = "estimated" if model.is_estimate else "fitted"
    for mode in model.modes:
        c, col = model.curves[mode], colors[mode]
        passes = flops.pass_factor(mode)
        hi = max(65536, int(c.attention.lengths[-1]) * 2)
        L = np.unique(np.geomspace(16, hi, 300).astype(np.int64))
        a = c.attention(L)
        ax_a.loglog(L, a, color=col, label=f"{mode}: {fitted} attn(L)")
        raw = _get(model.provenance, "fit", mode, "attention", "per_sequence_ms_raw")
        if isinstance(raw, Mapping) and all(
            str(k).isdigit() and isinstance(v, (int, float)) for k, v in raw.items()
        ):
            xs = np.array([int(k) for k in raw])
            ys = np.array(list(raw.values()))
            ok = ys > 0
            ax_a.loglog(xs[ok], ys[ok], "o", color=col, ms=4, label=f"{mode}: measured b(L)")
        ref = c.attention.lengths[-1]
        fl = flops.attention_core_flops(L, spec)
        scale = float(c.attention(np.array([ref]))[0]) / float(flops.attention_core_flops([int(ref)], spec)[0])
        ax_a.loglog(L, fl * scale, "--", color=col, alpha=0.5, label=f"{mode}: FLOPs-proportional")
        for kind, curve in c.linear.items():
            T = np.unique(np.geomspace(16, max(65536, curve.tokens[-1]), 400).astype(np.int64))
            ax_l.plot(T, curve(T), color=col, label=f"{mode}: {fitted} {kind} linear(T)")
            pts = [m for m in _measured(model, "linear", mode) if bool(m.get("moe")) == (kind == "moe")]
            if pts:
                ax_l.plot([m["tokens"] for m in pts], [m["ms"] for m in pts], ".", color=col, ms=3,
                          label=f"{mode}: measured")
            lf = flops.layer_linear_flops(T, spec, moe=kind == "moe")
            s = float(curve(curve.tokens[-1])) / float(flops.layer_linear_flops(curve.tokens[-1], spec, moe=kind == "moe"))
            ax_l.plot(T, lf * s, "--", color=col, alpha=0.5, label=f"{mode}: FLOPs-proportional")
            if peak:
                eff_l = passes * lf / (curve(T) * 1e-3) / peak
                ax_e.semilogx(T, eff_l, ":", color=col, label=f"{mode}: {kind} linear vs tokens")
        if peak:
            ax_e.semilogx(L, passes * fl / (a * 1e-3) / peak, color=col, label=f"{mode}: attention vs L")
        Ls = np.unique(np.geomspace(16, 65536, 200).astype(np.int64))
        ax_s.semilogx(Ls, model.sample_cost(Ls, mode) / Ls * 1e3, color=col, label=f"{mode}: sample_cost / L")
    ax_a.set(xlabel="sequence length L (tokens)", ylabel="ms per sequence per layer", title="attention core")
    ax_l.set(xlabel="tokens in micro-batch", ylabel="ms per layer", title="token-linear part of a layer",
             xscale="log", yscale="log")
    ax_e.set(xlabel="sequence length L (attention) or tokens in micro-batch (linear)",
             ylabel=f"fraction of peak bf16 ({peak / 1e12:.0f} TFLOP/s)" if peak else "fraction of peak bf16",
             title="efficiency vs length")
    ax_s.set(xlabel="sample length L (tokens)", ylabel="µs per token (all layers + head)",
             title=f"sample_cost per token (reference {model.reference_tokens} tokens)")
    for ax in axes.flat:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    title = _label(model)
    if model.is_estimate:
        title += "  [registry peak x assumed efficiency]"
    fig.suptitle(title, color="red" if model.is_estimate else "black")
    fig.tight_layout()
    # Through a temp file: a full disk or an interrupt leaves the old plot or none, never a
    # truncated one.
    try:
        with atomic_output(path) as tmp:
            fig.savefig(tmp, dpi=110, format=plot_format(path))
    finally:
        plt.close(fig)
    return path
