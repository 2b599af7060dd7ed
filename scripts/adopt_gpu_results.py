"""Ship what a GPU session (`scripts/gpu_session.sh`) wrote under $OUT, and summarise it.

    PYTHONPATH=. python scripts/adopt_gpu_results.py OUT_DIR [--dry-run]
        [--unvalidated [MODEL ...]] [--gpu KEY]

Run on the dev machine after the session's files came back. Files are looked for in
OUT_DIR and in its ``results.tgz`` (the session archives all but the log and the main
profile when it wrote more than 8 files). Everything is checked first, then copied (a bad
file is skipped, with the reason, before anything moved):

- ``<model>.json`` (a measured and validated cost model; ``--unvalidated MODEL`` also takes
  that model's ``--quick`` one, e.g. the session's MoE profile; ``--unvalidated`` alone,
  any) to ``costmodel/profiles/<gpu key>/<model>.json`` (``<model>-tp<N>`` for one
  tensor-parallel rank's shard, named so to ``--unvalidated`` too); profiles of two GPUs,
  or two of one model, are refused: one session folder at a time;
- ``bench_attention.json``, ``bench_mlp.json``, ``bench_schedule.json`` and the optional
  step's ``bench_schedule_forward.json`` (``--mode forward --align 2``) to
  ``benchmarks/results/<name>_<gpu key>.json`` (a file without result rows, such as an
  interrupted tuning, never replaces one with rows: it goes to ``<name>_partial_<key>``),
  ``<model>.png`` to ``benchmarks/results/<model>_<gpu key>.png`` and ``session.log`` to
  ``benchmarks/results/gpu_session_<gpu key>_<session date>.log`` (never over another
  session's log).

Without a profile (calibration failed, or a session that ran only some steps), the bench
files still ship, under the key of the GPU they name (or ``--gpu``).

Then it prints what the README and the issues need: every number against its target with
a verdict, the tuned backward configs next to the current first choices, the GPU tests'
outcome, the session's failed or skipped steps, and which shipped files are now stale. It
changes no code: adopting tuned configs in `triton_attention_configs.CONFIGS`, and the README and
the tests that pin the shipped profile, stay a person's edit. ``--dry-run`` copies nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from costmodel.model import CostModel

ROOT = Path(__file__).resolve().parents[1]
BENCHES = ("bench_attention", "bench_mlp", "bench_schedule", "bench_schedule_forward")
# Written only when a session asked for that step: its absence is no news.
OPTIONAL_BENCHES = ("bench_schedule_forward",)
# The issues' targets, judged here (the bench files carry their own where they can).
MAPE_TARGETS = {">=1024": 0.025, "all": 0.04}
ATTN_TARGETS = {"fwd": 1.0, "fwd+bwd": 0.8}  # Triton over torch-varlen, for L >= 4k
ATTN_FROM_L = 4096


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


# ---- finding the files ------------------------------------------------------------------
def _unpack(out: Path, into: Path) -> list[Path]:
    """The folders to look in: `out`, and `into` holding its results.tgz when it has one."""
    archive = out / "results.tgz"
    if not archive.exists():
        return [out]
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            bad = [m.name for m in members if not m.isfile() or "/" in m.name or m.name.startswith(".")]
            if bad:
                raise tarfile.TarError(f"unexpected entries {bad[:3]}")
            # Plain files of bare names, checked above; the "data" filter too where this
            # Python has it (3.10.12+, 3.11.4+), which also keeps 3.12+ from warning.
            if hasattr(tarfile, "data_filter"):
                tar.extractall(into, members=members, filter="data")
            else:
                tar.extractall(into, members=members)
    except (tarfile.TarError, EOFError, OSError) as exc:
        print(f"skip results.tgz: unreadable ({type(exc).__name__}: {exc}); only {out} is used")
        return [out]
    return [out, into]


def _find(folders: list[Path], name: str) -> Path | None:
    return next((f / name for f in folders if (f / name).exists()), None)


def _profiles(folders: list[Path], unvalidated: set[str] | bool) -> list[tuple[Path, CostModel]]:
    """(file, cost model) for every measured cost model worth shipping."""
    from costmodel.model import load_cost_model

    found = []
    for path in sorted(p for f in folders for p in f.glob("*.json")):
        if path.stem in BENCHES or path.name.endswith(".partial.json"):
            continue
        if path.name.endswith(".validation.json"):  # `validate` could not store it
            print(f"skip {path.name}: a validation that could not be stored in "
                  f"{path.name.replace('.validation', '')} (see session.log); it is not a "
                  "cost model")
            continue
        try:
            model = load_cost_model(path)
        except (ValueError, OSError) as exc:
            print(f"skip {path.name}: not a cost model ({exc})")
            continue
        kind = model.provenance.get("kind", "measured")
        let_through = unvalidated is True or (unvalidated and _profile_name(model) in unvalidated)
        if model.is_estimate:
            print(f"skip {path.name}: an estimate, not a measurement")
        elif kind != "measured":  # a synthetic-timer or CPU dry-run file names a GPU too
            print(f"skip {path.name}: made by a {kind} run, not measured on a GPU")
        elif not re.fullmatch(r"[a-z0-9][a-z0-9-]*", str(model.gpu_key)):
            print(f"skip {path.name}: GPU key {model.gpu_key!r} is not a folder name")
        elif model.validation_summary("train") is None and not let_through:
            print(f"skip {path.name}: not validated (a --quick run, or the validate step "
                  f"stored nothing: see session.log); --unvalidated {_profile_name(model)} ships it")
        else:
            found.append((path, model))
    return found


def _profile_name(model: CostModel) -> str:
    """The shipped name: the model's, with -tp<N> (-etp<M>) for one rank's shard."""
    tp, etp = model.tensor_parallel, model.expert_tensor_parallel
    experts = f"-etp{etp}" if etp != tp else ""
    return model.spec.name + (f"-tp{tp}{experts}" if (tp, etp) != (1, 1) else "")


def _partials(folders: list[Path]) -> list[str]:
    """How to fit each cut-short calibration's measurements that no cost model came of."""
    lines = []
    for path in sorted(p for f in folders for p in f.glob("*.partial.json")):
        fitted = path.name.replace(".partial", "")
        if _find(folders, fitted):
            continue  # the session refitted it already
        where = path
        if path.parent != folders[0]:  # unpacked into a folder deleted when adopt ends
            where = folders[0] / path.name
            lines.append(f"{path.name} is in {folders[0] / 'results.tgz'}: `tar xzf "
                         f"{folders[0] / 'results.tgz'} -C {folders[0]} {path.name}` first")
        lines.append(f"{path.name}: what a cut-short calibration measured; fit it with "
                     f"`PYTHONPATH=. python -m costmodel calibrate --refit {where} -o "
                     f"{folders[0] / fitted}` and adopt the folder again")
    return lines


def _bench_doc(path: Path) -> dict | None:
    """A bench result file's JSON object, or None (said why) when it is not one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"skip {path.name}: unreadable ({exc})")
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows", doc.get("runs")), list):
        print(f"skip {path.name}: not a benchmark result (no rows / runs list)")
        return None
    return doc


def _partial(doc: dict) -> str | None:
    """Why a bench result is partial (a cut-short step), or None."""
    if not doc.get("rows", doc.get("runs")):
        return "no result rows"
    if doc.get("interrupted") or any("interrupted" in str(e.get("error", ""))
                                     for e in doc.get("errors") or [] if isinstance(e, dict)):
        return "interrupted"
    if doc.get("error"):
        return "stopped on an error"
    if doc.get("unmeasured"):
        return f"not measured: {doc['unmeasured']}"
    return None


def _bench_gpu_key(docs: list[dict]) -> str | None:
    """The registry key of the GPU the bench files name (bench-schedule's under device)."""
    from costmodel.gpus import find_gpu_by_device_name

    names = {(d.get("provenance") or {}).get("gpu") or (d.get("device") or {}).get("gpu")
             for d in docs}
    infos = {find_gpu_by_device_name(n, allow_suffix=True) for n in names if isinstance(n, str)}
    keys = {i.key for i in infos if i is not None}
    return keys.pop() if len(keys) == 1 else None


# ---- summaries ----------------------------------------------------------------------------
def _profile_summary(model, shipped) -> list[str]:
    from costmodel.curves import MODES

    validation = model.extra.get("validation") or {}
    timing = (model.extra.get("kernels") or {}).get("timing", "eager (not recorded)")
    if validation.get("timing", timing) != timing:
        timing += f", validated with {validation['timing']} timing"
    plan = model.provenance.get("plan") or {}
    planned = (f" (planned {plan['estimated_s']} s for {plan.get('points', '?')} points: the plan's "
               "per-point overhead, PER_POINT_OVERHEAD_S, is sized from this)"
               if isinstance(plan, dict) and "estimated_s" in plan else "")
    sweep_s = model.provenance.get("sweep_seconds", "?")
    again_s = (model.provenance.get("retaken") or {}).get("seconds")
    if isinstance(sweep_s, (int, float)) and isinstance(again_s, (int, float)):
        sweep_s = round(sweep_s - again_s, 2)  # the plan's points alone; the retakes' below
    lines = [f"  timing {timing}; sweep {sweep_s} s{planned}"
             + ("; REFIT from measurements" if model.provenance.get("refit") else "")]
    drift = model.provenance.get("drift_probe") or {}
    if drift.get("warning"):
        lines.append(f"  drift probe moved {drift.get('relative_change', 0):+.1%} during the sweep")
    retaken = model.provenance.get("retaken") or {}
    # how noisy the sweep was between points (the shipped one: 197 off the fit, and its 16
    # probes, which are all measured again: 213)
    if retaken.get("points"):
        scatter = (f"; one measurement scatters {retaken['scatter']:.1%} between runs"
                   if isinstance(retaken.get("scatter"), (int, float)) else "")
        lines.append(f"  measured again: {retaken['points']} points (the whole-layer probes "
                     "and those off the monotone fit), "
                     f"{retaken.get('measurements')} measurements in {retaken.get('seconds')} s"
                     f"{scatter}")
    if validation.get("stopped_at_time_limit"):
        lines.append(f"  validation stopped at its time limit: {validation.get('count')} of "
                     f"{validation.get('requested_count')} micro-batches")
    if validation.get("interrupted"):
        lines.append(f"  validation interrupted ({validation['interrupted']}): "
                     f"{validation.get('count')} of {validation.get('requested_count')} micro-batches")
    for mode in MODES:
        summary = (validation.get("modes", {}).get(mode) or {}).get("summary")
        if not summary:
            lines.append(f"  {mode}: not validated")
            continue
        parts = []
        for split, target in MAPE_TARGETS.items():
            mape = summary.get(split, {}).get("cost_model", {}).get("mape")
            if mape is not None:
                parts.append(f"{split} {mape:.1%} (target {target:.1%}: {_verdict(mape <= target)})")
        lines.append(f"  {mode}: " + ", ".join(parts))
    if shipped is not None:
        # An H200 NVL may report the SXM's name (costmodel/gpus.py): its power limit tells.
        new_w, old_w = ((m.extra.get("device") or {}).get("power_limit_w") for m in (model, shipped))
        if isinstance(new_w, (int, float)) and isinstance(old_w, (int, float)) and (
                abs(new_w - old_w) > 0.1 * old_w):
            lines.append(f"  POWER LIMIT {new_w:.0f} W, the shipped profile's GPU had {old_w:.0f} W: "
                         "another variant of this GPU? Check before it replaces the shipped "
                         "profile (costmodel/gpus.py names the variants)")
        for mode in MODES:
            lines.append(f"  shipped now: {shipped.validation_summary(mode) or f'{mode}: not validated'}")
    return lines + _cheapest_fills(model, shipped)


def _cheapest_fills(model, shipped) -> list[str]:
    """Where each curve is cheapest per token, fixed cost included, at caps of 16k and 32k,
    beside the shipped profile's: the scheduler fills micro-batches there where that beats
    the cap (`schedule._at_the_cheapest_fill`). A step seen by two calibrations is the GPU's
    (GEMM waves); one that moves or goes is noise, which that start then chases."""
    from costmodel.scheduler.bounds import cheapest_fill_below
    from costmodel.scheduler.costs import as_cost

    lines = []
    for mode in model.modes:
        parts = []
        for name, m in (("new", model), ("shipped", shipped)):
            if m is None or mode not in m.modes:
                continue
            cost = as_cost(m, None, mode)
            for cap in (16384, 32768):
                fill, cheaper = cheapest_fill_below(cost, cap)
                parts.append(f"{name} cap {cap // 1024}k: {fill} ({cheaper:+.1%})")
        lines.append(f"  {mode}: cheapest fill per token (vs the cap's) " + ", ".join(parts))
    return lines


def _attention_summary(doc: dict) -> list[str]:
    times = {(r["L"], r["backend"], r["mode"]): r["ms"] for r in doc.get("rows", [])}
    lines = [f"attention, Triton / torch-varlen speed (targets for L >= {ATTN_FROM_L}: fwd >= 1x, "
             "fwd+bwd >= 0.8x):"]
    if doc.get("tune_error"):
        lines.append(f"  tuning FAILED before any candidate was judged: {doc['tune_error']}")
    if doc.get("interrupted") and not times:
        lines.append("  INTERRUPTED during tuning: no table; the tuned configs are the best of "
                     f"{len(doc.get('tune_rows', []))} timed candidates: rerun with "
                     "STEPS=bench_attention")
    elif doc.get("interrupted"):
        lines.append(f"  INTERRUPTED during the table: lengths up to {max(L for L, _, _ in times)} "
                     "timed: rerun with STEPS=bench_attention for the rest")
    worst: dict[str, float] = {}
    for L in sorted({L for L, _, _ in times}):
        ratios = []
        for mode in ATTN_TARGETS:
            ours, base = times.get((L, "triton", mode)), times.get((L, "torch-varlen", mode))
            if ours and base:
                ratios.append(f"{mode} {base / ours:.2f}x")
                if L >= ATTN_FROM_L:
                    worst[mode] = min(worst.get(mode, base / ours), base / ours)
            else:
                ratios.append(f"{mode} -")
        lines.append(f"  L={L:>6}: " + ", ".join(ratios))
    for mode, ratio in worst.items():
        lines.append(f"  {mode} for L >= {ATTN_FROM_L}: at least {ratio:.2f}x "
                     f"(target {ATTN_TARGETS[mode]}x: {_verdict(ratio >= ATTN_TARGETS[mode])})")
    # bench_attention.KV_AS_GIVEN: the same varlen_attn without the adapter's KV expansion,
    # timed where this torch computes GQA by itself: the fairer baseline, said next to it.
    if (doc.get("torch_varlen_kv_as_given") or {}).get("same_as_expanded"):
        fair = {mode: min((times[(L, "varlen-kv-as-is", mode)] / times[(L, "triton", mode)]
                           for L, b, m in times if b == "triton" and m == mode and L >= ATTN_FROM_L
                           and (L, "varlen-kv-as-is", mode) in times), default=None)
                for mode in ATTN_TARGETS}
        judged = [f"{mode} at least {r:.2f}x ({_verdict(r >= ATTN_TARGETS[mode])})"
                  if r is not None else f"{mode} not timed" for mode, r in fair.items()]
        lines.append("  against varlen_attn given the KV heads as they are (no expansion), for "
                     f"L >= {ATTN_FROM_L}: " + ", ".join(judged))
    tuned = doc.get("tuned_configs")
    if tuned:
        from costmodel.kernels.triton_attention import kernel_configs

        first = kernel_configs(doc.get("shape", {}).get("head_dim", 128))
        for kernel, cfg in tuned.items():
            same = "(the current first choice)" if cfg == first[kernel][0] else (
                f"(first choice now: {first[kernel][0]})")
            lines.append(f"  tuned {kernel}: {cfg} {same}")
        if any(cfg != first[k][0] for k, cfg in tuned.items()) and times:
            lines.append("  (the Triton rows above ran with the tuned configs: they describe "
                         "the code once CONFIGS puts them first)")
        if tuned.get("dkdv", {}).get("FUSE_DQ"):
            lines.append("  (a FUSE_DQ dk/dv winner goes first in CONFIGS['dkdv'] as it is: "
                         "it then decides for its fallbacks, and the dq configs go unused)")
        if tuned.get("dkdv", {}).get("SPLIT_GROUP"):
            lines.append("  (a SPLIT_GROUP dk/dv winner goes first in CONFIGS['dkdv'] as it "
                         "is: it then decides the grid and dk/dv buffers for its fallbacks)")
        gate = doc.get("gate_row_err_first_choice")
        if gate is not None:
            lines.append(f"  first choices on the varlen gate: row error {gate:.1e} against "
                         "float64 (bf16 rounding ~1e-2; the gate refuses above 0.25)")
        timed = [r["gate_row_err"] for r in doc.get("tune_rows", [])
                 if "ms" in r and r.get("gate_row_err") is not None]
        if timed:
            lines.append(f"  {len(timed)} candidates timed, their gate row errors "
                         f"{min(timed):.1e}..{max(timed):.1e}")
    return lines


def _mlp_summary(doc: dict) -> list[str]:
    target = float(doc.get("speedup_target", 1.5))
    lines = [f"fused SwiGLU activation over the unfused torch ops (target >= {target}x):"]
    for row in doc.get("rows", []):
        fwd, both = row.get("act_fwd_speedup"), row.get("act_fwdbwd_speedup")
        if fwd is None or both is None:
            lines.append(f"  T={row.get('tokens')}: -")
            continue
        lines.append(f"  T={row['tokens']:>6}: fwd {fwd:.2f}x, fwd+bwd {both:.2f}x "
                     f"({_verdict(min(fwd, both) >= target)})")
    return lines


def _headroom(check: dict) -> str:
    """Token balance's own imbalance, as the most a policy cuts at the same work."""
    room = check.get("tokens_balance_headroom")
    return f"; balance alone reaches {room:.1%}" if isinstance(room, (int, float)) else ""


def _schedule_summary(doc: dict) -> list[str]:
    config = doc.get("config") or {}
    mode, align = config.get("mode", "train"), config.get("align", 1)
    # A forward-only or aligned run is another measurement: its lines must say which.
    flags = "" if (mode, align) == ("train", 1) else f" --mode {mode} --align {align}"
    lines = [f"bench-schedule{flags} (target: calibrated >= 10% below tokens, <= flops, "
             "max/mean < 1.03):"]
    for run in doc.get("runs", []):
        speedup = run.get("speedup_over_tokens")
        lines.append(f"  dp {run['dp_size']:>3} {run['policy']:<10} makespan "
                     f"{run['measured_makespan_ms']:9.2f} ms  max/mean "
                     f"{run['measured_max_over_mean']:.3f}  speed-up "
                     + (f"{speedup:.3f}x" if isinstance(speedup, (int, float)) else "-"))
    for check in doc.get("targets", []):
        try:
            lines.append(
                f"  dp {check['dp_size']}: {check['makespan_cut_vs_tokens']:.1%} below tokens "
                f"({_verdict(check['cut_at_least_10pct'])}{_headroom(check)}), no worse than flops "
                f"({_verdict(check['no_worse_than_flops'])}), max/mean "
                f"{check['calibrated_max_over_mean']:.3f} "
                f"({_verdict(check['max_over_mean_below_1.03'])})")
        except (KeyError, TypeError, ValueError):  # another schema's checks: as they are
            lines.append(f"  dp {check.get('dp_size')}: {json.dumps(check)}")
    if doc.get("unmeasured"):
        lines.append(f"  not measured: {doc['unmeasured']}")
    if doc.get("error"):
        lines.append(f"  FAILED part way: {doc['error']}")
    return lines


def _pytest_summary(path: Path) -> list[str]:
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        return [f"GPU tests: {path.name} unreadable ({exc})"]
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return [f"GPU tests: {path.name} holds no test suite"]
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    lines = ["GPU tests: {tests} ran, {failures} failed, {errors} errors, {skipped} skipped"
             .format(**counts)]
    for case in suite.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            lines.append(f"  FAILED {case.get('classname')}::{case.get('name')}")
    return lines


def _log_summary(path: Path) -> list[str]:
    """The session's failed and skipped steps, from its `== name: rc=N` and SKIP lines."""
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("== SKIP") or (re.search(r": rc=(\d+) in ", line)
                                          and not re.search(r": rc=0 in ", line)):
            lines.append(f"  {line}")
    return ["session steps that failed or were skipped:"] + lines if lines else []


def _log_name(path: Path, key: str, fallback: str) -> str:
    match = re.search(r"== session start (\d{4}-\d{2}-\d{2})T(\d{2}):(\d{2})",
                      path.read_text(errors="replace"))
    date = match.group(1) if match else fallback
    name = f"gpu_session_{key}_{date}.log"
    existing = ROOT / "benchmarks" / "results" / name
    if existing.exists() and existing.read_bytes() != path.read_bytes():
        name = f"gpu_session_{key}_{date}" + (f"T{match.group(2)}{match.group(3)}" if match
                                              else "-2") + ".log"
    return name


# ---- adopt --------------------------------------------------------------------------------
def adopt(out: Path, dry_run: bool = False, unvalidated: set[str] | bool = False,
          gpu: str | None = None) -> int:
    """Check everything first, then copy: a bad file stops the run before anything moved."""
    from costmodel.model import load_cost_model

    results = ROOT / "benchmarks" / "results"
    with tempfile.TemporaryDirectory() as unpacked:
        folders = _unpack(out, Path(unpacked))
        profiles = _profiles(folders, unvalidated)
        for line in _partials(folders):
            print(line)
        keys = {str(model.gpu_key) for _, model in profiles}  # each a folder name (checked)
        names = [_profile_name(model) for _, model in profiles]
        if len(keys) > 1 or len(set(names)) < len(names):
            print(f"{out} holds profiles of several GPUs ({sorted(keys)}) or two of one model "
                  f"({names}): ship them one session folder at a time", file=sys.stderr)
            return 1
        docs = {}
        for name in BENCHES:
            path = _find(folders, f"{name}.json")
            if path is not None and (doc := _bench_doc(path)) is not None:
                docs[name] = (path, doc)
        key = keys.pop() if keys else gpu or _bench_gpu_key([d for _, d in docs.values()])
        if key is None:
            print(f"no measured cost model in {out} to ship, and no GPU to file the bench "
                  "results under: pass --gpu KEY (e.g. h200)", file=sys.stderr)
            return 1
        if not profiles:
            print(f"no measured cost model in {out}: shipping the bench results only, under {key}")
        date = str(profiles[0][1].extra.get("created", ""))[:10] if profiles else ""
        copies: list[tuple[Path, Path]] = []
        for path, model in profiles:
            dst = ROOT / "costmodel" / "profiles" / key / f"{_profile_name(model)}.json"
            try:
                shipped = load_cost_model(dst) if dst.exists() else None
            except ValueError:
                shipped = None
            print(f"\n{path.name}: {model.gpu}, {model.spec.name}")
            print("\n".join(_profile_summary(model, shipped)))
            copies.append((path, dst))
            # The session names the plot after the model (CAL= may name the profile otherwise).
            png = _find(folders, f"{path.stem}.png") or _find(folders, f"{model.spec.name}.png")
            if png is not None:
                copies.append((png, results / f"{model.spec.name}_{key}.png"))
            else:
                print(f"  no {model.spec.name}.png: the shipped plot is now stale")
        print()
        summarise = {"bench_attention": _attention_summary, "bench_mlp": _mlp_summary,
                     "bench_schedule": _schedule_summary,
                     "bench_schedule_forward": _schedule_summary}
        for name in BENCHES:
            if name not in docs and name in OPTIONAL_BENCHES:
                continue
            if name not in docs:
                stale = " (the shipped one is now stale)" if profiles and name == "bench_schedule" else ""
                print(f"{name}: no result to ship{stale}")
                continue
            path, doc = docs[name]
            try:  # and the failures each bench records per case
                print("\n".join(summarise[name](doc)
                                + [f"  FAILED {err}" for err in doc.get("errors") or []]))
                why = _partial(doc)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                print(f"skip {name}: unexpected contents ({type(exc).__name__}: {exc})")
                continue
            dst = results / f"{name}_{key}.json"
            if why and dst.exists():
                dst = results / f"{name}_partial_{key}.json"
                print(f"  {name} is partial ({why}): shipped as {dst.name}, not over the "
                      "shipped one")
            kept = Path(unpacked) / f"kept-{name}.json"  # outlives the archive's folder use
            kept.write_bytes(path.read_bytes())
            copies.append((kept, dst))
        xml = _find(folders, "pytest-gpu.xml")
        print("\n".join(_pytest_summary(xml)) if xml else "GPU tests: no pytest-gpu.xml")
        log = _find(folders, "session.log")
        if log is not None:
            print("\n".join(_log_summary(log)))
            copies.append((log, results / _log_name(log, key, date or "undated")))
        if key == "h200" and "qwen3-8b" in names:  # what the README and a benchmark judge by
            print("now stale, to rerun on this machine: benchmarks/results/"
                  "bench_scheduler_h200_profile.json (bench_scheduler.py --cost-model "
                  "h200/qwen3-8b --json ...), bench_correction_h200.json (bench_correction.py: "
                  "does the new profile need a correction?), the README's main-job output and "
                  "the tests that pin the shipped profile's numbers (grep tests/ for its "
                  "validation errors)")
        for src, dst in copies:
            print(f"{'would copy' if dry_run else 'copy'} {src.name} -> {dst.relative_to(ROOT)}")
            if not dry_run:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the folder the GPU session wrote ($OUT)")
    p.add_argument("--dry-run", action="store_true", help="print what would be copied")
    p.add_argument("--unvalidated", nargs="*", metavar="MODEL",
                   help="also ship these models' measured profiles that were not validated "
                        "(--quick runs); with no model named, any")
    p.add_argument("--gpu", help="GPU key for bench results when no profile names it")
    args = p.parse_args(argv)
    if not args.out.is_dir():
        print(f"error: {args.out} is not a folder", file=sys.stderr)
        return 2
    unvalidated = (False if args.unvalidated is None
                   else set(args.unvalidated) if args.unvalidated else True)
    gpu = None
    if args.gpu is not None:
        from costmodel.gpus import lookup_gpu

        try:
            gpu = lookup_gpu(args.gpu).key
        except ValueError as exc:
            print(f"error: --gpu: {exc}", file=sys.stderr)
            return 2
    return adopt(args.out, args.dry_run, unvalidated, gpu)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
