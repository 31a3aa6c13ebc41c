"""Each SSM-state Triton kernel alone on a disposable one-layer pool: what `harness autotune ssm` times per
kernel and what `scripts/bench_kernels.py` sweeps (SPEC §7, §8).

A `KernelCase` launches one kernel with a given config on pools filled with random non-zero values
(no zero fast paths), inputs built before the closure, and counts the bytes the launch must move:

    conv                     causal conv of the round's tokens: inputs read, outputs written, windows
    native-verify            read the accepted state, write W snapshots (decode: W = 1, in place)
    compact-verify           read the state, write W records
    compact-commit           read the state and the accepted records, write the state
    deferred-verify          read the state and the pending records, write the state, verify W tokens
    replay-forward           `history` records of history, no fold (the common round)
    replay-forward-folding   the same kernel where every row folds `Lh - W + 2` records first (bench only)
    replay-forward-matrix-folding  the same, folding in matrix form inside it (`inline-matrix*`; the matrix
                             fold's default BK, `precision`; bench only)
    replay-fold              the all-layer fold into a snapshot buffer (read state + raw records, write)
    replay-precompute        the precompute forward (tensor cores), `history` records of history
    replay-precompute-folding  the same kernel where every row folds its `Lh - W + 2` records inside it (the
                             matrix variants' fold; bench only)

Every row of a case is a request of the batch; accepted counts are 2 drafts (or W - 1 if fewer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from kernels.ssm.compact import compact_commit, compact_verify
from kernels.ssm.compact_precompute import compact_precompute_verify
from kernels.ssm.configs import (
    COMPACT_COMMIT,
    COMPACT_PRECOMPUTE,
    COMPACT_VERIFY,
    CONV,
    DEFERRED_PRECOMPUTE,
    DEFERRED_VERIFY,
    NATIVE_VERIFY,
    REPLAY_FOLD,
    REPLAY_FORWARD,
    REPLAY_MATRIX_FOLD,
    REPLAY_PRECOMPUTE,
    Config,
)
from kernels.ssm.conv import causal_conv_update
from kernels.ssm.dot_precision import DEFAULT_PRECISION
from kernels.ssm.native import native_verify
from kernels.ssm.replay import replay_fold, replay_forward
from kernels.ssm.replay_matrix_fold import matrix_fold_supported, replay_matrix_fold
from kernels.ssm.replay_precompute import precompute_supported, replay_precompute_forward
from states import StateConfig, make_state
from states.base import SSMState, _nbytes
from states.geometry import SSMGeometry
from states.params import SSMParams, make_token_inputs

CASES = (CONV, NATIVE_VERIFY, COMPACT_VERIFY, COMPACT_COMMIT, DEFERRED_VERIFY, REPLAY_FORWARD,
         "replay-forward-folding", "replay-forward-matrix-folding", REPLAY_FOLD, REPLAY_MATRIX_FOLD, REPLAY_PRECOMPUTE,
         "replay-precompute-folding", COMPACT_PRECOMPUTE, DEFERRED_PRECOMPUTE)


@dataclass(frozen=True)
class KernelCase:
    """One kernel alone: `run(config)` launches it once; `moved_bytes` is what that launch must move."""

    name: str
    kernel: str  # the config it takes (kernels/ssm/configs.py)
    run: Callable[[Config], object]
    moved_bytes: int


def _pool(geom: SSMGeometry, params: SSMParams, cfg: StateConfig, seed: int) -> tuple[SSMState, torch.Tensor]:
    st = make_state(geom, params, cfg)
    slots = st.alloc(cfg.max_requests)
    g = torch.Generator(device=cfg.device).manual_seed(seed)
    for t in st._pool_tensors().values():  # non-zero state and records: no zero-fast paths
        if t.is_floating_point():
            t.copy_(torch.rand(t.shape, generator=g, device=cfg.device).mul_(0.1).to(t.dtype))
    return st, slots


def kernel_cases(geom: SSMGeometry, params: SSMParams, *, batch: int, drafts: int, state_dtype: torch.dtype,
                 act_dtype: torch.dtype = torch.bfloat16, history_len: int = 16, history: int = 8,
                 device: str = "cuda", names: tuple[str, ...] = CASES, seed: int = 0,
                 precision: str = "") -> list[KernelCase]:
    """The cases of `names` that this geometry and width support, on layer 0 of one-layer pools.

    Args:
        geom: the SSM geometry (only layer 0 is used: pass `layers=1` to keep pools small).
        params: its layer parameters on `device`.
        batch: requests, each with W = drafts + 1 tokens.
        drafts: S; compact cases need S >= 1.
        history: replay records since the checkpoint for the forward cases (at most Lh - W).
        precision: the precompute forward's dot precision (kernels/ssm/replay_precompute.py; its
            default when empty).
    """
    n, W = batch, drafts + 1
    H, HV, K, V = geom.key_heads, geom.value_heads, geom.head_k_dim, geom.head_v_dim
    sb, ab = _nbytes(state_dtype), _nbytes(act_dtype)
    state = HV * K * V * sb
    a_width = HV * K if geom.family == "kda" else HV
    tok_in = (geom.conv_dim + a_width + HV) * ab + HV * V * 4  # qkv, a, b in, o (fp32) out
    gw = K if geom.family == "kda" else 1
    record = H * K * ab + HV * V * ab + HV * gw * 4 + HV * 4
    derived = H * K * 4 + HV * V * 4 + HV * gw * 4
    raw = H * K * ab + HV * V * ab + HV * 4
    history = min(history, history_len - W)
    x = make_token_inputs(geom, n * W, act_dtype, torch.Generator().manual_seed(seed + 1)).to(device)
    slots = torch.arange(n, device=device)
    widths = torch.full((n,), W, dtype=torch.int32, device=device)
    cu = torch.arange(n + 1, dtype=torch.int32, device=device) * W
    accepted = torch.full((n,), min(2, W - 1), dtype=torch.int32, device=device)
    kept = int(accepted[0]) + 1
    p, lb = params, geom.lower_bound
    prec = {"precision": precision} if precision else {}  # the matrix-form kernels' dot precision
    base = StateConfig("native", n, drafts=drafts, state_dtype=state_dtype, act_dtype=act_dtype,
                       history_len=history_len, backend="triton", device=device)
    cases: list[KernelCase] = []

    def add(name: str, kernel: str, run: Callable[[Config], object], moved: int) -> None:
        if name in names:
            cases.append(KernelCase(name, kernel, run, int(moved)))

    nat, _ = _pool(geom, params, base, seed)
    qkv = x.mixed_qkv.clone()  # the conv output the state kernels read (the conv case writes its own)
    conv_out = torch.empty_like(x.mixed_qkv)
    add(CONV, CONV, lambda c: causal_conv_update(x.mixed_qkv, nat.conv[0], nat.conv_offset, p.conv_weight[0], slots,
                                                 widths, cu, c, out=conv_out),
        n * geom.conv_dim * ab * (2 * W + 2 * (geom.conv_kernel - 1) + W))
    add(NATIVE_VERIFY, NATIVE_VERIFY,
        lambda c: native_verify(nat.ssm, 0, qkv, x.a, x.b, p.A_log[0], p.dt_bias[0], nat.conv_offset, slots, widths,
                                cu, c, lb),
        n * ((1 + W) * state + W * tok_in))

    if drafts >= 1:
        cmp, _ = _pool(geom, params, replace(base, mode="compact", variant="accept"), seed)
        pool = cmp._kernel_pool()
        add(COMPACT_VERIFY, COMPACT_VERIFY,
            lambda c: compact_verify(pool, 0, qkv, x.a, x.b, p.A_log[0], p.dt_bias[0], slots, widths, cu, c, lb),
            n * (state + W * (record + tok_in)))
        if precompute_supported(K, V, geom.family, W, lb) is None:
            add(COMPACT_PRECOMPUTE, COMPACT_PRECOMPUTE,
                lambda c: compact_precompute_verify(pool, 0, qkv, x.a, x.b, p.A_log[0], p.dt_bias[0], slots, widths,
                                                    cu, c, lb, **prec),
                n * (state + W * (record + tok_in)))
        add(COMPACT_COMMIT, COMPACT_COMMIT, lambda c: compact_commit(pool, slots, accepted, c),
            n * (2 * state + kept * record))
        dfr, _ = _pool(geom, params, replace(base, mode="compact", variant="deferred"), seed)
        dfr.pending[:n] = accepted
        dpool = dfr._kernel_pool()
        add(DEFERRED_VERIFY, DEFERRED_VERIFY,
            lambda c: compact_verify(dpool, 0, qkv, x.a, x.b, p.A_log[0], p.dt_bias[0], slots, widths, cu, c, lb),
            n * (2 * state + kept * record + W * (record + tok_in)))
        if DEFERRED_PRECOMPUTE in names and precompute_supported(K, V, geom.family, W, lb) is None:
            add(DEFERRED_PRECOMPUTE, DEFERRED_PRECOMPUTE,
                lambda c: compact_precompute_verify(dpool, 0, qkv, x.a, x.b, p.A_log[0], p.dt_bias[0], slots, widths,
                                                    cu, c, lb, **prec),
                n * (2 * state + kept * record + W * (record + tok_in)))

    # (each case's closure binds its own pool, records and buffer: later cases reuse the names)
    P = 2 * history_len
    folded = history_len - W + 2  # the records a folding row holds: it overflows the half it fills

    def every_row_folds(state) -> torch.Tensor:
        """Put every row where `replay_prepare` leaves a row that folds (the cursor on the other half,
        count 0); its fold_from: the `folded` records of the first half."""
        state.cursor[:n] = P
        return torch.full((n,), folded, dtype=torch.int32, device=device)

    for name, fold in ((REPLAY_FORWARD, False), ("replay-forward-folding", True)):
        if name not in names:
            continue
        rep, _ = _pool(geom, params, replace(base, mode="replay", variant="inline"), seed)
        if fold:
            count, fold_from = folded, every_row_folds(rep)
        else:
            rep.cursor[:n] = count = history
            fold_from = torch.full((n,), -1, dtype=torch.int32, device=device)
        moved = n * (state + W * (derived + raw + tok_in) + (count * (raw + HV * gw * 4) + state if fold
                                                             else history * derived))
        add(name, REPLAY_FORWARD,
            lambda c, r=rep, f=fold_from: replay_forward(r._pool, 0, qkv, x.a, x.b, p.A_log[0], p.dt_bias[0], slots,
                                                         widths, cu, f, c, lb),
            moved)
    if "replay-forward-matrix-folding" in names and matrix_fold_supported(K, V, base.history_dtype) is None:
        # the inline-matrix variants' forward in the round every row folds: the fold reads the derived records
        mat, _ = _pool(geom, params, replace(base, mode="replay", variant="inline-matrix"), seed)
        fold_from = every_row_folds(mat)
        fold_config = mat.kernel_configs[REPLAY_MATRIX_FOLD]
        add("replay-forward-matrix-folding", REPLAY_FORWARD,
            lambda c, m=mat, f=fold_from: replay_forward(m._pool, 0, qkv, x.a, x.b, p.A_log[0], p.dt_bias[0], slots,
                                                         widths, cu, f, c, lb, fold_config=fold_config,
                                                         fold_precision=precision or DEFAULT_PRECISION),
            n * (2 * state + W * (derived + raw + tok_in) + folded * derived))
    if REPLAY_FOLD in names:
        rep, _ = _pool(geom, params, replace(base, mode="replay", variant="inline"), seed)
        count = history_len
        fold_from = torch.full((n,), count, dtype=torch.int32, device=device)
        dst = torch.empty(n, 1, HV, K, V, dtype=state_dtype, device=device)
        add(REPLAY_FOLD, REPLAY_FOLD, lambda c, r=rep, f=fold_from, d=dst: replay_fold(r._pool, slots, f, c, dst=d),
            n * (2 * state + count * (raw + HV * gw * 4)))
    if REPLAY_MATRIX_FOLD in names and matrix_fold_supported(K, V, base.history_dtype) is None:
        mat, _ = _pool(geom, params, replace(base, mode="replay", variant="matrix"), seed)
        count = history_len
        fold_from = torch.full((n,), count, dtype=torch.int32, device=device)
        dst = torch.empty(n, 1, HV, K, V, dtype=state_dtype, device=device)
        add(REPLAY_MATRIX_FOLD, REPLAY_MATRIX_FOLD,
            lambda c, m=mat, f=fold_from, d=dst: replay_matrix_fold(m._pool, slots, f, c, dst=d, **prec),
            n * (2 * state + count * derived))
    if REPLAY_PRECOMPUTE in names and precompute_supported(K, V, geom.family, W, lb) is None:
        pre, _ = _pool(geom, params, replace(base, mode="replay", variant="precompute"), seed)
        pre.cursor[:n] = history
        add(REPLAY_PRECOMPUTE, REPLAY_PRECOMPUTE,
            lambda c: replay_precompute_forward(pre._pool, 0, qkv, x.a, x.b, p.A_log[0], p.dt_bias[0], slots, widths,
                                                cu, c, lb, **prec),
            n * (state + W * (derived + raw + tok_in) + history * derived))
    if ("replay-precompute-folding" in names and precompute_supported(K, V, geom.family, W, lb) is None
            and matrix_fold_supported(K, V, base.history_dtype) is None):
        # the matrix variants' forward where every row folds inside it (the round a row's ring half fills)
        mat, _ = _pool(geom, params, replace(base, mode="replay", variant="matrix"), seed)
        fold_from = every_row_folds(mat)
        add("replay-precompute-folding", REPLAY_PRECOMPUTE,
            lambda c, m=mat, f=fold_from: replay_precompute_forward(m._pool, 0, qkv, x.a, x.b, p.A_log[0],
                                                                    p.dt_bias[0], slots, widths, cu, c, lb, fold_from=f,
                                                                    **prec),
            n * (2 * state + W * (derived + raw + tok_in) + folded * derived))
    return cases
