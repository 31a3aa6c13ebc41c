"""The protocol every baseline (a peer's kernel library beside ours) follows.

A baseline is an adapter around a peer's public functions (fla-core, SGLang, FlashInfer). It says:

* which peer it wraps and at which version (`Peer`: distribution name, pinned version, how to install
  it); a peer that is missing, or installed at another version, makes every row of the backend
  `unsupported` with that sentence (`Peer.check`);
* which (mode, family) rows it implements, and why the others are not (`Baseline.unsupported`);
* how its pool is laid out and how the harness's pool, records and indices map onto it
  (`PeerPool`): `load` writes our states (`[L, n, HV, K, V]`) into the peer's layout, `state` reads the
  accepted state back in ours, `begin_round` / `forward` / `accept` run one round through the
  peer's functions on the packed tokens the harness gives every mode (conv outputs `[T, conv_dim]`).

Kernels never import the harness: everything here takes plain tensors and the `Dims` / `PoolSpec`
below, which scenarios build from their geometry and state config.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any, ClassVar

import torch


class PeerUnavailable(ImportError):
    """The peer's library is not importable here, or is installed at a version the adapter is not
    written against; the message is the row's `unsupported` reason."""


@dataclass(frozen=True)
class Peer:
    """A peer's distribution, pinned.

    Attributes:
        dist: the distribution name on the package index (`fla-core`, `sglang`, `flashinfer-python`).
        pin: the version the adapter is written against (pyproject's optional extra pins the same).
        extra: pyproject's optional extra that installs it.
        install: how to install it when the extra's full dependency set is not wanted.
    """

    dist: str
    pin: str
    extra: str
    install: str = ""

    def installed(self) -> str | None:
        """The installed version, or None."""
        try:
            return importlib.metadata.version(self.dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    def check(self) -> None:
        """Raise `PeerUnavailable` naming what is missing or different."""
        have = self.installed()
        how = self.install or f"pip install 'ssm-state-harness[{self.extra}]'"
        if have is None:
            raise PeerUnavailable(f"{self.dist}=={self.pin} is not installed here ({how})")
        if have != self.pin:
            raise PeerUnavailable(f"{self.dist} {have} is installed; the adapter is written against {self.pin} "
                                  f"(pyproject's `{self.extra}` extra; {how})")

    def file(self, relpath: str) -> str:
        """Path of a file of the installed distribution (after `check`)."""
        path = importlib.metadata.distribution(self.dist).locate_file(relpath)
        if not path.exists():
            raise PeerUnavailable(f"{self.dist} {self.installed()} has no {relpath}")
        return str(path)


@dataclass(frozen=True)
class Dims:
    """The layer shapes an adapter needs (from the harness's SSM geometry).

    Attributes:
        family: `gdn | kda`.
        layers: L, linear-attention layers in the pool.
        key_heads / value_heads: H, HV (value head h uses key head h // (HV / H)).
        head_k_dim / head_v_dim: K, V.
        lower_bound: KDA's gate bound (unused for GDN).
    """

    family: str
    layers: int
    key_heads: int
    value_heads: int
    head_k_dim: int
    head_v_dim: int
    lower_bound: float = -5.0

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_heads * self.head_k_dim + self.value_heads * self.head_v_dim

    def split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views `q [T, H, K]`, `k [T, H, K]`, `v [T, HV, V]` of packed conv outputs `[T, conv_dim]` (no copy:
        each keeps the token stride of `qkv`)."""
        H, HV, K, V = self.key_heads, self.value_heads, self.head_k_dim, self.head_v_dim
        if qkv.shape[-1] != self.conv_dim:
            raise ValueError(f"qkv {tuple(qkv.shape)} does not split into q, k ({H} x {K}) and v ({HV} x {V})")
        q = qkv[:, : H * K].unflatten(1, (H, K))
        k = qkv[:, H * K : 2 * H * K].unflatten(1, (H, K))
        v = qkv[:, 2 * H * K :].unflatten(1, (HV, V))
        return q, k, v


@dataclass(frozen=True)
class PoolSpec:
    """How the harness asks a peer pool to be built (from its state config).

    Attributes:
        mode: `native | compact | replay`, the harness mode the peer's kernels implement.
        capacity: request slots.
        width: W = drafts + 1, the most tokens a request verifies in a round.
        state_dtype / act_dtype / history_dtype: as the harness's state config.
        history_len: the harness's replay history length Lh (a peer maps it onto its own ring).
        device: where the pool lives.
        variant: the baseline's variant of the mode (`Baseline.variants`), e.g. SGLang's dot precision.
    """

    mode: str
    capacity: int
    width: int
    state_dtype: torch.dtype = torch.float32
    act_dtype: torch.dtype = torch.bfloat16
    history_len: int = 16
    history_dtype: torch.dtype = torch.float32
    device: str = "cpu"
    variant: str = ""


class PeerPool:
    """A peer's state pool for one (mode, family): its tensors in the peer's layout, and one round at a
    time through the peer's functions. Slot ids are the harness's (`[0, capacity)`)."""

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor the pool owns, `[L, slots, ...]` or `[slots, ...]` (cursors): footprints, and
        poisoning / checking slots no round may touch."""
        raise NotImplementedError

    def reset(self, slots: torch.Tensor) -> None:
        """A fresh request in `slots`: zero state, empty history."""
        raise NotImplementedError

    def load(self, slots: torch.Tensor, ssm: torch.Tensor) -> None:
        """Install accepted states `ssm [L, n, HV, K, V]` (state dtype, our layout) into `slots`."""
        raise NotImplementedError

    def state(self, slots: torch.Tensor) -> torch.Tensor:
        """The accepted state of `slots` in our layout, `[L, n, HV, K, V]` state dtype, nothing mutated
        (a peer that keeps a checkpoint and history materializes them here)."""
        raise NotImplementedError

    def begin_round(self, slots: torch.Tensor, widths: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
        """A round of `widths[r]` tokens (0 = idle) for `slots[r]`, packed by `cu_seqlens` (int32)."""
        raise NotImplementedError

    def forward(self, layer: int, qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                dt_bias: torch.Tensor) -> torch.Tensor:
        """One layer of the round: conv outputs `qkv [n * W, conv_dim]` (activation dtype, packed),
        gate input `a` (`[n * W, HV]` GDN, `[n * W, HV, K]` KDA), beta input `b [n * W, HV]`, the
        layer's `A_log [HV]` and `dt_bias`. Returns outputs `[n * W, HV, V]` float32 (packed rows; rows
        past the valid tokens are not read)."""
        raise NotImplementedError

    def accept(self, accepted: torch.Tensor) -> None:
        """End the round keeping tokens `0..accepted[r]` (-1 for idle rows)."""
        raise NotImplementedError

    def config(self) -> dict[str, dict[str, Any]]:
        """The launch parameters the pool passes the peer, by peer function (the row's `config` column)."""
        return {}

    def cycle(self) -> int:
        """Consecutive rounds a timing sample covers so the round's cost is the steady-state mean (a
        peer whose folds come every few rounds), 1 when every round costs the same."""
        return 1


class NativeRowsPool(PeerPool):
    """The native layout the peers' native kernels write in place: `rows [L, slots, W, HV, ...]`, a state
    per verified token of a slot (row `slot * W + t` of a layer's flat view), and the accepted row of each
    slot, which acceptance picks (nothing copied). `K_LAST` stores each state `[V, K]` (the peers' K-last
    layout) instead of our `[K, V]`; `DTYPE` fixes the pool's dtype (else the state dtype)."""

    K_LAST: ClassVar[bool] = False
    DTYPE: ClassVar[torch.dtype | None] = None

    def __init__(self, dims: Dims, spec: PoolSpec) -> None:
        self.dims, self.spec = dims, spec
        d = dims
        state = (d.head_v_dim, d.head_k_dim) if self.K_LAST else (d.head_k_dim, d.head_v_dim)
        self.rows = torch.zeros(d.layers, spec.capacity, spec.width, d.value_heads, *state,
                                dtype=self.DTYPE or spec.state_dtype, device=spec.device)
        self.accepted = torch.zeros(spec.capacity, dtype=torch.int32, device=spec.device)

    @classmethod
    def bytes_per_request(cls, dims: Dims, spec: PoolSpec) -> int:
        """W states per layer, and the accepted row."""
        size = torch.empty((), dtype=cls.DTYPE or spec.state_dtype).element_size()
        return dims.layers * spec.width * dims.value_heads * dims.head_k_dim * dims.head_v_dim * size + 4

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"rows": self.rows, "accepted": self.accepted}

    def reset(self, slots: torch.Tensor) -> None:
        self.rows[:, slots] = 0
        self.accepted[slots] = 0

    def load(self, slots: torch.Tensor, ssm: torch.Tensor) -> None:
        self.rows[:, slots, 0] = (k_last(ssm) if self.K_LAST else ssm).to(self.rows.dtype)
        self.accepted[slots] = 0

    def state(self, slots: torch.Tensor) -> torch.Tensor:
        picked = self.rows[:, slots, self.accepted[slots].long()]
        return from_k_last(picked).contiguous() if self.K_LAST else picked

    def flat(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s rows as the `[slots * W, HV, ...]` pool the peers index."""
        return self.rows[layer].flatten(0, 1)

    def begin_round(self, slots: torch.Tensor, widths: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
        self.slots, self.widths = slots, widths

    def accept(self, accepted: torch.Tensor) -> None:
        self.accepted[self.slots] = torch.where(self.widths > 0, accepted, self.accepted[self.slots])


class Baseline:
    """A peer's kernels as a backend of the harness: what it runs, and its pools."""

    name: ClassVar[str]
    peer: ClassVar[Peer]

    def unsupported(self, mode: str, family: str, spec: PoolSpec, dims: Dims) -> str:
        """Why the peer has no kernel for this row ("" when it has one), regardless of installation."""
        raise NotImplementedError

    def available(self, device: str) -> str:
        """"" when the peer's functions can be loaded here, else the reason (missing, other version)."""
        try:
            self.load(device)
        except PeerUnavailable as e:
            return str(e)
        return ""

    def load(self, device: str) -> Any:
        """Import the peer's functions (raises `PeerUnavailable`)."""
        raise NotImplementedError

    def variants(self, mode: str, family: str, device: str) -> tuple[str, ...]:
        """The baseline's variants of `mode` for `family` (the row's `variant` column), default first."""
        return ("",)

    def describe(self, spec: PoolSpec, dims: Dims) -> str:
        """One line for the row: which peer functions run, on what layout, with what precision."""
        raise NotImplementedError

    def pool(self, dims: Dims, spec: PoolSpec) -> PeerPool:
        raise NotImplementedError

    def bytes_per_request(self, dims: Dims, spec: PoolSpec) -> int:
        """State bytes per request of the peer's pool (what `pool(...)` allocates per slot)."""
        raise NotImplementedError


# ------------------------------------------------------------------------------------------------ layout
def k_last(ssm: torch.Tensor) -> torch.Tensor:
    """Our `[..., K, V]` states as the peers' `[..., V, K]` (K contiguous)."""
    return ssm.transpose(-1, -2)


def from_k_last(ssm: torch.Tensor) -> torch.Tensor:
    """The peers' `[..., V, K]` states as our `[..., K, V]`."""
    return ssm.transpose(-1, -2)


def padded_tokens(cu_seqlens: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(`tok [n, W]` packed row of each (request, position), `valid [n, W]` position < width): the
    gather from the harness's packed rows to a peer's fixed `[B, T]` layout, on the device, no sync."""
    n = cu_seqlens.shape[0] - 1
    pos = torch.arange(width, device=cu_seqlens.device)
    widths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    valid = pos[None, :] < widths[:, None]
    tok = (cu_seqlens[:-1, None].long() + pos[None, :]).clamp_max(n * width - 1)
    return tok, valid

