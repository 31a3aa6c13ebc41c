"""Shims that let Triton's benchmarking run under `TRITON_INTERPRET=1` on a CPU-only machine, and one
that makes the interpreter itself faster.

Without a GPU driver, two Triton entry points fail with "0 active drivers ([]). There should only be
one.": a `triton.autotune` with more than one config (its default benchmarker asks the driver), and
`triton.testing.do_bench`. Under the interpreter this module replaces both, and makes helper calls cheaper:

* the autotuner's default benchmarker (used only when a kernel passes no `do_bench=`) either picks
  the first config without running anything (`pick="first"`, the default: fast and deterministic)
  or runs every config once and times it with `perf_counter` (`pick="time"`);
* `triton.testing.do_bench` times with `perf_counter` (same arguments and return convention, ms);
* a `@triton.jit` helper called inside a launch no longer re-patches `triton.language` (see
  `_install_device_call_shim`: 40% of a kernel test's time went to it).

Importing this module installs the shims when interpreting and does nothing otherwise, so kernel
modules and `conftest.py` can import it unconditionally (a GPU run is untouched). Install before any
module does `from triton.testing import do_bench`, which would keep the original function.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Sequence

import torch
import triton
import triton.language as tl
import triton.runtime.autotuner as _autotuner
import triton.testing

_PICKS = ("first", "time")
_pick = "first"


def interpreting() -> bool:
    """True when Triton runs kernels in its Python interpreter (`TRITON_INTERPRET=1`)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None and hasattr(knobs.runtime, "interpret"):
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _autotune_bench(kernel_call: Callable[[], None], quantiles: Sequence[float] | None = None, **_: object):
    if _pick == "first":
        # Every config ties, so the autotuner keeps the first one (it takes the first minimum).
        elapsed_ms = 0.0
    else:
        start = time.perf_counter()
        kernel_call()
        elapsed_ms = (time.perf_counter() - start) * 1e3
    return [elapsed_ms] * len(quantiles) if quantiles else elapsed_ms


def cpu_do_bench(fn: Callable[[], object], warmup: float = 25, rep: float = 100, grad_to_none=None,
                 quantiles: Sequence[float] | None = None, return_mode: str = "mean"):
    """`triton.testing.do_bench` timed with `perf_counter`: one warm-up call, then calls until `rep`
    ms have passed (at least one). Times in ms; `warmup` is unused because the interpreter has
    nothing to warm beyond the first call."""
    if return_mode not in ("min", "max", "mean", "median", "all"):
        raise ValueError(f"return_mode must be min, max, mean, median or all, got {return_mode!r}")
    fn()
    times_ms: list[float] = []
    deadline = time.perf_counter() + rep / 1e3
    while not times_ms or time.perf_counter() < deadline:
        if grad_to_none is not None:
            for tensor in grad_to_none:
                tensor.grad = None
        start = time.perf_counter()
        fn()
        times_ms.append((time.perf_counter() - start) * 1e3)
    samples = torch.tensor(times_ms, dtype=torch.float64)
    if quantiles is not None:
        values = torch.quantile(samples, torch.tensor(list(quantiles), dtype=torch.float64)).tolist()
        return values[0] if len(values) == 1 else values
    if return_mode == "all":
        return times_ms
    return getattr(torch, return_mode)(samples).item()


_LANGS = (id(tl), id(tl.core))


def _lang_modules(fn: Callable) -> frozenset[int]:
    """Which of `triton.language` / `triton.language.core` a function's globals name (the modules the
    interpreter patches for it), by id."""
    return frozenset(id(v) for v in fn.__globals__.values() if id(v) in _LANGS)


def _install_device_call_shim() -> None:
    """Stop the interpreter re-patching `triton.language` on every `@triton.jit` helper call.

    A launch (`GridExecutor.__call__`) patches the language modules once, runs every program, then restores
    them. Each helper call inside a program (`InterpretedFunction.__call__`: `delta_step`, `load_token`, ...)
    patches them again, through `inspect.getmembers` of four modules and never restored, which is a no-op
    while its launch's patches stand: profiled on one kernel test (Triton 3.6), 34 of 85 s went to it. Here a
    helper call skips that re-patch while a launch runs and has patched every module the helper's globals
    name (a launch of our kernels patches `tl`; the first of Triton's own helpers, `tl.cumsum` and the like,
    patches `tl.core`); anywhere else it patches as before. Same interpreted program, same values."""
    from triton.runtime import interpreter

    if getattr(interpreter.InterpretedFunction, "_cpu_shim", False):
        return
    launches: list[set[int]] = []  # the language modules patched in each running launch, innermost last
    grid_call = interpreter.GridExecutor.__call__

    def tracked_grid_call(self, *args, **kwargs):
        launches.append(set(_lang_modules(self.fn)))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            launches.pop()

    def device_call(self, *args, **kwargs):
        langs = _lang_modules(self.fn)
        if not (launches and langs <= launches[-1]):
            interpreter._patch_lang(self.fn)
            if launches:
                launches[-1] |= langs  # patched until the launch restores (tl.core by Triton's own helpers)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.GridExecutor.__call__ = tracked_grid_call
    interpreter.InterpretedFunction.__call__ = device_call
    interpreter.InterpretedFunction._cpu_shim = True


def install(pick: str = "first") -> bool:
    """Install the shims if interpreting (idempotent; a second call only changes `pick`).

    Returns whether they are installed.
    """
    global _pick
    if pick not in _PICKS:
        raise ValueError(f"pick must be one of {_PICKS}, got {pick!r}")
    if not interpreting():
        return False
    _pick = pick
    if not getattr(_autotuner.Autotuner, "_cpu_shim", False):
        # A kernel that passed its own do_bench= keeps it; the rest get the CPU benchmarker.
        _autotuner.Autotuner.do_bench = property(lambda self: self._do_bench or _autotune_bench)
        _autotuner.Autotuner._cpu_shim = True
        triton.testing.do_bench = cpu_do_bench
    _install_device_call_shim()
    return True


install()
