"""SGLang 0.5.23's GDN ReplaySSM kernels as the `sglang` baseline: replay, and compact where it has one.

`sglang/kernels/ops/attention/linear/gdn_replayssm_spec_decode.py` (Triton; ported from vLLM's
ReplaySSM) keeps per request slot a frozen checkpoint `[slots, HV, V, K]` (K last) and a circular ring
of the last `L` committed tokens' records: `d [slots, HV, L, V]` (the delta-rule update vectors),
`k [slots, H, L, K]` (normalized keys), `g [slots, HV, L]` (fp32 log gates) and, for its exact fold, the
raw inputs `rawv [slots, HV, L, V]`, `rawk [slots, H, L, K]`, `beta [slots, HV, L]`. Per request three
cursors: `write_pos` (committed records), `cache_base` (where the ring starts), `is_flush`.

* replay (`gdn_replayssm_spec_decode`, `launch_mode="both"`, then `commit_gdn_replayssm_spec`): a
  verify reconstructs the window's outputs from checkpoint + history with the chunked `(I + A)^-1`
  transform (matrix products, `dot_precision`: TF32 by default on NVIDIA) and appends the window's
  records; accepting moves `write_pos`. A request whose `write_pos + 2W > L` is marked `is_flush`, and
  its next verify first folds the committed raw records into the checkpoint (a sequential fp32 fold),
  then computes its outputs from the folded checkpoint. The harness's `history_len` is the ring `L`.
* compact (fold every commit: the same verify with `launch_mode="verify"`, then
  `commit_gdn_replayssm_spec(fold_every_commit=True)` and `commit_gdn_replayssm_circular`): the
  checkpoint is always the accepted state; the verify writes the window's `(d, k, g)` records and the
  commit materializes the accepted prefix from them into the checkpoint (one launch for all layers,
  `tl.dot` products of the key ring and the decayed update vectors; with a bf16 ring their hi/lo
  residual parts are kept too). The ring needs `L >= 16` for its `tl.dot`.

KDA (`kda_replayssm_spec_decode.py`): SGLang's KDA ReplaySSM is a fold-every-commit scheme, the
harness's compact mode: its recurrent verify (`fused_sigmoid_gating_delta_rule_update` with
`disable_state_update=True, cache_ring=True`) reads the checkpoint and stores the window's raw k, v, gate
(per K) and beta into a per-slot ring; `commit_kda_replayssm_spec_all_layers` replays the accepted prefix
into the checkpoint (sequential fp32 steps, one launch for all layers). There is no KDA replay.

The kernel files are loaded alone from the installed wheel: they import helper names from modules that
pull in SGLang's server stack (`is_tf32_supported`, `is_gfx95_supported`, `is_arch_support_pdl`,
`get_device_sm`, ...), which are provided here with SGLang's own definitions.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from kernels.common.torch_ops import delta_rule_update, expand_heads, l2norm
from kernels.ssm.baselines.base import (
    Baseline, Dims, Peer, PeerPool, PoolSpec, from_k_last, k_last,
)
from kernels.ssm.baselines.loading import load_file

PEER = Peer("sglang", "0.5.23", extra="sglang",
            install="pip install --no-deps sglang==0.5.23: the adapter loads one kernel file from it")
KERNEL_FILE = "sglang/kernels/ops/attention/linear/gdn_replayssm_spec_decode.py"
KDA_VERIFY_FILE = "sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py"
KDA_COMMIT_FILE = "sglang/kernels/ops/attention/linear/kda_replayssm_spec_decode.py"
PRECISIONS = ("tf32", "ieee", "tf32x3", "bf16x3")  # Triton's tl.dot input precisions the kernel passes through
COMPACT_RING = 16  # the commit's tl.dot needs a reduction dimension of at least 16


def _is_nvidia_sm80() -> bool:
    """SGLang's `is_tf32_supported`: an NVIDIA GPU of compute capability 8 or newer."""
    return torch.cuda.is_available() and torch.version.hip is None and torch.cuda.get_device_capability(0)[0] >= 8


def _is_gfx95() -> bool:
    """SGLang's `is_gfx95_supported`: an AMD gfx95 GPU."""
    return bool(torch.version.hip) and "gfx95" in torch.cuda.get_device_properties(0).gcnArchName


def _cuda_capability() -> tuple[int, int]:
    ok = torch.cuda.is_available() and torch.version.cuda is not None
    return torch.cuda.get_device_capability(0) if ok else (0, 0)


def _sglang_srt_utils() -> dict[str, Any]:
    """`sglang.srt.utils`' device predicates the recurrent kernel file reads at import, as SGLang defines them."""
    cuda = torch.cuda.is_available() and torch.version.cuda is not None
    cuda_version = tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
    return {
        "get_device_sm": lambda: _cuda_capability()[0] * 10 + _cuda_capability()[1],
        "is_cuda": lambda: cuda,
        "is_hip": lambda: torch.version.hip is not None,
        "is_gfx95_supported": _is_gfx95,
        "is_sm90_supported": lambda: cuda and _cuda_capability()[0] == 9 and cuda_version >= (12, 3),
    }


def load_kda_kernels() -> Any:
    """SGLang's KDA ReplaySSM pair: the recurrent verify (ring-writing) and the all-layer commit fold."""
    PEER.check()
    verify = load_file(PEER.file(KDA_VERIFY_FILE), "sglang_fused_sigmoid_gating_recurrent", provide={
        # PDL (programmatic dependent launch) on SM90+, as SGLang decides it; it only overlaps launches
        "sglang.kernels.jit.utils": {"is_arch_support_pdl": lambda: torch.version.hip is None
                                     and _cuda_capability()[0] >= 9},
        "sglang.srt.utils": _sglang_srt_utils(),
    })
    commit = load_file(PEER.file(KDA_COMMIT_FILE), "sglang_kda_replayssm_spec_decode")
    return types.SimpleNamespace(verify=verify.fused_sigmoid_gating_delta_rule_update,
                                 commit=commit.commit_kda_replayssm_spec_all_layers)


def load_kernels() -> Any:
    """The kernel module of the installed SGLang, loaded alone (raises `PeerUnavailable`)."""
    PEER.check()
    return load_file(PEER.file(KERNEL_FILE), "sglang_gdn_replayssm_spec_decode", provide={
        "sglang.kernels.ops.attention.fla.utils": {"is_tf32_supported": _is_nvidia_sm80()},
        "sglang.srt.utils": {"is_gfx95_supported": _is_gfx95},
    })


def default_precision(device: str) -> str:
    """The kernel's own default `dot_precision` on `device`: TF32 on NVIDIA Ampere and newer, else IEEE."""
    return "tf32" if str(device).startswith("cuda") and _is_nvidia_sm80() else "ieee"


def ring_len(mode: str, spec: PoolSpec) -> int:
    """GDN's ring length L: the harness's history length for replay; for compact the smallest its commit's
    tl.dot takes (and at least the window). (KDA's ring is the window, W records.)"""
    if mode == "replay":
        return spec.history_len
    return max(COMPACT_RING, 1 << (spec.width - 1).bit_length())


class SGLang(Baseline):
    name = "sglang"
    peer = PEER

    def load(self, device: str) -> Any:
        return load_kernels()

    def unsupported(self, mode: str, family: str, spec: PoolSpec, dims: Dims) -> str:
        if family == "kda" and mode == "replay":
            return (f"SGLang {PEER.pin}'s KDA ReplaySSM folds every commit (the harness's compact mode); it keeps no "
                    "KDA history to replay")
        if mode == "native":
            return ("SGLang's ReplaySSM kernels keep a checkpoint and a ring (replay, compact); its native verify is "
                    "fla's fused_recurrent family, run by the fla backend")
        if spec.state_dtype != torch.float32:
            return ("the adapter runs SGLang's fp32-checkpoint path (a bf16 checkpoint switches its verify to "
                    "activation-dtype tensor-core products with residual keys, not wrapped)")
        if dims.head_k_dim & (dims.head_k_dim - 1) or dims.head_k_dim < 16:
            return f"SGLang's verify tiles K in powers of two of at least 16 (K = {dims.head_k_dim})"
        if family == "kda":
            return ("" if str(spec.device).startswith("cuda") else
                    "SGLang's KDA commit kernel runs on CUDA only (it calls .to on its loop index, a Python int in "
                    "Triton's interpreter)")
        L = ring_len(mode, spec)
        if mode == "replay" and L < 2 * spec.width:
            return (f"SGLang's ring of L = --history-len {L} records flushes when write_pos + 2W > L, so it needs "
                    f"L >= 2W = {2 * spec.width}")
        if mode == "compact" and spec.width < 2:
            return "compact needs drafts"
        return ""

    def variants(self, mode: str, family: str, device: str) -> tuple[str, ...]:
        """GDN: the verify's dot precision, the kernel's default on the device (bench_kernels times the others);
        KDA's verify is recurrent (fp32 FMA), one variant."""
        return (default_precision(device),) if mode in ("replay", "compact") and family == "gdn" else ("",)

    def describe(self, spec: PoolSpec, dims: Dims) -> str:
        if dims.family == "kda":
            return (f"SGLang {PEER.pin} fused_sigmoid_gating_delta_rule_update verify (disable_state_update, cache_ring: "
                    f"the window's raw k, v, gate and beta into a ring of {spec.width} records) + "
                    "commit_kda_replayssm_spec_all_layers (the accepted prefix folded into the K-last checkpoint); "
                    "fp32 FMA, outputs in the activation dtype")
        L = ring_len(spec.mode, spec)
        dots = f"{spec.variant} dots" if spec.variant else "dots at the kernel default"
        if spec.mode == "replay":
            what = (f"gdn_replayssm_spec_decode (exact-fold flushes) + commit_gdn_replayssm_spec on a K-last "
                    f"checkpoint and a ring of L = {L} records")
        else:
            what = (f"gdn_replayssm_spec_decode verify + commit_gdn_replayssm_spec(fold_every_commit) + "
                    f"commit_gdn_replayssm_circular on a K-last checkpoint and a ring of L = {L} (d, k, g) records"
                    + (", hi/lo residuals" if spec.history_dtype != torch.float32 else ""))
        return (f"SGLang {PEER.pin} {what}; verify {dots}, fp32 outputs (the caller's buffer)"
                + ("; the commit's tl.dot on fp32 rings is Triton's default (TF32 on NVIDIA)"
                   if spec.mode == "compact" else ""))

    def pool(self, dims: Dims, spec: PoolSpec) -> PeerPool:
        if dims.family == "kda":
            return SGLangKDAPool(dims, spec, load_kda_kernels())
        return SGLangGDNPool(dims, spec, self.load(spec.device))

    def bytes_per_request(self, dims: Dims, spec: PoolSpec) -> int:
        if dims.family == "kda":
            return sum(kda_ring_bytes(dims, spec).values())
        return sum(ring_bytes(dims, spec).values()) + 9  # + write_pos, cache_base (int32) and is_flush (int8)


def ring_bytes(dims: Dims, spec: PoolSpec) -> dict[str, int]:
    """Bytes per request of each pool tensor (all layers), by name."""
    nb = lambda dt: torch.empty((), dtype=dt).element_size()  # noqa: E731
    H, HV, K, V, Ly = dims.key_heads, dims.value_heads, dims.head_k_dim, dims.head_v_dim, dims.layers
    L, hist, act = ring_len(spec.mode, spec), nb(spec.history_dtype), nb(spec.act_dtype)
    out = {"checkpoint": HV * V * K * nb(spec.state_dtype), "d": HV * L * V * hist, "k": H * L * K * hist,
           "g": HV * L * 4}
    if spec.mode == "replay":
        out.update(rawv=HV * L * V * act, rawk=H * L * K * act, beta=HV * L * 4)
    elif spec.history_dtype != torch.float32:  # compact's hi/lo residuals, in the activation dtype
        out.update(d_residual=HV * L * V * act, k_residual=H * L * K * act)
    return {name: b * Ly for name, b in out.items()}


class SGLangGDNPool(PeerPool):
    """SGLang's layout, every tensor `[L, slots, ...]` (one layer's view is what the kernels take), cursors
    `[slots]` shared by the layers (request-keyed, advanced once per round)."""

    def __init__(self, dims: Dims, spec: PoolSpec, kernels: Any) -> None:
        self.dims, self.spec, self.k_ops = dims, spec, kernels
        self.mode, self.precision = spec.mode, spec.variant or default_precision(spec.device)
        if self.precision not in PRECISIONS:
            raise ValueError(f"SGLang dot precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")
        H, HV, K, V, Ly, cap = (dims.key_heads, dims.value_heads, dims.head_k_dim, dims.head_v_dim, dims.layers,
                                spec.capacity)
        self.L = L = ring_len(spec.mode, spec)
        z = lambda *shape, dtype: torch.zeros(*shape, dtype=dtype, device=spec.device)  # noqa: E731
        self.checkpoint = z(Ly, cap, HV, V, K, dtype=spec.state_dtype)
        self.d = z(Ly, cap, HV, L, V, dtype=spec.history_dtype)
        self.k = z(Ly, cap, H, L, K, dtype=spec.history_dtype)
        self.g = z(Ly, cap, HV, L, dtype=torch.float32)
        self.rawv = self.rawk = self.beta = None  # replay: the exact fold's raw records
        self.d_res = self.k_res = None  # compact with a 16-bit ring: the residual parts
        if self.mode == "replay":
            self.rawv = z(Ly, cap, HV, L, V, dtype=spec.act_dtype)
            self.rawk = z(Ly, cap, H, L, K, dtype=spec.act_dtype)
            self.beta = z(Ly, cap, HV, L, dtype=torch.float32)
        elif spec.history_dtype != torch.float32:
            self.d_res = z(Ly, cap, HV, L, V, dtype=spec.act_dtype)
            self.k_res = z(Ly, cap, H, L, K, dtype=spec.act_dtype)
        self.write_pos = z(cap, dtype=torch.int32)
        self.cache_base = z(cap, dtype=torch.int32)
        self.is_flush = z(cap, dtype=torch.int8)
        # launch parameters: V tiles of 32 with one warp were fastest on an H200 (BV 64 is SGLang's default)
        self.launch = {"block_v": min(32, _pow2(V)), "num_warps": 1, "num_stages": 2, "nk": 2 if K >= 32 else 1,
                       "block_v_flush": min(64, _pow2(V)), "num_warps_flush": 1, "num_stages_flush": 2,
                       "nk_flush": 2 if K >= 32 else 1}

    def tensors(self) -> dict[str, torch.Tensor]:
        named = {"checkpoint": self.checkpoint, "d": self.d, "k": self.k, "g": self.g, "rawv": self.rawv,
                 "rawk": self.rawk, "beta": self.beta, "d_residual": self.d_res, "k_residual": self.k_res,
                 "write_pos": self.write_pos, "cache_base": self.cache_base, "is_flush": self.is_flush}
        return {name: t for name, t in named.items() if t is not None}

    def config(self) -> dict[str, dict[str, Any]]:
        return {"gdn_replayssm_spec_decode": {**self.launch, "dot_precision": self.precision,
                                              "max_cache_len": self.L}}

    def cycle(self) -> int:
        """A flush comes every few rounds (ring L, window W): two ring lengths' worth of rounds covers it."""
        return 2 * -(-self.L // self.spec.width) if self.mode == "replay" else 1

    def reset(self, slots: torch.Tensor) -> None:
        for name, t in self.tensors().items():
            if t.dim() == 1:
                t[slots] = 0
            else:
                t[:, slots] = 0

    def load(self, slots: torch.Tensor, ssm: torch.Tensor) -> None:
        self.reset(slots)
        self.checkpoint[:, slots] = k_last(ssm).to(self.spec.state_dtype)

    def state(self, slots: torch.Tensor) -> torch.Tensor:
        """The checkpoint with the committed records folded in, in our layout: replay folds the raw records
        the way SGLang's exact fold does (sequential fp32 delta-rule steps); compact's ring is empty
        between rounds (its commit folds every round), and any (d, k, g) records left are added the way
        its commit does."""
        d = self.dims
        S = from_k_last(self.checkpoint[:, slots]).float()  # [Ly, n, HV, K, V]
        wp, base = self.write_pos[slots].long(), self.cache_base[slots].long()
        steps = int(wp.max()) if wp.numel() else 0
        group = d.value_heads // d.key_heads
        n = torch.arange(slots.shape[0], device=slots.device)
        for t in range(steps):
            live = (t < wp)[:, None, None, None]
            phys = (base + t) & (self.L - 1)  # ring position of the request's t-th committed record
            for layer in range(d.layers):
                if self.mode == "replay":
                    k = expand_heads(l2norm(self.rawk[layer, slots][n, :, phys]), group)  # [n, HV, K]
                    v = self.rawv[layer, slots][n, :, phys].float()
                    g = self.g[layer, slots][n, :, phys]
                    beta = self.beta[layer, slots][n, :, phys]
                    new, _ = delta_rule_update(S[layer], k, v, torch.exp(g)[..., None], beta)
                else:
                    k = expand_heads(self.k[layer, slots][n, :, phys].float(), group)
                    u = self.d[layer, slots][n, :, phys].float()
                    g = self.g[layer, slots][n, :, phys]
                    new = S[layer] * torch.exp(g)[..., None, None] + k[..., :, None] * u[..., None, :]
                S[layer] = torch.where(live, new, S[layer])
        return S.to(self.spec.state_dtype)

    def begin_round(self, slots: torch.Tensor, widths: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
        self.slots, self.widths, self.cu = slots, widths, cu_seqlens

    def forward(self, layer: int, qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                dt_bias: torch.Tensor) -> torch.Tensor:
        d, c = self.dims, self.launch
        q, k, v = d.split_qkv(qkv)  # views with the packed token stride: the kernel takes per-token strides
        out = torch.empty(qkv.shape[0], d.value_heads, d.head_v_dim, dtype=torch.float32, device=qkv.device)
        raw = self.mode == "replay"
        self.k_ops.gdn_replayssm_spec_decode(
            q, k, v, a, b, A_log, dt_bias, self.checkpoint[layer], self.d[layer], self.k[layer], self.g[layer],
            self.rawv[layer] if raw else (None if self.d_res is None else self.d_res[layer]),
            self.rawk[layer] if raw else (None if self.k_res is None else self.k_res[layer]),
            self.beta[layer] if raw else None,
            out, self.cu, self.slots, self.slots, self.write_pos, self.cache_base, self.is_flush,
            max_cache_len=self.L, max_spec_len=self.spec.width, scale=d.head_k_dim**-0.5,
            use_qk_l2norm_in_kernel=True, null_block_id=-1, bs_min=4, launch_mode="both" if raw else "verify",
            dot_precision=self.precision, **c,
        )
        return out

    def accept(self, accepted: torch.Tensor) -> None:
        num = torch.where(self.widths > 0, accepted + 1, 0).to(torch.int32)  # SGLang counts the bonus token
        self.k_ops.commit_gdn_replayssm_spec(
            self.write_pos, self.cache_base, self.is_flush, num, self.slots, self.L, self.spec.width,
            fold_every_commit=self.mode == "compact", null_block_id=-1,
        )
        if self.mode == "compact":
            self.k_ops.commit_gdn_replayssm_circular(
                checkpoint_state=self.checkpoint, d_cache=self.d, k_cache=self.k, g_cache=self.g,
                d_residual_cache=self.d_res, k_residual_cache=self.k_res, state_batch_indices=self.slots,
                replay_indices=self.slots, write_pos=self.write_pos, cache_base=self.cache_base,
                is_flush=self.is_flush, accept_lens=num, null_block_id=-1,
            )


def kda_ring_bytes(dims: Dims, spec: PoolSpec) -> dict[str, int]:
    """Bytes per request of the KDA pool's tensors (all layers): checkpoint and the window's raw ring."""
    nb = lambda dt: torch.empty((), dtype=dt).element_size()  # noqa: E731
    H, HV, K, V, Ly, W = dims.key_heads, dims.value_heads, dims.head_k_dim, dims.head_v_dim, dims.layers, spec.width
    act = nb(spec.act_dtype)
    out = {"checkpoint": HV * V * K * nb(spec.state_dtype), "rawv": HV * W * V * act, "rawk": H * W * K * act,
           "g": HV * W * K * 4, "beta": HV * W * 4}
    return {name: b * Ly for name, b in out.items()}


class SGLangKDAPool(PeerPool):
    """SGLang's KDA layout, `[L, slots, ...]`: the K-last checkpoint (always the accepted state) and the ring
    of the round's raw records at positions 0..W-1 of each slot."""

    def __init__(self, dims: Dims, spec: PoolSpec, kernels: Any) -> None:
        self.dims, self.spec, self.k_ops = dims, spec, kernels
        H, HV, K, V, Ly, cap, W = (dims.key_heads, dims.value_heads, dims.head_k_dim, dims.head_v_dim, dims.layers,
                                   spec.capacity, spec.width)
        z = lambda *shape, dtype: torch.zeros(*shape, dtype=dtype, device=spec.device)  # noqa: E731
        self.checkpoint = z(Ly, cap, HV, V, K, dtype=spec.state_dtype)
        self.rawv = z(Ly, cap, HV, W, V, dtype=spec.act_dtype)
        self.rawk = z(Ly, cap, H, W, K, dtype=spec.act_dtype)
        self.g = z(Ly, cap, HV, W, K, dtype=torch.float32)
        self.beta = z(Ly, cap, HV, W, dtype=torch.float32)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"checkpoint": self.checkpoint, "rawv": self.rawv, "rawk": self.rawk, "g": self.g, "beta": self.beta}

    def reset(self, slots: torch.Tensor) -> None:
        for t in self.tensors().values():
            t[:, slots] = 0

    def load(self, slots: torch.Tensor, ssm: torch.Tensor) -> None:
        self.reset(slots)
        self.checkpoint[:, slots] = k_last(ssm).to(self.spec.state_dtype)

    def state(self, slots: torch.Tensor) -> torch.Tensor:
        """The checkpoint: the commit folds every round's accepted prefix, so nothing is pending between rounds."""
        return from_k_last(self.checkpoint[:, slots]).contiguous()

    def begin_round(self, slots: torch.Tensor, widths: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
        self.slots, self.widths, self.cu = slots, widths, cu_seqlens

    def forward(self, layer: int, qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                dt_bias: torch.Tensor) -> torch.Tensor:
        d = self.dims
        q, k, v = (x[None] for x in d.split_qkv(qkv))  # [1, T, heads, dim] views: the kernel takes token strides
        o = self.k_ops.verify(
            A_log, a[None], dt_bias, 1.0, 20.0, q, k, v, b[None], self.checkpoint[layer], self.slots,
            scale=d.head_k_dim**-0.5, use_qk_l2norm_in_kernel=True, cu_seqlens=self.cu, is_kda=True,
            lower_bound=d.lower_bound, disable_state_update=True, cache_ring=True, replayssm_rawv=self.rawv[layer],
            replayssm_rawk=self.rawk[layer], replayssm_g=self.g[layer], replayssm_beta=self.beta[layer],
        )
        return o[0]

    def accept(self, accepted: torch.Tensor) -> None:
        num = torch.where(self.widths > 0, accepted + 1, 0).to(torch.int32)  # SGLang counts the bonus token
        self.k_ops.commit(self.checkpoint, self.rawv, self.rawk, self.g, self.beta, self.slots, num,
                          max_cache_len=self.spec.width, num_k_heads=self.dims.key_heads, null_block_id=-1)


def _pow2(x: int) -> int:
    return 1 << (x - 1).bit_length()


__all__ = ["PEER", "PRECISIONS", "SGLang", "SGLangGDNPool", "SGLangKDAPool", "default_precision",
           "load_kda_kernels", "load_kernels"]
