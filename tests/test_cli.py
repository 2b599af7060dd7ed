"""The `costmodel` command: help without torch, one-line errors, presets and flops."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.cli import main


def test_help_lists_commands(capsys):
    try:
        main(["--help"])
    except SystemExit as exit_:
        assert exit_.code == 0
    out = capsys.readouterr().out
    assert "presets" in out and "flops" in out


def test_version_names_the_package_version(capsys):
    """What a bug report needs first; pyproject reads the same `costmodel.__version__`."""
    import importlib.metadata

    import costmodel

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"costmodel {costmodel.__version__}"
    assert importlib.metadata.version("costmodel") == costmodel.__version__


def test_import_and_help_need_no_torch():
    # Block torch and triton: `import costmodel` and `--help` must still work.
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"
        "import costmodel, costmodel.cli\n"
        "try:\n    costmodel.cli.main(['--help'])\nexcept SystemExit as e:\n    sys.exit(e.code)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_presets(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v3" in out and "qwen3-30b-a3b" in out
    # the TP sizes calibrate --tensor-parallel takes: Qwen2.5-7B's 28 heads stop at 4
    assert re.search(r"qwen2\.5-7b .* 1,2,4$", out, re.MULTILINE)
    assert re.search(r"qwen3-8b .* 1,2,4,8,16$", out, re.MULTILINE)


def test_flops_table(capsys):
    assert main(["flops", "--model", "qwen3-8b", "--lengths", "512,4096"]) == 0
    out = capsys.readouterr().out
    assert "attention_core" in out and "total" in out
    # 4096 tokens of qwen3-8b: 66.947 TFLOP (hand-derived in test_flops.py)
    assert "66.947" in out


def test_user_errors_are_one_line(capsys):
    assert main(["flops", "--model", "gpt-9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "known presets" in err
    assert main(["flops", "--lengths", "12,-3"]) == 2
    assert "positive" in capsys.readouterr().err


def test_with_verbose_a_runtime_error_shows_where_it_came_from(capsys, monkeypatch):
    """A GPU session runs with -v and gets one try: a torch or CUDA RuntimeError from deep
    in a path that never ran there must say where it came from. A ValueError (bad input)
    stays one line."""
    from costmodel.commands import flops

    def broken(args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(flops, "run", broken)
    assert main(["flops", "--model", "qwen3-8b"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["-v", "flops", "--model", "qwen3-8b"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "in broken" in err and err.endswith("illegal memory access was encountered\n")
    monkeypatch.undo()
    assert main(["-v", "flops", "--model", "gpt-9"]) == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("target, says", [
    ("", "is empty; give a file path"),  # was ignored: exit 0 and nothing written
    ("/proc/costmodel-test.json", "cannot write there"),  # was found only at the write
    ("y" * 300 + ".json", "cannot write there (File name too long)"),
])
def test_output_paths_that_cannot_be_written_are_refused_first(target, says, capsys):
    for argv in (["schedule", "--n", "64", "--dp", "2", "--json", target],
                 ["report", "h200/qwen3-8b", "--png", target]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, (argv, err)


def test_schedule_keeps_each_group_on_one_rank(tmp_path, capsys):
    """--group-size G: each run of G consecutive samples (the last one shorter) on one rank,
    every sample once; too few groups for the ranks is a one-line error naming the flags."""
    import json

    out = tmp_path / "s.json"
    assert main(["schedule", "--n", "70", "--dp", "4", "--group-size", "8", "--cost", "flops",
                 "--json", str(out)]) == 0
    assert "in groups of 8 on one rank each" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    rank_of = {i: r for r, rank in enumerate(doc["microbatches"]) for mb in rank for i in mb}
    assert sorted(rank_of) == list(range(70))
    assert all(len({rank_of[i] for i in range(g, min(g + 8, 70))}) == 1 for g in range(0, 70, 8))
    assert doc["input"]["group_size"] == 8
    assert main(["schedule", "--n", "70", "--dp", "16", "--group-size", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--group-size 8 makes 9 group(s)" in err and "--dp 16" in err


def test_simulate_with_groups_compares_this_schedulers_policies(tmp_path, capsys):
    """--group-size in simulate: tokens, FLOPs and the cost model, each keeping groups whole;
    the baselines (which place samples) are left out, and the output says so."""
    import json

    out = tmp_path / "sim.json"
    assert main(["simulate", "--n", "96", "--dp", "4", "--group-size", "4", "--variant",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "groups of 4 on one rank each" in text and "baselines are not run" in text
    doc = json.loads(out.read_text())
    assert [r["policy"] for r in doc["policies"]] == ["tokens", "flops", "cost-model"]
    assert doc["input"]["group_size"] == 4


@pytest.mark.parametrize("argv, says", [
    # Each was reported only after CUDA started (on a GPU, after the clocks settled), or,
    # on a machine without one, hidden behind "needs a CUDA GPU".
    (["calibrate", "--gpu", "h999", "--model", "qwen3-8b", "-o", "x.json"], "unknown GPU 'h999'"),
    (["calibrate", "--gpu", "h200", "--model", "qwen3-8b", "-o", "x.json", "--max-len", "0"],
     "--max-len must be an integer number of tokens in 64"),  # said make_plan's max_len
    (["calibrate", "--model", "qwen3-8b", "-o", "x.json", "--max-len", "4096", "--max-tokens", "1024"],
     "--max-tokens (1024) must be >= --max-len (4096)"),
    (["calibrate", "--model", "qwen3-8b", "-o", "x.json", "--tensor-parallel", "0"],
     "argument --tensor-parallel: expected an integer >= 1, got '0'"),  # said tensor_parallel
    (["calibrate", "--model", "qwen3-30b-a3b", "-o", "x.json", "--expert-tensor-parallel", "0"],
     "argument --expert-tensor-parallel: expected an integer >= 1"),
    (["calibrate", "--model", "qwen3-8b", "-o", "x.json", "--budget-s", "0"],
     "argument --budget-s: expected a finite number of seconds > 0"),  # said "the time budget"
    (["calibrate", "--gpu", "h200", "--model", "qwen3-8b", "-o", "x.json", "--attention", "bogus"],
     "'bogus' is not an attention backend"),
    (["validate", "costmodel/profiles/h200/qwen3-8b.json", "--caps", "10", "--no-save"],
     "at least one cap >= 64"),
    (["validate", "costmodel/profiles/h200/qwen3-8b.json", "--caps", "0,4096", "--no-save"],
     "--caps must be comma-separated positive integers, got '0,4096'"),
    (["bench-schedule", "--dp", "8,0"], "--dp must be comma-separated positive integers"),
    (["validate", "costmodel/profiles/h200/qwen3-8b.json", "--repeats", "0", "--no-save"],
     "--repeats must be at least 1"),
    (["validate", "costmodel/profiles/h200/qwen3-8b.json", "--seed", "-1", "--no-save"],
     "--seed must be >= 0, got -1"),  # numpy refused it on the GPU, after the clocks settled
    (["bench-schedule", "--attention", "bogus"], "'bogus' is not an attention backend"),
    (["bench-schedule", "--warmup", "-5"], "--warmup and --seed must be >= 0"),
    (["bench-schedule", "--policies", " , "], "--policies ' , ': empty; give a comma-separated "
     "subset of tokens, flops, baseline, calibrated"),  # said "unknown []"
    (["bench-schedule", "--policies", "tokens,best"], "--policies 'tokens,best': unknown best;"),
    (["bench-schedule", "--cap", "10"], "--cap 10 is below the longest sample"),
    (["train-demo", "--attention", "bogus"], "'bogus' is not an attention backend"),
    (["calibrate", "--gpu", "h200", "--model", "qwen3-8b", "-o", "x.json", "--settle-s", "inf"],
     "expected a finite number of seconds"),  # would wait forever
])
def test_flag_errors_come_before_the_gpu(argv, says, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors (a bad type) exit from parsing
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert says in err and "CUDA" not in err, err


@pytest.mark.parametrize("argv, says", [
    (["schedule", "--n", "64", "--cost", "flop"],
     "--cost 'flop' is not 'tokens', 'flops' (did you mean 'flops'?) or a cost model"),
    (["schedule", "--n", "64", "--model", "qwen3-8"],
     "existing config.json path; did you mean 'qwen3-8b'? known presets: qwen3-0.6b"),
    (["calibrate", "--gpu", "h2000", "--model", "qwen3-8b", "-o", "x.json"],
     "unknown GPU 'h2000'; did you mean 'h200'? known GPUs: h100"),
    (["schedule", "--n", "64", "--cost", "nonsense"],  # no near name, no guess
     "--cost 'nonsense' is not 'tokens', 'flops' or a cost model"),
    (["schedule", "--n", "64", "--model", ""], "the model is empty; give a preset"),
    (["calibrate", "--refit", "costmodel", "-o", "x.json"], "--refit costmodel: is a folder"),
])
def test_typos_get_hints(argv, says, capsys):
    assert main(argv) == 2
    assert says in capsys.readouterr().err


REPO = Path(__file__).resolve().parents[1]
PROFILE_8B = "costmodel/profiles/h200/qwen3-8b.json"


@pytest.mark.parametrize("argv, says", [
    (["simulate", "--n", "64", "--cost-model", "h200/qwen3-4b"], "--cost-model-allow-other-shape"),
    (["schedule", "--n", "64", "--model", "qwen3-4b", "--cost", PROFILE_8B],
     "made for model 'qwen3-8b'"),  # the loader's own reason, not "is not a cost model"
    (["simulate", "--n", "64", "--cost-model", "tokens"], "already a row of the table"),
    (["schedule", "--n", "64", "--model", "qwen3-4b", "--cost", "h200/qwen3-8b"],
     "made for model 'qwen3-8b'"),  # a shipped name of another shape, too
])
def test_cost_model_errors_say_what_to_do(argv, says, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "is not 'tokens', 'flops'" not in err, err


def test_another_shape_when_asked_for(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["schedule", "--n", "64", "--model", "qwen3-4b", "--cost", PROFILE_8B,
                 "--cost-model-allow-other-shape"]) == 0
    assert main(["simulate", "--n", "64", "--cost-model", "h200/qwen3-4b",
                 "--cost-model-allow-other-shape"]) == 0
    assert "max/mean" in capsys.readouterr().out


def test_bench_schedule_builds_every_schedule_before_the_gpu(tmp_path, capsys):
    lengths = tmp_path / "three.txt"
    lengths.write_text("100\n200\n300\n")
    argv = ["bench-schedule", "--lengths", str(lengths), "--dp", "8", "--cost-model", "h200/qwen3-8b"]
    assert main(argv) == 2
    assert "DP size 8 is larger than the 3 samples" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["dir", "device", "under-a-file"])
def test_bad_output_paths_are_refused_before_any_work(tmp_path, capsys, target):
    """-o / --json / --png that cannot take a file: one line, exit 2, nothing replaced
    (a rename over /dev/null would replace the device)."""
    import os

    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    path = {"dir": str(tmp_path / "adir"), "device": os.devnull,
            "under-a-file": str(tmp_path / "afile" / "out.json")}[target]
    commands = [
        ["schedule", "--model", "qwen3-8b", "--n", "64", "--dp", "2", "--max-tokens", "16384",
         "--json", path],
        ["simulate", "--model", "qwen3-8b", "--n", "64", "--dp", "2", "--max-tokens", "16384",
         "--json", path],
        ["report", "h200/qwen3-8b", "--png", path],
        ["calibrate", "--refit", "costmodel/profiles/h200/qwen3-8b.json", "-o", path],
        ["bench-schedule", "--model", "qwen3-8b", "--lengths", "rl", "--dp", "2", "-o", path],
    ]
    for argv in commands:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("directory" in err or "regular file" in err
                                          or "not a folder" in err), (argv, err)
    assert os.path.exists(os.devnull) and not os.path.isfile(os.devnull)


def test_a_reader_that_stops_early_is_no_error(tmp_path):
    """`costmodel schedule ... --json F | head -1`: exit 0, nothing on stderr, and F written
    (the JSON is written before the table; it was lost, with an exit of 2)."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "s.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "costmodel", "schedule", "--n", "4096", "--dp", "16", "--json",
         str(out)], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # each line written as printed
    )
    proc.stdout.readline()
    proc.stdout.close()  # as head does after its line
    assert proc.wait(timeout=120) == 0
    assert proc.stderr.read() == b""
    assert out.is_file()


def test_api_entry_points_name_a_missing_argument():
    """None, a number or a generator where a list or a name belongs: a ValueError saying
    what was expected (AttributeError, TypeError, "dtype object", "1 samples" before)."""
    from costmodel.flops import calculate_fwd_flops
    from costmodel.model import load_cost_model
    from costmodel.scheduler import build_schedule
    from costmodel.spec import ModelSpec

    for lengths in (None, 100, (n for n in [1, 2])):
        with pytest.raises(ValueError, match="lengths must be a list or array with one length per sample"):
            build_schedule(lengths, dp_size=2, max_tokens_per_microbatch=1000)
    with pytest.raises(ValueError, match="flat list of integers, got nested lists of different"):
        build_schedule([[1, 2], [3]], dp_size=1, max_tokens_per_microbatch=10)  # not numpy's
    with pytest.raises(ValueError, match="a model preset is named by a string, got None; known"):
        ModelSpec.from_preset(None)
    with pytest.raises(ValueError, match="a cost model is a file path or a name like"):
        load_cost_model(None)
    with pytest.raises(ValueError, match="must be a list or array of integers, got NoneType"):
        calculate_fwd_flops(None, "qwen3-8b")
    assert calculate_fwd_flops(4096, "qwen3-8b") == calculate_fwd_flops([4096], "qwen3-8b")


def test_verbose_goes_before_or_after_the_command():
    from costmodel.cli import build_parser

    parser = build_parser()
    for argv, verbose in ((["schedule", "-v"], True), (["-v", "schedule"], True),
                          (["schedule"], False), (["report", "x.json", "--verbose"], True)):
        assert parser.parse_args(argv).verbose is verbose, argv


# -- from a mutation check: each test fails when the code it names is broken ---------------


def test_flops_attention_share_is_core_over_total(capsys):
    """the 'attention share' row is attention_core / total."""
    from costmodel.flops import flops_breakdown
    from costmodel.spec import ModelSpec

    assert main(["flops", "--model", "qwen3-8b", "--lengths", "4096,32768"]) == 0
    out = capsys.readouterr().out
    shares = [float(x.rstrip("%")) / 100 for x in
              next(ln for ln in out.splitlines() if ln.startswith("attention share")).split()[2:]]
    spec = ModelSpec.from_preset("qwen3-8b")
    for n, shown in zip((4096, 32768), shares):
        b = flops_breakdown([n], spec)
        assert shown == pytest.approx(b["attention_core"] / sum(b.values()), abs=6e-4)


def test_presets_active_parameters(capsys):
    """qwen3-8b has ~7.6B non-embedding parameters, qwen3-30b-a3b ~3.3B active."""
    assert main(["presets"]) == 0
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines()]
    rows = {cells[0]: float(cells[-2].rstrip("B")) for cells in lines  # active, then TP sizes
            if len(cells) > 2 and re.fullmatch(r"[0-9.]+B", cells[-2])}
    assert 7.0 < rows["qwen3-8b"] < 8.2
    assert 2.5 < rows["qwen3-30b-a3b"] < 4.0


def test_an_unknown_flag_shows_the_commands_own_usage(capsys):
    """`costmodel validate f.json --n 0` showed the top-level usage line, which lists no
    flag of validate's."""
    for argv, usage in ((["validate", "f.json", "--n", "0"], "usage: costmodel validate"),
                        (["--nope"], "usage: costmodel [-h]")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and usage in err, err
        assert "unrecognized arguments: " + " ".join(argv[2:] or argv) in err, err


def test_no_command_prints_help_and_exits_2(capsys):
    """`costmodel` alone is a usage error (exit 2, as argparse's own), not a success."""
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


@pytest.mark.parametrize("lengths", ["abc", "", ","])
def test_flops_lengths_that_hold_no_number_say_what_is_expected(lengths, capsys):
    """junk, empty or only commas: the flag's own message, not min()'s 'empty sequence'."""
    assert main(["flops", "--lengths", lengths]) == 2
    err = capsys.readouterr().err
    assert f"--lengths must be comma-separated positive integers, got {lengths!r}" in err, err


def test_settle_s_zero_means_no_settling():
    """--settle-s 0 is documented as 'none' and accepted; a negative number is not."""
    from costmodel.cli import build_parser

    parser = build_parser()
    for command in (["calibrate", "--model", "qwen3-8b", "-o", "x.json"], ["validate", "x.json"]):
        assert parser.parse_args([*command, "--settle-s", "0"]).settle_s == 0.0
        with pytest.raises(SystemExit):
            parser.parse_args([*command, "--settle-s", "-1"])


def test_flops_columns_and_the_all_column(capsys):
    """one length: one column, no 'all'; several: 'all' is the sum over them; a component
    that is zero for every length (MoE rows of a dense model) is left out."""
    assert main(["flops", "--model", "qwen3-8b", "--lengths", "4096"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split() == ["component", "4096"]
    assert "moe" not in out
    assert main(["flops", "--model", "qwen3-8b", "--lengths", "512,4096"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["component", "512", "4096", "all"]
    total = [float(x) for x in next(ln for ln in lines if ln.startswith("total")).split()[1:]]
    assert total[2] == pytest.approx(total[0] + total[1], abs=2e-3)


def test_presets_heads_column_is_query_over_kv_and_names_mla(capsys):
    """qwen3-8b has 32 query heads over 8 KV heads; deepseek-v3's attention is MLA."""
    assert main(["presets"]) == 0
    rows = {ln.split()[0]: ln.split() for ln in capsys.readouterr().out.splitlines()[2:]}
    assert rows["qwen3-8b"][3] == "32/8" and "MLA" not in rows["qwen3-8b"]
    assert rows["deepseek-v3"][3:5] == ["128/128", "MLA"]


def test_schedule_and_simulate_check_the_json_path_before_scheduling(tmp_path, capsys, monkeypatch):
    """A --json that cannot be written fails before the batch is scheduled (atomic_output
    would refuse it too, but only after the work)."""
    import costmodel.scheduler as scheduler

    def must_not_run(*args, **kwargs):
        raise AssertionError("scheduled before the output path was checked")

    monkeypatch.setattr(scheduler, "build_schedule", must_not_run)
    monkeypatch.setattr(scheduler, "baseline_microbatches", must_not_run)
    for command in ("schedule", "simulate"):
        assert main([command, "--n", "64", "--dp", "2", "--json", str(tmp_path)]) == 2
        assert "is a directory" in capsys.readouterr().err


def test_report_png_without_matplotlib_fails_before_the_report(tmp_path, capsys, monkeypatch):
    """`pip install -e .` has no matplotlib: --png said so only after printing the whole
    report, then exited 2."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    out = tmp_path / "plot.png"
    assert main(["report", "h200/qwen3-8b", "--png", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    assert captured.err.count("\n") == 1 and "pip install 'costmodel[plot]'" in captured.err


def test_an_empty_cost_model_is_named_as_empty(tmp_path, capsys, monkeypatch):
    """`report ''` and the rest read "" as the current folder: "is a folder, not a cost
    model file: give the file in it, e.g. ..." named some unrelated JSON file there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lengths.json").write_text("[1, 2]")
    for argv in (["report", ""], ["validate", "", "--no-save"], ["correct", "", "-o", "x.json"],
                 ["schedule", "--n", "8", "--dp", "1", "--cost", ""]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "the cost model is empty ('')" in err, argv
    assert not (tmp_path / "x.json").exists()
