"""The SSM state protocol shared by the native, compact and replay modes (SPEC §3).

A state object owns a pool of request slots for the `L` linear-attention layers of one rank, the conv
windows that go with them, and whatever its mode needs to roll back to the accepted prefix of a
speculative round. One verify/decode round is

    rnd = state.begin_round(slots, widths)      # replay folds histories that would overflow here
    for layer in range(L):
        out = state.forward(layer, inputs[layer])   # packed tokens, fixed shape [n * W, ...]
    state.accept(accepted)                      # accepted[r] in [0, widths[r] - 1], -1 for idle rows

`snapshot` reads the accepted state without mutating anything; `load` installs one.

Backends: `torch` runs the plain PyTorch step of kernels/<family>/naive.py; `triton` runs the fused
kernels of kernels/<family>/. Both evolve state through one shared step each, so the bitwise
contracts between modes hold within a backend.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from kernels.common.torch_ops import decay_from_log_gate, l2norm, split_qkv
from kernels.conv.naive import causal_conv
from kernels.gdn.naive import gdn_gate, gdn_step
from kernels.kda.naive import kda_gate, kda_step
from kernels.ssm.configs import CONV, Config, check_config, default_configs
from kernels.ssm.conv import causal_conv_update
from kernels.ssm.dot_precision import DEFAULT_PRECISION, PRECISIONS
from states.geometry import SSMGeometry
from states.params import SSMParams, TokenInputs

BACKENDS = ("torch", "triton")
STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ACT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}
# Variants of each mode, the default first (SPEC §3). They store and compute differently but keep the
# mode's contracts: every compact variant commits native's states bit for bit (accept and deferred its outputs
# too); every replay variant but `matrix*` (below) folds exactly.
# Replay's `precompute` runs its products on tensor cores at the precision that keeps the fp32 contract
# (kernels/ssm/replay_precompute.py); `precompute-<precision>` names each other precision it can take,
# measured beside it (plain `tf32` is outside the fp32 contract: SPEC §5, tensor-core variants).
PRECOMPUTE_PRECISION: dict[str, str] = {
    "precompute": DEFAULT_PRECISION, **{f"precompute-{p}": p for p in PRECISIONS if p != DEFAULT_PRECISION}}
# Compact's `accept-precompute` commits as `accept` does (the token loop over the records, bitwise) and takes
# its verify outputs from the same matrix form with an empty history (kernels/ssm/compact_precompute.py);
# `accept-precompute-<precision>` as above.
COMPACT_PRECOMPUTE_PRECISION: dict[str, str] = {f"accept-{v}": p for v, p in PRECOMPUTE_PRECISION.items()}
# Compact's `deferred-precompute` commits as `deferred` does (the pending records token by token, bitwise, in the
# verify launch) and takes the verify outputs from the same matrix form; `deferred-precompute-<precision>` as above.
DEFERRED_PRECOMPUTE_PRECISION: dict[str, str] = {f"deferred-{v}": p for v, p in PRECOMPUTE_PRECISION.items()}
# every compact variant whose verify is the matrix form, with its precision
COMPACT_MATRIX_VERIFY: dict[str, str] = {**COMPACT_PRECOMPUTE_PRECISION, **DEFERRED_PRECOMPUTE_PRECISION}
# Replay's `matrix` runs the precompute forward and folds in matrix form too (kernels/ssm/replay_matrix_fold.py):
# its folded states are not native's bit for bit but within the fp32 contract (SPEC §5), so it is a labelled
# variant beside the exact ones; `matrix-<precision>` for the other precisions that keep that contract (plain
# tf32 would put ~1e-3 into every fold of the state, so it has none). fp32 history only.
MATRIX_PRECISION: dict[str, str] = {
    "matrix": DEFAULT_PRECISION, **{f"matrix-{p}": p for p in PRECISIONS if p not in (DEFAULT_PRECISION, "tf32")}}
# Replay's `inline-matrix` keeps the inline token forward (its outputs from the token loop) and folds in matrix
# form inside it (the same helper as `matrix`'s fold): the token fold's 16 steps of the whole block, once every
# Lh / W rounds, are what decode's replay pays most for beside the checkpoint read. Labelled like `matrix`.
INLINE_MATRIX_PRECISION: dict[str, str] = {f"inline-{v}": p for v, p in MATRIX_PRECISION.items()}
# every replay variant that folds in matrix form (states within the fp32 contract, not bitwise), with the
# precision of its fold
MATRIX_FOLD_PRECISION: dict[str, str] = {**MATRIX_PRECISION, **INLINE_MATRIX_PRECISION}
# every replay variant whose forward is the precompute kernel, with its precision
REPLAY_MATRIX_FORWARD: dict[str, str] = {**PRECOMPUTE_PRECISION, **MATRIX_PRECISION}
MODE_VARIANTS: dict[str, tuple[str, ...]] = {
    "native": ("",),
    "compact": ("accept", "deferred", *COMPACT_PRECOMPUTE_PRECISION, *DEFERRED_PRECOMPUTE_PRECISION),
    "replay": ("inline", *REPLAY_MATRIX_FORWARD, *INLINE_MATRIX_PRECISION),
}


def precompute_precision(mode: str, variant: str) -> str | None:
    """The dot precision of a variant whose outputs come from the matrix form (replay `precompute*` and
    `matrix*`, compact `accept-precompute*` and `deferred-precompute*`), or None for the token-loop variants."""
    table = {"replay": REPLAY_MATRIX_FORWARD, "compact": COMPACT_MATRIX_VERIFY}.get(mode, {})
    return table.get(variant)


def tensor_core_precision(mode: str, variant: str) -> str | None:
    """The `tl.dot` precision of whatever a variant runs on tensor cores (its matrix-form outputs, or replay's
    matrix fold: `inline-matrix*` has only the latter), or None for the variants that run none."""
    fold = MATRIX_FOLD_PRECISION.get(variant) if mode == "replay" else None
    return precompute_precision(mode, variant) or fold


def separate_fold_launch(family: str, variant: str) -> bool:
    """Whether a replay variant folds in a launch of its own before the layer's forward, which then reads the
    checkpoint again: the precompute forward's token fold (`precompute*`) and KDA's matrix fold. The inline
    forward folds inside itself (`inline`, `inline-matrix*`), and GDN's matrix fold runs inside the precompute
    forward (its per-column gates made KDA's fused form slower: states/replay.py)."""
    return variant in PRECOMPUTE_PRECISION or (variant in MATRIX_PRECISION and family == "kda")


def exact_fold(mode: str, variant: str) -> bool:
    """Whether the variant's committed or folded states are native's bit for bit with an fp32 state (every
    variant but replay's `matrix*`, whose states are held to the fp32 contract's tolerance)."""
    return not (mode == "replay" and variant in MATRIX_FOLD_PRECISION)


def mode_variant(mode: str, variant: str) -> str:
    """`variant` of `mode` checked, with "" meaning the mode's default; ValueError naming the choices."""
    choices = MODE_VARIANTS.get(mode, ("",))
    if variant == "":
        return choices[0]
    if variant not in choices:
        named = ", ".join(c for c in choices if c) or "none"
        raise ValueError(f"unknown {mode} variant {variant!r}; choose one of {named}")
    return variant


@dataclass(frozen=True)
class StateConfig:
    """How a state pool is stored and run.

    Attributes:
        mode: `native | compact | replay`.
        max_requests: request slots in the pool.
        drafts: S, draft tokens per verify round (max width `W = S + 1`); 0 is plain decode.
        state_dtype: float32 or bfloat16.
        act_dtype: activation dtype of the inputs, conv windows and raw records.
        history_len: replay `Lh` (a power of two, >= 4, >= W); the ring holds `2 * Lh` records.
        history_dtype: replay derived-record dtype (normalized k and corrected value d).
        variant: the mode's variant (`MODE_VARIANTS`): compact `accept | deferred` (when a round's
            accepted records reach the state; `accept-precompute*`: accept with a matrix-form verify),
            replay `inline | precompute* | matrix* | inline-matrix*` (how forward projects the checkpoint,
            and for `matrix*` / `inline-matrix*` how the history folds); native has one. Empty means the
            mode's first (default) variant.
        backend: `torch` or `triton`.
        device: where the pool lives.
    """

    mode: str
    max_requests: int
    drafts: int = 0
    state_dtype: torch.dtype = torch.float32
    act_dtype: torch.dtype = torch.bfloat16
    history_len: int = 16
    history_dtype: torch.dtype = torch.float32
    variant: str = ""
    backend: str = "torch"
    device: str = "cpu"

    @property
    def width(self) -> int:
        """W, the most tokens one request verifies in a round."""
        return self.drafts + 1

    @property
    def mode_variant(self) -> str:
        """The variant this pool runs (the mode's default when `variant` is empty)."""
        return mode_variant(self.mode, self.variant)


@dataclass
class Round:
    """The batch of one round. Index tensors live on the pool's device.

    Attributes:
        slots: `[n]` int64          # slot: [batch row] -> pool row
        widths: `[n]` int32         # tokens each row verifies this round (0 = idle padding row)
        cu_seqlens: `[n + 1]` int32 # row r owns packed tokens cu_seqlens[r] : cu_seqlens[r + 1]
        width: W, the padded width (`T = n * W` packed rows).
    """

    slots: torch.Tensor
    widths: torch.Tensor
    cu_seqlens: torch.Tensor
    width: int
    layers_done: set[int] = field(default_factory=set)

    @property
    def n(self) -> int:
        return self.slots.shape[0]

    def padded_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(`tok [n, W]` packed row of each (request, position), `valid [n, W]` position < width)."""
        pos = torch.arange(self.width, device=self.slots.device)
        valid = pos[None, :] < self.widths[:, None]
        tok = (self.cu_seqlens[:-1, None].long() + pos[None, :]).clamp_max(self.n * self.width - 1)
        return tok, valid


@dataclass
class PreparedTokens:
    """A round's tokens after the conv, padded to `[n, W, ...]` (positions past a width are junk).

    `k_raw`/`v_raw` are the conv outputs (activation dtype) that records keep; `q`, `k`, `v` are the
    fp32 step inputs; `g` is the log gate and `decay = exp(g)`, `[n, W, HV]` (GDN) or `[n, W, HV, K]`.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    k_raw: torch.Tensor
    v_raw: torch.Tensor
    g: torch.Tensor
    decay: torch.Tensor
    beta: torch.Tensor


def round_state(state: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The fp32 value of `state` after rounding it to the state dtype (what a store then load gives)."""
    return state if dtype == torch.float32 else state.to(dtype).float()


class SSMState:
    """Base of the three modes: slots, conv windows, validation, and the torch-backend token prep."""

    mode: ClassVar[str]
    needs_drafts: ClassVar[bool] = False

    def __init__(self, geom: SSMGeometry, params: SSMParams, cfg: StateConfig) -> None:
        self._validate_config(geom, cfg)
        self.geom, self.cfg = geom, cfg
        self.params = params.to(cfg.device)
        L, C, cap = geom.layers, geom.conv_dim, cfg.max_requests
        dev = cfg.device
        # conv: [L, slots, conv_dim, kernel - 1 + S]; the accepted window starts at column conv_offset[slot]
        self.conv = torch.zeros(L, cap, C, geom.conv_kernel - 1 + cfg.drafts, dtype=cfg.act_dtype, device=dev)
        self.conv_offset = torch.zeros(cap, dtype=torch.int32, device=dev)  # slot -> accepted column
        self._allocate()
        self._free_slots = list(range(cap))
        self._live: set[int] = set()
        self.round: Round | None = None

    # ------------------------------------------------------------------ configuration
    @classmethod
    def _validate_config(cls, geom: SSMGeometry, cfg: StateConfig) -> None:
        if cfg.mode != cls.mode:
            raise ValueError(f"config mode {cfg.mode!r} given to the {cls.mode} state")
        mode_variant(cfg.mode, cfg.variant)
        if cfg.backend not in BACKENDS:
            raise ValueError(f"unknown backend {cfg.backend!r}; choose one of {', '.join(BACKENDS)}")
        if cfg.backend == "triton" and not str(cfg.device).startswith("cuda") and not _interpreting():
            raise ValueError("the triton backend needs --device cuda (or TRITON_INTERPRET=1 on CPU)")
        if str(cfg.device).startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {cfg.device!r} requested but CUDA is not available on this machine")
        if cfg.state_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"state dtype must be fp32 or bf16, got {DTYPE_NAMES.get(cfg.state_dtype, cfg.state_dtype)}")
        if cfg.act_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"activation dtype must be bf16 or fp32, got {cfg.act_dtype}")
        if cfg.drafts < 0:
            raise ValueError(f"drafts must be >= 0, got {cfg.drafts}")
        if cls.needs_drafts and cfg.drafts < 1:
            raise ValueError(f"{cls.mode} mode needs drafts (S >= 1): it stores a verify round's records")
        if cfg.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {cfg.max_requests}")

    # ------------------------------------------------------------------ pools (mode hooks)
    def _allocate(self) -> None:
        raise NotImplementedError

    # The triton kernels a pool of this mode and variant launches (kernels/ssm/configs.py), by name.
    def kernels(self) -> tuple[str, ...]:
        raise NotImplementedError

    def _default_kernel_configs(self) -> dict[str, Config]:
        g = self.geom
        return default_configs(self.kernels(), head_k_dim=g.head_k_dim, head_v_dim=g.head_v_dim, conv_dim=g.conv_dim)

    def set_kernel_configs(self, configs: dict[str, Config]) -> None:
        """Run the triton kernels with `configs` (kernel -> config; kernels not given keep theirs, kernels this
        pool does not launch are ignored after their config is checked)."""
        checked = {k: check_config(k, cfg) for k, cfg in configs.items()}
        self.kernel_configs = {**self.kernel_configs, **{k: cfg for k, cfg in checked.items() if k in self.kernel_configs}}

    def _pool_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor the pool owns, by name (for footprints, poisoning and snapshots in tests)."""
        return {"conv": self.conv, "conv_offset": self.conv_offset}

    def slot_rows(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of every pool tensor restricted to `slots` (pools are `[L, slots, ...]` or `[slots]`)."""
        slots = torch.as_tensor(slots, dtype=torch.long, device=self.cfg.device)
        return {name: t[slots] if t.dim() == 1 else t[:, slots] for name, t in self._pool_tensors().items()}

    def fill_slot_rows(self, slots: torch.Tensor, generator: torch.Generator) -> None:
        """Overwrite every pool byte of `slots` with random bits (poison for untouched-slot checks); `generator`
        seeds them (one draw), and the bits are drawn on the pool's device: on an H200 two spare slots of a
        Qwen3-Next native pool are 600 MB, seconds of CPU random numbers per variant and case."""
        slots = torch.as_tensor(slots, dtype=torch.long, device=self.cfg.device)
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        for t in self._pool_tensors().values():
            rows = t[slots] if t.dim() == 1 else t[:, slots]
            on_device = torch.Generator(device=t.device).manual_seed(seed)
            seed += 1  # each tensor its own stream
            bits = torch.randint(0, 256, (rows.numel() * rows.element_size(),), dtype=torch.uint8,
                                 generator=on_device, device=t.device)
            rows = bits.view(rows.dtype).view(rows.shape)
            if t.dim() == 1:
                t[slots] = rows
            else:
                t[:, slots] = rows

    @classmethod
    def bytes_per_request(cls, geom: SSMGeometry, cfg: StateConfig) -> dict[str, int]:
        """SPEC §3 formula, term by term, plus `total`. Subclasses add their state terms."""
        act = _nbytes(cfg.act_dtype)
        return {
            "conv": geom.layers * geom.conv_dim * (geom.conv_kernel - 1 + cfg.drafts) * act,
            "conv_offset": 4,
        }

    def footprint_bytes(self) -> int:
        """Bytes the pool holds on its device (storage actually allocated)."""
        return sum(t.untyped_storage().nbytes() for t in self._pool_tensors().values())

    def measured_bytes_per_request(self) -> float:
        return self.footprint_bytes() / self.cfg.max_requests

    # ------------------------------------------------------------------ slots
    def alloc(self, n: int) -> torch.Tensor:
        """Take `n` free slots (reset to a zero state); returns `[n]` int64 slot ids on the device."""
        if n > len(self._free_slots):
            raise ValueError(f"requested {n} slots but only {len(self._free_slots)} of {self.cfg.max_requests} are free")
        taken, self._free_slots = self._free_slots[:n], self._free_slots[n:]
        self._live.update(taken)
        slots = torch.tensor(taken, dtype=torch.long, device=self.cfg.device)
        self.reset(slots)
        return slots

    def free(self, slots: torch.Tensor) -> None:
        ids = self._check_slots(slots)
        self._live.difference_update(ids)
        self._free_slots.extend(ids)

    def reset(self, slots: torch.Tensor) -> None:
        """Zero state, conv window and bookkeeping of `slots` (a fresh request)."""
        slots = torch.as_tensor(slots, dtype=torch.long, device=self.cfg.device)
        self._check_slots(slots)
        self.conv[:, slots] = 0
        self.conv_offset[slots] = 0
        self._reset_mode(slots)

    def _reset_mode(self, slots: torch.Tensor) -> None:
        raise NotImplementedError

    def _check_slots(self, slots: torch.Tensor | list[int]) -> list[int]:
        ids = [int(s) for s in (slots.tolist() if isinstance(slots, torch.Tensor) else slots)]
        bad = [s for s in ids if not 0 <= s < self.cfg.max_requests]
        if bad:
            raise ValueError(f"slot ids {bad} out of range [0, {self.cfg.max_requests})")
        dead = [s for s in ids if s not in self._live]
        if dead:
            raise ValueError(f"slots {dead} are not allocated")
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate slot ids in {ids}")
        return ids

    # ------------------------------------------------------------------ rounds
    def begin_round(self, slots: torch.Tensor, widths: torch.Tensor | list[int], validate: bool = True) -> Round:
        """Start a round: `widths[r]` tokens for slot `slots[r]` (0 = idle row, up to W = S + 1)."""
        dev = self.cfg.device
        slots = torch.as_tensor(slots, dtype=torch.long, device=dev)
        widths = torch.as_tensor(widths, dtype=torch.int32, device=dev)
        W = self.cfg.width
        if validate:
            self._check_slots(slots)
            if widths.shape != slots.shape:
                raise ValueError(f"widths shape {tuple(widths.shape)} does not match slots {tuple(slots.shape)}")
            w = widths.tolist()
            bad = [x for x in w if not 0 <= x <= W]
            if bad:
                raise ValueError(f"widths {bad} outside [0, {W}] (W = drafts + 1 = {W})")
        cu = torch.zeros(slots.shape[0] + 1, dtype=torch.int32, device=dev)
        cu[1:] = torch.cumsum(widths, 0)
        self.round = Round(slots, widths, cu, W)
        self._begin_round_mode(self.round)
        return self.round

    def _begin_round_mode(self, rnd: Round) -> None:
        """Mode hook run once per round before any layer (replay folds here)."""

    def forward(self, layer: int, inputs: TokenInputs) -> torch.Tensor:
        """Run one layer for the current round; returns outputs `[n * W, HV, V]` float32 (packed rows)."""
        rnd = self._current_round()
        if not 0 <= layer < self.geom.layers:
            raise ValueError(f"layer {layer} outside [0, {self.geom.layers})")
        if layer in rnd.layers_done:
            raise ValueError(f"layer {layer} already ran this round (its conv window and state moved on)")
        self._check_inputs(inputs, rnd)
        rnd.layers_done.add(layer)
        if self.cfg.backend == "torch":
            return self._forward_torch(layer, inputs, rnd)
        return self._forward_triton(layer, inputs, rnd)

    def accept(self, accepted: torch.Tensor | list[int], validate: bool = True) -> None:
        """Keep tokens `0..accepted[r]` of the round for each row (-1 for idle rows); ends the round."""
        rnd = self._current_round()
        accepted = torch.as_tensor(accepted, dtype=torch.int32, device=self.cfg.device)
        if validate:
            if accepted.shape != rnd.slots.shape:
                raise ValueError(f"accepted shape {tuple(accepted.shape)} does not match the round's {rnd.n} rows")
            for r, (a, w) in enumerate(zip(accepted.tolist(), rnd.widths.tolist(), strict=True)):
                lo, hi = (0, w - 1) if w > 0 else (-1, -1)
                if not lo <= a <= hi:
                    raise ValueError(f"accepted[{r}] = {a} outside [{lo}, {hi}] for a row of width {w}")
            if len(rnd.layers_done) != self.geom.layers:
                missing = sorted(set(range(self.geom.layers)) - rnd.layers_done)
                raise ValueError(f"accept before every layer ran this round (missing layers {missing})")
        # where() instead of boolean indexing keeps accept free of host syncs (CUDA-graph capturable)
        active = rnd.widths > 0
        self.conv_offset[rnd.slots] = torch.where(active, accepted, self.conv_offset[rnd.slots])
        self._accept_mode(rnd, accepted)
        self.round = None

    def _between_rounds(self, what: str) -> None:
        """Snapshots and loads see committed state only: a round in progress has half-moved windows,
        snapshots, records or cursors."""
        if self.round is not None:
            raise ValueError(f"{what} during a round: call accept() first (layers done: {sorted(self.round.layers_done)})")

    def _current_round(self) -> Round:
        if self.round is None:
            raise ValueError("no round in progress: call begin_round(slots, widths) first")
        return self.round

    def _check_inputs(self, inputs: TokenInputs, rnd: Round) -> None:
        g = self.geom
        T = rnd.n * rnd.width
        a_shape = (T, g.value_heads) if g.family == "gdn" else (T, g.value_heads, g.head_k_dim)
        expect = {"mixed_qkv": (T, g.conv_dim), "a": a_shape, "b": (T, g.value_heads)}
        for name, shape in expect.items():
            got = tuple(getattr(inputs, name).shape)
            if got != shape:
                raise ValueError(f"inputs.{name} has shape {got}, expected {shape} for {rnd.n} rows x W={rnd.width}")

    # ------------------------------------------------------------------ accepted state
    def snapshot(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Accepted state of `slots`, without mutating anything.

        Returns:
            ssm `[n, L, HV, K, V]` state dtype, conv `[n, L, conv_dim, kernel - 1]` activation dtype.
        """
        slots = torch.as_tensor(slots, dtype=torch.long, device=self.cfg.device)
        self._check_slots(slots)
        self._between_rounds("snapshot")
        return self._snapshot_ssm(slots), self._accepted_conv(slots)

    def load(self, slots: torch.Tensor, ssm: torch.Tensor, conv: torch.Tensor) -> None:
        """Install snapshots into `slots` (clears records/history, resets offsets)."""
        slots = torch.as_tensor(slots, dtype=torch.long, device=self.cfg.device)
        self._check_slots(slots)
        self._between_rounds("load")
        g, n = self.geom, slots.shape[0]
        want_ssm = (n, g.layers, g.value_heads, g.head_k_dim, g.head_v_dim)
        want_conv = (n, g.layers, g.conv_dim, g.conv_kernel - 1)
        if tuple(ssm.shape) != want_ssm or tuple(conv.shape) != want_conv:
            raise ValueError(
                f"snapshot shapes ssm {tuple(ssm.shape)} / conv {tuple(conv.shape)} do not match the geometry "
                f"(ssm {want_ssm}, conv {want_conv})"
            )
        if ssm.dtype != self.cfg.state_dtype or conv.dtype != self.cfg.act_dtype:
            raise ValueError(
                f"snapshot dtypes ssm {ssm.dtype} / conv {conv.dtype} do not match the pool "
                f"({self.cfg.state_dtype} / {self.cfg.act_dtype})"
            )
        self.reset(slots)
        self.conv[:, slots, :, : g.conv_kernel - 1] = conv.to(self.cfg.device).transpose(0, 1)
        self._load_ssm(slots, ssm.to(self.cfg.device).transpose(0, 1))

    def _accepted_conv(self, slots: torch.Tensor) -> torch.Tensor:
        cols = self.conv_offset[slots].long()[:, None] + torch.arange(self.geom.conv_kernel - 1, device=slots.device)
        buf = self.conv[:, slots]  # [L, n, C, kernel - 1 + S]
        idx = cols[None, :, None, :].expand(buf.shape[0], -1, buf.shape[2], -1)
        return torch.gather(buf, 3, idx).transpose(0, 1).contiguous()

    def _snapshot_ssm(self, slots: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _load_ssm(self, slots: torch.Tensor, ssm: torch.Tensor) -> None:
        """`ssm` is `[L, n, HV, K, V]`."""
        raise NotImplementedError

    # ------------------------------------------------------------------ torch backend pieces
    def _forward_torch(self, layer: int, inputs: TokenInputs, rnd: Round) -> torch.Tensor:
        raise NotImplementedError

    def _forward_triton(self, layer: int, inputs: TokenInputs, rnd: Round) -> torch.Tensor:
        raise NotImplementedError(f"the triton backend of {self.mode} is not built yet")

    def _accept_mode(self, rnd: Round, accepted: torch.Tensor) -> None:
        raise NotImplementedError

    def _conv_and_prepare(self, layer: int, inputs: TokenInputs, rnd: Round) -> tuple[PreparedTokens, torch.Tensor]:
        """Conv (updating the windows), gates, beta and normalization for a round; torch backend.

        Returns the prepared tokens and `valid [n, W]`.
        """
        g = self.geom
        tok, valid = rnd.padded_index()
        kernel = g.conv_kernel
        x = inputs.mixed_qkv[tok]  # [n, W, C]
        buf = self.conv[layer, rnd.slots]  # [n, C, kernel - 1 + S]
        cols = self.conv_offset[rnd.slots].long()[:, None] + torch.arange(kernel - 1, device=tok.device)
        window = torch.gather(buf, 2, cols[:, None, :].expand(-1, buf.shape[1], -1))
        y, full = causal_conv(window, x, self.params.conv_weight[layer])
        # next window: stored columns [0, kernel - 2 + w) take full[:, :, 1 : kernel - 1 + w]
        ncol = buf.shape[2]
        w = rnd.widths.long()[:, None]
        keep = (torch.arange(ncol, device=tok.device)[None, :] < kernel - 2 + w) & (w > 0)  # idle rows keep all
        self.conv[layer, rnd.slots] = torch.where(keep[:, None, :], full[:, :, 1 : 1 + ncol], buf)

        q_raw, k_raw, v_raw = split_qkv(y, g.key_heads, g.head_k_dim, g.value_heads, g.head_v_dim)
        a, b = inputs.a[tok], inputs.b[tok]
        if g.family == "gdn":
            lg = gdn_gate(a, self.params.A_log[layer], self.params.dt_bias[layer])
        else:
            lg = kda_gate(a, self.params.A_log[layer], self.params.dt_bias[layer], g.lower_bound)
        prepared = PreparedTokens(
            q=l2norm(q_raw) * g.head_k_dim**-0.5,
            k=l2norm(k_raw),
            v=v_raw.float(),
            k_raw=k_raw,
            v_raw=v_raw,
            g=lg,
            decay=decay_from_log_gate(lg),
            beta=torch.sigmoid(b.double()).float(),  # fp64 then one rounding: shape-independent bits
        )
        return prepared, valid

    def _conv_triton(self, layer: int, inputs: TokenInputs, rnd: Round) -> torch.Tensor:
        """Conv of a round on the triton backend (advances the windows of `layer`, no host sync).

        Returns the conv outputs `[n * W, conv_dim]` in the activation dtype, written on valid rows.
        The mode sets `self.kernel_configs` (kernel -> config, kernels/ssm/configs.py).
        """
        return causal_conv_update(
            inputs.mixed_qkv, self.conv[layer], self.conv_offset, self.params.conv_weight[layer],
            rnd.slots, rnd.widths, rnd.cu_seqlens, self.kernel_configs[CONV],
        )

    def _step(self):
        return gdn_step if self.geom.family == "gdn" else kda_step

    def _scatter_outputs(self, o_pad: torch.Tensor, rnd: Round) -> torch.Tensor:
        """Padded outputs `[n, W, HV, V]` -> packed `[n * W, HV, V]` (padding rows left zero)."""
        tok, valid = rnd.padded_index()
        out = torch.zeros(rnd.n * rnd.width, *o_pad.shape[2:], dtype=torch.float32, device=o_pad.device)
        out[tok[valid]] = o_pad[valid]
        return out


def _nbytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
