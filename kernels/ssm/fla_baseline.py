"""fla-core's fused_recurrent kernels on a native verify/decode round: the field's reference kernel.

`fla_fused_recurrent` feeds `fused_recurrent_gated_delta_rule` (GDN) or `fused_recurrent_kda` (KDA) the
same tensors native verify consumes (conv outputs, raw gate and beta inputs, the accepted states) with
the gate, beta sigmoid and q/k normalization done in fla's kernel, so benchmark tables can put it
beside ours. It is a baseline, not a mode: fla keeps the state in fp32 over the whole round (no
per-token rounding), returns only the final state, and writes its outputs in the activation dtype.

fla-core is an optional dependency (the `fla` extra), imported on first use; without it the call
raises `FlaUnavailableError`, which scenarios report as an `unsupported` row.
"""

from __future__ import annotations

import torch


class FlaUnavailableError(ImportError):
    """fla-core (the `fla` extra) is not importable here."""


def _fla_kernels():
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        from fla.ops.kda import fused_recurrent_kda
    except ImportError as e:
        raise FlaUnavailableError(
            f"the fla baseline needs fla-core 0.6 (pip install 'ssm-state-harness[fla]'): {e}"
        ) from e
    return fused_recurrent_gated_delta_rule, fused_recurrent_kda


def fla_fused_recurrent(
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    lower_bound: float = -5.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer of a round through fla's fused_recurrent kernel.

    Args:
        qkv: `[T, 2*H*K + HV*V]` activation dtype, conv outputs q | k | v in packed rows.
        a: gate input, `[T, HV]` for GDN or `[T, HV, K]` for KDA (the family follows from its rank).
        b: `[T, HV]`, beta input (fla applies the sigmoid).
        A_log: `[HV]` fp32.
        dt_bias: `[HV]` (GDN) or `[HV * K]` (KDA) fp32.
        initial_state: `[n, HV, K, V]` fp32 or bf16, the accepted state of each request (e.g. gathered
            from a pool at `conv_offset`).
        cu_seqlens: `[n + 1]` int32 or int64 # row r owns packed tokens cu_seqlens[r] : cu_seqlens[r + 1]
        lower_bound: KDA gate bound.

    Returns:
        outputs `[T, HV, V]` float32 (fla's activation-dtype outputs widened; rows past
        `cu_seqlens[n]` zero) and the final states `[n, HV, K, V]` float32 (an idle row's is its
        initial state). Write them back with `pool[...] = final.to(pool.dtype)`.
    """
    gdn_kernel, kda_kernel = _fla_kernels()
    T, C = qkv.shape
    n, HV, K, V = initial_state.shape
    H = (C - HV * V) // (2 * K)
    if 2 * H * K + HV * V != C or cu_seqlens.shape != (n + 1,) or a.shape[:2] != (T, HV) or b.shape != (T, HV):
        raise ValueError(f"fla baseline inputs qkv {tuple(qkv.shape)}, a {tuple(a.shape)}, b {tuple(b.shape)}, "
                         f"cu_seqlens {tuple(cu_seqlens.shape)} do not fit states {tuple(initial_state.shape)}")
    q = qkv[:, : H * K].reshape(1, T, H, K).contiguous()
    k = qkv[:, H * K : 2 * H * K].reshape(1, T, H, K).contiguous()
    v = qkv[:, 2 * H * K :].reshape(1, T, HV, V).contiguous()
    common = dict(
        beta=b[None], A_log=A_log, dt_bias=dt_bias, scale=K**-0.5, initial_state=initial_state,
        output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
        use_beta_sigmoid_in_kernel=True, cu_seqlens=cu_seqlens.long(),
    )
    if a.dim() == 3:
        o, final = kda_kernel(q, k, v, g=a[None], lower_bound=lower_bound, **common)
    else:
        # g and beta by keyword: the 5th positional parameter of the GDN kernel is gk
        o, final = gdn_kernel(q, k, v, g=a[None], **common)
    valid = torch.arange(T, device=qkv.device) < cu_seqlens[-1]
    return torch.where(valid[:, None, None], o[0].float(), 0.0), final
