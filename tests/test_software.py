"""Software drift: a cost model timed under other torch / CUDA / kernel versions than this
process runs is flagged (a warning, never an error) where it is used and validated."""

from __future__ import annotations

import argparse
import json
import logging

import pytest
from test_integrations_slime import make_args

from costmodel.calibration import software
from costmodel.calibration.software import software_drift
from costmodel.integrations import args as cm_args

TIMED = {"torch": "2.11.0+cu130", "cuda": "13.0", "triton": "3.6.0", "flash_attn": "2.7.4"}


def test_a_patch_release_is_not_drift_and_a_minor_one_is():
    same = {"torch": "2.11.1", "cuda": "13.0", "triton": "3.6.1", "flash_attn": "2.7.4.post1"}
    assert software_drift(TIMED, same, "torch-varlen") == []
    newer = {"torch": "2.13.0+cu128", "cuda": "12.8", "triton": "3.9.0", "flash_attn": "2.8.0"}
    assert software_drift(TIMED, newer, "torch-varlen") == ["torch 2.11 -> 2.13", "CUDA 13.0 -> 12.8"]


@pytest.mark.parametrize("attention, flagged", [
    ("triton", ["triton 3.6 -> 3.9"]),
    ("flash-attn", ["flash-attn 2.7 -> 2.8"]),
    ("sdpa", []),
])
def test_kernel_libraries_count_only_for_the_attention_they_ran(attention, flagged):
    running = dict(TIMED, triton="3.9.0", flash_attn="2.8.0")
    assert software_drift(TIMED, running, attention) == flagged


@pytest.mark.parametrize("recorded, running", [
    (None, TIMED),                                   # an estimate: no device block
    ({"name": "NVIDIA H200"}, TIMED),                # a file that recorded no versions
    (TIMED, {"torch": None, "cuda": None}),          # a CPU-only process
    ({"torch": "nightly", "cuda": "13.0"}, dict(TIMED, torch="2.13.0")),  # unreadable
])
def test_what_either_side_lacks_is_not_compared(recorded, running):
    assert software_drift(recorded, running, "triton") == []


def test_running_software_reads_this_process():
    found = software.running_software()
    torch = pytest.importorskip("torch")
    assert found["torch"] == torch.__version__
    assert found["cuda"] == torch.version.cuda  # None on the CPU build CI runs


def test_triton_is_found_under_a_nightly_torchs_distribution_name(monkeypatch):
    """torch's nightlies install triton as the distribution ``pytorch-triton`` (no
    ``triton`` distribution at all): its version is still this process's triton's, which
    `device_fingerprint` records as ``triton.__version__``."""
    import importlib.metadata as md
    import sys
    from types import SimpleNamespace

    installed = {"pytorch-triton": "3.7.0+git1234abcd", "flash-attn": "2.8.3"}

    def version(name):
        name = name.replace("_", "-").lower()
        if name not in installed:
            raise md.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(md, "version", version)
    monkeypatch.setattr(md, "packages_distributions",
                        lambda: {"triton": ["pytorch-triton"], "flash_attn": ["flash_attn"]})
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    found = software._running_software.__wrapped__()  # not the process's cached answer
    assert found["triton"] == "3.7.0+git1234abcd"
    assert found["flash_attn"] == "2.8.3"
    assert software_drift(TIMED, dict(TIMED, triton=found["triton"]), "triton") == [
        "triton 3.6 -> 3.7"]
    # once imported, the module's own version (what the fingerprint reads)
    monkeypatch.setitem(sys.modules, "triton", SimpleNamespace(__version__="3.8.1"))
    assert software._running_software.__wrapped__()["triton"] == "3.8.1"


def _newer_torch(monkeypatch):
    monkeypatch.setattr(software, "running_software",
                        lambda: dict(TIMED, torch="2.13.0", cuda="12.8"))


@pytest.mark.parametrize("device", ["NVIDIA H200", None])
def test_training_flags_warn_about_a_profile_timed_under_another_torch(monkeypatch, caplog,
                                                                       device):
    """The shipped profile was timed under torch 2.11 / CUDA 13.0 (its device block). A
    process that sees no GPU is told too: it schedules for GPUs that run its software."""
    _newer_torch(monkeypatch)
    monkeypatch.setattr(cm_args, "current_gpu_name", lambda start_cuda=True: device)
    args = cm_args.add_arguments(argparse.ArgumentParser()).parse_args(
        ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192", "--balance-by-flops",
         "--cost-model", "h200/qwen3-8b"])
    with caplog.at_level(logging.WARNING, logger="costmodel.integrations.args"):
        assert cm_args.validate_args(args, spec="qwen3-8b") is not None  # loads: a warning only
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "torch 2.11 -> 2.13, CUDA 13.0 -> 12.8" in warnings[0]
    assert "`costmodel validate FILE --no-save`" in warnings[0]
    assert ("`costmodel calibrate --gpu auto --model qwen3-8b --attention torch-varlen --dtype "
            "bf16 --modes train,forward --max-len 32768 -o calibrated.json` times them again"
            ) in warnings[0]  # runnable as it is, and the sweep the file planned
    caplog.clear()
    monkeypatch.setattr(software, "running_software", lambda: dict(TIMED))
    with caplog.at_level(logging.WARNING, logger="costmodel.integrations.args"):
        cm_args.validate_args(args, spec="qwen3-8b")
    assert not caplog.records


def test_validate_notes_the_drift_before_it_measures(tmp_path, monkeypatch, capsys):
    import costmodel.calibration.device as device
    import costmodel.calibration.workloads as workloads
    from costmodel.calibration.timer import SyntheticTimer
    from costmodel.cli import main

    monkeypatch.setattr(device, "require_cuda", lambda: None)
    monkeypatch.setattr(device, "settle_gpu", lambda seconds: None)
    monkeypatch.setattr(device, "device_fingerprint", lambda: {"name": "NVIDIA H200"})
    monkeypatch.setattr(workloads, "KernelTimer",
                        lambda spec, **kw: SyntheticTimer(spec, noise=0.003, timing=kw["timing"]))
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--gpu", "h200", "--model", "qwen3-0.6b", "--quick", "--max-len",
                 "2048", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    doc["device"].update(TIMED)  # as a GPU's fingerprint records them
    out.write_text(json.dumps(doc))
    capsys.readouterr()
    _newer_torch(monkeypatch)
    assert main(["validate", str(out), "--count", "8", "--layers", "1", "--no-save"]) == 0
    assert f"note: {out} was timed under other software than this process runs (torch 2.11 " \
           "-> 2.13, CUDA 13.0 -> 12.8): this run measures whether its times moved" \
           in capsys.readouterr().err


def test_slime_drop_in_warns_once_about_another_gpu_or_torch(monkeypatch, caplog):
    """slime calls the drop-in every step: each reason is logged once per process."""
    from costmodel.integrations import slime
    from costmodel.scheduler import generate_lengths

    monkeypatch.setattr(cm_args, "_warned", set())
    args = make_args(max_tokens_per_gpu=8192, balance_data=True, cost_model="h200/qwen3-8b")
    lengths = generate_lengths(64, "rl", seed=0).tolist()

    def step():
        slime.build_dp_schedule(args, {"dp_size": 2, "cp_size": 1}, lengths,
                                global_batch_size=64, rollout_indices=list(range(64)))

    def warned():
        return [r.getMessage() for r in caplog.records if r.name == slime.logger.name]

    def on(name):
        def current_gpu_name(start_cuda):
            assert start_cuda is False  # the drop-in never starts CUDA itself
            return name
        return current_gpu_name

    monkeypatch.setattr(software, "running_software", lambda: dict(TIMED))
    monkeypatch.setattr(cm_args, "current_gpu_name", on("NVIDIA H200"))
    with caplog.at_level(logging.WARNING, logger="costmodel.integrations.slime"):
        step()
        assert warned() == []
        _newer_torch(monkeypatch)
        step()
        step()
        assert len(warned()) == 1 and "(torch 2.11 -> 2.13, CUDA 13.0 -> 12.8)" in warned()[0]
        monkeypatch.setattr(cm_args, "current_gpu_name", on("NVIDIA H100 80GB HBM3"))
        step()
        step()
    assert len(warned()) == 2
    assert "measured on NVIDIA H200 but this process runs on NVIDIA H100 80GB HBM3" in warned()[1]


def test_the_command_to_calibrate_again_keeps_the_shard_and_backend():
    from costmodel.calibration.software import calibrate_again
    from costmodel.estimate import estimate_cost_model
    from costmodel.spec import ModelSpec

    model = estimate_cost_model("qwen3-30b-a3b", "h200", tensor_parallel=2,
                                expert_tensor_parallel=1)
    model.extra["kernels"] = {"attention": "triton", "dtype": "fp16"}
    assert calibrate_again(model) == (
        "costmodel calibrate --gpu auto --model qwen3-30b-a3b --attention triton --dtype fp16 "
        "--tensor-parallel 2 --expert-tensor-parallel 1 -o calibrated.json")
    model.extra["kernels"]["timing"] = "eager"
    model.provenance["plan"] = {"modes": ["train"], "max_len": 8192, "max_tokens": 65536}
    assert calibrate_again(model).endswith(
        "--modes train --max-len 8192 --max-tokens 65536 --timing eager --tensor-parallel 2 "
        "--expert-tensor-parallel 1 -o calibrated.json")
    model.provenance["plan"]["max_tokens"] = 16384  # calibrate's default for --max-len 8192
    model.extra["kernels"]["timing"] = "graph"
    assert "--max-len 8192 --tensor-parallel" in calibrate_again(model)
    import dataclasses
    custom = dataclasses.replace(ModelSpec.from_preset("qwen3-8b"), num_layers=7)
    assert "--model <its HF config.json> --attention torch-varlen -o" in calibrate_again(
        estimate_cost_model(custom, "h200"))


def test_a_process_that_has_not_started_cuda_is_not_made_to(monkeypatch):
    """The slime drop-in runs on the rollout side too: asking for the device's name would
    create a CUDA context there (and break CUDA in the workers it forks)."""
    torch = pytest.importorskip("torch")
    from costmodel.calibration.device import current_gpu_name

    asked = []
    # is_available() counts devices through the CUDA runtime, which runs cuInit: that alone
    # breaks CUDA in forked workers, so it is not asked either.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append("cuInit") or True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: asked.append("init") or 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H200")
    assert current_gpu_name(start_cuda=False) is None and asked == []
    assert current_gpu_name() == "NVIDIA H200" and asked == ["cuInit", "init"]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert current_gpu_name(start_cuda=False) == "NVIDIA H200"


def test_verl_drop_in_warns_once_about_a_profile_timed_under_another_torch(monkeypatch, caplog):
    from costmodel.integrations import verl

    monkeypatch.setattr(cm_args, "_warned", set())
    asked = []
    monkeypatch.setattr(cm_args, "current_gpu_name", lambda start_cuda: asked.append(start_cuda))
    _newer_torch(monkeypatch)
    lengths = [300, 1200, 4000, 800, 2500, 60, 7000, 1500]
    with caplog.at_level(logging.WARNING, logger="costmodel.integrations.verl"):
        for _ in range(3):  # every step names the same file
            verl.balanced_micro_batches(lengths, 8192, cost="h200/qwen3-8b", spec="qwen3-8b")
        verl.balanced_micro_batches(lengths, 8192)  # verl's own workload: nothing to say
    warned = [r.getMessage() for r in caplog.records if r.name == verl.logger.name]
    assert len(warned) == 1
    # names the file as given: `costmodel validate FILE --no-save` takes it
    assert warned[0].startswith("cost model h200/qwen3-8b (qwen3-8b on NVIDIA H200 (measured)) "
                                "was timed under")
    assert "(torch 2.11 -> 2.13, CUDA 13.0 -> 12.8)" in warned[0]
    assert asked and not any(asked)  # never start_cuda=True: CUDA is verl's to start


def test_a_context_parallel_view_is_checked_as_its_model(monkeypatch):
    """README: for verl's Ulysses, bind ``cost=cm.for_context_parallel(sp)`` into the drop-in.
    The view's versions, kernels and shard are its model's: the same warning, and the same
    command to calibrate again (not one without its dtype, backend or TP)."""
    from costmodel.calibration.software import calibrate_again
    from costmodel.estimate import estimate_cost_model
    from costmodel.model import load_cost_model

    _newer_torch(monkeypatch)
    model = load_cost_model("h200/qwen3-8b")
    monkeypatch.setattr(cm_args, "current_gpu_name", lambda start_cuda=True: None)
    assert cm_args.gpu_mismatch(model.for_context_parallel(2), start_cuda=False) == \
        cm_args.gpu_mismatch(model, start_cuda=False) is not None
    monkeypatch.setattr(cm_args, "current_gpu_name", lambda start_cuda=True: "NVIDIA H100 80GB HBM3")
    assert "--dtype bf16" in cm_args.gpu_mismatch(model.for_context_parallel(2), start_cuda=False)
    sharded = estimate_cost_model("qwen3-30b-a3b", "h200", tensor_parallel=2,
                                  expert_tensor_parallel=1)
    sharded.extra["kernels"] = {"attention": "triton", "dtype": "fp16"}
    assert calibrate_again(sharded.for_context_parallel(4)) == calibrate_again(sharded)
