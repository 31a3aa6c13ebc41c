"""CPU pages: a host page pool the KV of any TP degree offloads to and loads from (SPEC §4).

Layout `[page, layer, token, parts * H_global, D]` (MLA `[page, layer, token, 1, 576]`), global head
numbering, so a page written at one TP degree is read at another. The memory is pinned when a CUDA
device exists (the direct kernels then reach it zero-copy); otherwise it is plain pageable CPU memory,
which `memory` says.

Each page has a ready flag. Offload skips pages already ready (dedup) or given as -1, writes the rest
from every writing rank, then marks them ready; load reads ready pages only and scatters them into
arbitrary pool slots. A request of `n` tokens uses `ceil(n / page_size)` pages, and a partial last page
holds its tokens at the tail.
"""

from __future__ import annotations

import torch

from states.geometry import AttnGeometry
from states.kv_pool import KVPool, PageTraffic, check_page_pool, copy_group, group_traffic, kv_parts, page_rows

DEFAULT_PAGE_SIZE = 256


class CPUPagePool:
    """Host KV pages of one model.

    Attributes:
        geometry: attention layers (global heads).
        page_size: tokens per page, a power of two in [16, 1024].
        pages: `[num_pages, L, page_size, parts * H_global, D]` on the host.
        ready: `[num_pages]` bool on the host, `# ready: [page] -> page holds valid KV`.
        pinned: whether `pages` is pinned (always, when CUDA is available).
    """

    def __init__(
        self,
        geometry: AttnGeometry,
        num_pages: int,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        check_page_pool(page_size, num_pages, dtype)
        self.geometry = geometry
        self.page_size = page_size
        self.pinned = torch.cuda.is_available()
        shape = (num_pages, geometry.layers, page_size, kv_parts(geometry) * geometry.kv_heads, geometry.head_dim)
        self.pages = torch.empty(shape, dtype=dtype, pin_memory=self.pinned)
        self.ready = torch.zeros(num_pages, dtype=torch.bool)

    @property
    def memory(self) -> str:
        """Label of the host memory kind, for reports."""
        return "pinned" if self.pinned else "pageable (no CUDA device: plain CPU memory)"

    @property
    def page_bytes(self) -> int:
        return self.pages[0].numel() * self.pages.element_size()

    def _rows(self, pools, token_slots, page_ids) -> tuple[torch.Tensor, torch.Tensor]:
        table, ids = page_rows(token_slots, page_ids, self.page_size, "tail")
        if pools and pools[0].geometry != self.geometry:
            raise ValueError(f"pool geometry {pools[0].geometry} differs from the pages' {self.geometry}")
        bad = (ids < -1) | (ids >= len(self.ready))
        if bad.any():
            raise ValueError(f"page ids must be in [-1, {len(self.ready)}), got {ids[bad].tolist()}")
        return table, ids

    def _skip_ready(self, ids: torch.Tensor) -> torch.Tensor:
        """Offload ids with ready pages replaced by -1 (they already hold this KV)."""
        return torch.where(ids >= 0, torch.where(self.ready[ids.clamp(min=0)], -1, ids), ids)

    def offload(
        self,
        pools: list[KVPool],
        token_slots: torch.Tensor | list[torch.Tensor],
        page_ids: torch.Tensor | list[torch.Tensor],
        *,
        backend: str = "triton",
        variant: str = "direct",
        **launch: int,
    ) -> torch.Tensor:
        """Write requests' KV from a TP group's pools into their pages.

        Args:
            pools: the TP group, one `KVPool` per rank in rank order (`tp_group`).
            token_slots: `[n]` int pool slots of one request in token order, or a list of requests.
            page_ids: `[ceil(n / page_size)]` int page of each chunk of the request (-1 = none), or a list.
            backend: `triton` or `torch`; variant: `direct` (kernel writes host memory) or `staged`.
            launch: Triton launch parameters.

        Returns:
            `[k]` int64, the pages written (and now ready); ready and -1 pages are skipped.
        """
        table, ids = self._rows(pools, token_slots, page_ids)
        ids = self._skip_ready(ids)
        copy_group(pools, self.pages, table, ids, direction="to_pages", backend=backend, variant=variant, launch=launch)
        written = ids[ids >= 0]
        self.ready[written] = True
        return written

    def load(
        self,
        pools: list[KVPool],
        token_slots: torch.Tensor | list[torch.Tensor],
        page_ids: torch.Tensor | list[torch.Tensor],
        *,
        backend: str = "triton",
        variant: str = "direct",
        **launch: int,
    ) -> None:
        """Scatter ready pages into a TP group's pools (every rank reads its own heads).

        Arguments as `offload`; the slots may differ from those the pages were offloaded from. -1 page
        ids are skipped; ValueError if a listed page is not ready.
        """
        table, ids = self._rows(pools, token_slots, page_ids)
        listed = ids[ids >= 0]
        if not bool(self.ready[listed].all()):
            raise ValueError(f"pages not ready cannot be loaded: {listed[~self.ready[listed]].tolist()}")
        copy_group(pools, self.pages, table, ids, direction="to_pool", backend=backend, variant=variant, launch=launch)

    def release(self, page_ids: torch.Tensor) -> None:
        """Clear the ready flag of pages so an offload writes them again."""
        self.ready[page_ids.cpu().long()] = False

    def traffic(
        self,
        pools: list[KVPool],
        token_slots: torch.Tensor | list[torch.Tensor],
        page_ids: torch.Tensor | list[torch.Tensor],
        *,
        direction: str,
        variant: str = "direct",
    ) -> PageTraffic:
        """Bytes an `offload` (`direction="to_pages"`) or `load` (`"to_pool"`) with these arguments moves
        now (call it before an offload: pages it makes ready would be skipped next time).

        Counts what `kv_pool.group_traffic` counts: each moved token row of each taking-part rank
        (writers for offload, all ranks for load), crossing PCIe once; device bytes are the pool side,
        plus staging write and read for the `staged` variant.
        """
        table, ids = self._rows(pools, token_slots, page_ids)
        if direction == "to_pages":
            ids = self._skip_ready(ids)
        return group_traffic(pools, table, ids, direction=direction, host=True, staged=variant == "staged")
