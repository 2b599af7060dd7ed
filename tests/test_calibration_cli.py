"""`--gpu` checks, missing torch/CUDA errors, and the calibrate/report/validate commands.

GPU tests at the bottom run only with CUDA (skipped with a reason otherwise)."""

import builtins
import json
import sys

import pytest

from costmodel.calibration.device import require_cuda, resolve_gpu
from costmodel.cli import main

try:
    import torch
except ImportError:
    torch = None

HAS_CUDA = torch is not None and torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

H200 = {"name": "NVIDIA H200", "sm_count": 132, "compute_capability": "9.0"}


def test_gpu_mismatch_names_what_was_found():
    with pytest.raises(ValueError) as err:
        resolve_gpu("h100", H200)
    msg = str(err.value)
    assert "--gpu h100" in msg and "'NVIDIA H200'" in msg and "--gpu h200" in msg


def test_gpu_match_and_auto():
    assert resolve_gpu("h200", H200)[0] == "h200"
    assert resolve_gpu("NVIDIA H200", H200)[0] == "h200"
    key, info = resolve_gpu("auto", H200)
    assert key == "h200" and info.sm_count == 132
    key, info = resolve_gpu("auto", {"name": "NVIDIA Tesla V100-SXM2-32GB"})
    assert key == "tesla-v100-sxm2-32gb" and info is None
    with pytest.raises(ValueError, match="not in the registry"):
        resolve_gpu("h100", {"name": "NVIDIA Tesla V100-SXM2-32GB"})
    with pytest.raises(ValueError, match="unknown GPU 'x9'"):
        resolve_gpu("x9", H200)


def test_no_torch_is_a_runtime_error(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "torch":
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    monkeypatch.setattr("importlib.import_module", lambda name: fake_import(name))
    with pytest.raises(RuntimeError, match="torch is not installed: pip install"):
        require_cuda()


@pytest.mark.skipif(torch is None or HAS_CUDA, reason="checks the no-CUDA error (needs torch without a GPU)")
def test_calibrate_without_cuda(tmp_path, capsys):
    out = tmp_path / "c.json"
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        require_cuda()
    assert main(["calibrate", "--gpu", "h200", "--model", "qwen3-0.6b", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "costmodel calibrate: error:" in err and "CUDA" in err
    assert not out.exists()


def test_calibrate_bad_arguments(tmp_path, capsys):
    assert main(["calibrate", "--model", "qwen3-0.6b", "--modes", "eval", "-o", str(tmp_path / "x.json")]) == 2
    assert "--modes 'eval'" in capsys.readouterr().err
    assert main(["calibrate", "--model", "nope", "-o", str(tmp_path / "x.json")]) == 2
    assert "neither a model preset" in capsys.readouterr().err


def test_report_estimate_by_name(tmp_path, capsys):
    png = tmp_path / "est.png"
    assert main(["report", "h200/qwen3-8b", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "ESTIMATE (not measured): qwen3-8b on NVIDIA H200" in out
    assert "validation: none" in out and png.stat().st_size > 10_000


def test_report_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "costmodel/1"')
    assert main(["report", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_validate_needs_a_measured_file(tmp_path, capsys):
    from costmodel.model import load_cost_model

    path = tmp_path / "est.json"
    load_cost_model("h200/qwen3-0.6b").save(path)
    assert main(["validate", str(path)]) == 2
    assert "is an estimate" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "missing.json")]) == 2


# ---- GPU ------------------------------------------------------------------------------------
@needs_gpu
@pytest.mark.gpu
def test_cuda_timer_measures_and_passes_flops_check():
    from costmodel.calibration.plan import SweepPoint
    from costmodel.calibration.workloads import CudaTimer
    from costmodel.spec import ModelSpec

    spec = ModelSpec.from_preset("qwen3-0.6b")
    timer = CudaTimer(spec, attention="torch-varlen")
    fp = timer.device_fingerprint()
    assert fp["sm_count"] > 0 and fp["torch"]
    for point in (SweepPoint("attention", "train", (1024,) * 4), SweepPoint("linear", "forward", (2048,)),
                  SweepPoint("head", "train", (512,)), SweepPoint("layer", "train", (300, 700)),
                  SweepPoint("stack", "forward", (100, 900), num_layers=2)):
        m = timer.measure(point, repeats=3, warmup=1)
        assert 0 < m.median_ms < 1000 and m.repeats == 3


@needs_gpu
@pytest.mark.gpu
def test_calibrate_quick_end_to_end_on_gpu(tmp_path, capsys):
    out = tmp_path / "small.json"
    rc = main(["calibrate", "--gpu", "auto", "--model", "qwen3-0.6b", "--quick", "--max-len", "4096",
               "--budget-s", "10", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["flops_check"]["points"] and not doc["is_estimate"]
    assert main(["validate", str(out), "--count", "16", "--layers", "2", "--modes", "forward"]) == 0
    assert json.loads(out.read_text())["validation"]["modes"]["forward"]
    assert main(["report", str(out), "--png", str(tmp_path / "p.png")]) == 0


# ---- the GPU workloads, run once on CPU at tiny shapes (no timing) ---------------------------
@pytest.mark.skipif(torch is None, reason="needs torch")
def test_workloads_build_and_run_on_cpu():
    """The closures CudaTimer times, built on CPU in fp32 with the sdpa backend."""
    import dataclasses

    from costmodel.calibration.plan import SweepPoint
    from costmodel.calibration.workloads import CudaTimer
    from costmodel.kernels.attention import get_attention
    from costmodel.spec import ModelSpec

    spec = dataclasses.replace(
        ModelSpec.from_preset("qwen3-30b-a3b"), num_layers=2, hidden_size=64, num_heads=4,
        num_kv_heads=2, head_dim=16, intermediate_size=96, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, vocab_size=128, moe_layers=(1,),
    )
    timer = object.__new__(CudaTimer)  # skip the CUDA checks of __init__
    timer.torch, timer.spec, timer.attention = torch, spec, "sdpa"
    timer.attn_fn = get_attention("sdpa")
    timer.dtype, timer.device, timer._modules = torch.float32, torch.device("cpu"), {}
    points = [
        SweepPoint("attention", "train", (8,) * 3), SweepPoint("attention", "forward", (16,)),
        SweepPoint("linear", "train", (24,)), SweepPoint("linear", "forward", (24,), moe=True),
        SweepPoint("head", "train", (10,)), SweepPoint("head", "forward", (10,)),
        SweepPoint("layer", "train", (5, 7), moe=True), SweepPoint("layer", "forward", (5, 7)),
        SweepPoint("stack", "train", (3, 9), num_layers=2), SweepPoint("stack", "forward", (3, 9), moe=True, num_layers=2),
    ]
    for point in points:
        fn, ws = timer._build(point)
        assert ws > 0
        fn()
        fn()  # twice: repeats must not fail on accumulated state
    layer = timer._modules[("layer", "none", False, 0)]
    # parameter gradients accumulate (k_norm gets none: with attention="none" k is unused)
    assert layer.w_qkv.grad is not None and layer.mlp.w_down.grad is not None


def test_calibrate_and_validate_commands_with_a_synthetic_device(tmp_path, monkeypatch, capsys):
    """The command code path end to end, with the CUDA timer swapped for the synthetic one."""
    import costmodel.calibration.device as device
    import costmodel.calibration.workloads as workloads
    from costmodel.calibration.timer import SyntheticTimer

    monkeypatch.setattr(device, "require_cuda", lambda: None)
    monkeypatch.setattr(workloads, "CudaTimer", lambda spec, **kw: SyntheticTimer(spec, noise=0.003))
    out = tmp_path / "cal.json"
    args = ["calibrate", "--gpu", "h200", "--model", "qwen3-0.6b", "--quick", "--max-len", "4096", "-o", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    assert "FLOPs check passed" in captured.out and "calibrate [" in captured.err
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("costmodel ") and doc["gpu"] == {"key": "h200", "name": "NVIDIA H200"}
    assert main(["calibrate", "--gpu", "h100", "--model", "qwen3-0.6b", "--quick", "-o", str(tmp_path / "x.json")]) == 2
    assert "this machine's GPU is 'NVIDIA H200'" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    assert main(["validate", str(out), "--count", "20", "--layers", "2"]) == 0
    text = capsys.readouterr().out
    assert "cost_model" in text and "stored the validation" in text
    val = json.loads(out.read_text())["validation"]
    assert val["modes"]["train"]["summary"]["all"]["cost_model"]["mape"] < 0.03
    assert main(["report", str(out)]) == 0
    assert "validation: 20 random micro-batches" in capsys.readouterr().out
