"""The `costmodel` command: help without torch, one-line errors, presets and flops."""

from __future__ import annotations

import subprocess
import sys

import pytest

from costmodel.cli import main


def test_help_lists_commands(capsys):
    try:
        main(["--help"])
    except SystemExit as exit_:
        assert exit_.code == 0
    out = capsys.readouterr().out
    assert "presets" in out and "flops" in out


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
