"""The field's kernels as baseline backends beside ours: one adapter per peer, one protocol (base.py).

    fla         fla-core's fused_recurrent_kda_fwd: native (decode and MTP), GDN and KDA
    sglang      SGLang's GDN ReplaySSM: replay (exact-fold flushes) and compact (fold every commit)
    flashinfer  FlashInfer's gated_delta_rule_mtp / decode_pretranspose: native, GDN

Each adapter imports its peer only when a pool is built (`Baseline.load`), so this registry imports
nothing beyond torch.
"""

from __future__ import annotations

from kernels.ssm.baselines.base import Baseline, Dims, Peer, PeerPool, PeerUnavailable, PoolSpec
from kernels.ssm.baselines.fla import Fla
from kernels.ssm.baselines.flashinfer import FlashInfer
from kernels.ssm.baselines.sglang import SGLang

BASELINES: dict[str, Baseline] = {b.name: b for b in (Fla(), SGLang(), FlashInfer())}

__all__ = ["BASELINES", "Baseline", "Dims", "Peer", "PeerPool", "PeerUnavailable", "PoolSpec"]
