"""`--gpu` checks, missing torch/CUDA errors, and the calibrate/report/validate commands.

GPU tests at the bottom run only with CUDA (skipped with a reason otherwise)."""

import builtins
import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

import costmodel
from costmodel.calibration.device import require_cuda, resolve_gpu
from costmodel.cli import main
from costmodel.spec import ModelSpec

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
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
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


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_a_cpu_only_torch_and_a_hidden_gpu_are_told_apart(monkeypatch):
    """A CPU build needs another torch; a CUDA build that sees no GPU needs the device made
    visible: each error says its own fix."""
    if torch.version.cuda is None:  # CI's torch
        with pytest.raises(RuntimeError, match="CPU-only build"):
            require_cuda()
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(RuntimeError, match=r"sees none \(CUDA_VISIBLE_DEVICES=''\)"):
        require_cuda()


def test_calibrate_bad_arguments(tmp_path, capsys):
    assert main(["calibrate", "--model", "qwen3-0.6b", "--modes", "eval", "-o", str(tmp_path / "x.json")]) == 2
    assert "--modes 'eval'" in capsys.readouterr().err
    assert main(["calibrate", "--model", "nope", "-o", str(tmp_path / "x.json")]) == 2
    assert "neither a model preset" in capsys.readouterr().err


def test_report_estimate_by_name(tmp_path, capsys):
    png = tmp_path / "est.png"
    assert main(["report", "h100/qwen3-8b", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "ESTIMATE (not measured): qwen3-8b on NVIDIA H100" in out
    assert "validation: none" in out and png.stat().st_size > 10_000


def test_report_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "costmodel/1"')
    assert main(["report", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_report_names_malformed_informational_fields_and_goes_on(tmp_path, capsys):
    doc = json.loads(Path("costmodel/profiles/h200/qwen3-8b.json").read_text())
    doc["flops_check"]["points"] = 5
    doc["residuals"] = {"train": 5}
    doc["provenance"]["drift_probe"] = 3
    doc["measurements"] = [1, "a", None, {"kind": "linear"}]
    path = tmp_path / "hand-edited.json"
    path.write_text(json.dumps(doc))
    assert main(["report", str(path), "--png", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    for field in ("flops_check", "residuals", "provenance.drift_probe"):
        assert f"{field}: malformed in this file, not shown" in out
    assert "cost_model" in out.split("drift_probe: malformed")[1]  # validation still shown
    assert (tmp_path / "p.png").stat().st_size > 10_000


@pytest.mark.parametrize("validation", [{"train": "x"}, {"count": 5, "modes": [1]}])
def test_report_names_a_validation_block_without_results_as_malformed(tmp_path, capsys,
                                                                      validation):
    """It printed "validation: None random micro-batches per mode through None layers +
    head (caps None)" over an empty table, as if a validation had run."""
    doc = json.loads(Path("costmodel/profiles/h200/qwen3-8b.json").read_text())
    doc["validation"] = validation
    path = tmp_path / "hand-edited.json"
    path.write_text(json.dumps(doc))
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "validation: malformed in this file, not shown" in out and "None random" not in out


def test_report_plot_is_written_whole_or_not_at_all(tmp_path, capsys, monkeypatch):
    import matplotlib.figure

    png = tmp_path / "plot.png"
    png.write_bytes(b"old plot")

    def full_disk(self, fname, **kwargs):
        Path(fname).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full_disk)
    assert main(["report", "h200/qwen3-8b", "--png", str(png)]) == 2
    assert png.read_bytes() == b"old plot" and sorted(tmp_path.iterdir()) == [png]
    assert "No space left on device" in capsys.readouterr().err
    # A format matplotlib cannot write is refused before the report, not after it.
    assert main(["report", "h200/qwen3-8b", "--png", str(tmp_path / "plot.xyz")]) == 2
    captured = capsys.readouterr()
    assert "cannot write a .xyz plot" in captured.err and "cost model" not in captured.out


def test_validate_needs_a_measured_file(tmp_path, capsys):
    from costmodel.model import load_cost_model

    path = tmp_path / "est.json"
    load_cost_model("h200/qwen3-0.6b").save(path)
    assert main(["validate", str(path)]) == 2
    assert "is an estimate" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "missing.json")]) == 2
    assert "no cost model file at" in capsys.readouterr().err
    # a shipped profile by name: only with --no-save (nothing to store it in); then it gets
    # as far as the GPU check
    assert main(["validate", "h200/qwen3-8b"]) == 2
    assert "can be validated with --no-save" in capsys.readouterr().err
    assert main(["validate", "h100/qwen3-8b", "--no-save"]) == 2
    assert "is an estimate" in capsys.readouterr().err
    if not HAS_CUDA:
        assert main(["validate", "h200/qwen3-8b", "--no-save"]) == 2
        assert "CUDA" in capsys.readouterr().err


# ---- GPU ------------------------------------------------------------------------------------
@needs_gpu
@pytest.mark.gpu
def test_cuda_timer_measures_and_passes_flops_check():
    from costmodel.calibration.plan import SweepPoint
    from costmodel.calibration.workloads import KernelTimer
    from costmodel.spec import ModelSpec

    spec = ModelSpec.from_preset("qwen3-0.6b")
    timer = KernelTimer(spec, attention="torch-varlen")
    fp = timer.device_fingerprint()
    assert fp["sm_count"] > 0 and fp["torch"]
    assert fp["costmodel"] == costmodel.__version__
    for point in (SweepPoint("attention", "train", (1024,) * 4), SweepPoint("linear", "forward", (2048,)),
                  SweepPoint("head", "train", (512,)), SweepPoint("layer", "train", (300, 700)),
                  SweepPoint("stack", "forward", (100, 900), num_layers=2)):
        m = timer.measure(point, repeats=3, warmup=1)
        assert 0 < m.median_ms < 1000 and m.repeats == 3


@needs_gpu
@pytest.mark.gpu
def test_graph_and_eager_timing_agree_where_the_gpu_is_busy():
    """Graph replays drop the launch overhead: equal (within noise) on a GPU-bound point,
    lower on a launch-bound one."""
    from costmodel.calibration.plan import SweepPoint
    from costmodel.calibration.workloads import KernelTimer
    from costmodel.spec import ModelSpec

    spec = ModelSpec.from_preset("qwen3-8b")
    graph = KernelTimer(spec, attention="torch-varlen", timing="graph")
    eager = KernelTimer(spec, attention="torch-varlen", timing="eager")
    big, tiny = SweepPoint("layer", "train", (4096, 4096)), SweepPoint("linear", "train", (64,))
    g_big, e_big = (t.measure(big, repeats=5, warmup=2).median_ms for t in (graph, eager))
    assert abs(g_big / e_big - 1) < 0.1, (g_big, e_big)
    g_tiny, e_tiny = (t.measure(tiny, repeats=5, warmup=2).median_ms for t in (graph, eager))
    assert g_tiny <= e_tiny * 1.05, (g_tiny, e_tiny)


@needs_gpu
@pytest.mark.gpu
def test_moe_layer_is_captured_into_a_cuda_graph():
    """Routing and grouped GEMM without host syncs: the MoE workloads time as graphs."""
    from costmodel.calibration.plan import SweepPoint
    from costmodel.calibration.workloads import KernelTimer
    from costmodel.kernels.moe import grouped_gemm_available

    if not grouped_gemm_available("cuda", torch.bfloat16):
        pytest.skip("no torch grouped GEMM here: MoE needs --timing eager")
    timer = KernelTimer(_tiny("qwen3-30b-a3b"), attention="torch-varlen", timing="graph")
    for point in (SweepPoint("linear", "train", (512,), moe=True),
                  SweepPoint("layer", "forward", (300, 700), moe=True)):
        assert timer.measure(point, repeats=3, warmup=1).median_ms > 0


@needs_gpu
@pytest.mark.gpu
def test_calibrate_quick_end_to_end_on_gpu(tmp_path, capsys):
    out = tmp_path / "small.json"
    rc = main(["calibrate", "--gpu", "auto", "--model", "qwen3-0.6b", "--quick", "--max-len", "4096",
               "--budget-s", "10", "--settle-s", "0", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["flops_check"]["points"] and not doc["is_estimate"]
    # No settling: the GPU session's time is short, and this checks the path, not the clocks.
    assert main(["validate", str(out), "--count", "16", "--layers", "2", "--modes", "forward",
                 "--settle-s", "0"]) == 0
    assert json.loads(out.read_text())["validation"]["modes"]["forward"]
    assert main(["report", str(out), "--png", str(tmp_path / "p.png")]) == 0


# ---- the GPU workloads, run on CPU at tiny shapes (a dry run of the GPU code path) ---------
def _tiny(preset: str):
    import dataclasses

    from costmodel.spec import ModelSpec

    spec = ModelSpec.from_preset(preset)
    moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
           "moe_layers": (1,)} if spec.is_moe else {}
    return dataclasses.replace(spec, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                               head_dim=16, intermediate_size=96, vocab_size=128, **moe)


@pytest.fixture
def one_thread():
    """Tiny ops: one intra-op thread is faster, and fair to the other test worker."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_workloads_build_and_run_on_cpu(one_thread):
    """Every kind of workload KernelTimer times, on CPU in fp32 with the sdpa backend."""
    from costmodel.calibration.plan import SweepPoint
    from costmodel.calibration.workloads import KernelTimer

    timer = KernelTimer(_tiny("qwen3-30b-a3b"), attention="sdpa", dtype="fp32", device="cpu")
    assert timer.device_fingerprint()["dry_run"]
    assert timer.device_fingerprint()["costmodel"] == costmodel.__version__  # whose sweep it was
    points = [
        SweepPoint("attention", "train", (8,) * 3), SweepPoint("attention", "forward", (16,)),
        SweepPoint("linear", "train", (24,)), SweepPoint("linear", "forward", (24,), moe=True),
        SweepPoint("head", "train", (10,)), SweepPoint("head", "forward", (10,)),
        SweepPoint("layer", "train", (5, 7), moe=True), SweepPoint("layer", "forward", (5, 7)),
        SweepPoint("stack", "train", (3, 9), num_layers=2), SweepPoint("stack", "forward", (3, 9), moe=True, num_layers=2),
    ]
    for point in points:
        m = timer.measure(point, repeats=2, warmup=1)  # three calls: repeats must not fail on accumulated state
        assert m.median_ms > 0 and m.repeats == 2
    layer = timer._modules[("layer", "none", False, 0)]
    # parameter gradients accumulate (k_norm gets none: with attention="none" k is unused)
    assert layer.w_qkv.grad is not None and layer.mlp.w_down.grad is not None


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_an_attention_point_runs_its_pack_through_the_backend(one_thread):
    """n sequences of length L, as offsets and max_seqlen; forward without autograd; train
    computes q/k/v gradients without accumulating them (a layer's flow on)."""
    from costmodel.calibration.plan import SweepPoint
    from costmodel.calibration.workloads import KernelTimer

    timer = KernelTimer(_tiny("qwen3-8b"), attention="sdpa", dtype="fp32", device="cpu")
    calls = []
    backend = timer.attn_fn

    def recording(q, k, v, cu, max_seqlen, **kw):
        calls.append((q, cu.tolist(), max_seqlen, torch.is_grad_enabled()))
        return backend(q, k, v, cu, max_seqlen, **kw)

    timer.attn_fn = recording
    timer.measure(SweepPoint("attention", "forward", (16,) * 2), repeats=2, warmup=1)
    assert [c[1:] for c in calls] == [([0, 16, 32], 16, False)] * 3
    calls.clear()
    timer.measure(SweepPoint("attention", "train", (8,) * 3), repeats=2, warmup=1)
    assert [c[1:] for c in calls] == [([0, 8, 16, 24], 8, True)] * 3
    q = calls[0][0]
    assert q.shape == (24, 4, 16) and q.requires_grad and q.grad is None


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_layer_and_stack_points_build_the_layers_they_name(one_thread):
    """linear: a layer without attention; layer: one with the timed backend; stack:
    `num_layers` distinct layers and the head, all learning; MoE points MoE layers;
    forward passes without autograd."""
    from costmodel.calibration.plan import SweepPoint
    from costmodel.calibration.workloads import KernelTimer

    timer = KernelTimer(_tiny("qwen3-30b-a3b"), attention="sdpa", dtype="fp32", device="cpu")
    timer.measure(SweepPoint("linear", "train", (12,), moe=True), repeats=1, warmup=0)
    timer.measure(SweepPoint("layer", "train", (5, 7)), repeats=1, warmup=0)
    timer.measure(SweepPoint("stack", "train", (3, 9), num_layers=2), repeats=1, warmup=0)
    assert set(timer._modules) == {("layer", "none", True, 0), ("layer", "sdpa", False, 0),
                                   ("layer", "sdpa", False, 1), "head"}
    moe = timer._modules[("layer", "none", True, 0)]
    assert moe.mlp is not timer._modules[("layer", "sdpa", False, 0)].mlp
    assert all(p.grad is not None for p in moe.mlp.parameters())  # the experts ran
    for i in (0, 1):  # both layers of the stack learn, the first twice (the layer point too)
        assert timer._modules[("layer", "sdpa", False, i)].w_qkv.grad is not None
    assert timer._modules["head"].weight.grad is not None
    grad_enabled = []
    timer._modules["head"].register_forward_pre_hook(lambda m, args: grad_enabled.append(torch.is_grad_enabled()))
    timer.measure(SweepPoint("stack", "forward", (3, 9), num_layers=2), repeats=1, warmup=0)
    assert grad_enabled == [False]


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.parametrize("kind", ["head", "layer"])
def test_repeats_do_not_accumulate_the_input_gradient(one_thread, kind):
    """Parameter gradients accumulate over repeats (gradient accumulation); the input's
    flows on to the previous layer in a model: the same after every repeat."""
    from costmodel.calibration.plan import SweepPoint
    from costmodel.calibration.workloads import KernelTimer

    timer = KernelTimer(_tiny("qwen3-8b"), attention="sdpa", dtype="fp32", device="cpu")
    module = timer._head() if kind == "head" else timer._layer("sdpa", False)
    inputs = []
    module.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
    fn, _ = timer._build(SweepPoint(kind, "train", (6, 10)))
    fn()
    first = inputs[0].grad.clone()
    fn()
    assert inputs[1] is inputs[0]
    torch.testing.assert_close(inputs[0].grad, first)


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_kernel_timer_rejects_an_unknown_dtype_or_device():
    from costmodel.calibration.workloads import KernelTimer

    with pytest.raises(ValueError, match="dtype 'fp8'; allowed: bf16, fp16, fp32"):
        KernelTimer(_tiny("qwen3-8b"), attention="sdpa", dtype="fp8", device="cpu")
    with pytest.raises(ValueError, match="device 'mps'; allowed: cuda, cpu"):
        KernelTimer(_tiny("qwen3-8b"), attention="sdpa", dtype="fp32", device="mps")


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_kernel_timer_rejects_an_unknown_timing():
    from costmodel.calibration.workloads import KernelTimer

    with pytest.raises(ValueError, match="timing 'wall'; allowed: graph, eager"):
        KernelTimer(_tiny("qwen3-8b"), attention="sdpa", dtype="fp32", device="cpu", timing="wall")


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_the_timer_refuses_what_a_layer_would_refuse_when_first_built():
    """A head dim the Triton kernel lacks: said when the timer is made, not minutes into an
    eager sweep when the first layer is built."""
    import costmodel.calibration.workloads as workloads

    with pytest.raises(ValueError, match="attention 'triton' supports head dims"):
        workloads.KernelTimer(_tiny("qwen3-8b"), attention="triton", dtype="fp32", device="cpu")


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_a_workload_no_graph_can_hold_is_timed_eagerly(monkeypatch, caplog):
    """sdpa reads the offsets on the host: graph timing falls back to eager at once; a
    failed start-up capture does too, with its reason, instead of ending the run."""
    import costmodel.calibration.workloads as workloads
    from costmodel.calibration.timer import GraphCaptureError

    spec = _tiny("qwen3-8b")
    timer = workloads.KernelTimer(spec, attention="sdpa", dtype="fp32", device="cpu", timing="graph")
    assert timer.timing == "eager" and "reads the sequence offsets on the host" in caplog.text
    timer.timing = "graph"  # as for a backend a graph can hold

    def fails():
        raise GraphCaptureError("a sync")

    monkeypatch.setattr(timer, "_check_capture", fails)
    timer._capture_or_time_eagerly()
    assert timer.timing == "eager" and "(a sync): timing eagerly" in caplog.text


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.parametrize("layers", ["dense", "all-moe", "mixed"])
def test_start_up_capture_check_covers_the_layer_kinds_the_model_has(monkeypatch, layers):
    """The graph-capture check at start (CUDA only) builds a stack of each layer kind the
    model has, and no other (an all-MoE model may have no dense MLP to build), small and
    mid-sized."""
    import dataclasses

    import costmodel.calibration.workloads as workloads

    spec = _tiny("qwen3-8b" if layers == "dense" else "qwen3-30b-a3b")
    if layers == "all-moe":
        spec = dataclasses.replace(spec, moe_layers=None, intermediate_size=0)
    timer = workloads.KernelTimer(spec, attention="sdpa", dtype="fp32", device="cpu")
    built = []
    monkeypatch.setattr(timer, "_build", lambda point: (built.append(point), (None, 0))[1])
    monkeypatch.setattr(workloads, "capture_cuda_graph", lambda fn, warmup: None)
    timer._check_capture()
    stacks = sorted({p.moe for p in built if p.kind == "stack"})
    assert stacks == {"dense": [False], "all-moe": [True], "mixed": [False, True]}[layers]
    # Each at a tiny and at a mid size: kernels pick their paths by size.
    for kind in ("attention", "stack"):
        assert {sum(p.lengths) for p in built if p.kind == kind} == {128, 4096}


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_kernel_timer_refuses_a_backend_that_computes_something_else(monkeypatch):
    """A backend that ignores causality (a misread torch signature) must not be calibrated."""
    import costmodel.kernels.attention as attention
    from costmodel.calibration.workloads import KernelTimer

    def full_attention(q, k, v, cu, max_seqlen, **_):  # right shapes, no causal mask
        group = q.shape[1] // k.shape[1]
        out = []
        for a, b in zip(cu.tolist()[:-1], cu.tolist()[1:]):
            qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k.repeat_interleave(group, 1),
                                                             v.repeat_interleave(group, 1)))
            out.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1))
        return torch.cat(out)

    monkeypatch.setattr(attention, "get_attention", lambda name: full_attention)
    with pytest.raises(RuntimeError, match=r"attention backend 'sdpa' is wrong on this machine \(relative error"):
        KernelTimer(_tiny("qwen3-8b"), attention="sdpa", dtype="fp32", device="cpu")


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.parametrize("broken", ["nan", "0.5% off"])
def test_kernel_timer_refuses_a_backend_that_is_nan_or_off_in_fp32(monkeypatch, broken):
    """NaN fails every comparison, so it must fail the check too; in fp32 the backend has
    to match the float64 reference closely (the bf16 tolerance would pass 2% errors)."""
    import costmodel.kernels.attention as attention
    from costmodel.calibration.workloads import KernelTimer

    sdpa = attention.get_attention("sdpa")
    wrong = {"nan": lambda out: out * float("nan"), "0.5% off": lambda out: out * 1.005}[broken]
    monkeypatch.setattr(attention, "get_attention", lambda name: lambda *a, **kw: wrong(sdpa(*a, **kw)))
    with pytest.raises(RuntimeError, match=r"attention backend 'sdpa' is wrong on this machine"):
        KernelTimer(_tiny("qwen3-8b"), attention="sdpa", dtype="fp32", device="cpu")


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.parametrize("preset, tp, etp", [
    ("qwen3-8b", 1, None), ("qwen3-30b-a3b", 1, None), ("qwen3-30b-a3b", 4, None),
    ("qwen3-30b-a3b", 2, 1)])
def test_cpu_dry_run_of_calibrate_validate_report(tmp_path, preset, tp, etp, one_thread):
    """The real workloads through the same pipeline as on the GPU: plan -> sweep -> fit ->
    file -> validate -> report, timed on CPU (the numbers mean nothing; shapes, dtypes and
    arguments are what is checked). At TP 4 the tiny MoE's shard has one query head, its
    two KV heads counted as one a rank, and experts a quarter as wide; at TP 2 with expert
    TP 1, whole experts."""
    from costmodel.calibration.pipeline import calibrate
    from costmodel.calibration.plan import QUICK_SETTINGS, make_plan
    from costmodel.calibration.report import format_report
    from costmodel.calibration.validate import run_validation
    from costmodel.calibration.workloads import KernelTimer
    from costmodel.model import load_cost_model

    spec = _tiny(preset)
    rank = spec.shard(tp, etp)
    timer = KernelTimer(rank, attention="sdpa", dtype="fp32", device="cpu")
    settings = dataclasses.replace(QUICK_SETTINGS, repeats=1, warmup=0, token_per_octave=2, max_packs=2,
                                   attention_per_octave=1, head_per_octave=1, probes_per_mode=2)
    plan = make_plan(rank, max_len=256, max_tokens=512, gpu="h200", settings=settings)
    model = calibrate(spec, timer=timer, plan=plan, gpu_key="cpu", gpu_info=None, attention="sdpa",
                      dtype="fp32", command="test", tensor_parallel=tp,
                      expert_tensor_parallel=etp)
    assert model.provenance["kind"] == "dry-run" and set(model.modes) == {"train", "forward"}
    assert not model.extra["flops_check"]["checked"]
    path = model.save(tmp_path / "dry.json")
    loaded = load_cost_model(path, spec=spec)
    assert loaded.tensor_parallel == tp and loaded.rank_spec == rank
    assert loaded.expert_tensor_parallel == (tp if etp is None else etp)
    block = run_validation(loaded, timer, count=6, caps=(128, 512), num_layers=2, repeats=1, warmup=0)
    assert block["count"] == 6 and set(block["modes"]) == {"train", "forward"}
    assert "CPU dry run" in format_report(loaded)
    assert set(loaded.curves["train"].linear) == ({"dense", "moe"} if spec.is_moe else {"dense"})


def _synthetic_device(monkeypatch, timer_class=None):
    """The command path on CPU: a 'NVIDIA H200' whose timer is the synthetic one (or
    ``timer_class``, a SyntheticTimer subclass)."""
    import costmodel.calibration.device as device
    import costmodel.calibration.workloads as workloads
    from costmodel.calibration.timer import SyntheticTimer

    timer_class = timer_class or SyntheticTimer
    monkeypatch.setattr(device, "require_cuda", lambda: None)
    monkeypatch.setattr(device, "settle_gpu", lambda seconds: None)
    monkeypatch.setattr(device, "device_fingerprint", lambda: {"name": "NVIDIA H200"})
    monkeypatch.setattr(workloads, "KernelTimer",
                        lambda spec, **kw: timer_class(spec, noise=0.003, timing=kw["timing"]))


def _sigterm_at(call: int):
    """A synthetic timer class that sends this process SIGTERM at its ``call``-th measurement
    (a `timeout` or a job's time limit mid-run)."""
    import os
    import signal

    from costmodel.calibration.timer import SyntheticTimer

    class Killed(SyntheticTimer):
        def measure(self, point, **kw):
            if self.calls == call:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().measure(point, **kw)

    return Killed


def _fail_first_fsync(monkeypatch, failure: BaseException) -> None:
    """The first atomic write (its fsync) raises ``failure``; later ones go through."""
    import os

    real_fsync, fsyncs = os.fsync, []

    def the_first_write_fails(fd):
        fsyncs.append(fd)
        if len(fsyncs) == 1:
            raise failure
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", the_first_write_fails)


def test_calibrate_and_validate_commands_with_a_synthetic_device(tmp_path, monkeypatch, capsys):
    """The command code path end to end, with the CUDA timer swapped for the synthetic one."""
    import costmodel.calibration.device as device
    import costmodel.calibration.workloads as workloads
    from costmodel.calibration.timer import SyntheticTimer

    monkeypatch.setattr(device, "require_cuda", lambda: None)
    monkeypatch.setattr(device, "settle_gpu", lambda seconds: None)
    monkeypatch.setattr(device, "device_fingerprint", lambda: {"name": "NVIDIA H200"})
    timer_kwargs = []
    monkeypatch.setattr(workloads, "KernelTimer",
                        lambda spec, **kw: timer_kwargs.append(kw) or SyntheticTimer(
                            spec, noise=0.003, timing=kw["timing"]))
    out = tmp_path / "cal.json"
    args = ["calibrate", "--gpu", "h200", "--model", "qwen3-0.6b", "--quick", "--max-len", "4096", "-o", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    assert "FLOPs check passed" in captured.out and "calibrate [" in captured.err
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("costmodel ") and doc["gpu"] == {"key": "h200", "name": "NVIDIA H200"}
    timers_built = len(timer_kwargs)
    assert main(["calibrate", "--gpu", "h100", "--model", "qwen3-0.6b", "--quick", "-o", str(tmp_path / "x.json")]) == 2
    assert "this machine's GPU is 'NVIDIA H200'" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    assert len(timer_kwargs) == timers_built  # refused before any timer (graph capture) was built
    monkeypatch.setattr(device, "device_fingerprint", lambda: {"name": "NVIDIA H100 80GB HBM3"})
    assert main(["validate", str(out), "--count", "20", "--layers", "2"]) == 2
    assert "calibrated on 'NVIDIA H200' but this GPU is 'NVIDIA H100 80GB HBM3'" in capsys.readouterr().err
    assert len(timer_kwargs) == timers_built
    monkeypatch.setattr(device, "device_fingerprint", lambda: {"name": "NVIDIA H200"})
    assert main(["validate", str(out), "--count", "20", "--layers", "2"]) == 0
    text = capsys.readouterr().out
    assert "cost_model" in text and "stored the validation" in text
    val = json.loads(out.read_text())["validation"]
    assert val["modes"]["train"]["summary"]["all"]["cost_model"]["mape"] < 0.03
    # validate times micro-batches the way the calibration timed its points
    assert doc["kernels"]["timing"] == "graph" and val["timing"] == "graph"
    assert timer_kwargs[0]["timing"] == timer_kwargs[-1]["timing"] == "graph"
    # The fingerprint read for the GPU check is handed on, not read again (nvidia-smi).
    assert all(kw["fingerprint"] == {"name": "NVIDIA H200"} for kw in timer_kwargs)
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "validation: 20 random micro-batches" in text
    assert "timing: CUDA-graph replays" in text
    # Where a workload cannot be captured, validation can time plain calls instead.
    assert main(["validate", str(out), "--count", "8", "--layers", "1", "--timing", "eager"]) == 0
    assert timer_kwargs[-1]["timing"] == "eager"
    assert json.loads(out.read_text())["validation"]["timing"] == "eager"


def test_sigterm_during_calibrate_saves_a_partial_file_that_refits(tmp_path, monkeypatch, capsys):
    """A `timeout` (SIGTERM/SIGINT) mid-sweep: exit 130, the measurements so far in
    OUT.partial.json, and `calibrate --refit` turns them into a cost model."""
    import signal

    from costmodel.calibration.plan import make_plan
    from costmodel.spec import ModelSpec

    plan = make_plan(ModelSpec.from_preset("qwen3-0.6b"), quick=True, max_len=4096, gpu="h200")
    stop_at = plan.essential + 5  # the coarse grid of both modes is measured

    _synthetic_device(monkeypatch, _sigterm_at(stop_at))
    out = tmp_path / "cal.json"
    args = ["calibrate", "--gpu", "h200", "--model", "qwen3-0.6b", "--quick", "--max-len", "4096", "-o", str(out)]
    assert main(args) == 130
    assert not out.exists()
    partial = tmp_path / "cal.partial.json"
    doc = json.loads(partial.read_text())
    assert doc["error"] == "KeyboardInterrupt: signal SIGTERM"
    assert len(doc["measurements"]) == stop_at - 1  # the first call was the drift probe
    assert f"--refit {partial}" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    assert main(["calibrate", "--refit", str(partial), "-o", str(out)]) == 0
    assert "refitted from" in capsys.readouterr().out
    assert json.loads(out.read_text())["provenance"]["refit"]["partial_error"].startswith("KeyboardInterrupt")


@pytest.fixture(scope="module")
def small_calibrated(tmp_path_factory):
    """`calibrate --quick` of qwen3-0.6b up to 4k tokens on the synthetic device, once."""
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    with pytest.MonkeyPatch.context() as monkeypatch:
        _synthetic_device(monkeypatch)
        assert main(["calibrate", "--gpu", "h200", "--model", "qwen3-0.6b", "--quick",
                     "--max-len", "4096", "-o", str(path)]) == 0
    return path


@pytest.mark.parametrize("stop_at", [13, 5])
def test_sigterm_during_validate_reports_and_stores_what_was_measured(
        small_calibrated, tmp_path, monkeypatch, capsys, stop_at):
    """`timeout` mid-validation: the micro-batches measured in every mode (6 of 20, the 7th
    half done) are reported and stored, marked interrupted, and the exit is 130; before 4
    are measured nothing is stored (too few to judge) and the file is as it was."""
    import shutil
    import signal


    _synthetic_device(monkeypatch, _sigterm_at(stop_at))
    path = tmp_path / "cal.json"
    shutil.copy(small_calibrated, path)
    before = path.read_bytes()
    assert main(["validate", str(path), "--count", "20", "--layers", "1"]) == 130
    captured = capsys.readouterr()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    if stop_at < 8:  # two modes: 4 micro-batches take 8 measurements
        assert path.read_bytes() == before and "stored" not in captured.out
        return
    block = json.loads(path.read_text())["validation"]
    assert block["interrupted"] == "signal SIGTERM" and block["count"] == 6
    assert block["requested_count"] == 20 and not block["stopped_at_time_limit"]
    for mode in ("train", "forward"):
        assert len(block["modes"][mode]["points"]) == 6
    assert "interrupted (signal SIGTERM), 20 requested" in captured.out
    assert "stored the validation" in captured.out
    assert main(["report", str(path)]) == 0
    assert "validation: 6 random micro-batches" in capsys.readouterr().out


@pytest.mark.parametrize("failure, rc", [(KeyboardInterrupt(), 130),
                                         (OSError(28, "No space left on device"), 2),
                                         (ValueError("Out of range float values"), 2)])
def test_a_failed_write_of_the_validation_keeps_it_beside_the_file(
        small_calibrated, tmp_path, monkeypatch, capsys, failure, rc):
    """Ctrl-C or a full disk while validate stores its result: the cost model file is as it
    was (never half-written) and the result, every point, is in PATH-stem.validation.json."""
    import shutil

    _synthetic_device(monkeypatch)
    path = tmp_path / "cal.json"
    shutil.copy(small_calibrated, path)
    before = path.read_bytes()
    _fail_first_fsync(monkeypatch, failure)
    assert main(["validate", str(path), "--count", "8", "--layers", "1"]) == rc
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.json", "cal.validation.json"]
    aside = json.loads((tmp_path / "cal.validation.json").read_text())
    assert aside["count"] == 8 and len(aside["modes"]["train"]["points"]) == 8
    assert "saved it to" in capsys.readouterr().err


def test_a_disk_that_refuses_the_validation_twice_reports_the_first_error(
        small_calibrated, tmp_path, monkeypatch, capsys):
    """Neither the file nor the file beside it can be written: the error is the first one
    (the disk's), no claim of a saved copy, and nothing half-written."""
    import os
    import shutil

    _synthetic_device(monkeypatch)
    path = tmp_path / "cal.json"
    shutil.copy(small_calibrated, path)
    before = path.read_bytes()

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    assert main(["validate", str(path), "--count", "8", "--layers", "1"]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "saved it to" not in err
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.json"]


@pytest.mark.parametrize("failure, rc", [(KeyboardInterrupt(), 130),
                                         (OSError(28, "No space left on device"), 2)])
def test_a_failed_write_of_the_fitted_model_keeps_the_measurements(tmp_path, monkeypatch, capsys,
                                                                  failure, rc):
    """Ctrl-C or a full disk while the finished model is written: nothing half-written, and
    the sweep's points in OUT.partial.json (they were lost once the sweep had returned)."""
    _synthetic_device(monkeypatch)
    _fail_first_fsync(monkeypatch, failure)
    out = tmp_path / "cal.json"
    args = ["calibrate", "--gpu", "h200", "--model", "qwen3-0.6b", "--quick", "--max-len", "4096", "-o", str(out)]
    assert main(args) == rc
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.partial.json"]
    partial = tmp_path / "cal.partial.json"
    doc = json.loads(partial.read_text())
    assert doc["error"].startswith(type(failure).__name__) and len(doc["measurements"]) > 100
    assert f"--refit {partial}" in capsys.readouterr().err
    assert main(["calibrate", "--refit", str(partial), "-o", str(out)]) == 0
    assert "refitted from" in capsys.readouterr().out


@pytest.mark.parametrize("change, message", [
    ({"ms": -3.36}, "ms=-3.36"), ({"ms": 1e300}, "below 1e+07 ms"),
    ({"n": 0}, "n must be a whole number"), ({"moe": "false"}, "moe must be true or false"),
    ({"n": 10**9}, "n must be a whole number in 1..1,048,576"),
    ({"kind": "attn"}, "unknown kind 'attn'"),
    ({"ms": "1.0"}, "ms must be a number, got '1.0'"), ({"spread": True}, "spread must be a number"),
])
def test_refit_refuses_impossible_measurements(tmp_path, capsys, change, message):
    """`calibrate --refit` on a file with an impossible point names it instead of fitting it
    (negative times once fitted to 1e-5 ms everywhere and passed the FLOPs check)."""
    doc = json.loads(Path("costmodel/profiles/h200/qwen3-8b.json").read_text())
    first = next(i for i, m in enumerate(doc["measurements"]) if m["kind"] == "attention")
    doc["measurements"][first].update(change)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    out = tmp_path / "out.json"
    assert main(["calibrate", "--refit", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"measurement {first} is invalid" in err and message in err, err
    assert not out.exists()


def test_refit_names_a_missing_gpu_key_and_warns_of_one_outside_the_registry(tmp_path, capsys, caplog):
    """Regression: a null key was written back as "None"; an unknown one skipped the FLOPs
    check without a word."""
    doc = json.loads(Path("costmodel/profiles/h200/qwen3-8b.json").read_text())
    bad, out = tmp_path / "bad.json", tmp_path / "out.json"
    doc["gpu"]["key"] = None
    bad.write_text(json.dumps(doc))
    assert main(["calibrate", "--refit", str(bad), "-o", str(out)]) == 2
    assert "gpu.key must be a registry key such as 'h200', got None" in capsys.readouterr().err
    doc["gpu"]["key"] = "tpu"
    bad.write_text(json.dumps(doc))
    assert main(["calibrate", "--refit", str(bad), "-o", str(out)]) == 0
    assert "GPU key 'tpu' is not in the registry: no peak FLOP/s" in caplog.text


def test_refit_with_a_model_says_refit_keeps_the_measured_model(tmp_path, capsys):
    argv = ["calibrate", "--refit", "costmodel/profiles/h200/qwen3-8b.json", "--model",
            "llama-3.1-8b", "-o", str(tmp_path / "o.json")]
    assert main(argv) == 2
    assert "drop --model" in capsys.readouterr().err


def test_refit_takes_a_shipped_profile_by_name(tmp_path, capsys):
    """report and validate take h200/qwen3-8b; --refit said 'no such file' (an audit)."""
    out = tmp_path / "o.json"
    assert main(["calibrate", "--refit", "h200/qwen3-8b", "-o", str(out)]) == 0
    assert "profiles/h200/qwen3-8b.json" in capsys.readouterr().out and out.is_file()
    assert main(["calibrate", "--refit", "h200/qwen3-9b", "-o", str(out)]) == 2
    assert "or a shipped profile's name such as h200/qwen3-8b" in capsys.readouterr().err


def test_an_empty_refit_says_it_is_empty(tmp_path, capsys):
    """`--refit ''` said "--model is required ... unless --refit" (an empty flag read as
    unset), then, with --model, calibrated as if no --refit had been given."""
    out = tmp_path / "o.json"
    for source in ("", " "):
        assert main(["calibrate", "--refit", source, "-o", str(out)]) == 2
        assert "--refit is empty: give a calibrated" in capsys.readouterr().err
    assert not out.exists()


def test_refit_refuses_measuring_flags_and_other_schemas(tmp_path, capsys):
    """A calibration walkthrough: --gpu/--max-len/--quick were silently ignored by --refit,
    and a file of an unknown schema was refitted into a costmodel/1 file."""
    src, out = "costmodel/profiles/h200/qwen3-8b.json", tmp_path / "o.json"
    assert main(["calibrate", "--refit", src, "--gpu", "h100", "--max-len", "10", "--quick",
                 "-o", str(out)]) == 2
    assert "--gpu, --max-len, --quick would be ignored" in capsys.readouterr().err
    doc = json.loads(Path(src).read_text())
    doc["schema"] = "costmodel/99"
    future = tmp_path / "future.json"
    future.write_text(json.dumps(doc))
    assert main(["calibrate", "--refit", str(future), "-o", str(out)]) == 2
    assert "unsupported schema 'costmodel/99'" in capsys.readouterr().err
    assert not out.exists()


def test_refit_without_layer_probes_says_where_the_overhead_comes_from(tmp_path, caplog):
    doc = json.loads(Path("costmodel/profiles/h200/qwen3-8b.json").read_text())
    doc["measurements"] = [m for m in doc["measurements"] if m["kind"] != "layer"]
    src = tmp_path / "no-probes.json"
    src.write_text(json.dumps(doc))
    assert main(["calibrate", "--refit", str(src), "-o", str(tmp_path / "o.json")]) == 0
    assert "no whole-layer probes" in caplog.text


def test_report_says_a_file_was_refitted_and_which_modes_it_lost(tmp_path, capsys):
    doc = json.loads(Path("costmodel/profiles/h200/qwen3-8b.json").read_text())
    doc["measurements"] = [m for m in doc["measurements"] if m["mode"] != "forward"]
    src, out = tmp_path / "train-only.json", tmp_path / "o.json"
    src.write_text(json.dumps(doc))
    assert main(["calibrate", "--refit", str(src), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"refit: from {src}" in text and "dropped mode: forward" in text


# -- from a mutation check: each test fails when the code it names is broken ---------------


def test_validate_count_is_checked_before_the_gpu(capsys):
    """--count 2 is refused with its own message, not after CUDA starts."""
    assert main(["validate", "h200/qwen3-8b", "--no-save", "--count", "2"]) == 2
    err = capsys.readouterr().err
    assert "--count must be 4..10,000" in err and "CUDA" not in err


def test_gpu_auto_in_any_case():
    """--gpu AUTO / ' auto' as calibrate's own plan check reads it."""
    from costmodel.calibration.device import resolve_gpu

    h200 = {"name": "NVIDIA H200"}
    assert resolve_gpu("AUTO", h200)[0] == "h200" and resolve_gpu(" auto", h200)[0] == "h200"


def _no_gpu_past_here(monkeypatch):
    """require_cuda fails with a marker: a command that gets that far has passed every check
    made before the GPU (on a GPU machine too, where it would otherwise start measuring)."""
    import costmodel.calibration.device as device

    def stop():
        raise RuntimeError("reached the GPU")

    monkeypatch.setattr(device, "require_cuda", stop)


PROFILE = "costmodel/profiles/h200/qwen3-8b.json"


@pytest.mark.parametrize("flags, says", [
    (["--count", "3"], "--count must be 4..10,000 micro-batches per mode, got 3"),
    # 10^11 were drawn after CUDA started (an audit's finding)
    (["--count", "100000000000"], "--count must be 4..10,000 micro-batches per mode"),
    (["--layers", "0"], "--layers must be between 1 and the model's 36, got 0"),
    (["--layers", "37"], "--layers must be between 1 and the model's 36, got 37"),
    (["--time-limit-s", "0"], "--time-limit-s must be > 0 seconds, got 0.0"),
    (["--caps", "32,4096"], "reached the GPU"),  # one cap >= 64 is enough
    (["--caps", "32,48"], "at least one cap >= 64 tokens"),
    # Out of the GPU's memory, once the clocks had settled (an audit's finding):
    (["--caps", "4096,99999999999"], "measured micro-batches of up to 32,768 tokens"),
    (["--caps", "32768"], "reached the GPU"),
])
def test_validate_flags_are_checked_before_the_gpu(flags, says, capsys, monkeypatch):
    _no_gpu_past_here(monkeypatch)
    assert main(["validate", PROFILE, "--no-save", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_validate_defaults_fit_a_small_sweep_and_a_model_of_few_layers(tmp_path, monkeypatch,
                                                                      capsys):
    """`costmodel validate FILE`, as calibrate's last line says to run it: the default caps
    are those within the file's --max-tokens, and the default stack at most the model's
    layers, whose stored validation `correct` can then read back."""
    import costmodel.calibration.device as device
    import costmodel.calibration.workloads as workloads
    from costmodel.calibration.timer import SyntheticTimer

    monkeypatch.setattr(device, "require_cuda", lambda: None)
    monkeypatch.setattr(device, "settle_gpu", lambda seconds: None)
    monkeypatch.setattr(device, "device_fingerprint", lambda: {"name": "NVIDIA H200"})
    monkeypatch.setattr(workloads, "KernelTimer", lambda spec, **kw: SyntheticTimer(
        spec, noise=0.003, timing=kw["timing"]))
    spec = ModelSpec.from_preset("qwen3-0.6b")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 2,
        "hidden_size": spec.hidden_size, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size, "vocab_size": spec.vocab_size,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"}))
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--gpu", "h200", "--model", str(config), "--quick", "--max-len",
                 "2048", "--max-tokens", "4096", "-o", str(out)]) == 0
    assert main(["validate", str(out), "--count", "12"]) == 0, capsys.readouterr().err
    block = json.loads(out.read_text())["validation"]
    assert block["caps"] == [768, 2048, 4096] and block["num_layers"] == 2
    assert main(["correct", str(out), "-o", str(tmp_path / "corrected.json")]) in (0, 1)
    assert "cannot be read back" not in capsys.readouterr().err
    # asked for, a cap past the sweep or a stack past the model is still refused
    assert main(["validate", str(out), "--count", "8", "--caps", "8192"]) == 2
    assert "--caps 8192: " in capsys.readouterr().err
    assert main(["validate", str(out), "--count", "8", "--layers", "4"]) == 2
    assert "--layers must be between 1 and the model's 2, got 4" in capsys.readouterr().err


def test_validate_refuses_a_mode_the_file_lacks_and_a_file_it_cannot_store_into(
        tmp_path, capsys, monkeypatch):
    """--modes forward of a train-only file, and (without --no-save) a file in a folder that
    takes no writes, are refused before the GPU, not after minutes of measuring."""
    import os
    import shutil

    doc = json.loads(Path(PROFILE).read_text())
    doc["measurements"] = [m for m in doc["measurements"] if m["mode"] != "forward"]
    src, train_only = tmp_path / "src.json", tmp_path / "train-only.json"
    src.write_text(json.dumps(doc))
    assert main(["calibrate", "--refit", str(src), "-o", str(train_only)]) == 0
    capsys.readouterr()
    _no_gpu_past_here(monkeypatch)
    assert main(["validate", str(train_only), "--no-save", "--modes", "forward"]) == 2
    assert "--modes forward: " in capsys.readouterr().err
    assert main(["validate", str(train_only), "--no-save", "--modes", "train"]) == 2
    assert "reached the GPU" in capsys.readouterr().err
    copy = tmp_path / "copy.json"
    shutil.copy(PROFILE, copy)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: mode != os.W_OK and real_access(p, mode, **kw))
    assert main(["validate", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "no permission to write in" in err and "reached the GPU" not in err, err


def test_calibrate_gpu_auto_in_any_case_and_output_checked_before_the_gpu(tmp_path, capsys, monkeypatch):
    """--gpu AUTO passes calibrate's own check (as resolve_gpu reads it), and an -o that
    cannot be written fails before the GPU starts."""
    _no_gpu_past_here(monkeypatch)
    assert main(["calibrate", "--gpu", "AUTO", "--model", "qwen3-8b", "-o", str(tmp_path / "x.json")]) == 2
    assert "reached the GPU" in capsys.readouterr().err
    assert main(["calibrate", "--gpu", "h200", "--model", "qwen3-8b", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and "reached the GPU" not in err, err


def test_parse_modes_refuses_none_and_keeps_each_once():
    from costmodel.commands.calibrate import parse_modes

    assert parse_modes(" train, forward,train ") == ("train", "forward")
    for text in (",", " ", ""):
        with pytest.raises(ValueError, match="use a comma-separated subset of train, forward"):
            parse_modes(text)


def test_refit_refuses_max_tokens_and_judges_the_stored_validation_again(tmp_path, capsys):
    """--max-tokens shapes a sweep, so --refit refuses it like --max-len; a refit of a file
    with a validation prints that validation judged by the new curves."""
    out = tmp_path / "o.json"
    assert main(["calibrate", "--refit", PROFILE, "--max-tokens", "4096", "-o", str(out)]) == 2
    assert "--max-tokens would be ignored" in capsys.readouterr().err
    assert main(["calibrate", "--refit", PROFILE, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "the stored validation's measured times, judged by the refitted curves:" in text
    assert "cost_model" in text.split("judged by the refitted curves:")[1]


def test_calibrate_dtype_reaches_the_timer_and_the_file(tmp_path, monkeypatch, capsys):
    """--dtype fp16 times and records an fp16 model, not the preset's bf16."""
    import costmodel.calibration.workloads as workloads
    from costmodel.calibration.timer import SyntheticTimer

    _synthetic_device(monkeypatch)
    specs = []
    monkeypatch.setattr(workloads, "KernelTimer", lambda spec, **kw: specs.append(spec) or SyntheticTimer(
        spec, noise=0.003, timing=kw["timing"]))
    out = tmp_path / "fp16.json"
    assert main(["calibrate", "--gpu", "h200", "--model", "qwen3-0.6b", "--quick", "--max-len", "4096",
                 "--modes", "train", "--dtype", "fp16", "-o", str(out)]) == 0, capsys.readouterr().err
    assert [s.dtype for s in specs] == ["fp16"]
    from costmodel.model import load_cost_model

    assert load_cost_model(out).spec.dtype == "fp16"


def test_report_spec_must_match_unless_allowed(capsys):
    """--spec names the shape the file must be for; --allow-other-shape lets another pass."""
    assert main(["report", "h200/qwen3-8b", "--spec", "qwen3-4b"]) == 2
    assert "made for model 'qwen3-8b'" in capsys.readouterr().err
    assert main(["report", "h200/qwen3-8b", "--spec", "qwen3-4b", "--allow-other-shape"]) == 0
    assert main(["report", "h200/qwen3-8b", "--spec", "qwen3-8b"]) == 0


@pytest.mark.parametrize("name, magic", [("plot.PDF", b"%PDF"), ("plot.svg", b"<svg"), ("plot", b"\x89PNG")])
def test_report_plot_is_written_in_the_format_its_suffix_names(name, magic, tmp_path, capsys):
    """.pdf in any case is a PDF, .svg an SVG, no suffix a PNG."""
    assert main(["report", "h200/qwen3-8b", "--png", str(tmp_path / name)]) == 0
    assert magic in (tmp_path / name).read_bytes()[:400]


def test_report_table_overhead_and_extrapolation(capsys):
    """The per-micro-batch overhead is layers x per-layer overhead + the micro-batch's own;
    attention rows up to the longest knot are measured, beyond it extrapolated; an
    estimate says where it comes from."""
    from costmodel.model import load_cost_model

    m = load_cost_model("h200/qwen3-8b")
    assert main(["report", "h200/qwen3-8b"]) == 0
    out = capsys.readouterr().out
    c = m.curves["train"]
    shown = float(re.search(r"\[train\] overhead ([\d.]+) ms per micro-batch", out).group(1))
    assert shown == pytest.approx(m.spec.num_layers * c.layer_overhead_ms + c.microbatch_overhead_ms, abs=1e-3)
    train = out.split("[train]")[1].split("[forward]")[0]
    assert int(c.attention.lengths[-1]) == 32768
    assert "(extrapolated)" not in re.search(r"^\s+32768 .*$", train, re.M).group(0)
    assert "(extrapolated)" in re.search(r"^\s+65536 .*$", train, re.M).group(0)
    assert main(["report", "h100/qwen3-8b"]) == 0
    assert "from registry peak rates times assumed efficiency" in capsys.readouterr().out


def test_report_plot_draws_measured_points_fitted_curves_flops_lines_and_efficiency(
        tmp_path, monkeypatch):
    """What the plot promises, read off the figure: the FLOPs-proportional lines go through
    the fitted curves at the longest knot; the efficiency curve is pass factor x FLOPs /
    time / peak; the measured points of a pass are that pass's well-formed ones."""
    import matplotlib.figure
    import numpy as np

    from costmodel import flops
    from costmodel.calibration.report import plot_report
    from costmodel.gpus import lookup_gpu
    from costmodel.model import CostModel, load_cost_model

    doc = json.loads(Path(PROFILE).read_text())
    good = [m for m in doc["measurements"] if m["kind"] == "linear" and m["mode"] == "train"
            and not m.get("moe")]
    doc["measurements"] += [{"kind": "linear", "mode": "train", "tokens": "4096", "ms": 1.0},
                            {"kind": "linear", "mode": "train", "tokens": 4096}]
    path = tmp_path / "extra.json"
    path.write_text(json.dumps(doc))
    m = load_cost_model(path)
    assert isinstance(m, CostModel) and good
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda self, fname, **kw: figures.append(self) or Path(fname).write_bytes(b"x"))
    plot_report(m, str(tmp_path / "p.png"))
    ax_a, ax_l, ax_e, _ = figures[0].axes

    def line(ax, label):
        (found,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
        return np.asarray(found.get_xdata(), float), np.asarray(found.get_ydata(), float)

    c, spec = m.curves["train"], m.spec
    ref = int(c.attention.lengths[-1])
    x, y = line(ax_a, "train: FLOPs-proportional")
    scale = y / flops.attention_core_flops(x.astype(np.int64), spec)
    assert scale * float(flops.attention_core_flops([ref], spec)[0]) == pytest.approx(
        float(c.attention(np.array([ref]))[0]), rel=1e-9)
    curve = c.linear["dense"]
    x, y = line(ax_l, "train: FLOPs-proportional")
    top = int(curve.tokens[-1])
    assert y / flops.layer_linear_flops(x.astype(np.int64), spec, moe=False) * float(
        flops.layer_linear_flops(top, spec, moe=False)) == pytest.approx(float(curve(top)), rel=1e-9)
    x, y = line(ax_l, "train: measured")
    assert len(x) == len(good)
    peak = lookup_gpu("h200").peak_bf16_flops
    x, y = line(ax_e, "train: attention vs L")
    L = x.astype(np.int64)
    assert y == pytest.approx(3 * flops.attention_core_flops(L, spec) / (c.attention(L) * 1e-3) / peak, rel=1e-9)
    assert ax_e.get_ylabel() == f"fraction of peak bf16 ({peak / 1e12:.0f} TFLOP/s)"


# -- from a second mutation check (calibration/device.py) ----------------------------------


def test_a_registered_name_plus_words_is_that_gpu_with_a_warning(caplog):
    """'NVIDIA H200 144GB' (a memory-size suffix) is the H200 for --gpu auto and --gpu h200,
    and the log says it was taken as such."""
    import logging

    found = {"name": "NVIDIA H200 144GB"}
    with caplog.at_level(logging.WARNING, logger="costmodel.calibration.device"):
        assert resolve_gpu("auto", found)[0] == "h200"
    assert "'NVIDIA H200 144GB' is not in the registry by its exact name; taking it as h200" in caplog.text
    assert resolve_gpu("h200", found)[0] == "h200"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="costmodel.calibration.device"):
        resolve_gpu("auto", H200)
    assert not caplog.records  # an exact name: nothing to say


def test_nvidia_smi_values_it_cannot_read_are_left_out(monkeypatch):
    """nvidia-smi prints '[N/A]' for a field a GPU does not report: that field is None (the
    fingerprint drops it), the others are read; output of another shape gives nothing,
    not numbers from the wrong columns."""
    import subprocess
    import types

    import costmodel.calibration.device as device

    out = {"text": "550.54.15, 1980, 2619, 1755, [N/A]\n"}
    monkeypatch.setattr(device.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(device.subprocess, "run",
                        lambda *a, **k: types.SimpleNamespace(stdout=out["text"]))
    assert device._nvidia_smi(0) == {"driver": "550.54.15", "max_sm_clock_mhz": 1980.0,
                                     "max_mem_clock_mhz": 2619.0, "sm_clock_mhz": 1755.0,
                                     "power_limit_w": None}
    out["text"] = "550.54.15, 1980, 2619, 1755, 700.00\n550.54.15, 1980, 2619, 1755, 700.00\n"
    assert device._nvidia_smi(0) == {}  # two GPUs' lines
    monkeypatch.setattr(device.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(
        subprocess.CalledProcessError(9, "nvidia-smi")))
    assert device._nvidia_smi(0) == {}


def test_settling_for_no_time_needs_no_gpu():
    """`--settle-s 0` turns settling off: it returns at once, on a machine with no GPU too."""
    from costmodel.calibration.device import settle_gpu

    assert settle_gpu(0) is None and settle_gpu(-1.0) is None


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_the_gpu_in_use_is_the_current_device_not_the_first(monkeypatch):
    """A process on its local rank's GPU (torch.cuda.set_device(3)) names that GPU."""
    from costmodel.calibration.device import current_gpu_name

    names = ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: names[index])
    assert current_gpu_name() == "NVIDIA H200"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert current_gpu_name() is None


def test_calibrate_one_tensor_parallel_rank(tmp_path, monkeypatch, capsys):
    """--tensor-parallel 2 times one rank's shard (half the heads and MLP width) and the file
    says so: validate and a refit time and fit that shard again, report names it."""
    import costmodel.calibration.device as device
    import costmodel.calibration.workloads as workloads
    from costmodel.calibration.timer import SyntheticTimer
    from costmodel.model import load_cost_model

    monkeypatch.setattr(device, "require_cuda", lambda: None)
    monkeypatch.setattr(device, "settle_gpu", lambda seconds: None)
    monkeypatch.setattr(device, "device_fingerprint", lambda: {"name": "NVIDIA H200"})
    timed = []
    monkeypatch.setattr(workloads, "KernelTimer", lambda spec, **kw: timed.append(spec) or
                        SyntheticTimer(spec, noise=0.003, timing=kw["timing"]))
    out = tmp_path / "tp2.json"
    base = ["calibrate", "--gpu", "h200", "--model", "qwen3-0.6b", "--quick", "--max-len", "4096"]
    assert main([*base, "--tensor-parallel", "3", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "num_heads=16, num_kv_heads=8 do not split evenly over TP 3" in err
    assert "split it: 1, 2, 4, 8, 16" in err and not timed and not out.exists()
    assert main([*base, "--tensor-parallel", "2", "-o", str(out)]) == 0, capsys.readouterr().err
    assert "FLOPs check passed" in capsys.readouterr().out
    assert (timed[0].num_heads, timed[0].num_kv_heads, timed[0].intermediate_size) == (8, 4, 1536)
    doc = json.loads(out.read_text())
    assert doc["tensor_parallel"] == 2 and doc["spec"]["num_heads"] == 16  # the model's shape
    model = load_cost_model(out, spec="qwen3-0.6b")
    assert model.tensor_parallel == 2 and model.rank_spec == timed[0]
    assert model.label == "qwen3-0.6b at TP 2 on NVIDIA H200 (synthetic)"
    assert main(["validate", str(out), "--count", "8", "--layers", "1"]) == 0
    assert timed[-1] == timed[0]  # validation times the same shard
    assert json.loads(out.read_text())["validation"]["modes"]["train"]["summary"]["all"][
        "cost_model"]["mape"] < 0.03
    assert main(["report", str(out)]) == 0
    report = capsys.readouterr().out
    assert "qwen3-0.6b at TP 2 (one rank's shard) on NVIDIA H200" in report
    assert "model: qwen3-0.6b (shape " + ModelSpec.from_preset("qwen3-0.6b").fingerprint() in report
    assert "timed per GPU: qwen3-0.6b (TP 2 rank): 8 query / 4 KV heads, MLP 1536," in report
    refitted = tmp_path / "refit.json"
    assert main(["calibrate", "--refit", str(out), "-o", str(refitted)]) == 0
    assert json.loads(refitted.read_text())["tensor_parallel"] == 2
    assert main(["calibrate", "--refit", str(out), "--tensor-parallel", "4", "-o", str(refitted)]) == 2
    assert "--tensor-parallel would be ignored" in capsys.readouterr().err


def test_a_cut_down_sku_is_not_calibrated_as_its_full_gpu():
    """An RTX 4090 D (114 SMs) is not the RTX 4090 (128): --gpu rtx4090 there is refused
    naming what was found, and --gpu auto takes it as a GPU outside the registry (no peak
    of another GPU to check against)."""
    found = {"name": "NVIDIA GeForce RTX 4090 D"}
    with pytest.raises(ValueError, match=r"'NVIDIA GeForce RTX 4090 D' \(not in the registry\)"):
        resolve_gpu("rtx4090", found)
    key, info = resolve_gpu("auto", found)
    assert key == "geforce-rtx-4090-d" and info is None
    assert resolve_gpu("rtx4090", {"name": "NVIDIA GeForce RTX 4090 48G DDR5"})[0] == "rtx4090"


def test_an_unregistered_gpu_never_gets_a_registry_key():
    """'NVIDIA H100' (a name some H100s report, which the registry cannot place as SXM or
    PCIe) is outside the registry: --gpu auto must not key it 'h100', which `refit`,
    `report`, `correct` and the profiles folder read as the H100 SXM and its peak."""
    from costmodel.gpus import GPUS

    for name in ("NVIDIA H100", "NVIDIA A800", "h200", "NVIDIA GeForce RTX 4090 D"):
        key, info = resolve_gpu("auto", {"name": name})
        assert info is None and key not in GPUS, name
    assert resolve_gpu("auto", {"name": "NVIDIA H100"})[0] == "h100-unregistered"
