"""The reference trainer: two gloo ranks on CPU, schedule agreement, validation before step 1."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from costmodel.calibration.correct import read_runs  # noqa: E402
from costmodel.cli import main  # noqa: E402
from costmodel.estimate import estimate_cost_model  # noqa: E402
from costmodel.spec import ModelSpec  # noqa: E402
from costmodel.training.trainer import (  # noqa: E402
    check_schedule_agreement,
    digest_to_int,
    move_grads_into,
)

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


def _torchrun_script(tmp_path: Path, body: str, *argv: str) -> subprocess.CompletedProcess:
    """torchrun (2 ranks) of a wrapper around the example: ``body`` runs first on each rank."""
    script = tmp_path / "wrapped.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'examples')!r}]\n"
        "import torch\n"
        "import costmodel.training.trainer as trainer\n"
        "import train_varlen\n"
        "RANK = int(os.environ['RANK'])\n"
        f"{body}\n"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--standalone", str(script), *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=_env(), cwd=tmp_path)


@pytest.fixture(scope="module")
def tiny_cost_model(tmp_path_factory) -> str:
    """A cost model (registry estimate) for the trainer's default tiny shape, in fp32."""
    import argparse

    from costmodel.training.config import add_trainer_arguments, tiny_spec

    args = add_trainer_arguments(argparse.ArgumentParser()).parse_args([])
    path = tmp_path_factory.mktemp("cm") / "tiny.json"
    estimate_cost_model(tiny_spec(args, dtype="fp32"), "h200").save(path)
    return str(path)


def test_torchrun_two_ranks_balanced_by_the_cost_model(tmp_path, tiny_cost_model, monkeypatch):
    """The example under torchrun: loss goes down, schedules agree, the log has the figures;
    both ranks end with the same weights, and so does one process training on the same
    global batches (other micro-batches, no all-reduce): the update ignores the partition."""
    import argparse

    from costmodel.training.config import add_trainer_arguments
    from costmodel.training.trainer import train

    log = tmp_path / "steps.jsonl"
    flags = [*FAST, "--steps", "5", "--device", "cpu", "--balance-by-flops", "--cost-model",
             tiny_cost_model]
    done = _torchrun_script(
        tmp_path,
        "real = trainer.train\n"
        "def keep(args):\n"
        "    result = real(args)\n"
        "    torch.save(result.model.state_dict(), f'{RANK}.pt')\n"
        "    return result\n"
        "trainer.train = keep\n"
        "trainer.exit_rank(train_varlen.main(sys.argv[1:]))",
        *flags, "--log-json", str(log), "--record-runs", str(tmp_path / "runs.jsonl"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(5))
    # every rank's step as a run `costmodel correct --runs` reads: its time, its tokens
    runs = read_runs(tmp_path / "runs.jsonl")
    assert [r.ms for r in runs] == pytest.approx([ms for r in records for ms in r["compute_ms"]])
    for step, r in enumerate(records):
        assert sum(sum(map(sum, run.microbatches)) for run in runs[2 * step: 2 * step + 2]) == r["tokens"]
    assert not list(log.parent.glob(".costmodel-*.tmp"))  # written beside it, then renamed
    for r in records:
        assert r["schedules_agree"] and r["cost"].startswith("cost-model")
        assert len(r["compute_ms"]) == 2 and min(r["compute_ms"]) > 0
        assert r["measured_imbalance"] >= 1.0 and r["predicted_imbalance"] >= 1.0
        assert r["flops_imbalance"] >= 1.0
        assert len(r["predicted_costs"]) == 2
    assert records[-1]["loss"] < records[0]["loss"] - 0.1
    assert "max/mean measured" in done.stdout and "predicted" in done.stdout
    assert "agreed by 2 ranks" in done.stdout

    rank0, rank1 = (torch.load(tmp_path / f"{r}.pt") for r in (0, 1))
    for name, value in rank0.items():
        assert torch.equal(value, rank1[name]), name  # all-reduced: bit-identical
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    single = train(add_trainer_arguments(argparse.ArgumentParser()).parse_args(flags))
    assert single.world_size == 1
    assert [r.loss for r in single.records] == pytest.approx([r["loss"] for r in records], rel=1e-5)
    # Adam's first steps move each weight by ~lr x sign(grad): a wrong all-reduce shifts them
    # by ~1e-2; rounding of near-zero gradients, measured, by up to 3e-5.
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(value, rank0[name], rtol=1e-4, atol=1e-4, msg=name)


def test_train_demo_spawns_two_ranks(tmp_path, capfd):
    log = tmp_path / "steps.jsonl"
    assert main(["train-demo", "--nproc", "2", "--steps", "2", *FAST, "--device", "cpu",
                 "--balance-by-flops", "--log-json", str(log)]) == 0
    out = capfd.readouterr().out
    assert "balanced by flops over 2 ranks" in out and "schedules agreed" in out
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 2 and all(len(r["compute_ms"]) == 2 for r in records)
    # balanced by FLOPs: the FLOPs yardstick is the predicted figure itself
    for r in records:
        assert r["flops_imbalance"] == pytest.approx(r["predicted_imbalance"], rel=1e-9)


def test_the_ranks_meet_through_a_file_of_the_launch_not_a_port(monkeypatch):
    """A port the parent found free could be taken before rank 0 bound it (a parallel test
    run did): the workers get a file:// init method in the launch's own temporary directory,
    gone when the launch ends."""
    from costmodel.cli import build_parser
    from costmodel.training import launch
    from costmodel.training.trainer import RENDEZVOUS_ATTR

    seen = []

    def start(args, nproc, out):
        path = Path(getattr(args, RENDEZVOUS_ATTR).removeprefix("file://"))
        seen.append((path, path.parent.is_dir(), Path(out).parent))
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "_start", start)
    with pytest.raises(KeyboardInterrupt):
        launch.launch(build_parser().parse_args(["train-demo", "--steps", "1"]), 2)
    ((path, existed, out_dir),) = seen
    assert existed and path.parent == out_dir and path.is_absolute()
    assert not path.parent.exists()


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
    assert "differs in num_layers 28 vs" in err  # two fingerprints alone said nothing


def test_more_bad_inputs_found_by_a_sweep(tmp_path, capsys):
    """Each failed in the workers, or named no flag, or asked for one rerun per step."""
    err = _error(["--attention", "torch-varlen", "--steps", "1"], capsys)
    assert err.startswith("costmodel train-demo: error: --attention torch-varlen:")
    assert "CUDA" in err  # was three lines: a log line, torch's SIGTERM warning, the error
    assert "--seed must be in 0..2^63-1" in _error(["--seed", str(2**70)], capsys)
    assert "--seed must be" in _error(["--seed", "-1"], capsys)
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("100\n300\n100\n900\n")
    err = _error(["--lengths-file", str(lengths), "--samples-per-step", "2", "--steps", "2",
                  "--max-tokens-per-gpu", "50"], capsys)
    assert "2 of 2 steps (first: step 1)" in err and "at least 900" in err  # not just step 1's 300
    assert "above the 2,147,483,647" in _error(["--max-tokens-per-gpu", "99999999999"], capsys)


def test_cuda_only_attention_on_a_cpu_run_of_a_gpu_machine(monkeypatch):
    """With CUDA present the backend loads, but --device cpu workers would still fail."""
    import torch

    from costmodel.training.launch import _check_attention_runs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="runs only on CUDA.*the device is cpu; use --attention sdpa"):
        _check_attention_runs("torch-varlen", "cpu", 16)
    _check_attention_runs("sdpa", "cpu", 16)


def test_the_backend_the_workers_take_is_checked_before_they_start(monkeypatch):
    """The default backend too, and the model's head dim: each failed in every worker
    after CUDA and NCCL start-up (a torch without varlen_attn; Triton with --head-dim 16)."""
    import torch

    from costmodel.cli import build_parser
    from costmodel.kernels import attention
    from costmodel.training import launch

    class Started(Exception):
        pass

    def start(*args):
        raise Started

    checked = []
    monkeypatch.setattr(launch, "_check_attention_runs", lambda *a: checked.append(a))
    monkeypatch.setattr(launch, "_start", start)
    with pytest.raises(Started):
        launch.launch(build_parser().parse_args(["train-demo", "--steps", "1"]), 1)
    assert checked == [("sdpa", "cpu", 16)]  # no --attention: the CPU default, checked
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(attention, "get_attention", lambda name, device: None)
    with pytest.raises(ValueError, match=r"--attention triton: .*head dims \[64, 128\].* is 16"):
        launch._check_attention_runs("triton", "cuda", 16)
    launch._check_attention_runs("triton", "cuda", 128)


def test_a_failed_workers_error_names_its_exception_not_its_advice():
    from costmodel.training.launch import _worker_error

    text = """
-- Process 0 terminated with the following error:
Traceback (most recent call last):
  File "trainer.py", line 1, in train
    loss = F.cross_entropy(logits, targets)
RuntimeError: CUDA error: an illegal memory access was encountered
CUDA kernel errors might be asynchronously reported at some other API call.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""
    assert _worker_error(text) == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert _worker_error("ValueError: bad\n") == "ValueError: bad"
    assert _worker_error("just a line") == "just a line"


def test_example_bad_input_exits_before_the_first_step(tmp_path):
    junk = tmp_path / "lengths.txt"
    junk.write_text("100\n200\nnot-a-length\n")
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_varlen.py"), "--lengths-file", str(junk),
         "--samples-per-step", "2", "--device", "cpu"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**_env(), "PYTHONPATH": ""},  # the example finds costmodel from its checkout
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]  # one line
    assert "line 3" in done.stderr and "train_varlen.py: error:" in done.stderr
    assert "step 1/" not in done.stdout


def test_example_says_an_unreadable_input_in_one_line(monkeypatch, capsys):
    """Regression: a --lengths-file or --cost-model the rank may not read (PermissionError,
    an OSError but no FileNotFoundError) was a traceback on every rank under torchrun."""
    import costmodel.training.trainer as trainer

    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import train_varlen

    def unreadable(args):
        raise PermissionError(13, "Permission denied", "lengths.txt")

    monkeypatch.setattr(trainer, "train", unreadable)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert train_varlen.main(["--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "train_varlen.py: error: [Errno 13] Permission denied: 'lengths.txt'"


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


def test_trainer_flags_on_a_parser_with_its_own_cap_flag():
    """Regression: a script's own --max-tokens-per-gpu without help (reused by add_arguments)
    made add_trainer_arguments fail on None + str; a hidden one was shown by the note."""
    import argparse

    from costmodel.training.config import add_trainer_arguments

    for own_help in ({}, {"help": argparse.SUPPRESS}):
        parser = argparse.ArgumentParser()
        parser.add_argument("--max-tokens-per-gpu", type=int, **own_help)
        add_trainer_arguments(parser)
        assert parser.parse_args([]).max_tokens_per_gpu == 1024  # the trainer's default
        assert "default here" not in parser.format_help()
    assert "(always on in this trainer)" in add_trainer_arguments(
        argparse.ArgumentParser()).format_help()


def test_warm_up_covers_every_triton_variant_on_a_gpu():
    """On a GPU the warm-up also runs micro-batches of 64, 65 and 1 tokens: Triton compiles
    a kernel variant per class of an integer argument (divisible by 16, not, 1), and a
    variant first met in a timed step cost about a second there. Not on CPU, where the
    interpreter compiles nothing."""
    import argparse

    from costmodel.training.config import add_trainer_arguments, prepare
    from costmodel.training.trainer import _warm_up

    args = add_trainer_arguments(argparse.ArgumentParser()).parse_args(
        ["--steps", "1", "--samples-per-step", "4"])
    plan = prepare(args, 2)
    seen = []

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, ids, cu_seqlens, max_seqlen):
            seen.append(int(ids.numel()))
            return self.w * ids.float()

    first = sum(int(plan.lengths[0][i]) for i in plan.schedules[0].microbatches[1][0])
    _warm_up(Model(), plan, args, torch.device("cpu"), 1, variants=True)
    assert seen == [first, 64, 65, 1]
    seen.clear()
    _warm_up(Model(), plan, args, torch.device("cpu"), 1)
    assert seen == [first]


def test_disagreeing_schedules_stop_with_a_clear_error():
    from costmodel.training.trainer import check_run_agreement

    check_run_agreement([5, 5, 5])
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1, 3\] were started with another run"):
        check_run_agreement([5, 6, 5, 7])
    check_schedule_agreement([digest_to_int("abc")] * 3, step=0)
    with pytest.raises(RuntimeError, match="step 5: the ranks built different schedules"):
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


@pytest.mark.parametrize(("patch", "reason"), [
    # Rank 1 started with another seed (or steps, shape, lengths file): caught before a
    # weight is shared (ranks hung in a collective, or trained on different data without
    # a word, or failed at a later step).
    ("if RANK == 1:\n    sys.argv += ['--seed', '1']\n",
     "rank(s) [1] were started with another run than rank 0"),
    # Rank 1 clips its lengths where the schedules (sample indices only) stay the same, or
    # runs another learning rate: both trained on without a word.
    ("sys.argv += ['--samples-per-step', '8', '--length-scale', '0.03125',\n"
     "             '--max-tokens-per-gpu', '100000']\n"
     "if RANK == 1:\n    sys.argv += ['--max-len', '347']\n",
     "rank(s) [1] were started with another run than rank 0"),
    ("if RANK == 1:\n    sys.argv += ['--lr', '0.5']\n",
     "rank(s) [1] were started with another run than rank 0"),
    # Rank 1's schedule digest off, past the run's check: caught at step 1.
    ("trainer.check_run_agreement = lambda fingerprints: None\n"
     "if RANK == 1:\n"
     "    real = trainer.digest_to_int\n"
     "    trainer.digest_to_int = lambda digest: real(digest) + 1\n",
     "step 1: the ranks built different schedules"),
])
def test_ranks_that_disagree_all_stop_before_training_with_the_reason(tmp_path, patch, reason):
    done = _torchrun_script(tmp_path, patch + "trainer.exit_rank(train_varlen.main(sys.argv[1:]))",
                            *FAST, "--steps", "2", "--device", "cpu")
    assert done.returncode != 0
    for rank in (0, 1):  # every rank says why; none waits
        assert f"error (rank {rank}): {reason}" in done.stderr
    assert "step 1/" not in done.stdout


def test_a_rank_that_fails_its_checks_alone_stops_the_others_without_a_launcher(tmp_path):
    """Regression: rank 1 alone lacked its --cost-model file (its node's copy, say) and
    stopped before joining the process group; rank 0 waited for it in the rendezvous for
    gloo's 30 minutes where no launcher stopped it (ranks started by hand, torchrun on
    several nodes). Two plain processes here, meeting through a file: both stop, saying why."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'examples')!r}]\n"
        "import costmodel.training.trainer as trainer\n"
        "import train_varlen\n"
        "real = trainer.train\n"
        "def train(args):\n"
        f"    setattr(args, trainer.RENDEZVOUS_ATTR, {(tmp_path / 'rdzv').as_uri()!r})\n"
        "    return real(args)\n"
        "trainer.train = train\n"
        "trainer.exit_rank(train_varlen.main(sys.argv[1:]))\n"
    )
    flags = [*FAST, "--steps", "1", "--device", "cpu"]
    missing = tmp_path / "nowhere.json"
    ranks = []
    for rank, extra in ((0, []), (1, ["--balance-by-flops", "--cost-model", str(missing)])):
        env = {**_env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        env.pop("MASTER_PORT", None)
        ranks.append(subprocess.Popen([sys.executable, str(script), *flags, *extra], env=env,
                                      cwd=tmp_path, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        done = [process.communicate(timeout=90) for process in ranks]
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert [process.returncode for process in ranks] == [2, 2]
    (out0, err0), (out1, err1) = done
    assert f"error (rank 1): --cost-model {missing}: no cost model file" in err1
    assert (f"error (rank 0): rank 1 stopped before training: --cost-model {missing}: no cost "
            "model file") in err0
    assert "step 1/" not in out0 + out1


def test_a_rank_whose_peer_never_starts_stops_after_the_group_timeout_saying_so():
    """Regression: rank 0 started by hand (MASTER_ADDR/MASTER_PORT, no torchrun) whose rank 1
    never started waited in the rendezvous for gloo's 30 minutes, then said "Wait timeout"."""
    import socket

    with socket.socket() as probe:  # a free port for the rendezvous rank 0 hosts
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**_env(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_varlen.py"), *FAST, "--steps", "1",
         "--device", "cpu", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "512",
         "--group-timeout-s", "2"],
        capture_output=True, text=True, timeout=90, env=env)
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 60
    assert ("error (rank 0): could not meet the other 1 rank(s) of the process group within "
            "2 s") in done.stderr
    assert "raise --group-timeout-s" in done.stderr and "step 1/" not in done.stdout


@pytest.mark.parametrize("value", ["nan", "0", "-1", "1e20"])
def test_a_group_timeout_out_of_range_is_refused_before_the_rank_joins(value):
    """Regression: ranks started by hand or by torchrun join the group before `prepare`
    checks the flags, so --group-timeout-s nan, 0, -1 or 1e20 reached the rendezvous and
    every rank said it "could not meet the other 1 rank(s) ... within nan s" and to raise
    the flag, not that the value is out of range."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**_env(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_varlen.py"), *FAST, "--steps", "1",
         "--device", "cpu", "--group-timeout-s", value],
        capture_output=True, text=True, timeout=90, env=env)
    assert done.returncode == 2, done.stderr
    assert "--group-timeout-s must be in (0, 604800] seconds" in done.stderr, done.stderr
    assert "could not meet" not in done.stderr


@pytest.mark.parametrize("flag", ["--log-json", "--record-runs"])
def test_log_json_that_cannot_be_written_stops_before_any_process_starts(tmp_path, capsys, flag):
    """Regression: rank 0 failed to open it after the process group started."""
    (tmp_path / "a_file").write_text("")
    err = _error([flag, str(tmp_path / "a_file" / "steps.jsonl")], capsys)
    assert flag in err and "is a file, not a folder" in err


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("big.txt", b"100\n99999999999999999999999\n", "too large"),  # was an OverflowError
        ("big.json", b"[100, 99999999999999999999999]", "entry at index 1"),  # was an OverflowError
        ("bad.npy", b"not an array", "not a .npy array"),  # said nothing of the file
        ("junk.txt", b"100\n12.5\n", "line 2"),
    ],
)
def test_lengths_file_errors_name_the_file(tmp_path, name, content, needle):
    from costmodel.scheduler import read_lengths

    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=needle) as err:
        read_lengths(path)
    assert name in str(err.value) and len(str(err.value).splitlines()) == 1


def test_bf16_model_trains_through_fp32_master_weights(monkeypatch):
    """On a GPU the model computes in bf16: gradients are all-reduced in fp32 and AdamW
    steps fp32 master weights copied back (bf16 parameters alone round Adam's small steps
    away). Run that path in one process on CPU, and check the layers skip the host-side
    cu_seqlens check (a device sync per layer on a GPU)."""
    import argparse

    import costmodel.training.trainer as trainer
    from costmodel.training.config import add_trainer_arguments

    args = add_trainer_arguments(argparse.ArgumentParser()).parse_args(
        [*FAST, "--steps", "4", "--device", "cpu"])
    monkeypatch.setattr(trainer, "_resolve_device", lambda a, rank: (
        torch.device("cpu"), "gloo", torch.bfloat16, "bf16", "sdpa"))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    result = trainer.train(args)
    assert all(p.dtype == torch.bfloat16 for p in result.model.parameters())
    assert not any(layer.check_values for layer in result.model.layers)
    assert result.last_loss < result.first_loss
    # Norm weights start at 1.0; with fp32 masters they move both ways, not only down.
    norm = result.model.norm.weight.float()
    assert (norm > 1.0).any() and (norm < 1.0).any()


def test_more_ranks_per_node_than_gpus_is_a_clear_error(monkeypatch):
    """torchrun --nproc_per_node 2 on a one-GPU machine: NCCL would fail later with
    'Duplicate GPU detected'; say what to change before any process group exists."""
    import argparse

    import costmodel.training.trainer as trainer

    monkeypatch.setattr(trainer, "device_kind", lambda requested: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="2 ranks per node but 1 visible GPU"):
        trainer._resolve_device(argparse.Namespace(device="cuda", attention=None), 1)


def test_bf16_gradients_are_summed_over_microbatches_in_fp32():
    """On the GPU (bf16 model) each micro-batch's backward added into the bf16 .grad:
    64 micro-batches drifted 0.84% from the fp32 sum. They go into fp32 buffers now."""
    torch = pytest.importorskip("torch")
    w = torch.nn.Parameter(torch.ones(256, dtype=torch.bfloat16))
    accum = [torch.zeros(256, dtype=torch.float32)]
    gen = torch.Generator().manual_seed(0)
    parts = [torch.rand(256, generator=gen) + 0.5 for _ in range(64)]
    for part in parts:
        (w * part.to(torch.bfloat16)).sum().backward()
        move_grads_into(accum, [w])
        assert w.grad is None
    exact = torch.stack([p.to(torch.bfloat16).float() for p in parts]).sum(0)
    assert torch.allclose(accum[0], exact, rtol=1e-6)
    in_bf16 = torch.zeros(256, dtype=torch.bfloat16)
    for part in parts:
        in_bf16 += part.to(torch.bfloat16)
    assert (in_bf16.float() - exact).abs().max() > 0.1  # what summing in bf16 loses


def _writer_of(folder, pids) -> int | None:
    """Which of ``pids`` has a costmodel temp file in ``folder`` open (rank 0, logging)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(str(folder)) and ".costmodel-" in target:
                        return int(pid)
    return None


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "kill rank 0"])
def test_interrupting_the_launcher_stops_its_workers_and_keeps_the_old_log(tmp_path, signame):
    """Regression: SIGINT to the launching process alone left it waiting on workers that
    trained on as orphans; and the log was opened with "w", so an interrupted run truncated
    the previous one. SIGTERM (a job scheduler's) killed the launcher at once, leaving the
    log's temp file and the workers behind; and a rank 0 killed (by SIGKILL, or by the
    launcher when it is blocked) left its temp file."""
    import signal
    import time

    log = tmp_path / "steps.jsonl"
    log.write_text("previous run\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "costmodel", "train-demo", "--nproc", "2", "--device", "cpu",
         *FAST, "--steps", "3000", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096",
         "--log-json", str(log)],
        cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # Its own process group, to clean up after a failure; and SIGINT handled even where
        # this test runs in a process that ignores it (a pytest-xdist worker does).
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # Until rank 0 holds its log's temp file open (it is training). A temp file in the
        # folder was not enough: the output check's probe is one too, and on a loaded CI
        # machine rank 0 had not opened its own a second after the probe (CI, 2026-12-03).
        deadline, writer = time.monotonic() + 120, None
        while writer is None:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            writer = _writer_of(tmp_path, children)
        time.sleep(1)
        if signame == "kill rank 0":
            os.kill(writer, signal.SIGKILL)
        else:
            proc.send_signal(getattr(signal, signame))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers
            proc.communicate()
    if signame == "kill rank 0":
        assert proc.returncode != 0 and "rank 0 exited with code -9 (signal SIGKILL)" in err, err
    else:
        assert proc.returncode == 130, err
        assert err.strip().endswith("interrupted")
    assert log.read_text() == "previous run\n"
    assert not list(tmp_path.glob(".costmodel-*.tmp"))


def _stubborn(ready) -> None:
    """A worker blocked where no Python handler runs (as in a collective a dead peer never
    joins): SIGINT and SIGTERM do nothing."""
    import signal
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(600)


def _polite(ready) -> None:
    import signal
    import time

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a pytest-xdist worker ignores it
    try:
        ready.set()
        time.sleep(600)
    except KeyboardInterrupt:
        raise SystemExit(7) from None  # cleaned up on the interrupt, the first step


def _timed_stop(monkeypatch, escalation, targets) -> tuple[float, list[int]]:
    """Start a forked process per target, wait until each is ready, stop them all with
    `launch._stop` under ``escalation``: (seconds the stop took, exit codes)."""
    import multiprocessing
    import time

    from costmodel.training import launch

    monkeypatch.setattr(launch, "_ESCALATION", escalation)
    ctx = multiprocessing.get_context("fork")
    events = [ctx.Event() for _ in targets]
    processes = [ctx.Process(target=t, args=(e,)) for t, e in zip(targets, events)]
    for process in processes:
        process.start()
    try:
        assert all(event.wait(30) for event in events)
        start = time.monotonic()
        launch._stop(processes)
        return time.monotonic() - start, [p.exitcode for p in processes]
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()


def test_stopping_workers_ends_with_sigkill_for_one_that_ignores_signals(monkeypatch):
    """Regression: the launcher's last step was SIGTERM, which a worker blocked in C (or
    handling it as an interrupt) outlives; the launcher then hung waiting for it."""
    import signal

    seconds, codes = _timed_stop(monkeypatch, ((signal.SIGINT, 2.0), (signal.SIGTERM, 1.0),
                                               (signal.SIGKILL, 5.0)), [_stubborn, _polite])
    assert seconds < 6  # one deadline per step, not one per worker
    assert codes == [-signal.SIGKILL, 7]


def test_an_interrupt_while_spawning_stops_the_workers_already_started(monkeypatch):
    """Regression: Ctrl-C or SIGTERM while torch spawned the workers left those already
    started running, and the launcher waited at exit for them."""
    import argparse
    import multiprocessing

    import torch.multiprocessing as mp

    from costmodel.training import launch

    ctx = multiprocessing.get_context("fork")
    ready, bystander_ready = ctx.Event(), ctx.Event()
    bystander = ctx.Process(target=_polite, args=(bystander_ready,))  # the caller's own
    bystander.start()
    started = [bystander]
    assert bystander_ready.wait(30)

    def spawn_one_then_interrupt(*args, **kwargs):
        started.append(ctx.Process(target=_polite, args=(ready,)))
        started[1].start()
        assert ready.wait(30)
        raise KeyboardInterrupt("signal SIGTERM")

    monkeypatch.setattr(mp, "start_processes", spawn_one_then_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            launch._start(argparse.Namespace(), 2, "unused")
        started[1].join(5)
        assert started[1].exitcode == 7  # interrupted, so it cleaned up
        assert bystander.is_alive()  # not launch's to stop
    finally:
        for process in started:
            if process.is_alive():
                process.kill()


def test_train_demo_without_torch_is_one_line(monkeypatch):
    """From a walkthrough: the base install (numpy, scipy) ended train-demo in a traceback."""
    import argparse
    import builtins
    import sys

    from costmodel.training import launch

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(RuntimeError, match=r"train-demo needs PyTorch, and torch is not "
                                           r"installed: pip install 'costmodel\[gpu\]'"):
        launch.launch(argparse.Namespace(), 2)

    def broken_torch(name, *args, **kwargs):  # installed, but a library it loads is missing
        if name == "torch":
            raise ImportError("libcudnn.so.9: cannot open shared object file")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken_torch)
    with pytest.raises(RuntimeError, match="importing torch failed: libcudnn.so.9: cannot open"):
        launch.launch(argparse.Namespace(), 2)


# -- from a mutation check: each test fails when the code it names is broken ---------------


def test_a_file_of_exactly_one_step_and_samples_at_the_cap_train(tmp_path):
    """a lengths file of exactly --samples-per-step lengths,
    and samples of exactly --max-tokens-per-gpu tokens, are valid."""
    from costmodel.training.config import prepare

    f = tmp_path / "l.txt"
    f.write_text("100\n50\n100\n30\n")
    from costmodel.cli import build_parser

    args = build_parser().parse_args(["train-demo", "--device", "cpu", "--lengths-file", str(f),
                                      "--samples-per-step", "4", "--steps", "1",
                                      "--max-tokens-per-gpu", "100"])
    plan = prepare(args, 2)
    assert len(plan.schedules) == 1 and plan.schedules[0].cap_violations == 0


# -- from a second mutation check (issue 6): each test fails when the code it names is broken --


def _trainer_args(*argv: str):
    import argparse

    from costmodel.training.config import add_trainer_arguments

    return add_trainer_arguments(argparse.ArgumentParser()).parse_args(list(argv))


@pytest.mark.parametrize(("argv", "needle"), [
    (["--steps", "0"], "--steps must be at least 1"),  # trained nothing and printed no step
    (["--lr", "0"], "--lr must be a positive finite number"),  # trained with frozen weights
    (["--max-len", "-1"], "--max-len must be 0 (no clip) or positive"),  # read as "no clip"
    (["--head-dim", "3"], "--head-dim must be even"),  # failed in every worker's first forward
    (["--group-timeout-s", "0"], "--group-timeout-s must be in (0, 604800] seconds"),
    (["--group-timeout-s", "nan"], "--group-timeout-s must be in (0, 604800] seconds"),
])
def test_flag_values_that_cannot_train_are_refused_before_any_step(argv, needle):
    from costmodel.training.config import prepare

    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        prepare(_trainer_args("--samples-per-step", "8", *argv), 2)


def test_an_output_that_is_another_output_or_an_input_is_refused(tmp_path, tiny_cost_model):
    """Regression: --log-json and --record-runs on one file kept the runs alone (the log,
    renamed first, was replaced), and either on the --lengths-file or --cost-model file
    replaced it at the end of the run. A link is replaced, not what it points to: allowed."""
    import shutil

    from costmodel.training.config import prepare

    lengths = tmp_path / "lengths.txt"
    lengths.write_text("100\n200\n300\n50\n")
    model = tmp_path / "model.json"
    shutil.copy(tiny_cost_model, model)
    (tmp_path / "link.json").symlink_to(model)
    flags = ["--samples-per-step", "4", "--steps", "1"]
    flops = [*flags, "--balance-by-flops", "--cost-model", str(model)]
    for argv, needle in (
        ([*flags, "--log-json", str(tmp_path / "o.jsonl"), "--record-runs",
          f"{tmp_path}/./o.jsonl"], "--log-json and --record-runs are the same file"),
        ([*flags, "--lengths-file", str(lengths), "--record-runs", str(lengths)],
         "--record-runs .* is the --lengths-file file"),
        ([*flops, "--log-json", f"{tmp_path}/../{tmp_path.name}/model.json"],
         "--log-json .* is the --cost-model file"),
        ([*flags, "--balance-by-flops", "--cost-model", str(tmp_path / "link.json"),
          "--record-runs", str(model)], "--record-runs .* is the --cost-model file"),
    ):
        with pytest.raises(ValueError, match=needle):
            prepare(_trainer_args(*argv), 2)
    prepare(_trainer_args(*flops, "--log-json", str(tmp_path / "link.json")), 2)


def test_a_step_of_one_token_samples_is_refused_before_training(tmp_path):
    """A step whose samples are all 1 token long has no target token: the loss would be
    divided by zero at that step, mid-run. Refused by prepare, naming the step."""
    from costmodel.training.config import prepare

    path = tmp_path / "lengths.txt"
    path.write_text("5\n7\n1\n1\n")  # step 1: 5 and 7 tokens; step 2: two 1-token samples
    args = _trainer_args("--lengths-file", str(path), "--samples-per-step", "2", "--steps", "2")
    with pytest.raises(ValueError, match="every sample of step 2 is 1 token long"):
        prepare(args, 2)


def test_synthetic_lengths_differ_per_step_and_file_lengths_are_clipped_too():
    """A step's lengths depend on (seed, step): steps differ, seeds differ, and a scale so
    small it rounds to nothing still gives 1-token samples; --max-len clips lengths from a
    file as it clips drawn ones."""
    from costmodel.training.data import LengthSource

    source = LengthSource(samples_per_step=32, seed=3, scale=1 / 32)
    assert not np.array_equal(source.lengths(0), source.lengths(1))
    np.testing.assert_array_equal(source.lengths(1), LengthSource(samples_per_step=32, seed=3,
                                                                  scale=1 / 32).lengths(1))
    assert not np.array_equal(source.lengths(0), LengthSource(samples_per_step=32, seed=4,
                                                              scale=1 / 32).lengths(0))
    assert LengthSource(samples_per_step=32, scale=1e-6).lengths(0).tolist() == [1] * 32
    from_file = LengthSource(samples_per_step=3, max_len=50, file_lengths=(10, 80, 50, 200))
    assert from_file.lengths(0).tolist() == [10, 50, 50]
    assert from_file.lengths(1).tolist() == [50, 10, 50]  # wraps around the file


def test_loss_and_gradient_are_the_global_mean_over_the_steps_target_tokens(tmp_path, monkeypatch):
    """The step record's loss is Σ of every micro-batch's summed cross-entropy over the
    step's target tokens (Σ (length - 1)), its tokens Σ length, and the gradient AdamW steps
    on is that global mean's gradient (not a sum: Adam hides a scale, the promise does not):
    recomputed here from the same initial weights on the whole batch at once."""
    import costmodel.training.trainer as trainer
    from costmodel.training.data import sample_tokens
    from costmodel.training.model import TinyGPT, packed_batch

    stepped = []

    class AdamW(torch.optim.AdamW):
        def step(self, closure=None):
            stepped.append([p.grad.clone() for g in self.param_groups for p in g["params"]])
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "AdamW", AdamW)
    lengths = [30, 50, 20, 40, 60, 10, 45, 25]
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, lengths)))
    args = _trainer_args("--lengths-file", str(path), "--samples-per-step", "8", "--steps", "1",
                         "--max-tokens-per-gpu", "64", "--device", "cpu", "--seed", "5")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    result = trainer.train(args)
    (record,) = result.records
    assert record.microbatches_per_rank > 2  # several micro-batches, each summed in
    assert record.tokens == sum(lengths)

    torch.manual_seed(5)  # the trainer's initial weights
    model = TinyGPT(result.model.spec, attention="sdpa")
    vocab = result.model.spec.vocab_size
    ids, targets, cu, max_len = packed_batch(
        [sample_tokens(5, 0, i, n, vocab) for i, n in enumerate(lengths)], device="cpu")
    loss = torch.nn.functional.cross_entropy(model(ids, cu, max_len), targets,
                                             ignore_index=-100, reduction="sum")
    mean = loss / sum(n - 1 for n in lengths)
    mean.backward()
    assert record.loss == pytest.approx(float(mean.detach()), rel=1e-5)
    (grads,) = stepped
    expected = [p.grad for p in model.parameters()]
    assert len(grads) == len(expected)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_ranks_that_disagree_are_named_whatever_the_number_of_runs():
    """Two ranks with two fingerprints (the common case) disagree as much as four with three."""
    from costmodel.training.trainer import check_run_agreement

    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1\] were started"):
        check_run_agreement([5, 6])
    with pytest.raises(RuntimeError, match="step 1: the ranks built different schedules"):
        check_schedule_agreement([1, 2], step=0)


def test_as_many_ranks_per_node_as_gpus_is_fine(monkeypatch):
    """The boundary of the check above: one rank per GPU is what NCCL needs."""
    import argparse

    import costmodel.training.trainer as trainer

    monkeypatch.setattr(trainer, "device_kind", lambda requested: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: chosen[-1])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    device, backend, *_ = trainer._resolve_device(argparse.Namespace(device="cuda", attention=None), 1)
    assert (device, backend, chosen) == (torch.device("cuda", 1), "nccl", [1])


def test_the_parent_checks_the_dp_size_and_gpus_before_spawning(monkeypatch):
    """`launch` validates with dp = --nproc before any worker starts (a worker would also
    refuse, after spawning, with a traceback per rank); with CUDA, --nproc up to the GPU
    count passes."""
    from costmodel.cli import build_parser
    from costmodel.training import launch

    class Started(Exception):
        pass

    def start(*args):
        raise Started

    monkeypatch.setattr(launch, "_start", start)
    monkeypatch.setattr(launch, "_check_attention_runs", lambda *a: None)
    args = build_parser().parse_args(["train-demo", "--device", "cpu", "--samples-per-step", "2"])
    with pytest.raises(ValueError, match="--nproc must be at least 1, got 0"):
        launch.launch(args, 0)
    with pytest.raises(ValueError, match="3 data-parallel ranks but only 2 samples per step"):
        launch.launch(args, 3)
    with pytest.raises(Started):
        launch.launch(args, 2)
    monkeypatch.setattr(launch, "device_kind", lambda requested: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match="--nproc 3 but only 2 GPUs are visible"):
        launch.launch(build_parser().parse_args(["train-demo", "--samples-per-step", "8"]), 3)
    with pytest.raises(Started):
        launch.launch(build_parser().parse_args(["train-demo", "--samples-per-step", "8"]), 2)


def test_a_worker_that_exits_on_its_own_is_not_said_to_die_of_signal_none():
    """Regression: a worker that exited with a code of its own (os._exit(3), a library's
    exit) was reported as 'exited with code 3 (signal None)'."""
    from costmodel.training.launch import _exited_message

    assert _exited_message(1, 3, None) == "rank 1 exited with code 3 before finishing"
    assert (_exited_message(0, -9, "SIGKILL")
            == "rank 0 exited with code -9 (signal SIGKILL) before finishing")


def test_a_chained_workers_error_names_the_exception_it_ended_with():
    from costmodel.training.launch import _worker_error

    text = """Traceback (most recent call last):
  File "trainer.py", line 3, in step
KeyError: 'train'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "trainer.py", line 9, in train
ValueError: cost model has no train curves
"""
    assert _worker_error(text) == "ValueError: cost model has no train curves"
    assert _worker_error("Traceback\nKeyboardInterrupt\nadvice after it\n") == "KeyboardInterrupt"


def test_train_demo_prints_one_line_per_step_and_the_run_summary(monkeypatch, capsys):
    """The table counts steps from 1 (as the log does) and the summary names the cost,
    the ranks, the first and last loss and the mean predicted and measured max/mean."""
    from costmodel.training import launch

    def record(step, loss, pred, meas):
        return {"step": step, "loss": loss, "tokens": 900 + step, "microbatches_per_rank": 2,
                "predicted_imbalance": pred, "measured_imbalance": meas,
                "compute_ms": [10.0, 12.5, 11.0], "cost": "flops"}

    records = [record(0, 4.5, 1.01, 1.20), record(1, 4.0, 1.03, 1.10), record(2, 3.5, 1.02, 1.3)]
    monkeypatch.setattr(launch, "launch", lambda args, nproc: records)
    assert main(["train-demo", "--nproc", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["1", "4.5000", "900", "2", "1.010", "1.200", "10.0", "12.5", "11.0"]
    assert lines[3].split()[:2] == ["3", "3.5000"]
    assert lines[4] == ("balanced by flops over 3 ranks: loss 4.5000 -> 3.5000; schedules agreed "
                        "on every step; mean max/mean predicted 1.020, measured 1.200")
    assert main(["train-demo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == records


def test_bf16_gradients_of_every_micro_batch_go_into_fp32_buffers(tmp_path, monkeypatch):
    """The trainer, not just the helper: with a bf16 model each micro-batch's gradients are
    moved into fp32 buffers (summed in the bf16 .grad they drifted 0.84% over 64)."""
    import costmodel.training.trainer as trainer

    path = tmp_path / "lengths.txt"
    path.write_text("30\n50\n20\n40\n60\n10\n")
    args = _trainer_args("--lengths-file", str(path), "--samples-per-step", "6", "--steps", "1",
                         "--max-tokens-per-gpu", "64", "--device", "cpu")
    monkeypatch.setattr(trainer, "_resolve_device", lambda a, rank: (
        torch.device("cpu"), "gloo", torch.bfloat16, "bf16", "sdpa"))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    moved = []
    real = trainer.move_grads_into

    def spy(accum, params):
        moved.append({buf.dtype for buf in accum})
        real(accum, params)

    monkeypatch.setattr(trainer, "move_grads_into", spy)
    (record,) = trainer.train(args).records
    assert record.microbatches_per_rank > 1
    assert moved == [{torch.float32}] * record.microbatches_per_rank


def test_packed_targets_never_cross_a_sequence_boundary():
    """Each token's target is the next token of its own sequence; a sequence's last token
    has none (-100, ignored), and cu_seqlens / max_seqlen describe the packing."""
    from costmodel.training.model import packed_batch

    ids, targets, cu, max_len = packed_batch([np.array([1, 2, 3]), np.array([4, 5])], device="cpu")
    assert ids.tolist() == [1, 2, 3, 4, 5]
    assert targets.tolist() == [2, 3, -100, 5, -100]
    assert cu.tolist() == [0, 3, 5] and cu.dtype == torch.int32 and max_len == 3


def test_stopping_several_stubborn_workers_waits_once_per_step_not_per_worker(monkeypatch):
    """Each escalation step has one deadline for all workers: three workers that ignore
    SIGINT and SIGTERM are killed after ~2 s here, not ~6 s (a full wait each)."""
    import signal

    seconds, codes = _timed_stop(monkeypatch, ((signal.SIGINT, 1.0), (signal.SIGTERM, 1.0),
                                               (signal.SIGKILL, 5.0)), [_stubborn] * 3)
    assert seconds < 4.5  # ~2 s; a wait per worker: ~6 s
    assert codes == [-signal.SIGKILL] * 3


def test_tiny_gpt_ties_its_head_to_the_embedding_and_builds_dense_models_only():
    """The spec says tie_word_embeddings (one vocab x hidden matrix, as counted); an MoE or
    MLA shape is refused, not silently built as a dense one."""
    import dataclasses

    from costmodel.training.model import TinyGPT

    spec = ModelSpec(name="t", num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1,
                     head_dim=16, intermediate_size=64, vocab_size=50, tie_word_embeddings=True,
                     dtype="fp32")
    model = TinyGPT(spec, attention="sdpa")
    assert model.lm_head.weight is model.embed.weight
    moe = dataclasses.replace(spec, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    with pytest.raises(ValueError, match="dense, non-MLA models only"):
        TinyGPT(moe, attention="sdpa")
