"""Checks of scalar arguments shared by the library's entry points (numpy/stdlib only)."""

from __future__ import annotations

import contextlib
import difflib
import numbers
import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, SupportsInt, cast

import numpy as np

__all__ = ["cost_model_choice", "did_you_mean", "import_torch", "on_off", "plain_scalar",
           "positive_int", "signed_digits", "whole_number"]

# Past this many significant digits a number is no count or length; int() itself refuses
# past 4,300 digits with a message naming its own limit.
MAX_DIGITS = 100


def did_you_mean(name: Any, choices: Iterable[str]) -> str:
    """"did you mean 'x'? " for the choice nearest a misspelt name, else "" (for messages
    that list every choice after it: the likely fix first)."""
    close = difflib.get_close_matches(str(name).strip().lower(), list(choices), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def positive_int(value: Any, name: str) -> int:
    """``value`` as an int >= 1; numpy integers too. ValueError naming ``name`` for 0, -1,
    2.5, "4" and True (which int() would take as 2, 4 and 1)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def on_off(value: Any, name: str) -> bool:
    """A switch from a flag or a config: None, a bool (numpy's too) or the integers 0 and 1
    (YAML and int-typed configs). ValueError naming ``name`` otherwise: the string "False"
    would read as on."""
    value = plain_scalar(value)
    if value is None:
        return False
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise ValueError(f"{name} must be true or false, got {value!r:.60}")


def true_or_false(value: Any, name: str) -> bool:
    """A switch of the Python API: True or False (numpy's too). ValueError naming ``name``
    otherwise: "no" or "False" would read as on."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r:.40}")
    return bool(value)


# ASCII digits only: int() also takes "8_192" and other scripts' digits ("٨١٩٢").
_DIGITS = re.compile(r"([+-]?)([0-9]+)")


def signed_digits(text: str) -> tuple[str, str] | None:
    """``text`` as its sign ("-" or "") and significant ASCII digits ("0" for zero), or
    None when it is not an optionally signed run of ASCII digits. Callers compare
    ``len(digits)`` with `MAX_DIGITS` before int(), each naming what the number was."""
    match = _DIGITS.fullmatch(text)
    if match is None:
        return None
    sign, digits = match.groups()
    return ("-" if sign == "-" else ""), digits.lstrip("0") or "0"


def whole_number(value: Any, name: str) -> int:
    """A count from a flag or a config: an integer, a whole float, Decimal or Fraction, a 0-d
    array, or its digits as text. ValueError naming ``name`` for a switch, other text or a
    fraction (Decimal("8192.7") became 8192)."""
    value = plain_scalar(value)
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a whole number, got {value!r:.60}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, (numbers.Rational, Decimal, float, np.floating)):
        # typeshed's numbers.Rational promises no int(); Fraction and the rest convert
        number = cast(SupportsInt, value)
        with contextlib.suppress(ValueError, OverflowError):  # nan, inf
            if number == int(number):
                return int(number)
    parts = signed_digits(value.strip()) if isinstance(value, str) else None
    if parts:
        if len(parts[1]) > MAX_DIGITS:
            raise ValueError(f"{name} is a {len(parts[1])}-digit number, far above any count")
        return int("".join(parts))
    raise ValueError(f"{name} must be a whole number, got {value!r:.60}")


def plain_scalar(value: Any) -> Any:
    """A 0-d numpy array or torch tensor as its Python value; anything else as it is."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return value


def cost_model_choice(value: Any, name: str) -> Any:
    """A cost model flag's value as given (a path, a shipped name, a CostModel), or None when
    unset: None, or false / 0 from a config. ValueError naming ``name`` for an empty string
    (it balanced FLOPs) or a config's ``true`` or other number."""
    if isinstance(value, (bool, np.bool_, numbers.Number)):
        if value:
            raise ValueError(f"{name} is {value!r}: give a cost model file or a shipped name "
                             "such as h200/qwen3-8b (false or unset: none)")
        return None
    if value is not None and not str(value).strip():
        raise ValueError(f"{name} is empty: give a cost model file or a shipped name such as "
                         "h200/qwen3-8b, or leave it out to balance analytic FLOPs")
    return value


def refuse_meta(value: Any, what: str, holds: str, instead: str) -> None:
    """A ValueError, "``what`` is a meta tensor, which holds no ``holds``: ``instead``", for
    a torch tensor on the meta device (a shape, no data), where torch's own error says only
    "Cannot copy out of meta tensor; no data!" or "item() cannot be called on meta tensors"."""
    if getattr(value, "is_meta", False):
        raise ValueError(f"{what} is a meta tensor, which holds no {holds}: {instead}")


def import_torch(what: str):
    """The torch module, or a RuntimeError saying that ``what`` needs it and how to get it
    (the package's base install is numpy and scipy only)."""
    try:
        import torch
    except ImportError as err:
        if isinstance(err, ModuleNotFoundError) and err.name == "torch":
            raise RuntimeError(
                f"{what} needs PyTorch, and torch is not installed: pip install "
                "'costmodel[gpu]' (or a torch build for your CUDA version from "
                "https://pytorch.org/get-started/locally/)"
            ) from None
        # torch is there, but something it loads is not (a CUDA library, say)
        raise RuntimeError(f"{what} needs PyTorch, and importing torch failed: {err}") from err
    return torch
