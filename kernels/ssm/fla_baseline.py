"""The field's reference kernel as a baseline: fla-core's `fused_recurrent_kda_fwd`, in place on a pool.

fla-core 0.6.0 carries vLLM's decode / speculative-decoding kernel as `fused_recurrent_kda_fwd`: with
`ssm_state_indices` it reads each sequence's initial state from a row of a state pool and writes
states back into pool rows, in place (`inplace_final_state=True`):

* decode (`indices [n]`): the accepted state of row `indices[r]` is read and overwritten, the way a
  server calls fla's fused_recurrent on its pool (no gather/scatter around it);
* MTP (`indices [n, W]` and `num_accepted_tokens [n]`): the initial state is row
  `indices[r, num_accepted[r] - 1]` and the state after token `t` goes to row `indices[r, t]`: the
  vLLM-style native kernel, one state write per verified token.

That is exactly the native pool's layout (`[L, slots, S + 1, HV, K, V]`, row `slot * W + t`), so the
baseline runs on the native pool of our harness. GDN runs through the same kernel with its gate
broadcast over K (`lower_bound=None` selects `-exp(A_log) * softplus(a + dt_bias)`). The kernel keeps
fp32 between tokens (no per-token rounding of a bf16 state), normalizes q and k, applies the gate and
beta's sigmoid itself, and writes outputs in the activation dtype.

fla-core is an optional dependency (the `fla` extra), imported on first use; without it the call
raises `FlaUnavailableError`, which scenarios report as an `unsupported` row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class FlaUnavailableError(ImportError):
    """fla-core (the `fla` extra) is not importable here."""


def _fla_kernel():
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    except ImportError as e:
        raise FlaUnavailableError(
            f"the fla baseline needs fla-core 0.6 (pip install 'ssm-state-harness[fla]'): {e}"
        ) from e
    return fused_recurrent_kda_fwd


@dataclass(frozen=True)
class FlaLayerInputs:
    """What a round of one layer hands fla besides q, k, v (built once, outside any timed region).

    Attributes:
        g: `[1, T, HV, K]` activation dtype, the gate input (GDN's `[T, HV]` broadcast over K).
        beta: `[1, T, HV]`, the beta input (fla applies the sigmoid).
        A_log: `[HV]` fp32.
        dt_bias: `[HV * K]` fp32 (GDN's `[HV]` broadcast over K).
        lower_bound: KDA's gate bound, None for GDN (selects the softplus gate).
    """

    g: torch.Tensor
    beta: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    lower_bound: float | None

    @classmethod
    def of(cls, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, K: int,
           lower_bound: float) -> FlaLayerInputs:
        """From the harness's inputs: a `[T, HV]` (GDN) or `[T, HV, K]` (KDA), b `[T, HV]`."""
        if a.dim() == 2:  # GDN through the KDA kernel: the same gate in every state row
            T, HV = a.shape
            return cls(a[:, :, None].expand(T, HV, K).contiguous()[None], b[None].contiguous(), A_log,
                       dt_bias[:, None].expand(HV, K).reshape(-1).contiguous(), None)
        return cls(a[None].contiguous(), b[None].contiguous(), A_log, dt_bias.contiguous(), lower_bound)


def fla_fused_recurrent_inplace(
    qkv: torch.Tensor,
    layer_inputs: FlaLayerInputs,
    pool_rows: torch.Tensor,
    indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_accepted: torch.Tensor | None = None,
    key_heads: int | None = None,
) -> torch.Tensor:
    """One layer of a round through fla's kernel, states read from and written to `pool_rows` in place.

    Args:
        qkv: `[T, 2*H*K + HV*V]` activation dtype, conv outputs q | k | v (split into contiguous q, k,
            v here, as a server calling fla does).
        layer_inputs: gate, beta and parameters (`FlaLayerInputs.of`).
        pool_rows: `[rows, HV, K, V]` fp32 or bf16 state rows (a native pool layer viewed flat).
        indices: `[n]` (decode) or `[n, W]` int   # (row, token) -> pool row its state is written to
        cu_seqlens: `[n + 1]` int64               # row r owns packed tokens cu_seqlens[r] : cu_seqlens[r + 1]
        num_accepted: `[n]` int32 for MTP: the initial state is `indices[r, num_accepted[r] - 1]`.
        key_heads: H (default: from the shapes with HV = pool heads and K = V = pool dims).

    Returns:
        outputs `[T, HV, V]` in the activation dtype (rows past `cu_seqlens[n]` untouched zeros).
    """
    kernel = _fla_kernel()
    T, C = qkv.shape
    _, HV, K, V = pool_rows.shape
    H = key_heads if key_heads is not None else (C - HV * V) // (2 * K)
    if 2 * H * K + HV * V != C:
        raise ValueError(f"qkv {tuple(qkv.shape)} does not split into q, k ({H} x {K}) and v ({HV} x {V})")
    q = qkv[:, : H * K].reshape(1, T, H, K).contiguous()
    k = qkv[:, H * K : 2 * H * K].reshape(1, T, H, K).contiguous()
    v = qkv[:, 2 * H * K :].reshape(1, T, HV, V).contiguous()
    li = layer_inputs
    o, _ = kernel(
        q, k, v, g=li.g, beta=li.beta, A_log=li.A_log, dt_bias=li.dt_bias, initial_state=pool_rows,
        scale=K**-0.5, inplace_final_state=True, cu_seqlens=cu_seqlens, ssm_state_indices=indices,
        num_accepted_tokens=num_accepted, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
        use_beta_sigmoid_in_kernel=True, lower_bound=li.lower_bound,
    )
    return o[0]
