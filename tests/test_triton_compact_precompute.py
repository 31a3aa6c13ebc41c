"""Compact's matrix-form verify (kernels/ssm/compact_precompute.py, the `accept-precompute*` and
`deferred-precompute*` variants).

Contracts checked here:
* the records it writes equal the token-loop verify's byte for byte (raw k and v, `exp(g)`, beta), and
  nothing else of the pool changes: the state is only read, other slots and positions keep their poison;
  a deferred pool's commit of its pending records is the token loop's, bit for bit, in the same launch;
* so the accept commit after it gives native's states bit for bit, round after round (the pool's own
  rollout against native's, with idle rows and every acceptance pattern);
* its outputs track the token loop's and the fp64 reference within the fp32 contract (1e-5 RMS), padding
  rows zero and every valid row written whatever the buffer held.

The interpreter computes every `tl.dot` in fp32 whatever precision is asked, so the precisions themselves
are measured on a GPU (scripts/gpu_precompute.sh; the same tests run there with TRITON_INTERPRET=0).
"""

from __future__ import annotations

import pytest
import torch

from kernels.ssm.compact import CompactPool, compact_verify
from kernels.ssm.compact_precompute import compact_precompute_verify
from kernels.ssm.configs import COMPACT_PRECOMPUTE, COMPACT_VERIFY, DEFERRED_PRECOMPUTE, DEFERRED_VERIFY, default_config
from states.base import COMPACT_PRECOMPUTE_PRECISION, DEFERRED_PRECOMPUTE_PRECISION, MODE_VARIANTS
from tests.test_triton_native_compact import (CAP, DEVICE, ROUNDS, SLOW, SMALL_BLOCKS, W, _bytes, _direct_inputs,
                                              _reference_errors, _rms, _run)

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
MATRIX = {"BV": 16, "BK": 16, "num_warps": 1, "num_stages": 1}


def _pool(geom, family: str, gen: torch.Generator) -> CompactPool:
    """An accept pool whose every tensor holds random bits (the state a plausible one)."""
    L, H, HV, K, V = geom.layers, geom.key_heads, geom.value_heads, geom.head_k_dim, geom.head_v_dim
    gate = [K] if family == "kda" else []
    return CompactPool(torch.randn(L, CAP, HV, K, V, generator=gen).mul(0.3).to(DEVICE),
                       torch.randn(L, CAP, H, W, K, generator=gen).to(torch.bfloat16).to(DEVICE),
                       torch.randn(L, CAP, HV, W, V, generator=gen).to(torch.bfloat16).to(DEVICE),
                       torch.rand(L, CAP, HV, W, *gate, generator=gen).to(DEVICE),
                       torch.rand(L, CAP, HV, W, generator=gen).to(DEVICE))


def _clone(pool: CompactPool) -> CompactPool:
    tensors = (pool.ssm, pool.rec_k, pool.rec_v, pool.rec_decay, pool.rec_beta)
    if pool.deferred:
        tensors += (pool.pending, pool.parity)
    return CompactPool(*(t.clone() for t in tensors))


def _deferred(pool: CompactPool, gen: torch.Generator) -> CompactPool:
    """A deferred pool from `pool`: two halves of random records, and per slot a pending round (last accepted
    token) in either half, or none (-1)."""
    halves = [torch.cat([t, t.flip(3)], dim=3) for t in (pool.rec_k, pool.rec_v, pool.rec_decay, pool.rec_beta)]
    pending = torch.tensor([W - 1, 1, W - 1, 2, -1][:CAP], dtype=torch.int32)
    parity = torch.tensor([0, 1, 0, 1, 0][:CAP], dtype=torch.int32)
    return CompactPool(pool.ssm, *halves, pending.to(DEVICE), parity.to(DEVICE))


@pytest.mark.parametrize("family", ["gdn", pytest.param("kda", marks=SLOW)])
def test_records_equal_the_token_loop_and_nothing_else_moves(family):
    gen = torch.Generator().manual_seed(11)
    widths = [2, 0, W]
    geom, (qkv, a, b, A_log, dt_bias, slots, widths_t, cu) = _direct_inputs(family, gen, widths)
    loop, matrix = _pool(geom, family, gen), None
    matrix = _clone(loop)
    before = _clone(loop)
    T, HV, V = qkv.shape[0], geom.value_heads, geom.head_v_dim
    step = default_config(COMPACT_VERIFY, head_k_dim=geom.head_k_dim, head_v_dim=V, conv_dim=geom.conv_dim)
    want = compact_verify(loop, 1, qkv, a, b, A_log, dt_bias, slots, widths_t, cu, step)
    got = compact_precompute_verify(matrix, 1, qkv, a, b, A_log, dt_bias, slots, widths_t, cu, MATRIX,
                                    geom.lower_bound, out=torch.full((T, HV, V), float("nan"), device=DEVICE))
    for name in ("ssm", "rec_k", "rec_v", "rec_decay", "rec_beta"):
        assert torch.equal(_bytes(getattr(matrix, name)), _bytes(getattr(loop, name))), f"{name} differs from the loop's"
    assert torch.equal(_bytes(matrix.ssm), _bytes(before.ssm)), "the state was written"
    # the records the round wrote are the only change: layer 0, idle row 0's slot and the other slots keep theirs
    changed = (matrix.rec_v != before.rec_v).any(-1).any(-1).any(-1)  # [L, CAP]
    assert not changed[0].any() and not changed[1, 0] and not changed[1, 4], "records outside the round changed"
    total = sum(widths)
    assert torch.equal(got[total:], torch.zeros_like(got[total:])), "padding rows were not zeroed"
    assert torch.isfinite(got[:total]).all(), "a valid output row was not written"
    assert _rms(got[:total], want[:total]) < 1e-5


# The rollouts run under `-m slow` (28 CPU seconds even for KDA in the interpreter): the fast suite holds the
# records byte for byte above, and the commit that reads them is accept's own (tests/test_triton_native_compact.py)
@pytest.mark.parametrize(("family", "state_dtype"), [
    pytest.param("gdn", torch.float32, marks=SLOW),
    pytest.param("kda", torch.float32, marks=SLOW),
    pytest.param("gdn", torch.bfloat16, marks=SLOW),
], ids=["gdn-fp32", "kda-fp32", "gdn-bf16"])
@pytest.mark.parametrize("variant", ["accept-precompute", "deferred-precompute"])
def test_commits_equal_native_bit_for_bit(family, state_dtype, variant):
    configs = {**SMALL_BLOCKS, COMPACT_PRECOMPUTE: MATRIX, DEFERRED_PRECOMPUTE: MATRIX}
    native, _ = _run("native", "triton", family, state_dtype, ROUNDS, configs=configs)
    matrix, state = _run("compact", "triton", family, state_dtype, ROUNDS, configs=configs, variant=variant)
    for i in range(len(ROUNDS)):
        for (got, want) in zip(matrix.after[i], native.after[i]):
            assert torch.equal(_bytes(got), _bytes(want)), f"round {i}: committed state differs from native's"
        for layer, (o, o_n) in enumerate(zip(matrix.outputs[i], native.outputs[i])):
            bound = 1e-5 if state_dtype == torch.float32 else 5e-3  # bf16: the loop rounds its state each token
            assert _rms(o, o_n) < bound, f"round {i} layer {layer}"
    if state_dtype == torch.float32:
        out_err, state_err = _reference_errors(matrix, state, ROUNDS)
        assert out_err < 1e-5 and state_err < 1e-5


def test_variants_and_their_refusals():
    assert MODE_VARIANTS["compact"][:2] == ("accept", "deferred")
    assert set(COMPACT_PRECOMPUTE_PRECISION) | set(DEFERRED_PRECOMPUTE_PRECISION) <= set(MODE_VARIANTS["compact"])
    assert COMPACT_PRECOMPUTE_PRECISION["accept-precompute"] == "ieee"
    assert DEFERRED_PRECOMPUTE_PRECISION == {k.replace("accept-", "deferred-"): p
                                             for k, p in COMPACT_PRECOMPUTE_PRECISION.items()}
    gen = torch.Generator().manual_seed(2)
    geom, (qkv, a, b, A_log, dt_bias, slots, widths_t, cu) = _direct_inputs("gdn", gen, [W, W, W])
    pool = _pool(geom, "gdn", gen)
    with pytest.raises(ValueError, match="precision 'fp16' not in"):
        compact_precompute_verify(pool, 0, qkv, a, b, A_log, dt_bias, slots, widths_t, cu, MATRIX, precision="fp16")
    # a deferred pool takes the deferred kernel's config (its own key in the autotuner and the caches)
    with pytest.raises(ValueError, match="BV"):
        compact_precompute_verify(_deferred(pool, gen), 0, qkv, a, b, A_log, dt_bias, slots, widths_t, cu,
                                  {"BV": 16, "num_warps": 1, "num_stages": 1})


@pytest.mark.parametrize("family", ["gdn", pytest.param("kda", marks=SLOW)])
@pytest.mark.parametrize("state_dtype", [torch.float32, pytest.param(torch.bfloat16, marks=SLOW)], ids=["fp32", "bf16"])
def test_deferred_commits_and_records_equal_the_token_loop(family, state_dtype):
    """Pending rounds in either half and an idle row (which keeps its pending round): the state the launch
    commits and the records it writes equal the token-loop deferred verify's byte for byte."""
    gen = torch.Generator().manual_seed(13)
    widths = [2, 0, W]  # batch rows -> slots 3 (pending 2, half 1), 0 (idle, pending W-1), 2 (pending W-1, half 0)
    geom, (qkv, a, b, A_log, dt_bias, slots, widths_t, cu) = _direct_inputs(family, gen, widths)
    accept = _pool(geom, family, gen)
    loop = _deferred(CompactPool(accept.ssm.to(state_dtype), accept.rec_k, accept.rec_v, accept.rec_decay,
                                 accept.rec_beta), gen)
    matrix, before = _clone(loop), _clone(loop)
    T, HV, V = qkv.shape[0], geom.value_heads, geom.head_v_dim
    step = default_config(DEFERRED_VERIFY, head_k_dim=geom.head_k_dim, head_v_dim=V, conv_dim=geom.conv_dim)
    want = compact_verify(loop, 1, qkv, a, b, A_log, dt_bias, slots, widths_t, cu, step)
    got = compact_precompute_verify(matrix, 1, qkv, a, b, A_log, dt_bias, slots, widths_t, cu, MATRIX,
                                    geom.lower_bound, out=torch.full((T, HV, V), float("nan"), device=DEVICE))
    for name in ("ssm", "rec_k", "rec_v", "rec_decay", "rec_beta", "pending", "parity"):
        assert torch.equal(_bytes(getattr(matrix, name)), _bytes(getattr(loop, name))), f"{name} differs from the loop's"
    committed = (matrix.ssm != before.ssm).flatten(2).any(-1)  # [L, CAP]
    assert committed[1].tolist() == [False, False, True, True, False], "commit of the wrong slots"
    assert not committed[0].any(), "a layer outside the round was written"
    total = sum(widths)
    assert torch.equal(got[total:], torch.zeros_like(got[total:])), "padding rows were not zeroed"
    assert torch.isfinite(got[:total]).all(), "a valid output row was not written"
    bound = 1e-5 if state_dtype == torch.float32 else 5e-3  # bf16: the loop rounds its state each token
    assert _rms(got[:total], want[:total]) < bound
