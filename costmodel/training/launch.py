"""Launch the reference trainer on N local processes without torchrun (`costmodel train-demo`).

The parent validates everything first (`config.prepare` with dp = N), so a bad flag is one
line and a non-zero exit before any process starts. Then it spawns N workers with
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) and waits; rank 0 writes its step
records to a JSON file the parent reads back. The ranks meet through a file in the launch's
temporary directory, not a port: a port picked free by the parent can be taken by another
program before rank 0 binds it (parallel test runs did, now and then).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from costmodel.checks import import_torch
from costmodel.integrations.args import _LOADED_ATTR as LOADED_ATTR
from costmodel.interrupts import signals_interrupt
from costmodel.training.config import prepare
from costmodel.training.trainer import (
    LOG_TEMP_NOTE_ATTR,
    RENDEZVOUS_ATTR,
    device_kind,
    exit_rank,
    run_settings,
)

__all__ = ["launch"]

logger = logging.getLogger(__name__)


def _worker(local_rank: int, args: argparse.Namespace, nproc: int, out: str) -> None:
    # Interruptible by SIGINT even where the launching shell ignored it (a background job),
    # and by SIGTERM (the parent's, a scheduler's), so that rank 0 removes its half-written
    # log: the parent interrupts its workers when it is stopped itself (`_stop`).
    with signals_interrupt():
        _train_one_rank(local_rank, args, nproc, out)
    exit_rank(0)  # finished: no interpreter shutdown to abort it (`exit_rank`)


def _train_one_rank(local_rank: int, args: argparse.Namespace, nproc: int, out: str) -> None:
    os.environ.update(
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
    )
    # Sandboxes and containers often have no routable interface: keep gloo on loopback.
    if "GLOO_SOCKET_IFNAME" not in os.environ and Path("/sys/class/net/lo").exists():
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    logging.basicConfig(
        level=logging.INFO if local_rank == 0 else logging.WARNING,
        format=f"[rank {local_rank}] %(message)s",
        stream=sys.stderr,  # progress; the parent prints the results on stdout
        force=True,
    )
    from costmodel.training.trainer import train

    result = train(args)
    if local_rank == 0:
        Path(out).write_text(json.dumps([r.to_dict() for r in result.records]))


def _check_attention_runs(name: str, device: str, head_dim: int) -> None:
    """ValueError unless backend ``name`` runs on ``device`` here for the model's head dim and
    the dtype a run there takes (`run_settings`): otherwise every worker would fail, after
    start-up."""
    from costmodel.kernels.attention import get_attention
    from costmodel.kernels.layer import check_attention_support

    try:
        get_attention(name, device)
        check_attention_support(name, run_settings(device)[1], head_dim)
    except (RuntimeError, ValueError) as exc:
        hint = "; use --attention sdpa (the CPU default)" if device == "cpu" else ""
        raise ValueError(f"--attention {name}: {exc}{hint}") from None


def _worker_error(text: str) -> str:
    """The line of a worker's traceback that names its exception (torch's CUDA errors end
    in advice such as 'Compile with TORCH_USE_CUDA_DSA ...'), else its last line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    raised = [ln for ln in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b", ln)]
    return (raised or lines or ["(no message)"])[-1]


def launch(args: argparse.Namespace, nproc: int) -> list[dict[str, Any]]:
    """Train on ``nproc`` local processes; return rank 0's step records (dicts).

    Raises ValueError / FileNotFoundError for bad flags (before spawning) and RuntimeError
    when a worker fails (naming the rank and its error).
    """
    if nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {nproc}")
    torch = import_torch("train-demo")
    import torch.multiprocessing as mp

    device = device_kind(args.device)
    if device == "cuda" and nproc > torch.cuda.device_count():
        raise ValueError(
            f"--nproc {nproc} but only {torch.cuda.device_count()} GPUs are visible; "
            "lower --nproc or use --device cpu"
        )
    args.device = device
    _, _, dtype_name, default_attention = run_settings(device)
    prepare(args, nproc, dtype=dtype_name)
    # The backend the workers will use (the default too), checked here: one line, not a
    # failure in every worker after CUDA and NCCL start-up.
    _check_attention_runs(args.attention or default_attention, device, args.head_dim)
    # Workers validate and load again on their own: pass the flags, not loaded objects.
    clean = argparse.Namespace(**vars(args))
    vars(clean).pop(LOADED_ATTR, None)
    clean.func = None
    with tempfile.TemporaryDirectory(prefix="costmodel-train-") as tmp:
        out = str(Path(tmp) / "records.json")
        note = Path(tmp) / "log-temp-path"
        setattr(clean, LOG_TEMP_NOTE_ATTR, str(note))
        setattr(clean, RENDEZVOUS_ATTR, f"file://{Path(tmp).resolve() / 'rendezvous'}")
        try:
            try:
                with signals_interrupt():  # SIGTERM too stops the workers first, not orphans them
                    _join(_start(clean, nproc, out))
            finally:  # rank 0's half-written log, should it have been killed (else renamed)
                _remove_noted_file(note)
        except mp.ProcessRaisedException as err:
            logger.info("rank %d failed:\n%s", err.error_index, err)  # the traceback, with -v
            raise RuntimeError(f"rank {err.error_index} failed: {_worker_error(str(err))}") from None
        except mp.ProcessExitedException as err:
            message = _exited_message(err.error_index, err.exit_code, err.signal_name)
            raise RuntimeError(message) from None
        return json.loads(Path(out).read_text())


def _exited_message(rank: int, exit_code: int, signal_name: str | None) -> str:
    """What to say of a worker that exited without raising: its code, and the signal that
    killed it if one did (an exit of its own, os._exit(3), has none: it said 'signal None')."""
    killed = f" (signal {signal_name})" if signal_name else ""
    return f"rank {rank} exited with code {exit_code}{killed} before finishing"


def _start(args: argparse.Namespace, nproc: int, out: str):
    """Spawn the workers (torch's process context). Interrupted while spawning (seconds on
    a small machine), stop those already started: the launcher would otherwise wait at exit
    for workers that wait for peers that never come."""
    import multiprocessing

    import torch.multiprocessing as mp

    others = set(multiprocessing.active_children())  # a caller's own children stay
    try:
        return mp.start_processes(_worker, args=(args, nproc, out), nprocs=nproc,
                                  join=False, start_method="spawn")
    except BaseException:
        _stop([p for p in multiprocessing.active_children() if p not in others])
        raise


def _remove_noted_file(note: Path) -> None:
    """Remove the file whose path ``note`` holds, if both are there."""
    with contextlib.suppress(FileNotFoundError):
        Path(note.read_text()).unlink()


def _join(context) -> None:
    """Wait for every worker. Interrupted (Ctrl-C, SIGTERM, or a signal to this process
    alone) or failed, stop them first: exiting would otherwise wait for workers that train
    on as orphans."""
    try:
        while not context.join():
            pass
    except BaseException:
        _stop(context.processes)
        raise


# How `_stop` escalates: each signal to every live worker, then up to this many seconds
# (one deadline for all) for them to exit.
_ESCALATION = ((signal.SIGINT, 10.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0))


def _stop(processes: list) -> None:
    """Stop ``processes``: an interrupt first, so that each cleans up (rank 0's half-written
    log), then SIGTERM, then SIGKILL for one blocked in C (a collective a dead peer never
    joins ignores both). A repeated Ctrl-C or SIGTERM meanwhile kills them at once."""
    def kill_now(signum, frame):
        _signal_all(processes, signal.SIGKILL)

    main = threading.current_thread() is threading.main_thread()  # handlers: main thread only
    previous = {sig: signal.signal(sig, kill_now) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        for signum, wait_s in _ESCALATION:
            alive = _signal_all(processes, signum)
            if not alive:
                return
            deadline = time.monotonic() + wait_s
            for process in alive:
                process.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal_all(processes: list, signum: int) -> list:
    """Send ``signum`` to each of ``processes`` still alive; return those."""
    alive = [process for process in processes if process.is_alive()]
    for process in alive:
        with contextlib.suppress(ProcessLookupError):  # exited just now
            os.kill(process.pid, signum)
    return alive
