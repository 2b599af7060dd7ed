"""`costmodel.portable`: costs the same to the last bit whatever numpy's CPU dispatch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from costmodel import portable

ROOT = Path(__file__).resolve().parents[1]

# Everything numpy can dispatch to above the x86-64 baseline (numpy 2 names; a name this
# CPU lacks is accepted and ignored).
_ABOVE_BASELINE = "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"

# What a rank derives from a cost model and lengths: tables, a schedule's digest.
_FINGERPRINTS = r"""
import hashlib, json, logging, sys
import numpy as np
from numpy._core._multiarray_umath import __cpu_features__
from costmodel.model import load_cost_model
from costmodel.scheduler import build_schedule, generate_lengths
logging.disable(logging.WARNING)
out = {"features": sorted(k for k, v in __cpu_features__.items() if v)}
L = np.arange(1, 65537)
for name in ("h200/qwen3-8b", "h100/qwen3-8b"):
    cm = load_cost_model(name)
    parts = [cm.sequence_costs(L, m).tobytes() + cm.token_costs(L.astype(float), m).tobytes()
             + cm.sample_cost(L, m).tobytes() for m in ("train", "forward")]
    out[name] = hashlib.sha256(b"".join(parts)).hexdigest()
    lengths = generate_lengths(4096, "rl", seed=3)
    out[name + " schedule"] = build_schedule(lengths, dp_size=16, max_tokens_per_microbatch=16384,
                                             cost=cm).digest()
print(json.dumps(out))
"""


def _fingerprints(disable: str = "") -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), NPY_DISABLE_CPU_FEATURES=disable)
    done = subprocess.run([sys.executable, "-c", _FINGERPRINTS], env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_costs_and_schedules_do_not_depend_on_numpys_cpu_dispatch():
    pytest.importorskip("numpy._core._multiarray_umath")  # numpy 2's name for the features
    native, baseline = _fingerprints(), _fingerprints(_ABOVE_BASELINE)
    if native["features"] == baseline["features"]:
        pytest.skip("this CPU has no numpy kernels above the baseline to switch off")
    # With numpy's exp/log/power, 1,418 (h200) and 5,638 (h100 estimate) of 131,072
    # attention-table entries differed between the AVX-512 and baseline kernels.
    for key in native:
        if key != "features":
            assert native[key] == baseline[key], key


def test_functions_match_numpy_to_rounding():
    x = np.random.default_rng(0).uniform(1e-3, 1e4, 5000)
    np.testing.assert_allclose(portable.exp(np.log(x)), x, rtol=1e-14)
    np.testing.assert_allclose(portable.log(x), np.log(x), rtol=1e-14)
    np.testing.assert_allclose(portable.power(x, 1.7), x**1.7, rtol=1e-14)
    assert portable.exp(np.zeros((2, 3))).shape == (2, 3)
    assert portable.log(np.array([])).size == 0


def test_geomspace_keeps_its_ends_and_ratio():
    g = portable.geomspace(16, 131072, 53)
    assert g[0] == 16 and g[-1] == 131072 and g.size == 53
    np.testing.assert_allclose(g, np.geomspace(16, 131072, 53), rtol=1e-13)
    np.testing.assert_allclose(g[1:] / g[:-1], (131072 / 16) ** (1 / 52), rtol=1e-13)
    assert list(portable.geomspace(3, 9, 1)) == [3.0]


def test_geomspace_of_no_points_is_empty():
    """As numpy's: ``num=0`` gives no points (not the start alone)."""
    assert portable.geomspace(3, 9, 0).size == 0 and np.geomspace(3, 9, 0).size == 0
