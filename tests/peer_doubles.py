"""Torch models of the peers' public functions, written from their documented contracts, for testing the
adapters' layout mapping where the peer itself cannot run (FlashInfer's CuTe DSL kernels need a GPU).

Each checks what its docstring promises to require (dtypes, shapes, contiguity, index dtypes) and does
what it promises (the K-last pool read and written through the given indices, -1 skipping a request),
in fp32 like the kernels. They are test doubles of the peer's API, not of the adapter: the adapter's
mapping runs unchanged on top of them and is compared with an independent fp64 reference.
"""

from __future__ import annotations

import torch


def _step_k_last(S: torch.Tensor, q, k, v, a, b, A_log, dt_bias, scale):
    """One GDN token on K-last states `S [B, HV, V, K]` fp32 (value head h reads key head h // (HV / H))."""
    HV, H = S.shape[1], q.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale  # the API's default
    q, k = (x.float() / torch.sqrt((x.float() ** 2).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    q, k = (x.repeat_interleave(HV // H, dim=1) for x in (q * scale, k))
    x = a.float() + dt_bias.float()
    g = -torch.exp(A_log.float()) * torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    beta = torch.sigmoid(b.float())
    S = S * torch.exp(g)[..., None, None]
    d = beta[..., None] * (v.float() - torch.einsum("bhvk,bhk->bhv", S, k))
    S = S + d[..., :, None] * k[..., None, :]
    return S, torch.einsum("bhvk,bhk->bhv", S, q)


class FlashInferGDNDouble:
    """`gated_delta_rule_mtp` (per-token `ssm_state_indices` scatter) and `gated_delta_rule_decode_pretranspose`
    (pool + indices, in place) of flashinfer.gdn_decode 0.7.2.post1, as documented."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @staticmethod
    def _check(q, k, v, pool, read, a, b):
        B, T, H, K = q.shape
        assert q.dtype == k.dtype == v.dtype == torch.bfloat16, "q, k, v must be bf16"
        assert all(x.is_contiguous() for x in (q, k, v, a, b)), "batch-major inputs are passed contiguous"
        assert pool.dtype == torch.float32 and pool.is_contiguous() and pool.shape[1:] == (v.shape[2], v.shape[3], K)
        assert read.shape == (B,) and read.dtype in (torch.int32, torch.int64)
        assert a.shape == b.shape == (B, T, v.shape[2])

    def gated_delta_rule_mtp(self, q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale=None,
                             output=None, intermediate_states_buffer=None, ssm_state_indices=None,
                             disable_state_update=None, use_qk_l2norm=True, output_state_indices=None):
        self.calls.append("mtp")
        self._check(q, k, v, initial_state, initial_state_indices, a, b)
        B, T = q.shape[:2]
        assert disable_state_update is not None and use_qk_l2norm and T >= 2
        if ssm_state_indices is not None:  # per-token pool scatter: exclusive with the buffer, needs state writes
            assert ssm_state_indices.shape == (B, T) and ssm_state_indices.dtype == torch.int32
            assert intermediate_states_buffer is None and disable_state_update is False
        if intermediate_states_buffer is not None:
            assert intermediate_states_buffer.shape[:2] == (B, T) and intermediate_states_buffer.dtype == torch.float32
        out = torch.zeros(B, T, v.shape[2], v.shape[3], dtype=torch.bfloat16)
        live = initial_state_indices >= 0
        read = initial_state_indices.long().clamp_min(0)
        S = initial_state[read].clone()
        for t in range(T):
            S, o = _step_k_last(S, q[:, t], k[:, t], v[:, t], a[:, t], b[:, t], A_log, dt_bias, scale)
            out[live, t] = o[live].to(torch.bfloat16)
            if ssm_state_indices is not None:
                initial_state[ssm_state_indices[live, t].long()] = S[live]
            if intermediate_states_buffer is not None:
                intermediate_states_buffer[live, t] = S[live]
        if not disable_state_update and ssm_state_indices is None:  # the final state over the read row
            initial_state[read[live]] = S[live]
        return out, initial_state

    def gated_delta_rule_decode_pretranspose(self, q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None,
                                             use_qk_l2norm=True, initial_state=None, initial_state_indices=None,
                                             output_state_indices=None, intermediate_states_buffer=None,
                                             disable_state_update=False, backend="auto"):
        self.calls.append("decode")
        self._check(q, k, v, initial_state, initial_state_indices, a, b)
        assert state is None and q.shape[1] == 1  # (the real kernel also needs K, V >= 128; not its layout)
        live = initial_state_indices >= 0
        idx = initial_state_indices.long().clamp_min(0)
        S, o = _step_k_last(initial_state[idx].clone(), q[:, 0], k[:, 0], v[:, 0], a[:, 0], b[:, 0], A_log, dt_bias,
                            scale)
        initial_state[idx[live]] = S[live]
        out = torch.zeros(q.shape[0], 1, v.shape[2], v.shape[3], dtype=torch.bfloat16)
        out[live, 0] = o[live].to(torch.bfloat16)
        return out, initial_state

