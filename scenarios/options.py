"""Parsing of scenario options shared by every scenario: lists, integers, dtypes, the device.

Each parser raises ValueError with one line that starts with the option's flag, so the CLI can print
it as it is. `None` means "not given" (the caller's default applies); anything else, the empty
string included, is parsed and must be valid: an empty `--batch ""` is an error, never the default.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import torch

_CUDA_DEVICE = re.compile(r"^cuda(:\d+)?$")


def given(value: Any, default: Any) -> Any:
    """`value` unless it was not given (None); unlike `value or default`, 0 and "" stay themselves."""
    return default if value is None else value


def split_list(value: str | list | tuple | None, flag: str) -> list[str]:
    """Items of a comma list; an empty list, an empty item (`2,,4`) or a repeated item is an error
    (a repeated item would run the same case twice)."""
    if value is None:
        return []
    raw = list(value) if isinstance(value, list | tuple) else str(value).split(",")
    items = [str(x).strip() for x in raw]
    if not any(items):
        raise ValueError(f"{flag} is empty")
    if not all(items):
        raise ValueError(f"{flag} has an empty item in {','.join(items)!r}")
    repeated = sorted({x for x in items if items.count(x) > 1})
    if repeated:
        raise ValueError(f"{flag} lists {repeated[0]!r} more than once")
    return items


def parse_int(value: Any, flag: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer in `[lo, hi]` (either bound optional)."""
    try:
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise ValueError(f"{flag} takes an integer, got {value!r}") from None
    if lo is not None and number < lo:
        raise ValueError(f"{flag} must be >= {lo}, got {number}")
    if hi is not None and number > hi:
        raise ValueError(f"{flag} must be <= {hi}, got {number}")
    return number


def parse_int_list(value: Any, flag: str, lo: int | None = None, hi: int | None = None) -> list[int]:
    return [parse_int(x, flag, lo, hi) for x in split_list(value, flag)]


def parse_batches(value: Any) -> list[int]:
    """`--batch`: a comma list of batch sizes >= 1."""
    return parse_int_list(value, "--batch", lo=1)


def parse_positive_float(value: Any, flag: str) -> float:
    """A finite number > 0."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{flag} takes a number, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{flag} must be a finite number > 0, got {value!r}")
    return number


def parse_dtype(value: str, table: dict[str, torch.dtype], flag: str) -> torch.dtype:
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{flag} must be one of {', '.join(table)}, got {value!r}") from None


def check_device(device: str, backends: list[str]) -> None:
    """`--device` names this machine's CPU or one of its CUDA devices, and the backends can run there."""
    if not (device == "cpu" or _CUDA_DEVICE.match(device)):
        raise ValueError(f"--device must be cpu or cuda[:i], got {device!r}")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device} needs CUDA, which this machine does not have (use --device cpu)")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    needs_gpu = [b for b in backends if b != "torch"]  # triton and the peers' kernels (Triton, CuTe DSL)
    if device == "cpu" and needs_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"--device cpu: the {needs_gpu[0]} backend runs Triton kernels and needs --device cuda "
            "(or TRITON_INTERPRET=1 to run them in the interpreter on CPU, tiny presets only)"
        )
