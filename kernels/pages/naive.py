"""PyTorch references of the page copies (the `torch` backend), by plain advanced indexing.

Same arguments and checks as the Triton kernels of `direct.py`; see `layout.py` for the layouts.
Every copy moves bits: same dtype on both sides, so NaN payloads and signed zeros survive.
"""

from __future__ import annotations

import torch

from kernels.pages.layout import check_page_copy


def _moved(slot_table: torch.Tensor, page_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(page row, position in page, pool slot, page index) of every token row that moves."""
    keep = (page_ids >= 0)[:, None] & (slot_table >= 0)
    rows, positions = keep.nonzero(as_tuple=True)
    return rows, positions, slot_table[rows, positions].long(), page_ids[rows].long()


def pool_to_pages_ref(
    pool: torch.Tensor,
    pages: torch.Tensor,
    slot_table: torch.Tensor,
    page_ids: torch.Tensor,
    *,
    parts: int,
    head_start: int = 0,
    validate: bool = True,
) -> None:
    """Write the pool's token rows into pages.

    Args:
        pool: `[L, tokens + 1, parts * HL, D]` one rank's KV pool (read).
        pages: `[N, L, P, parts * HG, D]` same dtype, layer-major view (written).
        slot_table: `[n, P]` int, `# slot_table: [page row, position] -> pool slot, -1 = none`.
        page_ids: `[n]` int, `# page_ids: [page row] -> page index in pages, -1 = skip the row`.
        parts: 2 for GQA (K then V), 1 for MLA.
        head_start: first global head of this rank's slice, within each part.
        validate: check the index values too (syncs a device).
    """
    c = check_page_copy(
        pool, pages, slot_table, page_ids, parts=parts, head_start=head_start, to_pages=True, validate=validate
    )
    _, positions, slots, pids = _moved(slot_table, page_ids)
    positions, pids = positions.to(pages.device), pids.to(pages.device)
    for part in range(parts):
        local = slice(part * c.local_heads, (part + 1) * c.local_heads)
        first = part * c.global_heads + head_start
        rows = pool[:, slots, local].transpose(0, 1)  # [m, L, HL, D]
        pages[pids, :, positions, first : first + c.local_heads] = rows.to(pages.device)


def pages_to_pool_ref(
    pool: torch.Tensor,
    pages: torch.Tensor,
    slot_table: torch.Tensor,
    page_ids: torch.Tensor,
    *,
    parts: int,
    head_start: int = 0,
    validate: bool = True,
) -> None:
    """Scatter page token rows into pool slots; arguments as `pool_to_pages_ref` (pool written)."""
    c = check_page_copy(
        pool, pages, slot_table, page_ids, parts=parts, head_start=head_start, to_pages=False, validate=validate
    )
    _, positions, slots, pids = _moved(slot_table, page_ids)
    positions, pids = positions.to(pages.device), pids.to(pages.device)
    for part in range(parts):
        first = part * c.global_heads + head_start
        rows = pages[pids, :, positions, first : first + c.local_heads]  # [m, L, HL, D]
        pool[:, slots, part * c.local_heads : (part + 1) * c.local_heads] = rows.transpose(0, 1).to(pool.device)
