"""PD staging pages: what a prefill node hands a decode node (SPEC §4).

A page is token-major `[page_tokens, L, parts * H_global, D]` (MLA `[page_tokens, L, 1, 576]`) in
global head numbering, so prefill at TP p and decode at TP d agree on it for any p, d that divide or
multiply the heads. The prefill group writes (each rank its head slice; one rank per replicated
slice; MLA: rank 0 only) and the decode group reads (every rank its slice; MLA: every rank the whole
latent). A request of `n` tokens fills `ceil(n / page_tokens)` pages, a partial last page from its
first position. On one device both groups are simulated ranks over the same pages (`write`, `read`).
Across processes each side keeps its own pages, each rank writes or reads only its slice
(`write_rank`, `read_rank`), and `states/pd_transport.py` moves the slices between them (`kv_field`,
`head_blocks`).
"""

from __future__ import annotations

import torch

from states.geometry import AttnGeometry
from states.kv_pool import (
    KVPool,
    PageTraffic,
    check_page_pool,
    copy_group,
    copy_rank,
    group_traffic,
    head_shard,
    kv_parts,
    page_rows,
)
from states.pd_transport import Field

DEFAULT_PAGE_TOKENS = 1024


class PDPagePool:
    """Device-side PD staging pages of one model.

    Attributes:
        geometry: attention layers (global heads).
        page_tokens: tokens per page, a power of two in [16, 1024].
        pages: `[num_pages, page_tokens, L, parts * H_global, D]`.
    """

    def __init__(
        self,
        geometry: AttnGeometry,
        num_pages: int,
        *,
        page_tokens: int = DEFAULT_PAGE_TOKENS,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> None:
        check_page_pool(page_tokens, num_pages, dtype)
        self.geometry = geometry
        self.page_tokens = page_tokens
        shape = (num_pages, page_tokens, geometry.layers, kv_parts(geometry) * geometry.kv_heads, geometry.head_dim)
        self.pages = torch.empty(shape, dtype=dtype, device=device)

    @property
    def page_bytes(self) -> int:
        return self.pages[0].numel() * self.pages.element_size()

    def _rows(self, pools, token_slots, page_ids) -> tuple[torch.Tensor, torch.Tensor]:
        if pools and pools[0].geometry != self.geometry:
            raise ValueError(f"pool geometry {pools[0].geometry} differs from the pages' {self.geometry}")
        return page_rows(token_slots, page_ids, self.page_tokens, "head")

    def _copy(self, pools, token_slots, page_ids, direction: str, backend: str, launch: dict) -> None:
        table, ids = self._rows(pools, token_slots, page_ids)
        # The kernels take pages layer-major; the token-major page is the same memory transposed.
        layer_major = self.pages.transpose(1, 2)
        copy_group(pools, layer_major, table, ids, direction=direction, backend=backend, launch=launch)

    def write_rank(self, pool: KVPool, token_slots: torch.Tensor | list[torch.Tensor],
                   page_ids: torch.Tensor | list[torch.Tensor], *, backend: str = "triton", **launch: int) -> None:
        """`write` for the one prefill rank of this process: its head slice (nothing for a replica)."""
        table, ids = self._rows([pool], token_slots, page_ids)
        copy_rank(pool, self.pages.transpose(1, 2), table, ids, direction="to_pages", backend=backend, launch=launch)

    def read_rank(self, pool: KVPool, token_slots: torch.Tensor | list[torch.Tensor],
                  page_ids: torch.Tensor | list[torch.Tensor], *, backend: str = "triton", **launch: int) -> None:
        """`read` for the one decode rank of this process: its head slice into its pool."""
        table, ids = self._rows([pool], token_slots, page_ids)
        copy_rank(pool, self.pages.transpose(1, 2), table, ids, direction="to_pool", backend=backend, launch=launch)

    def head_blocks(self, page_ids: list[int]) -> list[torch.Tensor]:
        """Views `[run, page_tokens, L, parts, H_global, D]` of the listed pages, one per run of consecutive
        ids (the blocks of `kv_field`; head axis `KV_HEAD_AXIS`)."""
        ids = sorted(set(page_ids))
        if not ids or ids[0] < 0 or ids[-1] >= self.pages.shape[0]:
            raise ValueError(f"page ids must be in [0, {self.pages.shape[0]}), got {page_ids}")
        runs, start = [], 0
        for k in range(1, len(ids) + 1):
            if k == len(ids) or ids[k] != ids[k - 1] + 1:
                runs.append((ids[start], ids[k - 1] + 1))
                start = k
        parts = kv_parts(self.geometry)
        return [self.pages[a:b].unflatten(3, (parts, self.geometry.kv_heads)) for a, b in runs]

    def write(
        self,
        pools: list[KVPool],
        token_slots: torch.Tensor | list[torch.Tensor],
        page_ids: torch.Tensor | list[torch.Tensor],
        *,
        backend: str = "triton",
        **launch: int,
    ) -> None:
        """Prefill side: write requests' KV from a TP group's pools into PD pages.

        Args:
            pools: the prefill TP group, one `KVPool` per rank in rank order, on the pages' device.
            token_slots: `[n]` int pool slots of one request in token order, or a list of requests.
            page_ids: `[ceil(n / page_tokens)]` int page of each chunk (-1 = skip the chunk), or a list.
            backend: `triton` or `torch`.
            launch: Triton launch parameters.
        """
        self._copy(pools, token_slots, page_ids, "to_pages", backend, launch)

    def read(
        self,
        pools: list[KVPool],
        token_slots: torch.Tensor | list[torch.Tensor],
        page_ids: torch.Tensor | list[torch.Tensor],
        *,
        backend: str = "triton",
        **launch: int,
    ) -> None:
        """Decode side: scatter PD pages into a TP group's pools; arguments as `write`."""
        self._copy(pools, token_slots, page_ids, "to_pool", backend, launch)

    def traffic(
        self,
        pools: list[KVPool],
        token_slots: torch.Tensor | list[torch.Tensor],
        page_ids: torch.Tensor | list[torch.Tensor],
        *,
        direction: str,
    ) -> PageTraffic:
        """Bytes a `write` (`direction="to_pages"`) or `read` (`"to_pool"`) with these arguments moves.

        Counts each moved token row of each taking-part rank (writers for write, all ranks for read),
        read from device memory and written to device memory: `device_bytes` is twice the row bytes.
        """
        table, ids = self._rows(pools, token_slots, page_ids)
        return group_traffic(pools, table, ids, direction=direction, host=False)


KV_HEAD_AXIS = 4  # of a `head_blocks` view: [pages, page_tokens, L, parts, H_global, D]


def kv_field(geometry: AttnGeometry, tp_prefill: int, tp_decode: int) -> Field:
    """How PD pages split between prefill TP p and decode TP d: each prefill rank that writes (one per
    replicated slice; MLA: rank 0) owns its head slice, each decode rank needs its own."""

    def heads(tp: int, rank: int) -> tuple[int, int]:
        shard = head_shard(geometry, tp, rank)
        return shard.head_start, shard.head_start + shard.local_heads

    src = tuple(heads(tp_prefill, i) if head_shard(geometry, tp_prefill, i).writes else None
                for i in range(tp_prefill))
    return Field("kv", KV_HEAD_AXIS, src, tuple(heads(tp_decode, j) for j in range(tp_decode)))
