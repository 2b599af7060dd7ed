"""The per-rank training loop of the reference trainer (torch.distributed data parallel).

One process per rank (launched by `torchrun` or by `costmodel train-demo`). Each rank:

1. validates the flags and builds every step's schedule on its own (`config.prepare`),
   before any training, so bad input never stops a run mid-step; then all-gathers whether
   that went well, so that a rank whose flags or files fail alone (a cost model or lengths
   file missing on its node) stops every rank with its reason, instead of leaving them
   waiting for it in the group's rendezvous (under a launcher that does not stop them for
   it: ranks started by hand, torchrun on several nodes);
2. before anything else, all-gathers a fingerprint of the whole run (model shape, seed,
   learning rate, every step's schedule) and stops on every rank if any differs: ranks
   started with different flags or lengths files, caught before a weight is shared (they
   hung in a collective, or agreed on step 1 and failed at a later step); then, per step,
   all-gathers the schedule's digest and stops with a clear error if any rank computed a
   different assignment;
3. runs its micro-batches as packed varlen sequences, forward and backward, with the loss
   summed over tokens and divided by the step's *global* target-token count — the summed
   gradient over ranks is then the gradient of the global mean loss, whatever the partition;
4. all-reduces the gradients (one flat buffer, once per step: the no_sync pattern), steps
   the optimizer, and all-gathers per-rank compute times for the imbalance figures.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from costmodel.calibration.runs_file import run_line
from costmodel.flops import sequence_fwd_flops
from costmodel.model_file import atomic_output
from costmodel.training.config import Plan, group_timeout_s, prepare
from costmodel.training.data import sample_tokens

__all__ = [
    "StepRecord", "TrainResult", "check_run_agreement", "check_schedule_agreement", "digest_to_int",
    "exit_rank", "run_fingerprint", "train",
]

logger = logging.getLogger(__name__)

# Set on args by the launcher: a file where rank 0 writes its --log-json temp file's path,
# so that the launcher removes it if rank 0 has to be killed (no cleanup of its own runs).
LOG_TEMP_NOTE_ATTR = "_costmodel_log_temp_note"
# Set by train-demo's launcher: the init method (a file:// URL in its temporary directory)
# its ranks meet through, in place of torchrun's MASTER_ADDR/MASTER_PORT.
RENDEZVOUS_ATTR = "_costmodel_rendezvous"


@dataclass(kw_only=True)
class StepRecord:
    """What rank 0 logs for one step."""

    step: int
    loss: float
    """Global mean next-token loss (over every target token of the step)."""
    tokens: int
    microbatches_per_rank: int
    compute_ms: list[float]
    """Per rank: forward+backward time of its micro-batches (no communication)."""
    measured_imbalance: float
    """max/mean of compute_ms."""
    predicted_costs: list[float]
    """Per rank: the schedule's predicted cost (in the balanced cost's unit)."""
    predicted_imbalance: float
    """max/mean of predicted_costs."""
    flops_imbalance: float
    """max/mean of the ranks' analytic training FLOPs: one yardstick for every policy (the
    predicted figure judges each by its own cost, so token balance predicts 1.000)."""
    cost: str
    digest: str
    schedules_agree: bool = True

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(kw_only=True)
class TrainResult:
    rank: int
    world_size: int
    records: list[StepRecord] = field(default_factory=list)
    model: Any = field(default=None, repr=False)
    """The trained `TinyGPT` (this rank's replica)."""

    @property
    def first_loss(self) -> float:
        return self.records[0].loss

    @property
    def last_loss(self) -> float:
        return self.records[-1].loss


def digest_to_int(digest: str) -> int:
    """A schedule digest as a non-negative int64, for an all-gather of tensors."""
    return int(hashlib.sha256(str(digest).encode()).hexdigest()[:15], 16)


def run_fingerprint(args: argparse.Namespace, plan: Plan) -> str:
    """What every rank of one run must agree on: the model shape, the seed (data and
    weights), the learning rate, every step's lengths and schedule (so the steps, cap and
    cost too). A schedule's digest names sample indices only: ranks with other lengths
    can build the same one."""
    lengths = hashlib.sha256()
    for step in plan.lengths:
        lengths.update(np.ascontiguousarray(step, dtype=np.int64).tobytes() + b"|")
    doc = {"spec": plan.spec.fingerprint(), "seed": args.seed, "lr": args.lr,
           "lengths": lengths.hexdigest(), "schedules": [str(s.digest()) for s in plan.schedules]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def check_run_agreement(fingerprints: list[int]) -> None:
    """Raise RuntimeError, on every rank alike, when the ranks' run fingerprints differ."""
    if len(set(fingerprints)) > 1:
        first = fingerprints[0]
        differ = [r for r, f in enumerate(fingerprints) if f != first]
        raise RuntimeError(
            f"rank(s) {differ} were started with another run than rank 0 (model shape, seed, "
            "learning rate, steps, lengths, cap or cost differ): start every rank with the same "
            "command and lengths file"
        )


def check_schedule_agreement(digests: list[int], step: int) -> None:
    """Raise RuntimeError when the ranks' schedule digests differ at ``step`` (0-based; said
    1-based, as the step log counts)."""
    if len(set(digests)) > 1:
        per_rank = ", ".join(f"rank {r}: {d:x}" for r, d in enumerate(digests))
        raise RuntimeError(
            f"step {step + 1}: the ranks built different schedules ({per_rank}); every rank must "
            "run the same costmodel version with the same flags, lengths and cost model"
        )


def _max_over_mean(values: list[float]) -> float:
    mean = float(np.mean(values))
    return float(np.max(values) / mean) if mean > 0 else 1.0


def device_kind(requested: str) -> str:
    """'cuda' or 'cpu' for --device auto|cuda|cpu; RuntimeError when CUDA is asked for but absent."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but no CUDA GPU is visible; use --device cpu")
    return requested


def run_settings(device: str):
    """What a run on ``device`` ("cuda" or "cpu") takes: (process-group backend, torch dtype,
    its name, the attention backend without --attention): nccl, bf16 and torch's varlen
    kernel on a GPU; gloo, fp32 and SDPA (per sequence) on CPU."""
    import torch

    if device == "cuda":
        return "nccl", torch.bfloat16, "bf16", "torch-varlen"
    return "gloo", torch.float32, "fp32", "sdpa"


def _resolve_device(args: argparse.Namespace, local_rank: int):
    import torch

    kind = device_kind(args.device)
    backend, dtype, dtype_name, attention = run_settings(kind)
    if kind == "cuda":
        per_node = _env_int("LOCAL_WORLD_SIZE", 1)
        if per_node > torch.cuda.device_count():
            raise RuntimeError(
                f"{per_node} ranks per node but {torch.cuda.device_count()} visible GPU(s): NCCL "
                "needs a GPU per rank; lower --nproc_per_node (or use --device cpu)"
            )
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    return device, backend, dtype, dtype_name, args.attention or attention


def _microbatch(args: argparse.Namespace, plan: Plan, step: int, mb, device):
    """The packed tensors of micro-batch ``mb`` (sample indices) of ``step``."""
    from costmodel.training.model import packed_batch

    lengths = plan.lengths[step]
    return packed_batch(
        [sample_tokens(args.seed, step, int(i), int(lengths[i]), plan.spec.vocab_size) for i in mb],
        device=device,
    )


def _warm_up(model, plan: Plan, args: argparse.Namespace, device, rank: int, *,
             variants: bool | None = None) -> None:
    """Untimed forward+backward passes, gradients dropped: kernel compilation and library
    start-up stay out of the steps' timings. This rank's first micro-batch, and with
    ``variants`` (default: on a GPU; Triton's CPU interpreter compiles nothing)
    micro-batches of every token-count class Triton compiles a kernel variant for (a
    variant first met in a timed step cost about a second there: max/mean ~2)."""
    import torch

    from costmodel.kernels import TRITON_VARIANT_LENGTHS
    from costmodel.training.model import packed_batch

    mb = plan.schedules[0].microbatches[rank][0] if plan.schedules else []
    batches = [_microbatch(args, plan, 0, mb, device)] if mb else []
    if device.type == "cuda" if variants is None else variants:
        vocab = plan.spec.vocab_size
        batches += [packed_batch([sample_tokens(args.seed, 0, 0, n, vocab) for n in lengths],
                                 device=device) for lengths in TRITON_VARIANT_LENGTHS]
    for ids, _, cu_seqlens, max_seqlen in batches:
        model(ids, cu_seqlens, max_seqlen).float().sum().backward()
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None else int(value)


def train(args: argparse.Namespace) -> TrainResult:
    """Run this process's rank of the job described by ``args`` (torchrun's environment).

    RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT come from the environment (a single
    process when they are absent). Returns the per-step records (complete on rank 0) and
    this rank's trained model.
    """
    import torch.distributed as dist

    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", rank)
    device, backend, dtype, spec_dtype, attention = _resolve_device(args, local_rank)
    own_group = not dist.is_initialized()
    if own_group:
        init_method = getattr(args, RENDEZVOUS_ATTR, None)  # None: torchrun's env://
        if init_method is None and "MASTER_PORT" not in os.environ:  # no torchrun
            if world > 1:
                raise RuntimeError(
                    f"WORLD_SIZE={world} but MASTER_PORT is not set: launch the ranks with "
                    "torchrun (or set MASTER_ADDR and MASTER_PORT on every rank)"
                )
            # A lone process meets no one: an in-memory store, no port to pick or lose.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            _join_group(backend, init_method, rank, world, group_timeout_s(args))
    try:
        # Every check, before any training; a rank that fails tells the others (they would
        # wait for it in the group's first collective, or in its rendezvous had it stopped
        # before joining it).
        plan = _prepare_on_every_rank(args, world, dtype_name=spec_dtype, attention=attention,
                                      device=device)
        result = _train_loop(args, plan, device=device, dtype=dtype, attention=attention)
        if own_group and world > 1:
            # Leave together: a rank that tears gloo down while its peer still talks to it
            # can abort the peer at exit ("terminate called without an active exception",
            # seen on a loaded 2-core machine in 2 of 17 runs). Only after success: a rank
            # that failed never arrives, and its launcher (torchrun, train-demo) stops the
            # others rather than leave them in this barrier.
            dist.barrier()
        return result
    finally:
        if own_group and dist.is_initialized():
            dist.destroy_process_group()


def _join_group(backend: str, init_method: str | None, rank: int, world: int,
                timeout_s: float) -> None:
    """Join the ranks' process group, or stop saying what to do: a peer that never joins (it
    died at start, or was never started where ranks start by hand) ends the wait after
    ``timeout_s``, where torch says "Wait timeout" alone."""
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as exc:  # a timeout, a refused address, a port in use: all said the same way
        raise RuntimeError(
            f"could not meet the other {world - 1} rank(s) of the process group "
            f"within {timeout_s:g} s ({type(exc).__name__}: {_one_line(exc)}): start every rank "
            "with the same MASTER_ADDR and MASTER_PORT (torchrun starts them together), or "
            "raise --group-timeout-s if they start far apart"
        ) from exc


def exit_rank(code: int) -> NoReturn:
    """End this rank's process with ``code`` at once, skipping the interpreter's shutdown.

    What the run writes is written by then (its logs are flushed here). Shutting down after
    a finished two-rank run, torch's gloo teardown now and then aborts a rank ("terminate
    called without an active exception", SIGABRT): 1 of 40 `train-demo --nproc 2` runs on the
    loaded 2-core dev machine (and a CI run), after the rank had destroyed its process group
    and returned, its only thread in no Python frame (faulthandler). A finished run would
    read as a failed one."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _prepare_on_every_rank(args: argparse.Namespace, world: int, *, dtype_name: str,
                           attention: str, device) -> Plan:
    """`config.prepare` and the attention backend's check on this rank, then one all-gather
    of how they went. A rank that failed raises its own error; the others a RuntimeError
    naming it and its error, so every rank stops before training with the reason (a rank
    that stopped before joining the group leaves the others waiting for it in the rendezvous
    until --group-timeout-s, where no launcher stops them)."""
    import torch.distributed as dist

    from costmodel.kernels.attention import get_attention

    error: Exception | None = None
    try:
        plan = prepare(args, world, dtype=dtype_name)
        get_attention(attention, device.type)  # unusable on this device: says how to fix it
    except Exception as exc:  # any: the other ranks must hear of it, not wait
        error = exc
    failed: list[tuple[int, str]] = []
    if world > 1:
        said: list[Any] = [None] * world
        dist.all_gather_object(said, None if error is None else _one_line(error))
        failed = [(r, m) for r, m in enumerate(said) if m is not None]
    if error is not None:
        raise error
    if failed:
        rank, message = failed[0]
        more = f" (rank(s) {[r for r, _ in failed[1:]]} failed too)" if len(failed) > 1 else ""
        raise RuntimeError(f"rank {rank} stopped before training: {message}{more}")
    return plan


def _one_line(error: BaseException) -> str:
    """``error`` as one line: its message, else its type's name."""
    text = " ".join(str(error).split())
    return text or type(error).__name__


def _all_gather_int(value: int, world: int, device) -> list[int]:
    """Every rank's ``value`` (an int64), in rank order."""
    import torch
    import torch.distributed as dist

    mine = torch.tensor([value], dtype=torch.int64, device=device)
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    return [int(t.item()) for t in gathered]


def move_grads_into(accum: list, params: list) -> None:
    """Add each parameter's .grad into its (fp32) buffer in ``accum`` and clear it, so the
    next micro-batch's backward starts from zero instead of summing in the model's dtype."""
    for buf, p in zip(accum, params):
        if p.grad is not None:
            buf += p.grad
            p.grad = None


def _train_loop(args, plan: Plan, *, device, dtype, attention: str) -> TrainResult:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from costmodel.training.model import TinyGPT

    rank, world = dist.get_rank(), dist.get_world_size()
    check_run_agreement(_all_gather_int(digest_to_int(run_fingerprint(args, plan)), world, device))
    torch.manual_seed(args.seed)
    model = TinyGPT(plan.spec, attention=attention, device=device, dtype=dtype)
    for p in model.parameters():  # same weights everywhere even if init ever drew per rank
        dist.broadcast(p.data, src=0)
    params = [p for p in model.parameters() if p.requires_grad]
    # fp32 master weights and optimizer state when the model computes in bf16: a bf16
    # parameter near 1.0 moves in steps of 2^-7, so Adam's small updates would round away.
    master = params if dtype == torch.float32 else [p.detach().float() for p in params]
    optimizer = torch.optim.AdamW(master, lr=args.lr, weight_decay=0.0)
    _warm_up(model, plan, args, device, rank)
    cuda = device.type == "cuda"
    result = TrainResult(rank=rank, world_size=world, model=model)
    record_runs = rank == 0 and getattr(args, "record_runs", None)
    runs: list[str] = []  # every rank's step as a measured run (--record-runs)
    with contextlib.ExitStack() as stack:
        log_file = None
        if args.log_json and rank == 0:
            # Written to a temp file beside it and renamed when the run ends: an interrupted
            # run leaves the previous log whole, not a truncated one (each step is logged).
            tmp = stack.enter_context(atomic_output(args.log_json))
            note = getattr(args, LOG_TEMP_NOTE_ATTR, None)
            if note:  # for the launcher, should this rank be killed
                Path(note).write_text(str(tmp))
            log_file = stack.enter_context(open(tmp, "w"))
        for step, (lengths, schedule) in enumerate(zip(plan.lengths, plan.schedules)):
            digest = str(schedule.digest())
            check_schedule_agreement(_all_gather_int(digest_to_int(digest), world, device), step)

            # Target tokens of the whole step: the loss is a sum over this rank's tokens
            # divided by it, so Σ over ranks of the gradients is the global mean's gradient.
            global_targets = int(np.maximum(lengths - 1, 0).sum())
            batches = [_microbatch(args, plan, step, mb, device) for mb in schedule.microbatches[rank]]
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            loss_sum = torch.zeros((), dtype=torch.float32, device=device)
            # bf16 models: gradients summed over micro-batches in fp32 (Megatron's main_grad);
            # summed in the bf16 .grad, 64 micro-batches drifted 0.84% from the fp32 sum.
            accum = None if master is params else [torch.zeros_like(m) for m in master]
            for ids, targets, cu_seqlens, max_seqlen in batches:
                logits = model(ids, cu_seqlens, max_seqlen)
                loss = F.cross_entropy(logits.float(), targets, ignore_index=-100, reduction="sum")
                (loss / global_targets).backward()
                loss_sum += loss.detach()
                if accum is not None:
                    move_grads_into(accum, params)
            if cuda:
                torch.cuda.synchronize(device)
            compute_ms = (time.perf_counter() - start) * 1e3

            # One fp32 all-reduce of every gradient (bf16 sums lose precision with ranks).
            grads = accum or [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.reshape(-1).float() for g in grads])
            dist.all_reduce(flat)
            offset = 0
            for m, g in zip(master, grads):
                n = g.numel()
                m.grad = flat[offset : offset + n].view_as(m).clone()
                offset += n
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if master is not params:
                with torch.no_grad():
                    for p, m in zip(params, master):
                        p.copy_(m)
                        p.grad = None

            stats = torch.tensor([compute_ms, float(loss_sum)], dtype=torch.float64, device=device)
            all_stats = [torch.zeros_like(stats) for _ in range(world)]
            dist.all_gather(all_stats, stats)
            per_rank = [t.tolist() for t in all_stats]
            times = [row[0] for row in per_rank]
            predicted = [float(c) for c in schedule.rank_costs]
            sample_flops = sequence_fwd_flops(lengths, plan.spec)
            rank_flops = [float(sum(sample_flops[i] for mb in mbs for i in mb))
                          for mbs in schedule.microbatches]
            record = StepRecord(
                step=step,
                loss=sum(row[1] for row in per_rank) / global_targets,
                tokens=int(lengths.sum()),
                microbatches_per_rank=len(schedule.microbatches[rank]),
                compute_ms=times,
                measured_imbalance=_max_over_mean(times),
                predicted_costs=predicted,
                predicted_imbalance=_max_over_mean(predicted),
                flops_imbalance=_max_over_mean(rank_flops),
                cost=plan.cost_label,
                digest=digest,
            )
            result.records.append(record)
            if record_runs:  # rank 0 writes them all at the end
                runs += [run_line([[int(lengths[i]) for i in mb] for mb in mbs], ms)
                         for mbs, ms in zip(schedule.microbatches, times)]
            if rank == 0:
                logger.info(
                    "step %d/%d loss %.4f tokens %d mb/rank %d | compute ms %s | max/mean "
                    "measured %.3f predicted %.3f (%s) flops %.3f | schedule %s agreed by %d "
                    "ranks",
                    step + 1, len(plan.schedules), record.loss, record.tokens,
                    record.microbatches_per_rank, " ".join(f"{t:.1f}" for t in times),
                    record.measured_imbalance, record.predicted_imbalance, record.cost,
                    record.flops_imbalance, digest[:12], world,
                )
                if log_file is not None:
                    log_file.write(json.dumps(record.to_dict()) + "\n")
    if record_runs:
        with atomic_output(record_runs) as tmp:
            tmp.write_text("".join(line + "\n" for line in runs))
    if rank == 0 and result.records:
        logger.info(
            "done: loss %.4f -> %.4f over %d steps; schedules agreed on every step; "
            "mean max/mean measured %.3f, predicted %.3f, flops %.3f",
            result.first_loss, result.last_loss, len(result.records),
            float(np.mean([r.measured_imbalance for r in result.records])),
            float(np.mean([r.predicted_imbalance for r in result.records])),
            float(np.mean([r.flops_imbalance for r in result.records])),
        )
    return result
