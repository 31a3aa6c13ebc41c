"""FlashInfer 0.7.2.post1's GDN decode and MTP kernels as the `flashinfer` baseline: native mode, GDN.

`flashinfer/gdn_decode.py` (CuTe DSL kernels, JIT-compiled on first call) takes an fp32 state pool
`[pool, HV, V, K]` (K last) with per-request read indices:

* decode (W = 1): `gated_delta_rule_decode_pretranspose(..., initial_state=pool, initial_state_indices)`
  reads each request's state row and overwrites it in place;
* MTP (W > 1): `gated_delta_rule_mtp(..., ssm_state_indices [B, T], disable_state_update=False)` reads
  row `initial_state_indices[r]` and writes the state after token `t` into row `ssm_state_indices[r, t]`
  (its FLA-style per-token pool scatter): exactly the harness's native pool, `S + 1` rows per request
  (row `slot * W + t`), the accepted one chosen by the acceptance, nothing copied.

Its inputs are `[B, T, ...]` with one T for every request and bf16 q, k, v (its outputs are bf16), so the
round's packed tokens are gathered into that layout (rows padded to W where a round's widths vary; the
padded tokens' states land in rows past the request's width, which acceptance never picks) and split
into contiguous q, k, v. Idle rows get index -1, which the kernels skip. FlashInfer's other verify
forms (`intermediate_states_buffer`, `disable_state_update=True`) are timed beside ours by
scripts/bench_kernels.py; its ReplaySSM path needs SM100/SM103.

Loading: `flashinfer.gdn_decode` is imported through a hollow `flashinfer` package (its `__init__`, which
imports every FlashInfer op, is not run). The CuTe DSL kernels need `nvidia-cutlass-dsl` (4.8.1 ran) and
`apache-tvm-ffi`; the module imports its kernels inside `try`, so a missing one is found here and named.
"""

from __future__ import annotations

from typing import Any

import torch

from kernels.ssm.baselines.base import (
    Baseline, Dims, NativeRowsPool, Peer, PeerPool, PeerUnavailable, PoolSpec, padded_tokens,
)
from kernels.ssm.baselines.loading import load_submodule

PEER = Peer("flashinfer-python", "0.7.2.post1", extra="flashinfer")


def load_gdn_decode(device: str) -> Any:
    """`flashinfer.gdn_decode` with its CuTe DSL kernels importable (raises `PeerUnavailable`)."""
    if not str(device).startswith("cuda"):
        raise PeerUnavailable("FlashInfer's GDN kernels are CuTe DSL kernels for CUDA devices (SM90 and newer)")
    PEER.check()
    if torch.cuda.get_device_capability(torch.device(device)) < (9, 0):
        raise PeerUnavailable("FlashInfer's GDN decode and MTP kernels need SM90 or newer")
    folder = PEER.file("flashinfer/__init__.py").rsplit("/", 1)[0]
    gdn = load_submodule("flashinfer", folder, "gdn_decode")
    for flag, sub in (("_MTP_AVAILABLE", "gdn_kernels.gdn_decode_mtp"),
                      ("_PRETRANSPOSE_AVAILABLE", "gdn_kernels.gdn_decode_pretranspose")):
        if not getattr(gdn, flag, False):
            load_submodule("flashinfer", folder, sub)  # raises PeerUnavailable with the import error
            raise PeerUnavailable(f"flashinfer.gdn_decode: {flag} is False")
    return gdn


class FlashInfer(Baseline):
    name = "flashinfer"
    peer = PEER

    def load(self, device: str) -> Any:
        return load_gdn_decode(device)

    def unsupported(self, mode: str, family: str, spec: PoolSpec, dims: Dims) -> str:
        if family != "gdn":
            return "FlashInfer's gdn_decode kernels are GDN's (its KDA decode, recurrent_kda, is not wrapped)"
        if mode != "native":
            return (f"FlashInfer {PEER.pin} has no {mode} path on SM90 (its ReplaySSM verify needs SM100/SM103); "
                    "its decode and MTP kernels are the native mode")
        if spec.state_dtype != torch.float32:
            return "FlashInfer's gated_delta_rule_mtp takes an fp32 state pool (its bf16-state path is not wrapped)"
        if spec.act_dtype != torch.bfloat16:
            return "FlashInfer's GDN kernels take bf16 (or fp16) q, k, v"
        if dims.head_k_dim < 128 or dims.head_v_dim < 128:
            return f"FlashInfer's fp32-state GDN kernels need K, V >= 128 (K = {dims.head_k_dim}, V = {dims.head_v_dim})"
        return ""

    def describe(self, spec: PoolSpec, dims: Dims) -> str:
        fn = ("gated_delta_rule_decode_pretranspose, in place" if spec.width == 1
              else "gated_delta_rule_mtp with per-token ssm_state_indices (a state per verified token)")
        return (f"FlashInfer {PEER.pin} {fn} on a K-last fp32 pool of the native layout; q/k/v gathered into "
                "[B, T] and split, fp32 FMA, bf16 outputs")

    def pool(self, dims: Dims, spec: PoolSpec) -> PeerPool:
        return FlashInferPool(dims, spec, self.load(spec.device))

    def bytes_per_request(self, dims: Dims, spec: PoolSpec) -> int:
        return FlashInferPool.bytes_per_request(dims, spec)


class FlashInferPool(NativeRowsPool):
    """The native layout K-last in fp32, the pool FlashInfer's kernels index."""

    K_LAST = True
    DTYPE = torch.float32

    def __init__(self, dims: Dims, spec: PoolSpec, gdn: Any) -> None:
        super().__init__(dims, spec)
        self.gdn = gdn

    def begin_round(self, slots: torch.Tensor, widths: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
        W = self.spec.width
        super().begin_round(slots, widths, cu_seqlens)
        live = widths > 0
        rows = slots.to(torch.int32) * W
        # read row: the accepted snapshot; -1 (idle) makes the kernels skip the request
        self.read = torch.where(live, rows + self.accepted[slots], -1).to(torch.int32)
        self.scatter = (rows[:, None] + torch.arange(W, device=slots.device, dtype=torch.int32)).contiguous()
        self.tok, valid = padded_tokens(cu_seqlens, W)
        # where each (request, position) output goes among the packed rows; padded positions go to a spare
        # row past them (an index, not a boolean mask: no host sync, so a round stays graph-capturable)
        self.dest = torch.where(valid, self.tok, slots.shape[0] * W).flatten()

    def _batch_major(self, x: torch.Tensor) -> torch.Tensor:
        """Packed rows `[n * W, ...]` -> `[n, W, ...]` (contiguous), the padded token of each (request, position)."""
        return x[self.tok]

    def forward(self, layer: int, qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                dt_bias: torch.Tensor) -> torch.Tensor:
        d, W = self.dims, self.spec.width
        n = self.slots.shape[0]
        # one gather per part: each comes out contiguous [n, W, heads, dim], as the CuTe kernels take it
        q, k, v = (self._batch_major(t) for t in d.split_qkv(qkv))
        a3, b3 = self._batch_major(a), self._batch_major(b)
        flat = self.flat(layer)
        scale = d.head_k_dim**-0.5
        if W == 1:
            o, _ = self.gdn.gated_delta_rule_decode_pretranspose(
                q, k, v, None, A_log, a3, dt_bias, b3, scale=scale, use_qk_l2norm=True, initial_state=flat,
                initial_state_indices=self.read, backend="flashinfer")
        else:
            o, _ = self.gdn.gated_delta_rule_mtp(
                q, k, v, flat, self.read, A_log, a3, dt_bias, b3, scale=scale, ssm_state_indices=self.scatter,
                disable_state_update=False, use_qk_l2norm=True)
        out = torch.zeros(n * W + 1, d.value_heads, d.head_v_dim, dtype=o.dtype, device=o.device)
        out[self.dest] = o.flatten(0, 1)  # back to packed rows
        return out[: n * W]


__all__ = ["PEER", "FlashInfer", "FlashInferPool", "load_gdn_decode"]
