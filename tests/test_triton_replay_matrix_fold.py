"""Replay's matrix fold (kernels/ssm/replay_matrix_fold.py) against the fold's definition in fp64.

The definition is the token loop `S_j = e^{g_j} ⊙ S_{j-1} + k_j d_j^T` over a row's `count` records since
its checkpoint, from the stored normalized keys, d's and log gates (states/replay.py). The pool here is
random (records need not come from a forward: the fold is linear algebra over whatever is stored), with
rows in both ring halves, counts from 0 to Lh, rows that do not fold (`fold_from = -1`), two V blocks, more
than one key head per value-head group, and poison in every output it must not write. Interpreter on CPU,
real compilation on a GPU (where the products run at the asked precision)."""

from __future__ import annotations

import pytest
import torch

from kernels.common.triton_cpu import interpreting
from kernels.ssm.replay import ReplayPool
from kernels.ssm.replay_matrix_fold import matrix_fold_supported, replay_matrix_fold

DEVICE = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
CONFIG = {"BV": 16, "BK": 16, "num_warps": 1, "num_stages": 1}
L, CAP, H, HV, K, V, LH = 2, 6, 1, 2, 16, 32, 4
P = 2 * LH
# slot, phase, count, folds? (fold_from -1 leaves the row alone)
ROWS = [(4, 0, 4, True), (1, 1, 3, True), (2, 0, 0, True), (5, 1, 2, False), (0, 1, 1, True)]
FP32_RMS = 1e-6  # one reassociated fp32 sum of <= Lh terms per element; on a GPU at ieee / bf16x3 the same order


def _pool(kda: bool, state_dtype: torch.dtype, gen: torch.Generator) -> ReplayPool:
    gate = (L, CAP, HV, P, K) if kda else (L, CAP, HV, P)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)

    hist_k = torch.nn.functional.normalize(torch.randn(L, CAP, H, P, K, generator=gen), dim=-1).to(DEVICE)
    log_g = -torch.rand(gate, generator=gen).mul(0.7).to(DEVICE)  # decays 0.5 .. 1
    return ReplayPool(rand(L, CAP, HV, K, V, dtype=state_dtype) * 0.3, hist_k, rand(L, CAP, HV, P, V) * 0.2, log_g,
                      rand(L, CAP, H, P, K, dtype=torch.bfloat16), rand(L, CAP, HV, P, V, dtype=torch.bfloat16),
                      torch.rand(L, CAP, HV, P, generator=gen).to(DEVICE), torch.zeros(CAP, dtype=torch.int32,
                                                                                      device=DEVICE))


def _definition(pool: ReplayPool, slot: int, phase: int, count: int) -> torch.Tensor:
    """`[L, HV, K, V]` fp64: the token loop over the row's records."""
    S = pool.ssm[:, slot].double().clone()
    for j in range(count):
        pos = phase * LH + j
        k = pool.hist_k[:, slot, :, pos].double().repeat_interleave(HV // H, dim=1)  # [L, HV, K]
        d = pool.hist_d[:, slot, :, pos].double()  # [L, HV, V]
        g = pool.hist_g[:, slot, :, pos].double()  # [L, HV] or [L, HV, K]
        decay = torch.exp(g)[..., None, None] if g.dim() == 2 else torch.exp(g)[..., None]
        S = decay * S + k[..., :, None] * d[..., None, :]
    return S


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_matrix_fold_is_the_token_loop_of_its_records(kda: bool, state_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7 + kda + 2 * (state_dtype == torch.bfloat16))
    pool = _pool(kda, state_dtype, gen)
    slots = torch.tensor([r[0] for r in ROWS], device=DEVICE)
    cursors = torch.tensor([ph * P + c for _, ph, c, _ in ROWS], dtype=torch.int32, device=DEVICE)
    fold_from = torch.where(torch.tensor([f for *_, f in ROWS], device=DEVICE), cursors, -1).to(torch.int32)
    pool.cursor[slots] = cursors
    want = torch.stack([_definition(pool, s, ph, c) for s, ph, c, _ in ROWS])  # [n, L, HV, K, V]
    tol = FP32_RMS if state_dtype == torch.float32 else 2 ** -8  # bf16: rounded once

    # snapshot: into a poisoned copy; the pool is only read, rows that do not fold keep the poison
    before = {name: t.clone() for name, t in vars(pool).items()}
    dst = torch.full((len(ROWS), L, HV, K, V), float("nan"), dtype=state_dtype, device=DEVICE)
    replay_matrix_fold(pool, slots, fold_from, CONFIG, dst=dst)
    for name, t in vars(pool).items():
        assert torch.equal(t, before[name]), f"a snapshot fold wrote the pool's {name}"
    for i, (_, _, _, folds) in enumerate(ROWS):
        if folds:
            assert torch.isfinite(dst[i]).all()
            assert _rms(dst[i], want[i]) <= tol, f"row {i}: RMS {_rms(dst[i], want[i]):.2e} against the token loop"
        else:
            assert dst[i].isnan().all(), f"row {i} does not fold, yet its destination was written"
    # a row with no record folds to its checkpoint, rounded once: the same bits
    assert torch.equal(dst[2], pool.ssm[:, ROWS[2][0]])

    # in place, one layer: that layer's folding rows change, every other byte of the pool stays
    replay_matrix_fold(pool, slots, fold_from, CONFIG, layer=1)
    for i, (slot, _, _, folds) in enumerate(ROWS):
        assert torch.equal(pool.ssm[1, slot], dst[i, 1] if folds else before["ssm"][1, slot])
    keep = torch.ones(L, CAP, dtype=torch.bool)
    keep[1, [s for s, *_, f in ROWS if f]] = False
    assert torch.equal(pool.ssm[keep.to(DEVICE)], before["ssm"][keep.to(DEVICE)])
    for name in ("hist_k", "hist_d", "hist_g", "raw_k", "raw_v", "raw_beta", "cursor"):
        assert torch.equal(getattr(pool, name), before[name]), f"an in-place fold wrote the pool's {name}"


def test_the_matrix_fold_refuses_what_it_cannot_fold() -> None:
    assert "K >= 16" in matrix_fold_supported(8, 16, torch.float32)
    assert "fp32" in matrix_fold_supported(128, 128, torch.bfloat16)
    assert matrix_fold_supported(128, 128, torch.float32) is None
    gen = torch.Generator().manual_seed(3)
    pool = _pool(False, torch.float32, gen)
    bf16 = ReplayPool(pool.ssm, pool.hist_k.bfloat16(), pool.hist_d.bfloat16(), pool.hist_g, pool.raw_k, pool.raw_v,
                      pool.raw_beta, pool.cursor)
    slots = torch.tensor([0], device=DEVICE)
    with pytest.raises(ValueError, match="bf16 history"):
        replay_matrix_fold(bf16, slots, torch.zeros(1, dtype=torch.int32, device=DEVICE), CONFIG)
    with pytest.raises(ValueError, match="precision 'fp16'"):
        replay_matrix_fold(pool, slots, torch.zeros(1, dtype=torch.int32, device=DEVICE), CONFIG, precision="fp16")


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_the_forward_folds_inside_as_the_fold_launch_does(kda: bool) -> None:
    """`replay_precompute_forward(..., fold_from=...)` (the matrix variants' fused fold) against the matrix
    fold's own launch followed by the forward: every byte of the pool and of the outputs the same (the same
    helper at the same config; on a GPU within the fold's fp32 bound, since the two kernels may lay out the
    product differently), folding and non-folding rows, one row shorter than the round, the other layer
    untouched."""
    from kernels.ssm.replay_precompute import replay_precompute_forward

    gen = torch.Generator().manual_seed(23 + kda)
    W = 2  # the non-folding row holds 2 records: 2 + W <= Lh
    fused = _pool(kda, torch.float32, gen)
    apart = ReplayPool(**{name: t.clone() for name, t in vars(fused).items()})
    slots = torch.tensor([r[0] for r in ROWS], device=DEVICE)
    n = len(ROWS)
    old = torch.tensor([ph * P + c for _, ph, c, _ in ROWS], dtype=torch.int32, device=DEVICE)
    folds = torch.tensor([f for *_, f in ROWS], device=DEVICE)
    fold_from = torch.where(folds, old, -1).to(torch.int32)
    after = torch.where(folds, (1 - old // P) * P, old).to(torch.int32)  # replay_prepare's flip
    for pool in (fused, apart):
        pool.cursor[slots] = after
    widths = torch.tensor([W, W, 1, W, W], dtype=torch.int32, device=DEVICE)
    cu = torch.cat([widths.new_zeros(1), widths.cumsum(0).to(torch.int32)])  # packed, the padding after
    qkv = torch.randn(n * W, 2 * H * K + HV * V, generator=gen).to(torch.bfloat16).to(DEVICE)
    a = torch.randn(*((n * W, HV, K) if kda else (n * W, HV)), generator=gen).to(DEVICE)
    b = torch.randn(n * W, HV, generator=gen).to(DEVICE)
    A_log = torch.rand(HV, generator=gen).to(DEVICE)
    dt_bias = torch.randn(HV * K if kda else HV, generator=gen).to(DEVICE)
    args = (qkv, a, b, A_log, dt_bias, slots, widths, cu, CONFIG)

    replay_matrix_fold(apart, slots, fold_from, CONFIG, layer=1)
    want = replay_precompute_forward(apart, 1, *args)
    before = {name: t.clone() for name, t in vars(fused).items()}
    got = replay_precompute_forward(fused, 1, *args, fold_from=fold_from)

    exact = interpreting()
    assert torch.isfinite(got).all()
    assert torch.equal(got, want) if exact else _rms(got, want) <= FP32_RMS
    for name, t in vars(fused).items():
        assert torch.equal(t[0], before[name][0]) if name != "cursor" else True, f"layer 0's {name} was written"
        if exact or name != "ssm":
            assert torch.equal(t, getattr(apart, name)), f"{name} differs from the fold launch's"
        else:
            assert _rms(t, apart.ssm) <= FP32_RMS
    with pytest.raises(ValueError, match="fold_from must be"):
        replay_precompute_forward(fused, 1, *args, fold_from=fold_from[:2])
