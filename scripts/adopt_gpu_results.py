"""Ship what a GPU session (`scripts/gpu_session.sh`) wrote under $OUT, and summarise it.

    PYTHONPATH=. python scripts/adopt_gpu_results.py OUT_DIR [--dry-run] [--unvalidated]

Run on the dev machine after the session's files came back. It checks everything first
and then copies (a bad file is skipped, with the reason, before anything moved):

- ``<model>.json`` (a measured and validated cost model; ``--unvalidated`` also takes a
  ``--quick`` one) to ``costmodel/profiles/<gpu key>/<model>.json``, for every such
  profile in OUT_DIR (qwen3-8b, and qwen3-30b-a3b when the session got that far); profiles
  of two GPUs, or two of one model, are refused: one session folder at a time;
- ``bench_attention.json``, ``bench_mlp.json``, ``bench_schedule.json`` to
  ``benchmarks/results/<name>_<gpu key>.json``, ``<model>.png`` to
  ``benchmarks/results/<model>_<gpu key>.png`` and ``session.log`` to
  ``benchmarks/results/gpu_session_<gpu key>_<date>.log`` (bench files also from the
  session's ``results.tgz``, which it writes past 8 files);

then prints what the README and the issues need: validation errors against the targets,
the attention ratios against torch-varlen, the tuned backward configs next to the current
first choices, and bench-schedule's target checks. It changes no code: adopting tuned
configs in `triton_attention._CONFIGS`, and the README and the tests that pin the shipped
profile, stay a person's edit. ``--dry-run`` copies nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHES = ("bench_attention", "bench_mlp", "bench_schedule")


def _profiles(out: Path, unvalidated: bool) -> list[tuple[Path, object]]:
    """(file, cost model) for every measured cost model in `out` worth shipping."""
    from costmodel.model import load_cost_model

    found = []
    for path in sorted(out.glob("*.json")):
        if path.stem in BENCHES or path.name.endswith(".partial.json"):
            continue
        try:
            model = load_cost_model(path)
        except (ValueError, OSError) as exc:
            print(f"skip {path.name}: not a cost model ({exc})")
            continue
        kind = model.provenance.get("kind", "measured")
        if model.is_estimate:
            print(f"skip {path.name}: an estimate, not a measurement")
        elif kind != "measured":  # a synthetic-timer or CPU dry-run file names a GPU too
            print(f"skip {path.name}: made by a {kind} run, not measured on a GPU")
        elif not re.fullmatch(r"[a-z0-9][a-z0-9-]*", str(model.gpu_key)):
            print(f"skip {path.name}: GPU key {model.gpu_key!r} is not a folder name")
        elif model.validation_summary("train") is None and not unvalidated:
            print(f"skip {path.name}: not validated (a --quick run?); --unvalidated ships it")
        else:
            found.append((path, model))
    return found


def _copy(src: Path, dst: Path, dry_run: bool) -> None:
    print(f"{'would copy' if dry_run else 'copy'} {src} -> {dst.relative_to(ROOT)}")
    if not dry_run:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)


def _attention_summary(doc: dict) -> list[str]:
    times = {(r["L"], r["backend"], r["mode"]): r["ms"] for r in doc.get("rows", [])}
    lines = ["attention, Triton / torch-varlen speed (target: fwd >= 1x and fwd+bwd >= 0.8x "
             "for L >= 4k):"]
    for L in sorted({L for L, _, _ in times}):
        ratios = []
        for mode in ("fwd", "fwd+bwd"):
            ours, base = times.get((L, "triton", mode)), times.get((L, "torch-varlen", mode))
            ratios.append(f"{mode} {base / ours:.2f}x" if ours and base else f"{mode} -")
        lines.append(f"  L={L:>6}: " + ", ".join(ratios))
    tuned = doc.get("tuned_configs")
    if tuned:
        from costmodel.kernels.triton_attention import kernel_configs

        first = kernel_configs(doc.get("shape", {}).get("head_dim", 128))
        for kernel, cfg in tuned.items():
            same = "(the current first choice)" if cfg == first[kernel][0] else (
                f"(first choice now: {first[kernel][0]})")
            lines.append(f"  tuned {kernel}: {cfg} {same}")
        if tuned.get("dkdv", {}).get("FUSE_DQ"):
            lines.append("  (a FUSE_DQ dk/dv winner goes first in _CONFIGS['dkdv'] as it is: "
                         "it then decides for its fallbacks, and the dq configs go unused)")
        gate = doc.get("gate_row_err_first_choice")
        if gate is not None:
            lines.append(f"  first choices on the varlen gate: row error {gate:.1e} against "
                         "float64 (bf16 rounding ~1e-2; the gate refuses above 0.25)")
    for err in doc.get("errors", []):
        lines.append(f"  FAILED {err}")
    return lines


def _schedule_summary(doc: dict) -> list[str]:
    lines = ["bench-schedule (target: calibrated >= 10% below tokens, <= flops, max/mean < 1.03):"]
    for run in doc.get("runs", []):
        lines.append(f"  dp {run['dp_size']:>3} {run['policy']:<10} makespan "
                     f"{run['measured_makespan_ms']:9.2f} ms  max/mean "
                     f"{run['measured_max_over_mean']:.3f}  speed-up "
                     f"{run.get('speedup_over_tokens') or 0:.3f}x")
    for check in doc.get("targets", []):
        lines.append(f"  dp {check['dp_size']}: {json.dumps(check)}")
    if doc.get("unmeasured"):
        lines.append(f"  not measured: {doc['unmeasured']}")
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


def _bench_files(out: Path, unpack_to: Path) -> dict[str, Path]:
    """name -> file of each benchmark result in `out`, or in its results.tgz (the session
    archives all but the log and the profile when it wrote more than 8 files)."""
    archive = out / "results.tgz"
    if archive.exists():
        with tarfile.open(archive) as tar:
            tar.extractall(unpack_to, filter="data")
    found = {}
    for name in BENCHES:
        for folder in (out, unpack_to):
            if (folder / f"{name}.json").exists():
                found[name] = folder / f"{name}.json"
                break
    return found


def adopt(out: Path, dry_run: bool = False, unvalidated: bool = False) -> int:
    """Check everything first, then copy: a bad file stops the run before anything moved."""
    profiles = _profiles(out, unvalidated)
    if not profiles:
        print(f"no measured cost model in {out} to ship", file=sys.stderr)
        return 1
    keys = {model.gpu_key for _, model in profiles}
    names = [model.spec.name for _, model in profiles]
    if len(keys) > 1 or len(set(names)) < len(names):
        print(f"{out} holds profiles of several GPUs ({sorted(keys)}) or two of one model "
              f"({names}): ship them one session folder at a time", file=sys.stderr)
        return 1
    (key,) = keys
    date = str(profiles[0][1].extra.get("created", ""))[:10] or "undated"
    results = ROOT / "benchmarks" / "results"
    copies: list[tuple[Path, Path]] = []
    for path, model in profiles:
        print(f"\n{path.name}: {model.gpu}, {model.spec.name}")
        for mode in ("train", "forward"):
            print(f"  {model.validation_summary(mode) or f'{mode}: not validated'}")
        copies.append((path, ROOT / "costmodel" / "profiles" / key / f"{model.spec.name}.json"))
        png = out / f"{path.stem}.png"
        if png.exists():
            copies.append((png, results / f"{path.stem}_{key}.png"))
    print()
    with tempfile.TemporaryDirectory() as unpacked:
        benches = _bench_files(out, Path(unpacked))
        for name in BENCHES:
            doc = _bench_doc(benches[name]) if name in benches else None
            if doc is None:
                print(f"{name}: no result to ship")
                continue
            summarise = {"bench_attention": _attention_summary,
                         "bench_schedule": _schedule_summary}.get(name)
            try:
                print("\n".join(summarise(doc)) if summarise else f"{name}: shipped as is")
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                print(f"skip {name}: unexpected contents ({type(exc).__name__}: {exc})")
                continue
            kept = Path(unpacked) / f"kept-{name}.json"  # outlives the archive's folder use
            kept.write_bytes(benches[name].read_bytes())
            copies.append((kept, results / f"{name}_{key}.json"))
        if (out / "session.log").exists():
            copies.append((out / "session.log", results / f"gpu_session_{key}_{date}.log"))
        for src, dst in copies:
            _copy(src, dst, dry_run)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the folder the GPU session wrote ($OUT)")
    p.add_argument("--dry-run", action="store_true", help="print what would be copied")
    p.add_argument("--unvalidated", action="store_true",
                   help="also ship measured profiles that were not validated (--quick runs)")
    args = p.parse_args(argv)
    if not args.out.is_dir():
        print(f"error: {args.out} is not a folder", file=sys.stderr)
        return 2
    return adopt(args.out, args.dry_run, args.unvalidated)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
