"""Where a row's round time goes: every kernel's device time per round, for each variant a harness run times.

A row of `harness run` is one number (a round of all layers, CUDA-graph replays). When a kernel is fast alone
(scripts/bench_kernels.py) and its row is not, this says which launches the row spends the difference on:
it runs `harness run` unchanged and, after each variant's timing, runs that same timed closure (the same
pool, rounds and inputs) eagerly under torch.profiler and sums each CUDA kernel's device time, per round.

    python3 scripts/profile_rows.py [--calls 2] [--csv FILE] -- mtp-fixed --preset qwen3-next --device cuda \
        --batch 128 --drafts 3 --replay-forward matrix-bf16x3 --rounds 2 --check-requests 1 --out /tmp/p

Everything after `--` is `harness run`'s command line (a run directory is written as usual). Prints, per
variant: the row's median round time, the profiled kernels' sum per round (launched eagerly, so the sum
excludes launch gaps the graph removes), and each kernel's launches and microseconds per round, largest
first; `--csv` writes the same as rows (variant, kernel, launches_per_round, us_per_round, share).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

import scenarios.ssm_engine as engine

PROFILES: list[dict] = []  # one per timed variant: label, row median, kernels


def _kernel_times(prof) -> dict[str, tuple[int, float]]:
    """name -> (launches, device us) of the CUDA kernels in a profile (memcpy/memset included)."""
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            entry = out[e.name]
            entry[0] += 1
            entry[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return {k: (n, us) for k, (n, us) in out.items()}


def _profiling_time_variant(profiled_calls: int):
    """`_time_variant` that, after its timing, profiles `profiled_calls` eager calls of the timed closure."""
    original = engine._time_variant

    def timed(case, v, wl, ctx):
        seen: dict = {}

        def bench(fn, setup=None, calls: int = 1):
            timing = ctx.bench(fn, setup=setup, calls=calls)  # the row's own timing, untouched
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(profiled_calls):
                    fn()
                torch.cuda.synchronize()
            seen.update(rounds=profiled_calls * calls, kernels=_kernel_times(prof))
            return timing

        fields, rec = original(case, v, wl, replace(ctx, bench=bench))
        if seen:
            r = seen["rounds"]
            PROFILES.append({"label": f"{engine.label(v)} batch {wl.batch}", "median_us": fields.get("median_us"),
                             "kernels": {k: (n / r, us / r) for k, (n, us) in seen["kernels"].items()}})
        return fields, rec

    return timed


def _short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def main() -> None:
    argv = sys.argv[1:]
    ours, run_args = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else ([], argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2, help="eager calls of each timed closure profiled (default 2)")
    ap.add_argument("--csv", help="also write the per-kernel rows here")
    args = ap.parse_args(ours)
    if not run_args:
        ap.error("give `harness run`'s arguments after --")
    if not torch.cuda.is_available():
        raise SystemExit("profile_rows: needs a CUDA device (the rows are timed there)")
    engine._time_variant = _profiling_time_variant(args.calls)
    from harness.cli import app

    try:
        app(["run", *run_args], standalone_mode=False)
    except SystemExit as e:
        if e.code:
            raise
    rows = []
    for p in PROFILES:
        total = sum(us for _, us in p["kernels"].values())
        median = p["median_us"]
        print(f"\n== {p['label']}: row median {median:.1f} us a round, profiled kernels {total:.1f} us a round")
        for name, (n, us) in sorted(p["kernels"].items(), key=lambda kv: -kv[1][1]):
            print(f"  {us:10.1f} us  {100 * us / total:5.1f}%  {n:6.1f} launches  {_short(name)}")
            rows.append({"variant": p["label"], "kernel": name, "launches_per_round": f"{n:.2f}",
                         "us_per_round": f"{us:.2f}", "share": f"{us / total:.4f}", "row_median_us": median})
    if args.csv and rows:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
