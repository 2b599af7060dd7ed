"""`agree_on_schedule`: ranks that built different schedules, on two gloo ranks and as records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.integrations.agree import agree_on_schedule, disagreement, rank_record
from costmodel.scheduler import build_schedule

LENGTHS = [3000, 120, 900, 4000, 50, 2500, 700, 1800]


def _schedule(cost="tokens", lengths=LENGTHS):
    return build_schedule(lengths, dp_size=2, max_tokens_per_microbatch=4096, cost=cost,
                          spec="qwen3-8b")


def test_records_that_match_agree():
    record = rank_record(_schedule(), LENGTHS)
    assert disagreement([record, dict(record)]) is None


def test_another_schedule_names_the_ranks_and_what_differs():
    """Ranks by their global rank (a data-parallel group of ranks 4, 6 and 10 here)."""
    a = rank_record(_schedule("tokens"), LENGTHS, rank=4)
    b = rank_record(_schedule("flops"), LENGTHS, rank=10)
    assert a["schedule"] != b["schedule"]
    kind, message = disagreement([a, dict(a, rank=6), b])
    assert kind == "schedule"
    assert "rank(s) [10] built another schedule than rank 4" in message
    assert "rank 10 balances 'flops" in message
    newer = dict(b, cost=a["cost"], versions=dict(a["versions"], numpy="9.9"))
    kind, message = disagreement([a, newer])
    assert f"rank 10 runs numpy 9.9 (rank 4: {a['versions']['numpy']})" in message
    kind, message = disagreement([a, dict(b, cost=a["cost"])])
    assert "same code, versions and cost name" in message
    # Other costmodel code under the same version string is named by its source digest;
    # a version a rank does not report is "unknown", not a KeyError.
    other = dict(b, cost=a["cost"], versions={**a["versions"], "costmodel": "0.1.0 (source x)",
                                              "torch": "2.9"})
    kind, message = disagreement([dict(a, versions={"numpy": a["versions"]["numpy"]}), other])
    assert "rank 10 runs costmodel 0.1.0 (source x) (rank 4: unknown)" in message
    assert "rank 10 runs torch 2.9 (rank 4: unknown)" in message
    assert "(source " in a["versions"]["costmodel"]


def test_other_lengths_are_named_before_schedules():
    other = LENGTHS[:-1] + [1801]
    kind, message = disagreement([rank_record(_schedule(), LENGTHS),
                                  rank_record(_schedule("flops", other), other, rank=1)])
    assert kind == "lengths" and "rank(s) [1] hold other sample lengths" in message


def test_the_same_lengths_in_another_order_are_other_lengths():
    """A rank that adopted rank 0's schedule for a permutation of its lengths would run other
    samples than scheduled (over the cap, some twice): the order is part of the digest."""
    shuffled = LENGTHS[::-1]
    kind, _ = disagreement([rank_record(_schedule(), LENGTHS),
                            rank_record(_schedule(lengths=shuffled), shuffled, rank=1)])
    assert kind == "lengths"


def test_refuses_an_unknown_policy_and_a_missing_process_group():
    with pytest.raises(ValueError, match="on_mismatch must be one of"):
        agree_on_schedule(_schedule(), LENGTHS, on_mismatch="ignore")
    pytest.importorskip("torch.distributed")
    with pytest.raises(RuntimeError, match="needs torch.distributed initialised"):
        agree_on_schedule(_schedule(), LENGTHS)


_TWO_RANKS = """
import json, logging, sys
import torch.distributed as dist
import torch.multiprocessing as mp
sys.path.insert(0, sys.argv[2])
from tests.test_agree import LENGTHS, _schedule
from costmodel.integrations.agree import agree_on_schedule

class Kept(logging.Handler):
    def emit(self, record):
        self.last = record.getMessage()

def run(rank, init, out):
    kept = Kept()
    logging.getLogger("costmodel").addHandler(kept)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    other = LENGTHS[:-1] + [1801]
    cases = [  # (cost, lengths, on_mismatch) of rank 1; rank 0 balances tokens over LENGTHS
        ("tokens", LENGTHS, "adopt"), ("flops", LENGTHS, "adopt"), ("flops", LENGTHS, "raise"),
        ("tokens", other, "adopt"),
    ]
    for cost, lengths, policy in cases:
        if rank == 0:  # "adopt" always: rank 1 alone asking to raise makes both raise
            cost, lengths, policy = "tokens", LENGTHS, "adopt"
        mine = _schedule(cost, lengths)
        kept.last = None
        try:
            got = agree_on_schedule(mine, lengths, on_mismatch=policy)
            outcome = [got.digest(), got is mine, kept.last]
        except RuntimeError as exc:
            outcome = "RuntimeError: " + str(exc)
        with open(f"{out}.{rank}", "a") as f:
            f.write(json.dumps(outcome) + "\\n")
    solo = dist.new_group([0])  # rank 1 is outside it
    try:
        got = agree_on_schedule(_schedule(), LENGTHS, group=solo)
        outcome = [got.digest(), True, None]
    except ValueError as exc:
        outcome = "ValueError: " + str(exc)
    with open(f"{out}.{rank}", "a") as f:
        f.write(json.dumps(outcome) + "\\n")
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(run, nprocs=2, args=(sys.argv[1], sys.argv[3]))
"""


def test_two_gloo_ranks_adopt_rank_0s_schedule_or_raise_alike(tmp_path):
    """Rank 1 balancing FLOPs where rank 0 balances tokens (as a rank with another version
    or cost model file would): with "adopt" both run rank 0's schedule (rebuilt from plain
    lists) and each warns; with "raise" on rank 1 alone both raise (rank 0 waited in the
    broadcast once); other lengths raise even with "adopt"."""
    pytest.importorskip("torch.distributed")
    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "two_ranks.py"
    script.write_text(_TWO_RANKS)
    out = tmp_path / "outcomes"
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "init"), str(root), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    outcomes = [[json.loads(line) for line in Path(f"{out}.{rank}").read_text().splitlines()]
                for rank in (0, 1)]
    tokens = _schedule("tokens").digest()
    same, adopted, raised, other, outside = zip(*outcomes)
    assert outside == ([tokens, True, None],
                       "ValueError: rank 1 is not in the group given to agree_on_schedule: call "
                       "it on the group's ranks only")
    assert same == ([tokens, True, None], [tokens, True, None])  # each keeps its own object
    assert [a[:2] for a in adopted] == [[tokens, True], [tokens, False]]  # rank 1 runs rank 0's
    for warned in (a[2] for a in adopted):  # each rank warns
        assert "rank(s) [1] built another schedule than rank 0" in warned
        assert warned.endswith("every rank runs the schedule of rank 0 this step")
    for outcome in raised + other:
        assert outcome.startswith("RuntimeError: rank(s) [1]")
    assert "other sample lengths" in other[0] and "another schedule" in raised[1]
