"""verl's batch as `rearrange_micro_batches` reads it: each sequence's tokens (from the
``attention_mask``, or the rows of a nested ``input_ids``) and the rows of each micro-batch
(a TensorDict, or a plain dict entry by entry).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.checks import refuse_meta

__all__ = ["batch_lengths", "check_dict_rows", "select_rows"]


def batch_lengths(batch: Any) -> np.ndarray:
    """Tokens per sequence of verl's batch, as verl counts them."""
    # keys(): membership on a TensorDict itself is not supported in every release
    keys = set(batch.keys()) if callable(getattr(batch, "keys", None)) else set()
    input_ids = batch["input_ids"] if "input_ids" in keys else None
    if input_ids is not None and getattr(input_ids, "is_nested", False):
        lengths = _nested_lengths(input_ids)
        empty_row = "an empty row of the nested input_ids"
    else:
        empty_row = "an all-zero attention_mask"
        mask = batch["attention_mask"] if "attention_mask" in keys else None
        if mask is None or getattr(mask, "ndim", 0) != 2 or not hasattr(mask, "sum"):
            found = (f"an attention_mask of shape {tuple(getattr(mask, 'shape', ()))}"
                     if mask is not None else f"keys {sorted(map(str, keys))[:8]}")
            raise ValueError(
                "batch must be verl's TensorDict (or a dict of tensors) with a 2-D "
                f"attention_mask (batch × sequence) or a nested input_ids; got "
                f"{type(batch).__name__} with {found}"
            )
        refuse_meta(mask, "attention_mask", "tokens to count",
                    "give the batch with its real attention_mask")
        if bool(((mask != 0) & (mask != 1)).any()):  # 0.5 or -1 summed to a wrong length
            raise ValueError("attention_mask must hold 0 and 1 only (1: a token of the "
                             "sequence); got other values")
        # Counted in int64: a half-precision mask summed in its own dtype rounds (bf16 read
        # a row of 5,000 tokens as 4,992; fp16 4,001 as 4,000).
        if hasattr(mask, "cpu"):
            import torch

            lengths = mask.sum(dim=1, dtype=torch.int64)
        else:
            lengths = np.asarray(mask).sum(axis=1, dtype=np.int64)
    lengths = np.asarray(lengths.tolist(), dtype=np.int64)
    empty = np.flatnonzero(lengths < 1)
    if empty.size:
        raise ValueError(f"row {int(empty[0])} of the batch has no tokens ({empty_row}; "
                         f"{empty.size} such rows): drop empty rows before "
                         "rearrange_micro_batches")
    return lengths


def _nested_lengths(input_ids: Any) -> np.ndarray:
    """Tokens in each row of a nested ``input_ids``, in either of torch's layouts: jagged
    from its offsets (or its lengths, where it has holes), strided (torch's default) a row
    at a time, as it has neither offsets() (AttributeError) nor a shape ("Internal error
    ... Please file an issue")."""
    import torch

    refuse_meta(input_ids, "input_ids", "tokens to count",
                "give the batch with its real input_ids")
    if input_ids.layout == torch.jagged:  # 0.4 ms at 4,096 rows; unbind takes 22
        # A jagged view with holes (torch.nested.narrow) keeps its base's offsets: their
        # differences are the base's rows (10 tokens for a row of 2), its lengths() the rows'.
        lengths = input_ids.lengths()
        lengths = input_ids.offsets().diff() if lengths is None else lengths
        return np.asarray(lengths.tolist(), dtype=np.int64)
    return np.asarray([row.shape[0] for row in input_ids.unbind()], dtype=np.int64)


def select_rows(batch: Any, idx: list[int]) -> Any:
    """The rows ``idx`` of verl's batch: verl's own helper when it has one (it handles
    nested tensors), else TensorDict indexing; a plain dict entry by entry."""
    import torch

    if isinstance(batch, dict):
        return {k: _entry_rows(v, idx) for k, v in batch.items()}
    try:
        from verl.utils.tensordict_utils import index_select_tensor_dict
    except ImportError:
        return batch[torch.as_tensor(idx, dtype=torch.long)]
    return index_select_tensor_dict(batch, idx)


def _has_rows(value: Any) -> bool:
    """Whether an entry of a plain dict batch holds one row per sequence (a tensor or array
    of one dimension or more, a list, a tuple), not one value for the whole batch (a
    string, a number, a 0-d tensor, None)."""
    return isinstance(value, (list, tuple)) or (getattr(value, "ndim", 0) >= 1
                                                and hasattr(value, "__getitem__"))


def check_dict_rows(batch: Any, rows: int, where: str = "batch") -> None:
    """ValueError unless every entry of a plain dict batch with rows has ``rows`` of them
    (a TensorDict checks its own batch size). Another count was indexed silently (more
    rows) or raised IndexError in `select_rows`, after the ranks had agreed (fewer)."""
    if not isinstance(batch, dict):
        return
    for key, value in batch.items():
        name = f"{where}[{key!r}]"
        if isinstance(value, dict):
            check_dict_rows(value, rows, name)
        elif _has_rows(value) and _row_count(value) != rows:
            raise ValueError(f"{name} has {_row_count(value)} rows, but the batch has {rows} "
                             "sequences (its attention_mask's rows): give each entry one row "
                             "per sequence, or one value for the whole batch")


def _row_count(value: Any) -> int:
    """Rows of an entry with rows; len() of a strided nested tensor reads its shape, which
    that layout does not have (torch's "Internal error ... Please file an issue")."""
    return value.size(0) if getattr(value, "is_nested", False) else len(value)


def _entry_rows(value: Any, idx: list[int]) -> Any:
    """The rows ``idx`` of one entry of a plain dict batch, of the entry's own type; a value
    for the whole batch as it is."""
    import torch

    if isinstance(value, dict):
        return {k: _entry_rows(v, idx) for k, v in value.items()}
    if not _has_rows(value):
        return value
    if isinstance(value, (list, tuple)):  # an index tensor raised TypeError on these
        picked = [value[i] for i in idx]
        return picked if isinstance(value, list) else tuple(picked)
    if getattr(value, "is_nested", False):  # nested tensors take no index tensor
        return torch.nested.as_nested_tensor([value[i] for i in idx], layout=value.layout)
    if isinstance(value, np.ndarray):  # numpy reads a one-element tensor as a scalar index:
        return value[np.asarray(idx, dtype=np.intp)]  # a one-row micro-batch lost its axis
    return value[torch.as_tensor(idx, dtype=torch.long)]
