"""Per-kernel roofline of the SSM state kernels on a CUDA box: each kernel alone, one layer, CUDA-graph
timing, bytes from what the kernel must move, % of the device-to-device copy ceiling measured first.

Where the harness's round timings say how fast a mode is, this says which kernel is short of the
byte roofline and under which launch config (the step class's BV x num_warps), so kernel work and
autotune spaces are chosen from measurements. Kernels (one layer, W = 1 + drafts):

    conv            causal conv of the round's tokens
    native          native verify: read the accepted state, write W snapshots
    compact         compact verify (accept): read the state, write W records
    commit          compact commit (accept): read the state and accepted records, write the state
    deferred        compact verify (deferred): apply the pending records, write the state, verify
    replay          replay forward, `count` history records, no fold
    replay-fold     replay forward where every row folds its records first
    precompute      replay precompute forward (tensor cores; BV at least 16), `count` history records
    decode          native decode (W = 1, state updated in place)
    fla-decode      fla-core fused_recurrent_kda_fwd in place on a pool, T = 1 (the decode baseline),
                    with the q/k/v split of the conv output it needs

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
from kernels.ssm.compact import compact_commit, compact_verify  # noqa: E402
from kernels.ssm.configs import STEP, config_space  # noqa: E402
from kernels.ssm.conv import causal_conv_update  # noqa: E402
from kernels.ssm.native import native_verify  # noqa: E402
from kernels.ssm.replay import replay_forward  # noqa: E402
from kernels.ssm.replay_precompute import replay_precompute_forward  # noqa: E402
from states import StateConfig, make_state  # noqa: E402
from states.params import make_params, make_token_inputs  # noqa: E402
from states.presets import get_ssm_preset  # noqa: E402

DEVICE = "cuda"  # --device cpu (with TRITON_INTERPRET=1 and a tiny preset) only smoke-tests the script


def _state(geom, params, mode, variant, n, drafts, state_dtype, history_len=16):
    cfg = StateConfig(mode, n, drafts=drafts, state_dtype=state_dtype, history_len=history_len, variant=variant,
                      backend="triton", device=DEVICE)
    st = make_state(geom, params, cfg)
    slots = st.alloc(n)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for name, t in st._pool_tensors().items():  # non-zero state and records: no zero-fast paths
        if t.is_floating_point():
            t.copy_(torch.rand(t.shape, generator=g, device=DEVICE).mul_(0.1).to(t.dtype))
    return st, slots


def kernel_cases(geom, params, n: int, drafts: int, state_dtype: torch.dtype, step: dict):
    """(name, callable, bytes) of every kernel at batch n with the `step` config."""
    W = drafts + 1
    H, HV, K, V = geom.key_heads, geom.value_heads, geom.head_k_dim, geom.head_v_dim
    sb = torch.empty((), dtype=state_dtype).element_size()
    state = HV * K * V * sb
    tok_in = (geom.conv_dim + HV + HV) * 2 + HV * V * 4  # qkv + a + b (bf16) in, o (fp32) out
    record = H * K * 2 + HV * V * 2 + HV * 4 + HV * 4
    x = make_token_inputs(geom, n * W, torch.bfloat16, torch.Generator().manual_seed(1)).to(DEVICE)
    slots = torch.arange(n, device=DEVICE)
    widths = torch.full((n,), W, dtype=torch.int32, device=DEVICE)
    cu = torch.arange(n + 1, dtype=torch.int32, device=DEVICE) * W
    accepted = torch.full((n,), min(2, W - 1), dtype=torch.int32, device=DEVICE)
    p = params
    out = []

    nat, _ = _state(geom, params, "native", "", n, drafts, state_dtype)
    nat.set_kernel_configs({"step": step})
    qkv = torch.empty_like(x.mixed_qkv)
    conv_cfg = nat.kernel_configs["conv"]
    out.append(("conv", lambda: causal_conv_update(x.mixed_qkv, nat.conv[0], nat.conv_offset, p.conv_weight[0], slots,
                                                     widths, cu, conv_cfg, out=qkv),
                n * geom.conv_dim * 2 * (2 * W + 2 * (geom.conv_kernel - 1) + W)))
    qkv.copy_(x.mixed_qkv)
    out.append(("native", lambda: native_verify(nat.ssm, 0, qkv, x.a, x.b, p.A_log[0], p.dt_bias[0], nat.conv_offset,
                                                slots, widths, cu, step),
                n * ((1 + W) * HV * K * V * sb + W * tok_in)))

    cmp, _ = _state(geom, params, "compact", "accept", n, drafts, state_dtype)
    pool = cmp._kernel_pool()
    out.append(("compact", lambda: compact_verify(pool, 0, qkv, x.a, x.b, p.A_log[0], p.dt_bias[0], slots, widths, cu,
                                                  step),
                n * (state + W * (record + tok_in))))
    out.append(("commit", lambda: compact_commit(pool, slots, accepted, step),
                n * (2 * state + (int(accepted[0]) + 1) * record)))

    dfr, _ = _state(geom, params, "compact", "deferred", n, drafts, state_dtype)
    dfr.pending[:n] = accepted
    dpool = dfr._kernel_pool()
    out.append(("deferred", lambda: compact_verify(dpool, 0, qkv, x.a, x.b, p.A_log[0], p.dt_bias[0], slots, widths,
                                                   cu, step),
                n * (2 * state + (int(accepted[0]) + 1) * record + W * (record + tok_in))))

    for name, count, fold in (("replay", 8, False), ("replay-fold", 14, True)):
        rep, _ = _state(geom, params, "replay", "", n, drafts, state_dtype)
        P = 2 * rep.cfg.history_len
        rep.cursor[:n] = count  # phase 0, `count` records since the checkpoint
        fold_from = torch.full((n,), count if fold else -1, dtype=torch.int32, device=DEVICE)
        if fold:  # the forward then reads the other half with count 0 (what prepare leaves behind)
            rep.cursor[:n] = P
        derived = H * K * 4 + HV * V * 4 + HV * 4
        raw = H * K * 2 + HV * V * 2 + HV * 4
        moved = n * (state + W * (derived + raw + tok_in) + (count * (raw + HV * 4) + state if fold else count * derived))
        out.append((name, (lambda r=rep, f=fold_from: replay_forward(r._pool, 0, qkv, x.a, x.b, p.A_log[0],
                                                                     p.dt_bias[0], slots, widths, cu, f, step)),
                    moved))

    pre, _ = _state(geom, params, "replay", "precompute", n, drafts, state_dtype)
    pre.cursor[:n] = 8
    pre_cfg = {"BV": max(16, step["BV"]), "num_warps": step["num_warps"], "num_stages": 1}
    derived = H * K * 4 + HV * V * 4 + HV * 4
    raw = H * K * 2 + HV * V * 2 + HV * 4
    out.append(("precompute", lambda: replay_precompute_forward(pre._pool, 0, qkv, x.a, x.b, p.A_log[0], p.dt_bias[0],
                                                                slots, widths, cu, pre_cfg),
                n * (state + W * (derived + raw + tok_in) + 8 * derived)))

    dec, _ = _state(geom, params, "native", "", n, 0, state_dtype)
    x1 = make_token_inputs(geom, n, torch.bfloat16, torch.Generator().manual_seed(2)).to(DEVICE)
    w1 = torch.ones(n, dtype=torch.int32, device=DEVICE)
    cu1 = torch.arange(n + 1, dtype=torch.int32, device=DEVICE)
    out.append(("decode", lambda: native_verify(dec.ssm, 0, x1.mixed_qkv, x1.a, x1.b, p.A_log[0], p.dt_bias[0],
                                                dec.conv_offset, slots, w1, cu1, step),
                n * (2 * state + tok_in)))
    return out


def fla_cases(geom, params, n: int, state_dtype: torch.dtype):
    """fla-core's fused_recurrent_kda_fwd in place on a pool (the decode baseline), T = 1."""
    try:
        from kernels.ssm.fla_baseline import FlaLayerInputs, fla_fused_recurrent_inplace
    except ImportError:
        return []
    HV, K, V = geom.value_heads, geom.head_k_dim, geom.head_v_dim
    x1 = make_token_inputs(geom, n, torch.bfloat16, torch.Generator().manual_seed(2)).to(DEVICE)
    rows = torch.rand(n, HV, K, V, device=DEVICE).to(state_dtype)
    cu1 = torch.arange(n + 1, dtype=torch.int64, device=DEVICE)
    idx = torch.arange(n, device=DEVICE)
    p = params
    li = FlaLayerInputs.of(x1.a, x1.b, p.A_log[0], p.dt_bias[0], K, geom.lower_bound)
    sb = rows.element_size()

    def run():
        return fla_fused_recurrent_inplace(x1.mixed_qkv, li, rows, idx, cu1, None, geom.key_heads)

    try:
        run()
    except Exception as e:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
        print(f"fla baseline unavailable: {type(e).__name__}: {e}", file=sys.stderr)
        return []
    moved = n * (2 * HV * K * V * sb + (3 * geom.conv_dim + HV * K + HV) * 2 + HV * V * 2)  # incl. the q/k/v split
    return [("fla-decode", run, moved)]


def _setup(args):
    geom = replace(get_ssm_preset(args.preset).ssm, layers=1)
    params = make_params(geom, torch.bfloat16, torch.Generator().manual_seed(0)).to(DEVICE)
    sd = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.state_dtype]
    return geom, params, sd


def _configs(args, geom) -> list[dict]:
    """The asked BV x num_warps grid, less what the step config space prunes (4..128 values a thread)."""
    space = config_space(STEP, head_k_dim=geom.head_k_dim, head_v_dim=geom.head_v_dim, conv_dim=geom.conv_dim)
    grid = [{"BV": bv, "num_warps": nw, "num_stages": 1}
            for bv, nw in itertools.product((int(b) for b in args.bv.split(",")), (int(w) for w in args.warps.split(",")))]
    return [c for c in grid if c in space]


def _warm(job) -> str:
    """Worker: launch every kernel of one (batch, config) once, so its compile lands in Triton's cache."""
    args, n, step = job
    global DEVICE
    DEVICE = args.device
    geom, params, sd = _setup(args)
    keep = set(filter(None, args.kernels.split(",")))
    for name, fn, _ in kernel_cases(geom, params, n, args.drafts, sd, step):
        if not keep or name in keep:
            try:
                fn()
            except Exception:  # noqa: BLE001 - the timing pass reports it
                pass
    torch.cuda.synchronize()
    return f"b{n} BV{step['BV']} w{step['num_warps']}"


def precompile(args, geom, batches: list[int]) -> None:
    """Compile every (batch, config) in `args.jobs` processes first: the timing pass then loads kernels from
    Triton's cache instead of compiling one at a time (device time is for measuring)."""
    import multiprocessing as mp

    jobs = [(args, n, c) for n in batches for c in _configs(args, geom)]
    t0 = time.time()
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        for i, done in enumerate(pool.imap_unordered(_warm, jobs), 1):
            if i % 8 == 0 or i == len(jobs):
                print(f"precompiled {i}/{len(jobs)} ({done}) at {time.time() - t0:.0f}s", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-next")
    ap.add_argument("--batch", default="32,128,512")
    ap.add_argument("--drafts", type=int, default=3)
    ap.add_argument("--state-dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--bv", default="8,16,32")
    ap.add_argument("--warps", default="1,2,4")
    ap.add_argument("--kernels", default="", help="comma list to keep (default: all)")
    ap.add_argument("--out", default="kernels.csv")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--jobs", type=int, default=1, help="processes that compile every case first (CUDA only)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    torch.manual_seed(0)
    geom, params, sd = _setup(args)
    batches = [int(b) for b in args.batch.split(",")]
    if args.jobs > 1 and DEVICE == "cuda":
        precompile(args, geom, batches)
    ceilings = env.measure_ceilings(DEVICE)
    ceiling = ceilings.get("d2d-copy", ceilings.get("cpu-memcpy"))["gbps"]
    keep = set(filter(None, args.kernels.split(",")))
    rows = []
    t0 = time.time()
    for n in batches:
        for step in _configs(args, geom):
            bv, nw = step["BV"], step["num_warps"]
            for name, fn, moved in kernel_cases(geom, params, n, args.drafts, sd, step):
                if keep and name not in keep:
                    continue
                try:
                    t = timing.bench(fn, device=DEVICE, warmup=3, rep=20 if DEVICE == "cuda" else 2)
                except Exception as e:  # noqa: BLE001 - a config that does not compile is a row, not a crash
                    rows.append(dict(kernel=name, batch=n, BV=bv, warps=nw, status=f"{type(e).__name__}"))
                    continue
                gbps = moved / (t.median_us * 1e-6) / 1e9
                rows.append(dict(kernel=name, batch=n, BV=bv, warps=nw, status="ok", median_us=round(t.median_us, 2),
                                 p20_us=round(t.p20_us, 2), p80_us=round(t.p80_us, 2), bytes=int(moved),
                                 gbps=round(gbps, 1), ceiling_pct=round(100 * gbps / ceiling, 1)))
            torch.cuda.empty_cache()
        for name, fn, moved in fla_cases(geom, params, n, sd):
            t = timing.bench(fn, device=DEVICE, warmup=3, rep=20 if DEVICE == "cuda" else 2)
            gbps = moved / (t.median_us * 1e-6) / 1e9
            rows.append(dict(kernel=name, batch=n, BV=8, warps=1, status="ok", median_us=round(t.median_us, 2),
                             p20_us=round(t.p20_us, 2), p80_us=round(t.p80_us, 2), bytes=int(moved),
                             gbps=round(gbps, 1), ceiling_pct=round(100 * gbps / ceiling, 1)))
        print(f"batch {n} done at {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    fields = ["kernel", "batch", "BV", "warps", "status", "median_us", "p20_us", "p80_us", "bytes", "gbps", "ceiling_pct"]
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
            k = (r["kernel"], r["batch"])
            if k not in best or r["median_us"] < best[k]["median_us"]:
                best[k] = r
    for (name, n), r in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"  b{n:<4} {name:<12} {r['median_us']:>9.1f} us  {r['ceiling_pct']:>5.1f}%  BV{r['BV']} w{r['warps']}")


if __name__ == "__main__":
    main()
