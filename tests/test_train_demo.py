"""The reference trainer: two gloo ranks on CPU, schedule agreement, validation before step 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from costmodel.cli import main  # noqa: E402
from costmodel.gpus import estimate_cost_model  # noqa: E402
from costmodel.spec import ModelSpec  # noqa: E402
from costmodel.training.trainer import check_schedule_agreement, digest_to_int  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# Small and fast: ~4k tokens a step over two ranks, a 2-layer model of width 64.
FAST = ["--samples-per-step", "32", "--length-scale", "0.03", "--lr", "1e-2"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    if Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def torchrun(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
        str(REPO / "examples" / "train_varlen.py"), *argv,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=REPO)


@pytest.fixture(scope="module")
def tiny_cost_model(tmp_path_factory) -> str:
    """A cost model (registry estimate) for the trainer's default tiny shape, in fp32."""
    import argparse

    from costmodel.training.config import add_trainer_arguments, tiny_spec

    args = add_trainer_arguments(argparse.ArgumentParser()).parse_args([])
    path = tmp_path_factory.mktemp("cm") / "tiny.json"
    estimate_cost_model(tiny_spec(args, dtype="fp32"), "h200").save(path)
    return str(path)


def test_torchrun_two_ranks_balanced_by_the_cost_model(tmp_path, tiny_cost_model):
    log = tmp_path / "steps.jsonl"
    done = torchrun(
        *FAST, "--steps", "5", "--device", "cpu", "--balance-by-flops", "--cost-model",
        tiny_cost_model, "--log-json", str(log),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(5))
    for r in records:
        assert r["schedules_agree"] and r["cost"].startswith("cost-model")
        assert len(r["compute_ms"]) == 2 and min(r["compute_ms"]) > 0
        assert r["measured_imbalance"] >= 1.0 and r["predicted_imbalance"] >= 1.0
        assert len(r["predicted_costs"]) == 2
    assert records[-1]["loss"] < records[0]["loss"] - 0.1
    assert "max/mean measured" in done.stdout and "predicted" in done.stdout
    assert "agreed by 2 ranks" in done.stdout


def test_train_demo_spawns_two_ranks(tmp_path, capfd):
    log = tmp_path / "steps.jsonl"
    assert main(["train-demo", "--nproc", "2", "--steps", "2", *FAST, "--device", "cpu",
                 "--balance-by-flops", "--log-json", str(log)]) == 0
    out = capfd.readouterr().out
    assert "balanced by flops over 2 ranks" in out and "schedules agreed" in out
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 2 and all(len(r["compute_ms"]) == 2 for r in records)


def _error(argv: list[str], capsys) -> str:
    assert main(["train-demo", "--nproc", "2", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_bad_inputs_stop_before_any_process_starts(tmp_path, capsys):
    junk = tmp_path / "lengths.txt"
    junk.write_text("120\n# a comment\n\n300\nforty\n")
    assert "line 5" in _error(["--lengths-file", str(junk)], capsys)
    assert "raise --max-tokens-per-gpu" in _error(["--max-tokens-per-gpu", "16"], capsys)
    assert "--samples-per-step" in _error(["--samples-per-step", "1"], capsys)
    short = tmp_path / "short.txt"
    short.write_text("100\n200\n")
    assert "lower --samples-per-step" in _error(["--lengths-file", str(short)], capsys)


def test_cost_model_for_another_shape_is_rejected(tmp_path, capsys):
    other = tmp_path / "qwen3.json"
    estimate_cost_model(ModelSpec.from_preset("qwen3-0.6b"), "h200").save(other)
    err = _error(["--balance-by-flops", "--cost-model", str(other)], capsys)
    assert "--cost-model-allow-other-shape" in err


def test_example_bad_input_exits_before_the_first_step(tmp_path):
    junk = tmp_path / "lengths.txt"
    junk.write_text("100\n200\nnot-a-length\n")
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_varlen.py"), "--lengths-file", str(junk),
         "--samples-per-step", "2", "--device", "cpu"],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]  # one line
    assert "line 3" in done.stderr and "train_varlen.py: error:" in done.stderr
    assert "step 1/" not in done.stdout


def test_lengths_file_drives_the_steps(tmp_path):
    import argparse

    from costmodel.training.config import add_trainer_arguments, prepare

    values = [int(x) for x in np.arange(20, 200, 9)]  # 20 lengths
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps(values))
    parser = add_trainer_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--steps", "3", "--samples-per-step", "8", "--lengths-file", str(path)])
    plan = prepare(args, 2)
    assert plan.lengths[0].tolist() == values[:8]
    assert plan.lengths[2].tolist() == values[16:] + values[:4]  # wraps around the file
    for schedule in plan.schedules:
        assert schedule.dp_size == 2
        assert sorted(i for r in schedule.microbatches for mb in r for i in mb) == list(range(8))


def test_disagreeing_schedules_stop_with_a_clear_error():
    check_schedule_agreement([digest_to_int("abc")] * 3, step=0)
    with pytest.raises(RuntimeError, match="step 4: the ranks built different schedules"):
        check_schedule_agreement([digest_to_int("abc"), digest_to_int("abd")], step=4)


def test_update_does_not_depend_on_the_partition():
    """Loss summed per micro-batch over the global token count: any split, same gradient."""
    from costmodel.training.data import sample_tokens
    from costmodel.training.model import TinyGPT, packed_batch

    spec = ModelSpec(name="t", num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1,
                     head_dim=16, intermediate_size=64, vocab_size=50, tie_word_embeddings=True,
                     dtype="fp32")
    torch.manual_seed(0)
    model = TinyGPT(spec, attention="sdpa")
    lengths = [7, 30, 12, 3, 19, 25]
    samples = [sample_tokens(0, 0, i, n, spec.vocab_size) for i, n in enumerate(lengths)]
    total = sum(n - 1 for n in lengths)

    def grads(partition):
        model.zero_grad()
        for mb in partition:
            ids, targets, cu, max_len = packed_batch([samples[i] for i in mb], device="cpu")
            logits = model(ids, cu, max_len)
            loss = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
            (loss / total).backward()
        return [p.grad.clone() for p in model.parameters()]

    whole = grads([[0, 1, 2, 3, 4, 5]])
    split = grads([[4], [1, 3], [0, 5, 2]])  # e.g. two ranks' micro-batches, all-reduced
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
