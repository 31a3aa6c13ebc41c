"""The Triton specializations the GPU gate's cases compile, found on a machine without a GPU (issue 23).

A cold GPU gate spends most of its time compiling: Triton builds one binary per specialization, i.e.
per (kernel, key), where the key holds the pointer dtypes and alignments, each integer argument's
class (`== 1` becomes a constant, `% 16 == 0` a divisibility hint, else plain), every constexpr and the
launch options (num_warps, num_stages). This script computes those keys without a GPU: Triton is
pointed at a stand-in CUDA driver (an H200's target, sm 90, and its device limits) and each gate case
runs on CPU tensors with the triton backend. Nothing runs on a device, so the kernels' outputs are
garbage and every comparison is meaningless here; only the keys and compiles are real. (The SSM and
page kernels take their control flow from the workload, widths and accepted counts, never from kernel
outputs, so garbage outputs reach the same launches.)

Two modes:

* `list` (default): Triton's `jit_cache_hook` records every launch's key and skips it; nothing is
  compiled. Per case: its specializations, how many no earlier case had; in all: distinct ones per kernel.
* `simulate`: the gate as on a GPU from a cold cache: the compile-ahead pass of harness/gate.py, then
  every case through Triton's real JIT path, whose CUDA compiles (ptxas included) run on this CPU
  into a fresh `TRITON_CACHE_DIR`; only the final launch is a no-op. Triton's compilation listener
  counts, per case, the specializations compiled on first launch (what compile-ahead missed), those
  loaded from the cache, and the seconds spent. This checks compile-ahead's coverage and cache keys.

Usage (TRITON_INTERPRET must be unset: the interpreter computes no keys):
    .venv/bin/python scripts/gate_specializations.py --shapes tiny --per-case [--json out.json]
    .venv/bin/python scripts/gate_specializations.py --shapes tiny --mode simulate --per-case
    .venv/bin/python scripts/gate_specializations.py --shapes model --launch-only

`--shapes model` allocates model-shape pools on the CPU (GBs; `--launch-only` runs only what the
compile-ahead pass runs, each SSM case's `launch`, plus the page cases, and skips checkpoint-restore,
whose fp64 reference at model shape takes very long on a CPU). Autotuned configs are looked up as on
`--gpu-name` (default NVIDIA H200), so model cases get the block sizes an H200 run picks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# what an H200 reports (torch.cuda.get_device_properties): the limits Triton checks before a launch
H200 = {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}


class _Utils:
    """The driver utilities a first launch calls: device limits, loading the binary (nothing loaded)."""

    def get_device_properties(self, device: int) -> dict:
        return dict(H200)

    def load_binary(self, name, kernel, shared, device):
        return None, None, 0, 0, 1024  # module, function, registers, spills, max threads per block


class _StandInDriver:
    """What Triton's JIT asks the active driver: a CUDA target of compute capability 9.0 (H100, H200),
    device 0, stream 0, device limits, and a launcher, which does nothing."""

    def __init__(self, capability: int = 90) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)
        self.utils = _Utils()

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def launcher_cls(self, src, metadata):
        return lambda *args, **kwargs: None

    def is_active(self) -> bool:
        return True


@contextlib.contextmanager
def recording(keys: set[tuple[str, str]]) -> Iterator[None]:
    """Every launch inside adds `(kernel name, key)` to `keys` and is skipped (nothing compiles)."""
    from triton import knobs

    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002 - Triton's names
        keys.add((fn.name, key))
        return True

    previous = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        yield
    finally:
        knobs.runtime.jit_cache_hook = previous


def install_stand_in(gpu_name: str) -> None:
    """Make the harness run its triton backend on CPU tensors through the stand-in driver."""
    import triton

    import harness.autotune as autotune
    import scenarios  # noqa: F401 - every scenario module imported, so the patch below reaches each
    import scenarios.options
    import states.base

    triton.runtime.driver.set_active(_StandInDriver())
    # option checks and the states refuse the triton backend on `--device cpu` outside the interpreter
    check = scenarios.options.check_device

    def check_device(device, backends):
        check(device, [b for b in backends if b != "triton"])

    for module in list(sys.modules.values()):
        if getattr(module, "check_device", None) is check:
            module.check_device = check_device
    states.base._interpreting = lambda: True
    init = autotune.AutotuneCache.__init__

    def cache_init(self, path, **kw):  # the shipped configs are keyed by GPU name
        kw["gpu_name"] = kw.get("gpu_name") or gpu_name
        init(self, path, **kw)

    autotune.AutotuneCache.__init__ = cache_init


def planned_cases(shapes: str, only: str | None) -> list:
    """(scenario, case, label) of the gate at `shapes`, triton backend only (torch compiles nothing)."""
    from harness.gate import model_cases, tiny_cases
    from harness.runner import case_label
    from scenarios import get_scenario

    out = []
    try:  # the GPU tiny gate's selection (issue 23); older trees had one list for CPU and GPU
        tiny = tiny_cases(gpu=True)
    except TypeError:
        tiny = tiny_cases()
    for name, options in (tiny if shapes == "tiny" else model_cases()):
        scenario = get_scenario(name)
        for case in scenario.plan({**options, "backend": "triton", "device": "cpu"}):
            label = case_label(scenario.name, case)
            if not only or only in label:
                out.append((scenario, case, label))
    return out


def run_cases(planned: list, launch_only: bool, observe) -> tuple[list[dict], dict, list]:
    """Each case run (or only `launch`ed) inside `observe(record)`; returns per-case dicts, errors, skipped."""
    from harness.phases import PhaseClock
    from harness.runner import make_context, run_case

    clock = PhaseClock("cpu")
    ctx, _ = make_context("cpu", 0, {}, None, scenario="gate", time_cases=False, clock=clock)
    rows, errors, skipped = [], {}, []
    for scenario, case, label in planned:
        if launch_only and not hasattr(scenario, "launch") and scenario.name == "checkpoint-restore":
            skipped.append(label)
            continue
        how = "launch" if launch_only and hasattr(scenario, "launch") else "run"
        t0 = time.perf_counter()
        record: dict = {}
        with observe(record):
            try:
                scenario.launch(case, ctx) if how == "launch" else run_case(scenario, case, ctx, clock)
            except Exception as exc:  # noqa: BLE001 - garbage outputs may trip a check; reported
                errors[label] = f"{type(exc).__name__}: {exc}"
        rows.append({"case": label, "how": how, "seconds": round(time.perf_counter() - t0, 2), **record})
    return rows, errors, skipped


def list_mode(planned: list, launch_only: bool) -> dict:
    union: set[tuple[str, str]] = set()

    @contextlib.contextmanager
    def observe(record: dict) -> Iterator[None]:
        keys: set[tuple[str, str]] = set()
        with recording(keys):
            yield
        record.update(specializations=len(keys), new=len(keys - union),
                      keys=sorted(f"{k} {v}" for k, v in keys))
        union.update(keys)

    rows, errors, skipped = run_cases(planned, launch_only, observe)
    return {"distinct": len(union), "per_kernel": dict(sorted(Counter(k for k, _ in union).items())),
            "per_case": rows, "errors": errors, "skipped": skipped}


def simulate_mode(planned: list, ahead: bool, processes: int | None) -> dict:
    from harness.gate import compile_ahead

    from kernels.common.precompile import compile_log, summarize_compiles

    out: dict = {}
    if ahead:
        t0 = time.perf_counter()
        ahead = compile_ahead([(s, c) for s, c, _ in planned], "cpu", processes=processes)
        if isinstance(ahead, tuple):  # older trees returned (recorded, failures)
            ahead = {"specializations": ahead[0], "failures": ahead[1]}
        out["compile_ahead"] = {"seconds": round(time.perf_counter() - t0, 1), "recorded": ahead["specializations"],
                                "failures": ahead["failures"]}

    @contextlib.contextmanager
    def observe(record: dict) -> Iterator[None]:
        with compile_log() as events:
            yield
        record.update(summarize_compiles(events))

    rows, errors, skipped = run_cases(planned, False, observe)
    out.update(per_case=rows, errors=errors, skipped=skipped,
               compiled=sum(r["compiled"] for r in rows), loaded=sum(r["loaded"] for r in rows),
               compile_s=round(sum(r["compile_s"] for r in rows), 1))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", choices=("tiny", "model"), default="tiny")
    p.add_argument("--mode", choices=("list", "simulate"), default="list")
    p.add_argument("--launch-only", action="store_true",
                   help="list: SSM cases through their compile-ahead `launch` only; checkpoint-restore skipped")
    p.add_argument("--no-ahead", action="store_true", help="simulate: without the compile-ahead pass")
    p.add_argument("--processes", type=int, default=None, help="simulate: compile-ahead workers")
    p.add_argument("--gpu-name", default="NVIDIA H200", help="GPU the shipped autotune configs are looked up for")
    p.add_argument("--case", default=None, help="only cases whose label contains this")
    p.add_argument("--json", type=Path, default=None, help="write the whole report (every key of every case) here")
    p.add_argument("--per-case", action="store_true", help="print one line per case")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("gate_specializations: unset TRITON_INTERPRET (the interpreter computes no specialization keys)",
              file=sys.stderr)
        return 2
    if args.mode == "simulate" and "TRITON_CACHE_DIR" not in os.environ:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="gate-spec-cache-")  # cold, and not the user's
    install_stand_in(args.gpu_name)
    planned = planned_cases(args.shapes, args.case)
    t0 = time.perf_counter()
    if args.mode == "list":
        report = list_mode(planned, args.launch_only)
    else:
        report = simulate_mode(planned, not args.no_ahead, args.processes)
    report = {"shapes": args.shapes, "mode": args.mode, "cases": len(report["per_case"]),
              "wall_s": round(time.perf_counter() - t0, 1), **report}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    for c in report["per_case"] if args.per_case else ():
        if args.mode == "list":
            print(f"{c['specializations']:4d} {c['new']:4d}  {c['case']}")
        else:
            missed = ", ".join(f"{k} x{n}" for k, n in c["kernels"].items())
            print(f"{c['compiled']:4d} compiled {c['loaded']:4d} loaded {c['compile_s']:6.1f} s  {c['case']}"
                  + (f"  [{missed}]" if missed else ""))
    if args.mode == "list":
        print(f"{args.shapes} gate: {report['cases']} cases, {report['distinct']} distinct specializations")
        for kernel, n in report["per_kernel"].items():
            print(f"  {kernel}: {n}")
    else:
        ahead = report.get("compile_ahead")
        if ahead:
            print(f"compile-ahead: {ahead['recorded']} specializations in {ahead['seconds']} s, "
                  f"{len(ahead['failures'])} failed")
        print(f"{args.shapes} gate cases: {report['compiled']} compiled on first launch "
              f"({report['compile_s']} s), {report['loaded']} loaded from the cache; wall {report['wall_s']} s")
    for label, err in report["errors"].items():
        print(f"  error in {label}: {err}")
    if report["skipped"]:
        print(f"  skipped (--launch-only): {len(report['skipped'])} checkpoint-restore cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
