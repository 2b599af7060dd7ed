"""Test-session setup shared by all test modules.

Triton decorates its own library functions (tl.zeros, ...) when triton is first imported,
and reads TRITON_INTERPRET at that moment; so without a GPU the interpreter must be switched
on before *any* module imports triton. Setting it here, before test collection, makes the
CPU run independent of which test module happens to import triton first.
"""

import importlib.util
import logging
import os
from pathlib import Path

import pytest

try:
    import torch
except ImportError:  # numpy-only install: the torch/triton tests skip themselves
    torch = None

if torch is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")  # a loader, no state: hypothesis tests may take it too
def load_benchmark():
    """Import a script of benchmarks/ (not a package) by name, e.g. "bench_mlp"."""

    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(autouse=True)
def _logging_enabled_after_each_test():
    """A benchmark's or script's main() run by a test may turn warnings off for the whole
    process (`logging.disable`, as bench_fill_shapes does): the tests after it in the same
    worker then read no warning, and fail by the order they were dealt in."""
    yield
    logging.disable(logging.NOTSET)
