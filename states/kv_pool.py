"""Attention KV pools of one TP rank, and which global heads a rank holds (SPEC §4).

* GQA pool `[layers, tokens + 1, 2 * H_local, D]`: K heads then V heads.
* MLA pool `[layers, tokens + 1, 1, kv_lora_rank + rope_dim]`, replicated on every rank.

The spare last row (slot `tokens`) is the padding slot: never handed out, never moved by a page copy.
On one device, TP ranks are simulated as head slices: one pool per rank (`tp_group`), and a page
transfer of a TP group (`copy_group`) runs each rank's copy in turn: writes of shared pages by one
rank per replicated slice, reads by every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.pages import check_page_copy, check_page_size, page_copy, slot_table
from states.geometry import AttnGeometry

# fp8 variants would add their dtypes here: the page kernels copy bits of any element size.
KV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_page_pool(page_size: int, num_pages: int, dtype: torch.dtype) -> None:
    """The checks every page pool (CPU or PD) makes before allocating anything."""
    check_page_size(page_size)
    check_kv_dtype(dtype)
    if num_pages < 1:
        raise ValueError(f"a page pool needs at least one page, got {num_pages}")


def check_kv_dtype(dtype: torch.dtype) -> None:
    if dtype not in KV_DTYPES:
        raise ValueError(f"KV dtype must be one of {KV_DTYPES}, got {dtype}")


def kv_parts(geometry: AttnGeometry) -> int:
    """Head groups of a token row: 2 for GQA (K then V), 1 for MLA (the latent)."""
    return 2 if geometry.family == "gqa" else 1


@dataclass(frozen=True)
class HeadShard:
    """The global heads one TP rank holds, per part (K or V; the MLA latent is one head).

    Attributes:
        tp, rank: TP degree and this rank.
        local_heads: heads per part on this rank, `max(1, H // tp)`.
        head_start: first global head of the rank's slice.
        replicas: ranks holding the same slice (`tp // H` when `tp > H`, else 1; `tp` for MLA).
    """

    tp: int
    rank: int
    local_heads: int
    head_start: int
    replicas: int

    @property
    def writes(self) -> bool:
        """Whether this rank writes shared pages: one rank per replicated slice (rank % replicas == 0)."""
        return self.rank % self.replicas == 0


def head_shard(geometry: AttnGeometry, tp: int, rank: int) -> HeadShard:
    """Rank `rank`'s slice at TP `tp`; ValueError when TP neither divides nor multiplies the heads."""
    if tp < 1 or not 0 <= rank < tp:
        raise ValueError(f"rank {rank} is not a rank of TP {tp}")
    local = geometry.local_kv_heads(tp)
    replicas = max(1, tp // geometry.kv_heads)
    return HeadShard(tp, rank, local, (rank // replicas) * local, replicas)


@dataclass(frozen=True)
class KVPool:
    """One rank's KV pool.

    Attributes:
        geometry: the model's attention layers (global heads).
        shard: which heads this rank holds.
        kv: `[L, tokens + 1, parts * H_local, D]` (MLA: `[L, tokens + 1, 1, 576]`).
    """

    geometry: AttnGeometry
    shard: HeadShard
    kv: torch.Tensor

    @classmethod
    def create(
        cls,
        geometry: AttnGeometry,
        tokens: int,
        *,
        tp: int = 1,
        rank: int = 0,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> KVPool:
        """An uninitialised pool of `tokens` slots (plus the padding slot) for rank `rank` of TP `tp`."""
        check_kv_dtype(dtype)
        if tokens < 1:
            raise ValueError(f"a pool needs at least one token slot, got {tokens}")
        shard = head_shard(geometry, tp, rank)
        shape = (geometry.layers, tokens + 1, kv_parts(geometry) * shard.local_heads, geometry.head_dim)
        return cls(geometry, shard, torch.empty(shape, dtype=dtype, device=device))

    @property
    def tokens(self) -> int:
        """Token slots handed out (`0 .. tokens - 1`); slot `tokens` is the padding slot."""
        return self.kv.shape[1] - 1

    @property
    def parts(self) -> int:
        return kv_parts(self.geometry)

    def global_heads(self) -> torch.Tensor:
        """`[parts * H_local]` int64: the page head (global numbering, K part first) of each pool head."""
        h, local = self.geometry.kv_heads, self.shard.local_heads
        start = self.shard.head_start
        return torch.cat([torch.arange(start, start + local) + part * h for part in range(self.parts)])

    def row_bytes(self) -> int:
        """Bytes of one token over all layers in this pool: `L * parts * H_local * D * elem`."""
        return self.kv[:, 0].numel() * self.kv.element_size()


def tp_group(
    geometry: AttnGeometry,
    tokens: int,
    tp: int,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> list[KVPool]:
    """One pool per simulated rank of TP `tp`, in rank order."""
    return [KVPool.create(geometry, tokens, tp=tp, rank=r, dtype=dtype, device=device) for r in range(tp)]


def check_group(pools: list[KVPool]) -> None:
    """ValueError unless `pools` is one whole TP group: ranks 0..tp-1 in order, one geometry, dtype,
    device and slot count."""
    if not pools:
        raise ValueError("no pools given")
    first = pools[0]
    tp = first.shard.tp
    ranks = [p.shard.rank for p in pools]
    if ranks != list(range(tp)):
        raise ValueError(f"expected the {tp} pools of ranks 0..{tp - 1} in order, got ranks {ranks}")
    for p in pools:
        same = (p.geometry, p.shard.tp, p.kv.dtype, p.kv.device, p.tokens)
        if same != (first.geometry, tp, first.kv.dtype, first.kv.device, first.tokens):
            raise ValueError(f"pools of one TP group differ: rank {p.shard.rank} has {same}")


@dataclass(frozen=True)
class PageTraffic:
    """Bytes one page transfer moves, summed over the simulated ranks that take part.

    Attributes:
        host_bytes: bytes read from or written to host memory (each crosses PCIe once).
        device_bytes: bytes read plus bytes written in device memory (pools, staging, PD pages).
        tokens: token rows moved per taking-part rank (pages skipped as ready or -1 excluded).
        ranks: ranks that move data (writers only for page writes, every rank for page reads).
    """

    host_bytes: int
    device_bytes: int
    tokens: int
    ranks: int


def page_rows(
    token_slots: torch.Tensor | list[torch.Tensor],
    page_ids: torch.Tensor | list[torch.Tensor],
    page_size: int,
    align: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The page rows of a batch of requests, on the host.

    Args:
        token_slots: one request's `[n]` pool slots, or a list of them.
        page_ids: that request's `[ceil(n / page_size)]` page indices (-1 = no page), or a list.
        page_size: tokens per page.
        align: `tail` or `head`, where a partial last page keeps its tokens (`kernels.pages.slot_table`).

    Returns:
        `table [pages, page_size]` int64 (`# table: [page row, position] -> pool slot, -1 = none`) and
        `ids [pages]` int64 (`# ids: [page row] -> page index, -1 = no page`).
    """
    if isinstance(token_slots, torch.Tensor):
        token_slots, page_ids = [token_slots], [page_ids]
    if len(token_slots) != len(page_ids):
        raise ValueError(f"{len(token_slots)} requests of token slots but {len(page_ids)} of page ids")
    tables, ids = [], []
    for r, (slots, pages) in enumerate(zip(token_slots, page_ids, strict=True)):
        table = slot_table(slots.cpu(), page_size, align)
        if pages.dim() != 1 or pages.shape[0] != table.shape[0] or pages.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"request {r}: {slots.shape[0]} tokens need {table.shape[0]} pages of {page_size}, "
                f"got page ids {pages.dtype} {tuple(pages.shape)}"
            )
        tables.append(table)
        ids.append(pages.cpu().to(torch.int64))
    return torch.cat(tables), torch.cat(ids)


def copy_group(
    pools: list[KVPool],
    pages: torch.Tensor,
    table: torch.Tensor,
    ids: torch.Tensor,
    *,
    direction: str,
    backend: str,
    variant: str = "direct",
    launch: dict[str, int] | None = None,
) -> None:
    """Run one page transfer for every simulated rank of a TP group.

    Every rank's tensors and the index values are checked before the first copy, so a bad call
    writes nothing. `to_pages` runs on the writing ranks only (`HeadShard.writes`); `to_pool` on all.

    Args:
        pools: the whole TP group, rank order.
        pages: `[N, L, P, parts * HG, D]` layer-major view of the page tensor.
        table, ids: page rows from `page_rows`.
        direction: `to_pages` or `to_pool`.
        backend, variant: see `kernels.pages.page_copy`.
        launch: Triton launch parameters (`programs`, `block_tokens`, `block_cols`, `num_warps`).
    """
    check_group(pools)
    copy = page_copy(direction, backend, variant)
    launch = launch or {}
    if launch and backend != "triton":
        raise ValueError(f"launch parameters {sorted(launch)} apply to the triton backend only")
    device = pools[0].kv.device
    table, ids = table.to(device), ids.to(device)
    to_pages = direction == "to_pages"
    for i, p in enumerate(pools):
        start = p.shard.head_start
        check_page_copy(p.kv, pages, table, ids, parts=p.parts, head_start=start, to_pages=to_pages, validate=i == 0)
    for p in pools:
        if p.shard.writes or not to_pages:
            copy(p.kv, pages, table, ids, parts=p.parts, head_start=p.shard.head_start, validate=False, **launch)


def copy_rank(
    pool: KVPool,
    pages: torch.Tensor,
    table: torch.Tensor,
    ids: torch.Tensor,
    *,
    direction: str,
    backend: str,
    launch: dict[str, int] | None = None,
) -> None:
    """`copy_group` for the one rank a process holds (the other ranks of its TP group live in other
    processes): checked first, then copied; a replica rank (`HeadShard.writes` False) writes no pages."""
    copy = page_copy(direction, backend)
    launch = launch or {}
    if launch and backend != "triton":
        raise ValueError(f"launch parameters {sorted(launch)} apply to the triton backend only")
    table, ids = table.to(pool.kv.device), ids.to(pool.kv.device)
    to_pages = direction == "to_pages"
    start = pool.shard.head_start
    check_page_copy(pool.kv, pages, table, ids, parts=pool.parts, head_start=start, to_pages=to_pages)
    if pool.shard.writes or not to_pages:
        copy(pool.kv, pages, table, ids, parts=pool.parts, head_start=start, validate=False, **launch)


def group_traffic(
    pools: list[KVPool], table: torch.Tensor, ids: torch.Tensor, *, direction: str, host: bool, staged: bool = False
) -> PageTraffic:
    """Bytes `copy_group` moves for these page rows.

    Counted: each moved token row (page id >= 0, slot >= 0) of each taking-part rank, all layers,
    that rank's heads (`KVPool.row_bytes`). Direct: the row is read on one side and written on the
    other, so host-side pages count `host_bytes` once and `device_bytes` once; device-side pages
    (PD) count `device_bytes` twice. Staged (host pages only): the pool side, the staging write and
    the staging read by the DMA make `device_bytes` three times the row bytes. Index tables are not
    counted.
    """
    check_group(pools)
    if direction not in ("to_pages", "to_pool"):
        raise ValueError(f"unknown direction {direction!r}; choose to_pages or to_pool")
    tokens = int(((ids >= 0)[:, None] & (table >= 0)).sum())
    ranks = sum(p.shard.writes for p in pools) if direction == "to_pages" else len(pools)
    moved = tokens * ranks * pools[0].row_bytes()
    if not host:
        return PageTraffic(host_bytes=0, device_bytes=2 * moved, tokens=tokens, ranks=ranks)
    return PageTraffic(host_bytes=moved, device_bytes=(3 if staged else 1) * moved, tokens=tokens, ranks=ranks)
