"""scripts/adopt_gpu_results.py on a GPU session's folder, made of the shipped results."""

from __future__ import annotations

import importlib.util
import json
import re
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
    schedule = json.loads((RESULTS / "bench_schedule_h200.json").read_text())
    schedule["targets"][-1]["tokens_balance_headroom"] = 1 - 1 / 1.2279  # as bench-schedule writes
    (out / "bench_schedule.json").write_text(json.dumps(schedule))
    (out / "session.log").write_text("== session start 2026-12-01T10:31:02Z on vm\n"
                                     "== bench_mlp: rc=124 in 60s\n== SKIP calibrate_moe: 12s left\n")
    (out / "broken.json").write_text("{")
    return out


def test_ships_the_profile_and_results_and_summarises_them(adopt_script, tmp_path, capsys):
    out = _session_folder(tmp_path)
    assert adopt_script.main([str(out)]) == 0
    repo = tmp_path / "repo"
    assert (repo / "costmodel/profiles/h200/qwen3-8b.json").read_bytes() == (
        out / "qwen3-8b.json").read_bytes()
    for name in ("bench_attention_h200.json", "bench_schedule_h200.json",
                 "gpu_session_h200_2026-12-01.log"):
        assert (repo / "benchmarks/results" / name).exists(), name
    text = capsys.readouterr().out
    assert "train: >=1024 3.8% (target 2.5%: MISSED), all 13.2% (target 4.0%: MISSED)" in text
    assert "sweep 60.82 s (planned 55.86 s for 668 points" in text
    assert "L=  8192: fwd 1.44x, fwd+bwd 0.70x" in text
    assert "fwd+bwd for L >= 4096: at least 0.68x (target 0.8x: MISSED)" in text
    assert "tuned dkdv: {'BLOCK_M': 64" in text and "first choice now" in text
    assert "a FUSE_DQ dk/dv winner goes first in CONFIGS['dkdv'] as it is" in text
    assert "varlen gate: row error 1.2e-02 against float64" in text
    assert "dp  64 calibrated makespan    139.02 ms" in text
    assert ("dp 64: 15.3% below tokens (met; balance alone reaches 18.6%), no worse than flops "
            "(met), max/mean 1.036 (MISSED)") in text
    assert "dp 8: 5.6% below tokens (MISSED), no worse" in text  # a file without the field
    assert "skip broken.json: not a cost model" in text
    assert "== bench_mlp: rc=124 in 60s" in text and "== SKIP calibrate_moe" in text
    assert "now stale" in text and "no qwen3-8b.png" in text


def test_the_optional_forward_bench_schedule_ships_beside_the_train_one(adopt_script, tmp_path,
                                                                       capsys):
    """gpu_session.sh's optional bench_schedule_forward step: shipped under its own name,
    summarised with its flags (no cost model to skip); silent when the step did not run."""
    out = _session_folder(tmp_path)
    assert adopt_script.main([str(out), "--dry-run"]) == 0
    assert "bench_schedule_forward" not in capsys.readouterr().out
    forward = json.loads((out / "bench_schedule.json").read_text())
    forward["config"].update(mode="forward", align=2)
    (out / "bench_schedule_forward.json").write_text(json.dumps(forward))
    assert adopt_script.main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "bench-schedule --mode forward --align 2 (target: calibrated" in text
    assert "bench-schedule (target: calibrated" in text  # the train one, as before
    assert "skip bench_schedule_forward.json" not in text
    results = tmp_path / "repo" / "benchmarks" / "results"
    assert json.loads((results / "bench_schedule_forward_h200.json").read_text())["config"][
        "mode"] == "forward"


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
    (out / "qwen3-4b.validation.json").write_text(json.dumps(doc.pop("validation")))
    (out / "qwen3-4b.json").write_text(json.dumps(doc))  # unvalidated (a --quick run)
    assert adopt_script.main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "skip qwen3-4b.validation.json: a validation that could not be stored in qwen3-4b.json" in text
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


def test_a_second_session_shows_the_shipped_profile_and_keeps_the_first_log(
        adopt_script, tmp_path, capsys):
    out = _session_folder(tmp_path)
    assert adopt_script.main([str(out)]) == 0
    capsys.readouterr()
    (out / "session.log").write_text("== session start 2026-12-01T14:05:00Z on vm\n")
    doc = json.loads((out / "qwen3-8b.json").read_text())
    doc["device"]["power_limit_w"] = 600.0  # an NVL that reports the SXM's name
    doc["provenance"]["retaken"] = {"points": 41, "measurements": 82, "off_by_more_than": 0.01,
                                    "seconds": 7.5, "scatter": 0.0213, "scatter_pairs": 41}
    (out / "qwen3-8b.json").write_text(json.dumps(doc))
    assert adopt_script.main([str(out)]) == 0
    text = capsys.readouterr().out
    assert ("measured again: 41 points (the whole-layer probes and those off the monotone "
            "fit), 82 measurements in 7.5 s; one "
            "measurement scatters 2.1% between runs") in text
    # beside the plan's estimate, the sweep's own seconds (60.82 with the retakes)
    assert "sweep 53.32 s (planned 55.86 s for 668 points" in text
    assert "shipped now: validated (train, 120 micro-batches)" in text  # old next to new
    assert "POWER LIMIT 600 W, the shipped profile's GPU had 700 W" in text
    # where each curve is cheapest per token, new beside shipped (the same file here)
    assert ("train: cheapest fill per token (vs the cap's) new cap 16k: 10496 (-6.1%), new cap "
            "32k: 17920 (-1.8%), shipped cap 16k: 10496 (-6.1%)") in text
    results = tmp_path / "repo" / "benchmarks" / "results"
    assert (results / "gpu_session_h200_2026-12-01.log").read_text().startswith(
        "== session start 2026-12-01T10:31")  # the first session's log stays
    assert (results / "gpu_session_h200_2026-12-01T1405.log").exists()


def test_everything_in_the_archive_is_found_and_an_unvalidated_moe_profile_ships_by_name(
        adopt_script, tmp_path, capsys):
    """A review found: the plot and the MoE profile inside results.tgz were ignored, and
    --unvalidated could only ship every unvalidated profile at once."""
    import tarfile

    out = _session_folder(tmp_path)
    (out / "qwen3-8b.png").write_bytes(b"png")
    doc = json.loads((out / "qwen3-8b.json").read_text())
    doc.pop("validation")
    doc["spec"]["name"] = "qwen3-4b"  # stands for the --quick MoE profile
    (out / "qwen3-4b.json").write_text(json.dumps(doc))
    with tarfile.open(out / "results.tgz", "w:gz") as tar:
        for name in ("qwen3-8b.png", "qwen3-4b.json", "bench_attention.json"):
            tar.add(out / name, arcname=name)
            (out / name).unlink()
    assert adopt_script.main([str(out), "--unvalidated", "qwen3-4b"]) == 0
    repo = tmp_path / "repo"
    assert (repo / "costmodel/profiles/h200/qwen3-4b.json").exists()
    assert (repo / "benchmarks/results/qwen3-8b_h200.png").read_bytes() == b"png"
    assert (repo / "benchmarks/results/bench_attention_h200.json").exists()
    assert adopt_script.main([str(out), "--unvalidated", "qwen3-30b-a3b"]) == 0
    assert "skip qwen3-4b.json: not validated" in capsys.readouterr().out


def test_without_a_profile_the_bench_results_ship_under_their_gpu(adopt_script, tmp_path, capsys):
    out = _session_folder(tmp_path)
    (out / "qwen3-8b.json").unlink()
    (out / "qwen3-8b.partial.json").write_text("{}")
    assert adopt_script.main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "shipping the bench results only, under h200" in text
    assert "calibrate --refit" in text and "qwen3-8b.partial.json" in text
    assert (tmp_path / "repo/benchmarks/results/bench_attention_h200.json").exists()
    (out / "bench_attention.json").unlink()  # bench-schedule alone names its GPU too
    schedule = json.loads((out / "bench_schedule.json").read_text())
    schedule["error"] = "measuring stopped on an error: RuntimeError: CUDA out of memory"
    (out / "bench_schedule.json").write_text(json.dumps(schedule))
    assert adopt_script.main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "under h200" in text and "FAILED part way: measuring stopped" in text
    assert "partial (stopped on an error): shipped as bench_schedule_partial_h200.json" in text
    (out / "bench_schedule.json").unlink()
    assert adopt_script.main([str(out)]) == 1
    assert "pass --gpu KEY" in capsys.readouterr().err
    (out / "bench_mlp.json").write_text(json.dumps({"rows": [], "provenance": {}}))
    assert adopt_script.main([str(out), "--gpu", "h100", "--dry-run"]) == 0
    assert "bench_mlp_h100.json" in capsys.readouterr().out
    assert adopt_script.main([str(out), "--gpu", "v100"]) == 2
    assert "unknown GPU" in capsys.readouterr().err


def test_an_interrupted_tuning_never_replaces_a_table_and_a_broken_archive_is_skipped(
        adopt_script, tmp_path, capsys):
    out = _session_folder(tmp_path)
    assert adopt_script.main([str(out)]) == 0
    capsys.readouterr()
    tuning = {"rows": [], "interrupted": True, "tuned_configs": {},
              "tune_rows": [{"L": 8192, "kernel": "dq", "ms": 1.0, "gate_row_err": 0.01}]}
    (out / "bench_attention.json").write_text(json.dumps(tuning))
    (out / "results.tgz").write_bytes(b"\x1f\x8b truncated")
    assert adopt_script.main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "skip results.tgz: unreadable" in text
    assert "INTERRUPTED during tuning" in text and "no result rows" in text
    results = tmp_path / "repo" / "benchmarks" / "results"
    assert json.loads((results / "bench_attention_h200.json").read_text())["rows"]
    assert json.loads((results / "bench_attention_partial_h200.json").read_text())["interrupted"]


def test_a_null_errors_field_is_read_as_none(adopt_script, tmp_path, capsys):
    out = _session_folder(tmp_path)
    mlp = json.loads((RESULTS / "bench_mlp_h200.json").read_text())
    mlp["errors"] = None
    (out / "bench_mlp.json").write_text(json.dumps(mlp))
    assert adopt_script.main([str(out), "--dry-run"]) == 0
    assert "bench_mlp_h200.json" in capsys.readouterr().out


def test_gpu_test_results_are_summarised(adopt_script, tmp_path, capsys):
    out = _session_folder(tmp_path)
    (out / "pytest-gpu.xml").write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.test_timer" name="test_cold"><failure/></testcase>'
        '<testcase classname="tests.test_x" name="test_ok"/></testsuite></testsuites>')
    assert adopt_script.main([str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "GPU tests: 3 ran, 1 failed, 0 errors, 1 skipped" in text
    assert "FAILED tests.test_timer::test_cold" in text


def test_the_varlen_baseline_without_its_kv_expansion_is_judged_too(adopt_script, tmp_path, capsys):
    """Where this torch's varlen_attn handled the KV heads as they are, the Triton ratios
    against it (no expansion copy in the baseline) are printed next to the adapter's."""
    out = _session_folder(tmp_path)
    doc = json.loads((out / "bench_attention.json").read_text())
    doc["torch_varlen_kv_as_given"] = {"same_as_expanded": True, "max_rel_err": 1e-3}
    doc["rows"] += [{**r, "backend": "varlen-kv-as-is", "ms": r["ms"] * 0.9}
                    for r in doc["rows"] if r["backend"] == "torch-varlen"]
    (out / "bench_attention.json").write_text(json.dumps(doc))
    assert adopt_script.main([str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "against varlen_attn given the KV heads as they are (no expansion), for L >= 4096: " \
           "fwd at least" in text
    assert re.search(r"fwd\+bwd at least 0\.6\dx \(MISSED\)", text)  # ~0.9 of the adapter's 0.68x


def test_partial_measurements_get_a_refit_hint_only_when_nothing_was_fitted(
        adopt_script, tmp_path, capsys):
    """A review found: a partial the session refitted still got 'fit it with --refit', and
    one from results.tgz was named inside a folder deleted when adopt ends."""
    out = _session_folder(tmp_path)
    (out / "qwen3-8b.partial.json").write_text("{}")  # refitted: qwen3-8b.json is there
    (out / "qwen3-30b-a3b.partial.json").write_text("{}")
    import tarfile

    with tarfile.open(out / "results.tgz", "w:gz") as tar:
        tar.add(out / "qwen3-30b-a3b.partial.json", arcname="qwen3-30b-a3b.partial.json")
    (out / "qwen3-30b-a3b.partial.json").unlink()
    assert adopt_script.main([str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "qwen3-8b.partial.json:" not in text
    assert f"tar xzf {out / 'results.tgz'} -C {out} qwen3-30b-a3b.partial.json" in text
    assert f"--refit {out / 'qwen3-30b-a3b.partial.json'} -o {out / 'qwen3-30b-a3b.json'}" in text


def test_attention_summary_says_where_the_table_stopped(adopt_script):
    rows = [{"L": L, "backend": b, "mode": m, "ms": 1.0}
            for L in (512, 1024) for b in ("torch-varlen", "triton") for m in ("fwd", "fwd+bwd")]
    text = "\n".join(adopt_script._attention_summary(
        {"rows": rows, "interrupted": True, "tune_error": "CompilationError: at 12:4"}))
    assert "tuning FAILED before any candidate was judged: CompilationError" in text
    assert "INTERRUPTED during the table: lengths up to 1024 timed" in text
    assert "no table" not in text


# -- from a mutation check: each test fails when the code it names is broken ---------------


def test_two_profiles_of_one_model_are_refused(adopt_script, tmp_path, capsys):
    """both would go to profiles/h200/qwen3-8b.json, the later name
    silently winning."""
    out = tmp_path / "out"
    out.mkdir()
    profile = ROOT / "costmodel" / "profiles" / "h200" / "qwen3-8b.json"
    shutil.copyfile(profile, out / "qwen3-8b.json")
    shutil.copyfile(profile, out / "qwen3-8b-rerun.json")
    assert adopt_script.main([str(out)]) == 1
    assert "two of one model" in capsys.readouterr().err
    assert not (tmp_path / "repo").exists()


def test_bench_files_of_two_gpus_are_not_filed_under_either(adopt_script, tmp_path, capsys):
    """without a profile, bench files that name different GPUs give no key."""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copyfile(RESULTS / "bench_attention_h200.json", out / "bench_attention.json")
    schedule = json.loads((RESULTS / "bench_schedule_h200.json").read_text())
    schedule["device"]["gpu"] = "NVIDIA H100 80GB HBM3"
    (out / "bench_schedule.json").write_text(json.dumps(schedule))
    assert adopt_script.main([str(out)]) == 1
    assert "pass --gpu KEY" in capsys.readouterr().err
    assert not (tmp_path / "repo").exists()


def test_a_tensor_parallel_shard_ships_beside_the_whole_layer(adopt_script, tmp_path, capsys):
    """The session's quick TP-2 profile of the same model is no second profile of it: it
    ships as <model>-tp2 when named so to --unvalidated, and is skipped otherwise."""
    out = _session_folder(tmp_path)
    doc = json.loads((out / "qwen3-8b.json").read_text())
    doc.update(tensor_parallel=2, validation=None)
    (out / "qwen3-8b-tp2.json").write_text(json.dumps(doc))
    assert adopt_script.main([str(out)]) == 0
    assert "--unvalidated qwen3-8b-tp2 ships it" in capsys.readouterr().out
    profiles = tmp_path / "repo" / "costmodel" / "profiles" / "h200"
    assert not (profiles / "qwen3-8b-tp2.json").exists()
    assert adopt_script.main([str(out), "--unvalidated", "qwen3-8b-tp2"]) == 0
    assert json.loads((profiles / "qwen3-8b-tp2.json").read_text())["tensor_parallel"] == 2
    assert "tensor_parallel" not in json.loads((profiles / "qwen3-8b.json").read_text())
