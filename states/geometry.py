"""Shapes of what a state pool stores: linear-attention (GDN/KDA) layers and attention KV layers.

Geometries are per tensor-parallel rank: a preset at TP p already holds its local head counts.
The conventions follow SPEC §2 (HV value heads, H key heads, value head `h` uses key head
`h // (HV // H)`) and §4 (K heads then V heads in the GQA pool, a 576-wide latent for MLA).
"""

from __future__ import annotations

from dataclasses import dataclass

SSM_FAMILIES = ("gdn", "kda")
ATTN_FAMILIES = ("gqa", "mla")


@dataclass(frozen=True)
class SSMGeometry:
    """One rank's linear-attention layers.

    Attributes:
        family: `gdn` (scalar gate per head) or `kda` (a `[K]` gate vector per head).
        layers: linear-attention layers `L`.
        key_heads: `H`, heads of q and k.
        value_heads: `HV`, heads of v and of the state; a multiple of `H`.
        head_k_dim: `K`, rows of the state.
        head_v_dim: `V`, columns of the state.
        conv_kernel: taps of the causal depthwise conv (its state keeps `conv_kernel - 1` inputs).
        lower_bound: KDA gate bound (`g = lower_bound * sigmoid(...)`); unused for GDN.
    """

    family: str
    layers: int
    key_heads: int
    value_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int = 4
    lower_bound: float = -5.0

    def __post_init__(self) -> None:
        if self.family not in SSM_FAMILIES:
            raise ValueError(f"unknown SSM family {self.family!r}; choose one of {', '.join(SSM_FAMILIES)}")
        for name in ("layers", "key_heads", "value_heads", "head_k_dim", "head_v_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.value_heads % self.key_heads:
            raise ValueError(f"value_heads ({self.value_heads}) must be a multiple of key_heads ({self.key_heads})")
        if self.conv_kernel < 2:
            raise ValueError(f"conv_kernel must be >= 2, got {self.conv_kernel}")

    @property
    def conv_dim(self) -> int:
        """Channels of `mixed_qkv`: q | k | v = `2*H*K + HV*V`."""
        return 2 * self.key_heads * self.head_k_dim + self.value_heads * self.head_v_dim

    @property
    def gate_width(self) -> int:
        """Elements of one head's log gate per token: 1 for GDN, `K` for KDA."""
        return 1 if self.family == "gdn" else self.head_k_dim

    @property
    def group(self) -> int:
        """Value heads per key head (`HV // H`)."""
        return self.value_heads // self.key_heads

    @property
    def state_elems(self) -> int:
        """Elements of one layer's state for one request: `HV*K*V`."""
        return self.value_heads * self.head_k_dim * self.head_v_dim


@dataclass(frozen=True)
class AttnGeometry:
    """Attention KV layers of a model, in global head numbering (TP splits them at run time).

    Attributes:
        family: `gqa` (K and V heads of `head_dim`) or `mla` (one latent of `kv_lora_rank + rope_dim`,
            replicated on every TP rank).
        layers: attention layers holding KV.
        kv_heads: global KV heads (GQA); 1 for MLA.
        head_dim: GQA head dim; for MLA the packed width `kv_lora_rank + rope_dim`.
        kv_lora_rank, rope_dim: MLA latent split (0 for GQA).
    """

    family: str
    layers: int
    kv_heads: int
    head_dim: int
    kv_lora_rank: int = 0
    rope_dim: int = 0

    def __post_init__(self) -> None:
        if self.family not in ATTN_FAMILIES:
            raise ValueError(f"unknown attention family {self.family!r}; choose one of {', '.join(ATTN_FAMILIES)}")
        if self.family == "mla" and (self.kv_heads != 1 or self.head_dim != self.kv_lora_rank + self.rope_dim):
            raise ValueError("MLA stores one latent head of width kv_lora_rank + rope_dim")

    def local_kv_heads(self, tp: int) -> int:
        """KV heads one rank holds at TP `tp` (replicated when `tp > kv_heads`; MLA is always 1)."""
        if self.family == "mla":
            return 1
        if tp % self.kv_heads and self.kv_heads % tp:
            raise ValueError(f"TP {tp} neither divides nor is a multiple of {self.kv_heads} KV heads")
        return max(1, self.kv_heads // tp)
