"""Native verify/decode: read the accepted snapshot, store the state after every token (SPEC §3).

Pool `ssm [L, slots, S + 1, HV, K, V]` (fp32 or bf16): snapshot `t` of a slot holds the state after
token `t` of the last round and `conv_offset[slot]` names the accepted one. Per request, value head
and BV block of state columns, the kernel reads the accepted snapshot, then for each of its `w`
tokens prepares q, k, v, `exp(g)` and beta from the conv output (`load_token`, `prepare_token`), runs `delta_step`,
takes the output from the unrounded fp32 state, rounds the state to the state dtype, stores it into
snapshot `t` and carries on from the rounded value. Decode (S = 0) is the same kernel with one
snapshot, updated in place. Grid and block shapes follow fla's fused_recurrent: one program per
(V block, request, value head), the whole K in one block; the token loop is unrolled over the round
width W (masked past a row's width) so every token's loads can be issued ahead of the math.

`head_gate_params`, `zero_padding_rows` and `check_verify_inputs` are shared with compact and
replay, and every mode prepares a token with `load_token` / `prepare_token` (kernels/ssm/step.py),
so all of them feed the step the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ssm.configs import NATIVE_VERIFY, Config, check_config
from kernels.ssm.step import (
    ENABLE_FP_FUSION,
    decay_of,
    delta_step,
    load_token,
    prepare_token,
    round_to,
    step_output,
)


@triton.jit
def head_gate_params(A_log, dt_bias, i_hv, o_k, m_k, K: tl.constexpr, IS_KDA: tl.constexpr):
    """`(A_log, dt_bias)` of value head `i_hv` in fp32: dt_bias is a scalar (GDN) or `[BK]` (KDA)."""
    b_A_log = tl.load(A_log + i_hv).to(tl.float32)
    if IS_KDA:
        b_bias = tl.load(dt_bias + i_hv * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    else:
        b_bias = tl.load(dt_bias + i_hv).to(tl.float32)
    return b_A_log, b_bias


@triton.jit
def zero_padding_rows(out, cu_seqlens, i_n, bos, w, n, i_hv, o_v, m_v, HV: tl.constexpr, V: tl.constexpr,
                      W: tl.constexpr, BV: tl.constexpr):
    """Packed rows past `cu_seqlens[n]` are padding; request `i_n` zeroes its `W - w` share of them."""
    pad = tl.load(cu_seqlens + n).to(tl.int64) + i_n * W - bos
    for t in range(0, W - w):
        tl.store(out + ((pad + t) * HV + i_hv) * V + o_v, tl.zeros([BV], dtype=tl.float32), mask=m_v)


@triton.jit(do_not_specialize=["layer", "cap", "n"])
def native_verify_kernel(qkv, a, b, A_log, dt_bias, out, ssm, conv_offset, slots, widths, cu_seqlens,
                         layer, cap, n, scale, lower_bound,
                         H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
                         IS_KDA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    pid = tl.program_id(0)
    NV: tl.constexpr = tl.cdiv(V, BV)
    i_v, i_nh = pid % NV, pid // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    slot = tl.load(slots + i_n).to(tl.int64)
    w = tl.load(widths + i_n)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    # an idle row reads nothing of its slot: its offset may be anything, e.g. in a slot never used
    off = tl.load(conv_offset + slot, mask=w > 0, other=0).to(tl.int64)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    # snapshot t of (layer, slot, head) at ((row * W + t) * HV + i_hv) * K * V; row is int64 through slot
    row = layer * cap + slot
    o_h = o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(ssm + ((row * W + off) * HV + i_hv) * K * V + o_h, mask=m_h & (w > 0), other=0.0).to(tl.float32)
    b_A_log, b_bias = head_gate_params(A_log, dt_bias, i_hv, o_k, m_k, K, IS_KDA)
    # the round's token loop, unrolled over W: token t + 1's loads are issued before token t's math and
    # stores (a store may alias a later load, so the compiler would not hoist them itself)
    x_q, x_k, x_v, x_a, x_b = load_token(qkv, a, b, bos, w > 0, i_h, i_hv, o_k, m_k, o_v, m_v, H, HV, K, V, IS_KDA)
    for t in tl.static_range(W):
        c_q, c_k, c_v, c_a, c_b = x_q, x_k, x_v, x_a, x_b
        if t + 1 < W:
            x_q, x_k, x_v, x_a, x_b = load_token(qkv, a, b, bos + t + 1, t + 1 < w, i_h, i_hv, o_k, m_k, o_v, m_v,
                                                 H, HV, K, V, IS_KDA)
        b_q, b_k, b_v, b_g, b_beta = prepare_token(c_q, c_k, c_v, c_a, c_b, b_A_log, b_bias, scale, lower_bound,
                                                   IS_KDA)
        b_h = delta_step(b_h, b_k, b_v, decay_of(b_g, IS_KDA), b_beta)
        tl.store(out + ((bos + t) * HV + i_hv) * V + o_v, step_output(b_h, b_q), mask=m_v & (t < w))
        b_h = round_to(b_h, ssm.dtype.element_ty)
        tl.store(ssm + ((row * W + t) * HV + i_hv) * K * V + o_h, b_h, mask=m_h & (t < w))
        b_h = b_h.to(tl.float32)
    zero_padding_rows(out, cu_seqlens, i_n, bos, w, n, i_hv, o_v, m_v, HV, V, W, BV)


def check_verify_inputs(qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                        dt_bias: torch.Tensor, slots: torch.Tensor, widths: torch.Tensor, cu_seqlens: torch.Tensor,
                        H: int, HV: int, K: int, V: int, W: int, out: torch.Tensor | None) -> tuple[bool, torch.Tensor]:
    """Validate a verify launch's token inputs; returns `(is_kda, out)` with `out` allocated if None."""
    n = slots.shape[0]
    T = n * W
    is_kda = a.dim() == 3
    want = {
        "qkv": (T, 2 * H * K + HV * V), "a": (T, HV, K) if is_kda else (T, HV), "b": (T, HV),
        "A_log": (HV,), "dt_bias": (HV * K,) if is_kda else (HV,), "widths": (n,), "cu_seqlens": (n + 1,),
    }
    got = {"qkv": qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias, "widths": widths, "cu_seqlens": cu_seqlens}
    for name, shape in want.items():
        if tuple(got[name].shape) != shape:
            raise ValueError(f"{name} has shape {tuple(got[name].shape)}, expected {shape} "
                             f"({n} requests x W={W}, H={H}, HV={HV}, K={K}, V={V})")
        if not got[name].is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if out is None:
        return is_kda, torch.empty(T, HV, V, dtype=torch.float32, device=qkv.device)
    if tuple(out.shape) != (T, HV, V) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} must be a contiguous float32 {(T, HV, V)}")
    return is_kda, out


def step_launch_options(kernel: str, config: Config, V: int) -> tuple[int, dict]:
    """`(BV, launch kwargs)` of a state kernel's config: BV capped by V, fp fusion off (SPEC §2)."""
    config = check_config(kernel, config)
    opts = {"num_warps": config["num_warps"], "num_stages": config["num_stages"], "enable_fp_fusion": ENABLE_FP_FUSION}
    return min(config["BV"], triton.next_power_of_2(V)), opts


def native_verify(
    ssm: torch.Tensor,
    layer: int,
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    conv_offset: torch.Tensor,
    slots: torch.Tensor,
    widths: torch.Tensor,
    cu_seqlens: torch.Tensor,
    config: Config,
    lower_bound: float = -5.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer of a native verify (or decode, S = 0) round; writes snapshots `0 .. w - 1` of each row.

    Args:
        ssm: `[L, slots, S + 1, HV, K, V]` fp32 or bf16, the whole native pool (contiguous).
        layer: which layer of the pool.
        qkv: `[T, 2*H*K + HV*V]` activation dtype, conv outputs q | k | v, packed (`T = n * (S + 1)`).
        a: gate input, `[T, HV]` for GDN or `[T, HV, K]` for KDA (the family follows from its rank).
        b: `[T, HV]`, beta input.
        A_log: `[HV]` fp32.
        dt_bias: `[HV]` (GDN) or `[HV * K]` (KDA) fp32.
        conv_offset: `[slots]` int32           # slot -> accepted snapshot (and conv window column)
        slots: `[n]` int64                     # slot: [batch row] -> pool row (distinct)
        widths: `[n]` int32, tokens of each row (0 = idle: nothing read or written but zero outputs).
        cu_seqlens: `[n + 1]` int32            # row r owns packed tokens cu_seqlens[r] : cu_seqlens[r] + widths[r]
        config: the `native-verify` config (`BV`, `num_warps`, `num_stages`).
        lower_bound: KDA gate bound.
        out: optional `[T, HV, V]` float32 buffer.

    Returns:
        out `[T, HV, V]` float32: every row written, rows past `cu_seqlens[n]` zero.
    """
    L, cap, W, HV, K, V = ssm.shape
    H = (qkv.shape[1] - HV * V) // (2 * K)
    if not ssm.is_contiguous() or not 0 <= layer < L:
        raise ValueError(f"native pool {tuple(ssm.shape)} must be contiguous and layer {layer} in [0, {L})")
    is_kda, out = check_verify_inputs(qkv, a, b, A_log, dt_bias, slots, widths, cu_seqlens, H, HV, K, V, W, out)
    BV, opts = step_launch_options(NATIVE_VERIFY, config, V)
    n = slots.shape[0]
    native_verify_kernel[(triton.cdiv(V, BV) * n * HV,)](
        qkv, a, b, A_log, dt_bias, out, ssm, conv_offset, slots, widths, cu_seqlens,
        layer, cap, n, K**-0.5, lower_bound,
        H=H, HV=HV, K=K, V=V, W=W, IS_KDA=is_kda, BK=triton.next_power_of_2(K), BV=BV, **opts,
    )
    return out
