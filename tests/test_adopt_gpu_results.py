"""scripts/adopt_gpu_results.py on a GPU session's folder, made of the shipped results."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture
def adopt_script(monkeypatch, tmp_path):
    """The script, writing under tmp_path/repo instead of this checkout."""
    spec = importlib.util.spec_from_file_location("adopt", ROOT / "scripts" / "adopt_gpu_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", tmp_path / "repo")
    return module


def _session_folder(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    shutil.copyfile(ROOT / "costmodel" / "profiles" / "h200" / "qwen3-8b.json", out / "qwen3-8b.json")
    attention = json.loads((RESULTS / "bench_attention_h200.json").read_text())
    attention["tuned_configs"] = {"dkdv": {"BLOCK_M": 64, "BLOCK_N": 128, "MASK_BLOCK_M": 64,
                                           "num_warps": 8, "num_stages": 1, "FUSE_DQ": 1}}
    attention["gate_row_err_first_choice"] = 0.012
    (out / "bench_attention.json").write_text(json.dumps(attention))
    shutil.copyfile(RESULTS / "bench_schedule_h200.json", out / "bench_schedule.json")
    (out / "session.log").write_text("== session start\n")
    (out / "broken.json").write_text("{")
    return out


def test_ships_the_profile_and_results_and_summarises_them(adopt_script, tmp_path, capsys):
    out = _session_folder(tmp_path)
    assert adopt_script.main([str(out)]) == 0
    repo = tmp_path / "repo"
    assert (repo / "costmodel/profiles/h200/qwen3-8b.json").read_bytes() == (
        out / "qwen3-8b.json").read_bytes()
    for name in ("bench_attention_h200.json", "bench_schedule_h200.json",
                 "gpu_session_h200_2026-11-30.log"):
        assert (repo / "benchmarks/results" / name).exists(), name
    text = capsys.readouterr().out
    assert "13.2% on all sizes" in text  # the validation line of the profile
    assert "L=  8192: fwd 1.44x, fwd+bwd 0.70x" in text
    assert "tuned dkdv: {'BLOCK_M': 64" in text and "first choice now" in text
    assert "a FUSE_DQ dk/dv winner goes first in _CONFIGS['dkdv'] as it is" in text
    assert "varlen gate: row error 1.2e-02 against float64" in text
    assert "dp  64 calibrated makespan    139.02 ms" in text
    assert "skip broken.json: not a cost model" in text


def test_dry_run_copies_nothing_and_an_empty_folder_ships_nothing(adopt_script, tmp_path, capsys):
    out = _session_folder(tmp_path)
    assert adopt_script.main([str(out), "--dry-run"]) == 0
    assert not (tmp_path / "repo").exists()
    assert "would copy" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert adopt_script.main([str(empty)]) == 1
    assert "no measured cost model" in capsys.readouterr().err
    assert adopt_script.main([str(tmp_path / "missing")]) == 2


def test_bad_or_ambiguous_files_are_skipped_or_refused_before_anything_moves(
        adopt_script, tmp_path, capsys):
    """A review found: a broken or partial bench file crashed after the profile was copied,
    bench_mlp was copied unchecked, an unvalidated --quick profile replaced the shipped one,
    and two GPUs' profiles mixed their keys."""
    out = _session_folder(tmp_path)
    (out / "bench_mlp.json").write_text("[1, 2, 3]")
    (out / "bench_schedule.json").write_text('{"runs": [{"policy": "tokens"}]}')  # partial
    doc = json.loads((out / "qwen3-8b.json").read_text())
    synthetic = {**doc, "provenance": {**doc["provenance"], "kind": "synthetic"}}
    (out / "llama-3.1-8b.json").write_text(json.dumps(synthetic))  # a test's file, names a GPU
    doc.pop("validation")
    (out / "qwen3-4b.json").write_text(json.dumps(doc))  # unvalidated (a --quick run)
    assert adopt_script.main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "skip llama-3.1-8b.json: made by a synthetic run, not measured on a GPU" in text
    assert "skip bench_mlp.json: not a benchmark result" in text
    assert "skip bench_schedule: unexpected contents" in text
    assert "skip qwen3-4b.json: not validated" in text
    results = tmp_path / "repo" / "benchmarks" / "results"
    assert (results / "bench_attention_h200.json").exists()
    assert not (results / "bench_mlp_h200.json").exists()
    assert not (results / "bench_schedule_h200.json").exists()
    assert not (tmp_path / "repo" / "costmodel" / "profiles" / "h200" / "qwen3-4b.json").exists()

    h100 = json.loads((out / "qwen3-8b.json").read_text())
    h100["gpu"] = {"key": "h100", "name": "NVIDIA H100 80GB HBM3"}
    (out / "other.json").write_text(json.dumps(h100))
    assert adopt_script.main([str(out), "--unvalidated"]) == 1
    assert "several GPUs" in capsys.readouterr().err


def test_bench_files_inside_the_sessions_archive_are_shipped(adopt_script, tmp_path):
    import tarfile

    out = _session_folder(tmp_path)
    with tarfile.open(out / "results.tgz", "w:gz") as tar:  # what gpu_session.sh writes
        tar.add(out / "bench_attention.json", arcname="bench_attention.json")
    (out / "bench_attention.json").unlink()
    assert adopt_script.main([str(out)]) == 0
    shipped = tmp_path / "repo" / "benchmarks" / "results" / "bench_attention_h200.json"
    assert json.loads(shipped.read_text())["tuned_configs"]["dkdv"]["BLOCK_M"] == 64
