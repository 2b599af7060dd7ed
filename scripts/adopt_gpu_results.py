"""Ship what a GPU session (`scripts/gpu_session.sh`) wrote under $OUT, and summarise it.

    PYTHONPATH=. python scripts/adopt_gpu_results.py OUT_DIR [--dry-run]

Run on the dev machine after the session's files came back. It copies, each only after it
loads and checks:

- ``<model>.json`` (a measured cost model, not an estimate) to
  ``costmodel/profiles/<gpu key>/<model>.json``, for every measured profile in OUT_DIR
  (qwen3-8b, and qwen3-30b-a3b when the session got that far);
- ``bench_attention.json``, ``bench_mlp.json``, ``bench_schedule.json`` to
  ``benchmarks/results/<name>_<gpu key>.json``, ``<model>.png`` to
  ``benchmarks/results/<model>_<gpu key>.png`` and ``session.log`` to
  ``benchmarks/results/gpu_session_<gpu key>_<date>.log``;

then prints what the README and the issues need: validation errors against the targets,
the attention ratios against torch-varlen, the tuned backward configs next to the current
first choices, and bench-schedule's target checks. It changes no code: adopting tuned
configs in `triton_attention._CONFIGS`, and the README and the tests that pin the shipped
profile, stay a person's edit. ``--dry-run`` copies nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHES = ("bench_attention", "bench_mlp", "bench_schedule")


def _profiles(out: Path) -> list[tuple[Path, object]]:
    """(file, cost model) for every measured cost model in `out`."""
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
        if model.is_estimate:
            print(f"skip {path.name}: an estimate, not a measurement")
            continue
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


def adopt(out: Path, dry_run: bool = False) -> int:
    profiles = _profiles(out)
    if not profiles:
        print(f"no measured cost model in {out}: nothing to ship", file=sys.stderr)
        return 1
    key = profiles[0][1].gpu_key
    date = str(profiles[0][1].extra.get("created", ""))[:10] or "undated"
    for path, model in profiles:
        print(f"\n{path.name}: {model.gpu}, {model.spec.name}")
        for mode in ("train", "forward"):
            print(f"  {model.validation_summary(mode) or f'{mode}: not validated'}")
        _copy(path, ROOT / "costmodel" / "profiles" / model.gpu_key
              / f"{model.spec.name}.json", dry_run)
        png = out / f"{path.stem}.png"
        if png.exists():
            _copy(png, ROOT / "benchmarks" / "results" / f"{path.stem}_{key}.png", dry_run)
    print()
    for name in BENCHES:
        path = out / f"{name}.json"
        if not path.exists():
            print(f"{name}: not in {out}")
            continue
        doc = json.loads(path.read_text())
        if name == "bench_attention":
            print("\n".join(_attention_summary(doc)))
        elif name == "bench_schedule":
            print("\n".join(_schedule_summary(doc)))
        _copy(path, ROOT / "benchmarks" / "results" / f"{name}_{key}.json", dry_run)
    log = out / "session.log"
    if log.exists():
        _copy(log, ROOT / "benchmarks" / "results" / f"gpu_session_{key}_{date}.log", dry_run)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the folder the GPU session wrote ($OUT)")
    p.add_argument("--dry-run", action="store_true", help="print what would be copied")
    args = p.parse_args(argv)
    if not args.out.is_dir():
        print(f"error: {args.out} is not a folder", file=sys.stderr)
        return 2
    return adopt(args.out, args.dry_run)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
