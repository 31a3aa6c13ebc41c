"""fla-core's `fused_recurrent_kda_fwd` as the `fla` baseline: native mode, in place on a pool.

fla-core 0.6.0 carries vLLM's decode / speculative-decoding kernel as `fused_recurrent_kda_fwd`: with
`ssm_state_indices` it reads each sequence's initial state from a row of a state pool and writes
states back into pool rows, in place (`inplace_final_state=True`):

* decode (`indices [n]`): the state of row `indices[r]` is read and overwritten, the way a server calls
  fla's fused_recurrent on its pool (no gather/scatter around it);
* MTP (`indices [n, W]` and `num_accepted_tokens [n]`): the initial state is row
  `indices[r, num_accepted[r] - 1]` and the state after token `t` goes to row `indices[r, t]`: the
  vLLM-style native kernel, one state write per verified token.

That is exactly the harness's native pool (`[L, slots, W, HV, K, V]`, row `slot * W + t`), so the pool
here is ours and `load` / `state` copy nothing but the accepted row. GDN runs through the same kernel
with its gate broadcast over K (`lower_bound=None` selects `-exp(A_log) * softplus(a + dt_bias)`). The
kernel keeps fp32 between tokens, normalizes q and k, applies the gate and beta's sigmoid itself, and
writes outputs in the activation dtype. It takes contiguous q, k, v, so the conv output is split into
them first (a copy a server calling fla pays too).
"""

from __future__ import annotations

from typing import Any

import torch

from kernels.ssm.baselines.base import Baseline, Dims, NativeRowsPool, Peer, PeerPool, PeerUnavailable, PoolSpec

PEER = Peer("fla-core", "0.6.0", extra="fla")


class Fla(Baseline):
    name = "fla"
    peer = PEER

    def load(self, device: str) -> Any:
        self.peer.check()
        try:
            from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
        except ImportError as e:
            raise PeerUnavailable(f"fla-core {self.peer.installed()} does not import here: {e}") from e
        return fused_recurrent_kda_fwd

    def unsupported(self, mode: str, family: str, spec: PoolSpec, dims: Dims) -> str:
        if mode != "native":
            return (f"fla-core has no {mode} state kernel: its fused_recurrent writes a state per verified token "
                    "(the native mode)")
        return ""

    def describe(self, spec: PoolSpec, dims: Dims) -> str:
        how = ("MTP: a state per verified token, vLLM-style" if spec.width > 1
               else "decode: the state row overwritten")
        return (f"fla-core {self.peer.pin} fused_recurrent_kda_fwd in place on the native pool layout ({how}); "
                "q/k/v split from the conv output, fp32 FMA, outputs in the activation dtype")

    def pool(self, dims: Dims, spec: PoolSpec) -> PeerPool:
        return FlaPool(dims, spec, self.load(spec.device))

    def bytes_per_request(self, dims: Dims, spec: PoolSpec) -> int:
        return FlaPool.bytes_per_request(dims, spec)


class FlaPool(NativeRowsPool):
    """Our native layout (`[K, V]` states in the state dtype), run in place by fla's kernel."""

    def __init__(self, dims: Dims, spec: PoolSpec, kernel) -> None:
        super().__init__(dims, spec)
        self.kernel = kernel

    def begin_round(self, slots: torch.Tensor, widths: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
        W = self.spec.width
        super().begin_round(slots, widths, cu_seqlens)
        self.cu = cu_seqlens.long()
        # (request, token) -> row of the flat pool layer (slot * W + t); decode: the slot's own row
        self.indices = slots if W == 1 else slots[:, None] * W + torch.arange(W, device=slots.device)
        self.num_accepted = None if W == 1 else self.accepted[slots] + 1  # fla reads row indices[r, num - 1]

    def forward(self, layer: int, qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                dt_bias: torch.Tensor) -> torch.Tensor:
        d = self.dims
        K = d.head_k_dim
        q, k, v = (x.contiguous()[None] for x in d.split_qkv(qkv))
        g, beta, dtb, lower = fla_gate_inputs(a, b, dt_bias, K, d.family, d.lower_bound)
        o, _ = self.kernel(
            q, k, v, g=g, beta=beta, A_log=A_log, dt_bias=dtb, initial_state=self.flat(layer), scale=K**-0.5,
            inplace_final_state=True, cu_seqlens=self.cu, ssm_state_indices=self.indices,
            num_accepted_tokens=self.num_accepted, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True, lower_bound=lower,
        )
        return o[0]


def fla_gate_inputs(a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor, K: int, family: str,
                    lower_bound: float):
    """(g `[1, T, HV, K]`, beta `[1, T, HV]`, dt_bias `[HV * K]`, lower_bound) as fla's KDA kernel takes
    them: GDN's gate input `[T, HV]` and `dt_bias [HV]` broadcast over K, and no lower bound (which
    selects GDN's softplus gate)."""
    if family == "gdn":
        T, HV = a.shape
        g = a[:, :, None].expand(T, HV, K).contiguous()[None]
        return g, b[None].contiguous(), dt_bias[:, None].expand(HV, K).reshape(-1).contiguous(), None
    return a[None].contiguous(), b[None].contiguous(), dt_bias.contiguous(), lower_bound
