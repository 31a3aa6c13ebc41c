"""Per-kernel roofline of the SSM state kernels on a CUDA box: each kernel alone, one layer, CUDA-graph
timing, bytes from what the kernel must move, % of the device-to-device copy ceiling measured first.

Where the harness's round timings say how fast a mode is, this says which kernel is short of the
byte roofline and under which launch config (BV x num_warps), so kernel work and autotune spaces are
chosen from measurements. The cases and their byte counts are scenarios/ssm_kernels.py's (the ones
`harness autotune ssm` times), plus:

    decode          native verify at W = 1 (state updated in place)

and beside them the peers' kernels (scenarios/ssm_peer_kernels.py: fla, FlashInfer, SGLang at each of its
dot precisions), timed once per batch at their own launch parameters; a peer that is not installed is one
printed line. `--peers off` leaves them out, `--peers only` times nothing else.

Usage (prints a table, writes CSV):
    python3 scripts/bench_kernels.py --preset qwen3-next --batch 32,128,512 --out kernels.csv
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import env, timing  # noqa: E402
from kernels.common.precompile import collect_compiles, compile_all  # noqa: E402
from kernels.ssm.configs import (  # noqa: E402
    COMPACT_PRECOMPUTE, DEFERRED_PRECOMPUTE, NATIVE_VERIFY, REPLAY_MATRIX_FOLD, REPLAY_PRECOMPUTE, config_axes,
    config_space, default_config)
from scenarios.ssm_kernels import CASES as SWEPT  # noqa: E402
from scenarios.ssm_kernels import kernel_cases as ssm_kernel_cases  # noqa: E402
from scenarios.ssm_peer_kernels import peer_cases  # noqa: E402
from states.params import make_params  # noqa: E402
from states.presets import get_ssm_preset  # noqa: E402

DEVICE = "cuda"  # --device cpu (with TRITON_INTERPRET=1 and a tiny preset) only smoke-tests the script


def kernel_cases(geom, params, n: int, drafts: int, state_dtype: torch.dtype, names: tuple[str, ...],
                 precision: str = ""):
    """The scenarios/ssm_kernels.py cases of `names` at batch n (plus `decode`), pools built once;
    `precision` sets the precompute forward's dot precision (its default when empty)."""
    cases = ssm_kernel_cases(geom, params, batch=n, drafts=drafts, state_dtype=state_dtype, device=DEVICE,
                             names=names, precision=precision)
    if drafts and "decode" in names:
        cases += [replace(c, name="decode") for c in ssm_kernel_cases(geom, params, batch=n, drafts=0,
                                                                         state_dtype=state_dtype, device=DEVICE,
                                                                         names=(NATIVE_VERIFY,))]
    return cases


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _configs(args, geom, kernel: str) -> list[dict]:
    """The asked BV x num_warps (x BK x num_stages, which only the precompute forward takes; x BC, the conv's
    channel block) grid narrowed to `kernel`'s axes and space, each config once; the kernel's default where
    none of the grid is in it (the conv without --bc; the precompute below BV 16)."""
    dims = {"head_k_dim": geom.head_k_dim, "head_v_dim": geom.head_v_dim, "conv_dim": geom.conv_dim}
    space = config_space(kernel, **dims)
    out: list[dict] = []
    for bv, nw, bk, ns, bc in itertools.product(_ints(args.bv), _ints(args.warps), _ints(args.bk), _ints(args.stages),
                                                _ints(args.bc) if args.bc else [None]):
        point = {"BV": bv, "num_warps": nw, "BK": bk, "num_stages": ns, "BC": bc}
        config = {k: point[k] for k in config_axes(kernel) if k in point}
        if config in space and config not in out:
            out.append(config)
    return out or [default_config(kernel, **dims)]


MATRIX_KERNELS = (REPLAY_PRECOMPUTE, COMPACT_PRECOMPUTE, REPLAY_MATRIX_FOLD, DEFERRED_PRECOMPUTE)  # the kernels that take a dot precision


def sweep(args, geom, params, sd, n: int, keep: set[str]):
    """(name, precision, config, run, bytes) of every kernel, config and (for the precompute forward)
    precision at batch n; the token-step kernels are timed once, not once per precision."""
    names = tuple(keep) if keep else (*SWEPT, "decode")
    for i, prec in enumerate(_precisions(args)):
        wanted = names if i == 0 else tuple(nm for nm in names if nm in MATRIX_KERNELS)
        for case in kernel_cases(geom, params, n, args.drafts, sd, wanted, prec):
            label = prec if case.kernel in MATRIX_KERNELS else ""
            for config in _configs(args, geom, case.kernel):
                yield case.name, label, config, (lambda c=case, cfg=config: c.run(cfg)), case.moved_bytes
        torch.cuda.empty_cache() if DEVICE == "cuda" else None


def _setup(args):
    geom = replace(get_ssm_preset(args.preset).ssm, layers=1)
    params = make_params(geom, torch.bfloat16, torch.Generator().manual_seed(0)).to(DEVICE)
    sd = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.state_dtype]
    return geom, params, sd


def precompile(args, geom, params, sd, batches: list[int], keep: set[str]) -> None:
    """Compile every (batch, kernel, config, precision) in `args.jobs` processes first: the timing pass then
    loads the kernels from Triton's cache instead of compiling them one at a time (device time is for measuring)."""
    with collect_compiles() as jobs:
        for n in batches:
            for *_, run, _ in sweep(args, geom, params, sd, n, keep):
                run()
    seconds, failures = compile_all(jobs, args.jobs)
    print(f"precompiled {len(jobs)} kernels in {seconds:.0f}s ({len(failures)} failed: timed below as errors)",
          file=sys.stderr, flush=True)


def _precisions(args) -> list[str]:
    return [p for p in args.precision.split(",")] if args.precision else [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-next")
    ap.add_argument("--batch", default="32,128,512")
    ap.add_argument("--drafts", type=int, default=3)
    ap.add_argument("--state-dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--bv", default="8,16,32")
    ap.add_argument("--warps", default="1,2,4")
    ap.add_argument("--bk", default="32", help="K chunks of the precompute forward")
    ap.add_argument("--stages", default="1", help="num_stages of the precompute forward")
    ap.add_argument("--precision", default="", help="comma list of the precompute forward's dot precisions "
                    "(default: its default; e.g. ieee,tf32x3,bf16x3,bf16x6,tf32)")
    ap.add_argument("--bc", default="", help="comma list of the conv's channel blocks (default: its default config)")
    ap.add_argument("--kernels", default="", help="comma list to keep (default: all)")
    ap.add_argument("--out", default="kernels.csv")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--jobs", type=int, default=1, help="processes that compile every case first (CUDA only)")
    ap.add_argument("--peers", default="on", choices=["on", "off", "only"], help="the peers' kernels beside ours")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    torch.manual_seed(0)
    geom, params, sd = _setup(args)
    batches = [int(b) for b in args.batch.split(",")]
    keep = set(filter(None, args.kernels.split(",")))
    if args.jobs > 1 and DEVICE == "cuda" and args.peers != "only":
        precompile(args, geom, params, sd, batches, keep)
    ceilings = env.measure_ceilings(DEVICE)
    ceiling = ceilings.get("d2d-copy", ceilings.get("cpu-memcpy"))["gbps"]
    rows = []
    t0 = time.time()
    for n in batches:
        for name, prec, cfg, fn, moved in (sweep(args, geom, params, sd, n, keep) if args.peers != "only" else []):
            label = dict(kernel=name, batch=n, BV=cfg.get("BV", cfg.get("BC")), warps=cfg["num_warps"],
                         BK=cfg.get("BK", ""), stages=cfg["num_stages"], precision=prec)
            try:
                t = timing.bench(fn, device=DEVICE, warmup=3, rep=20 if DEVICE == "cuda" else 2)
            except Exception as e:  # noqa: BLE001 - a config that does not compile is a row, not a crash
                rows.append(dict(**label, status=f"{type(e).__name__}"))
                continue
            gbps = moved / (t.median_us * 1e-6) / 1e9
            rows.append(dict(**label, status="ok", median_us=round(t.median_us, 2), p20_us=round(t.p20_us, 2),
                             p80_us=round(t.p80_us, 2), bytes=int(moved), gbps=round(gbps, 1),
                             ceiling_pct=round(100 * gbps / ceiling, 1)))
        for name, fn, moved in (peer_cases(geom, params, n, args.drafts, sd, DEVICE) if args.peers != "off" else []):
            if keep and name not in keep:
                continue
            label = dict(kernel=name, batch=n, BV="-", warps="-", BK="", stages="", precision="")
            try:  # a peer's first call compiles (FlashInfer's CuTe DSL: seconds); a failure is a row, not a crash
                t = timing.bench(fn, device=DEVICE, warmup=3, rep=20 if DEVICE == "cuda" else 2)
            except Exception as e:  # noqa: BLE001
                print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
                rows.append(dict(**label, status=f"{type(e).__name__}"))
                continue
            gbps = moved / (t.median_us * 1e-6) / 1e9
            rows.append(dict(**label, status="ok", median_us=round(t.median_us, 2),
                             p20_us=round(t.p20_us, 2), p80_us=round(t.p80_us, 2), bytes=int(moved),
                             gbps=round(gbps, 1), ceiling_pct=round(100 * gbps / ceiling, 1)))
        print(f"batch {n} done at {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    fields = ["kernel", "batch", "BV", "warps", "BK", "stages", "precision", "status", "median_us", "p20_us", "p80_us",
              "bytes", "gbps", "ceiling_pct"]
    manifest = env.manifest(["scripts/bench_kernels.py", *sys.argv[1:]], 0, DEVICE, ceilings)
    Path(args.out).with_suffix(".manifest.json").write_text(json.dumps(manifest, indent=1, default=str))
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    print(f"d2d copy ceiling {ceiling:.0f} GB/s; best config per kernel and batch (% of ceiling):")
    best: dict[tuple, dict] = {}
    for r in rows:
        if r["status"] == "ok":
            k = (r["kernel"], r["precision"], r["batch"])
            if k not in best or r["median_us"] < best[k]["median_us"]:
                best[k] = r
    for (name, prec, n), r in sorted(best.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
        launch = "peer" if r["BV"] == "-" else f"BV{r['BV']} w{r['warps']}"
        extra = f" BK{r['BK']} s{r['stages']}" if r["BK"] != "" else ""
        print(f"  b{n:<4} {name + (':' + prec if prec else ''):<30} {r['median_us']:>9.1f} us  {r['ceiling_pct']:>5.1f}%"
              f"  {launch}{extra}")


if __name__ == "__main__":
    main()
