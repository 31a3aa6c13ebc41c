"""What a page copy takes, and the checks every backend runs before it writes a byte.

A page copy moves token rows between one rank's KV pool and a tensor of pages:

* pool  `[L, tokens + 1, parts * HL, D]`: `parts` is 2 for GQA (K heads then V heads) and 1 for MLA
  (one latent); `HL` heads per part live on this rank; the last row is the padding slot, never moved.
* pages `[N, L, P, parts * HG, D]` viewed layer-major (a token-major page is passed as a transposed
  view); `HG` global heads per part. The rank's slice of part `p` is heads
  `[p * HG + head_start, p * HG + head_start + HL)`.
* slot_table `[n, P]` and page_ids `[n]` say which page row goes where (-1 = nothing moved).

Every backend calls `check_page_copy` before launching, so bad input raises ValueError with the
numbers and leaves every tensor untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_PAGE_TOKENS = 16
MAX_PAGE_TOKENS = 1024
ALIGNS = ("tail", "head")


def _is_int(t: torch.Tensor) -> bool:
    return t.dtype in (torch.int32, torch.int64)


def check_page_size(page_size: int) -> None:
    """ValueError unless `page_size` is a power of two in [16, 1024]."""
    if not (MIN_PAGE_TOKENS <= page_size <= MAX_PAGE_TOKENS) or page_size & (page_size - 1):
        raise ValueError(
            f"page size must be a power of two in [{MIN_PAGE_TOKENS}, {MAX_PAGE_TOKENS}] tokens, got {page_size}"
        )


def slot_table(token_slots: torch.Tensor, page_size: int, align: str = "tail") -> torch.Tensor:
    """Lay one request's token slots out over its pages.

    Args:
        token_slots: `[n]` integer, pool slot of each token of the request, in token order.
        page_size: tokens per page P.
        align: where a partial last page keeps its tokens: `tail` (positions `[P - r, P)`, CPU pages)
            or `head` (positions `[0, r)`, PD pages).

    Returns:
        `[ceil(n / P), P]` int64 on the device of `token_slots`; -1 marks a position with no token.
    """
    check_page_size(page_size)
    if align not in ALIGNS:
        raise ValueError(f"unknown align {align!r}; choose one of {', '.join(ALIGNS)}")
    if token_slots.dim() != 1 or not _is_int(token_slots):
        raise ValueError(f"token_slots must be 1-D int32/int64, got {token_slots.dtype} {tuple(token_slots.shape)}")
    n = token_slots.shape[0]
    pad = -n % page_size
    hole = torch.full((pad,), -1, dtype=torch.int64, device=token_slots.device)
    slots = token_slots.to(torch.int64)
    if align == "tail":
        # The hole goes in front of the last page's tokens, so they end at the page's last position.
        full = n - (n % page_size if pad else 0)
        slots = torch.cat([slots[:full], hole, slots[full:]])
    else:
        slots = torch.cat([slots, hole])
    return slots.view(-1, page_size)


@dataclass(frozen=True)
class PageCopy:
    """Checked geometry of one pool <-> pages copy."""

    layers: int
    page_tokens: int
    parts: int
    local_heads: int
    global_heads: int
    head_dim: int
    head_start: int

    @property
    def chunk(self) -> int:
        """Contiguous elements one token row of one part moves: `HL * D`."""
        return self.local_heads * self.head_dim


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_page_copy(
    pool: torch.Tensor,
    pages: torch.Tensor,
    slot_table: torch.Tensor,
    page_ids: torch.Tensor,
    *,
    parts: int,
    head_start: int,
    to_pages: bool,
    validate: bool = True,
) -> PageCopy:
    """Check one copy's tensors; ValueError naming the problem and the numbers.

    Shapes, dtypes and devices are always checked (no device sync). With `validate`, the index values
    are checked too (this reads them, so it syncs a device): page ids in `[-1, N)`, slots in
    `[-1, tokens)` (the padding slot is never moved), page ids unique when writing pages, and pool
    slots unique when writing the pool, since two writers of one place would race.
    """
    _require(pool.dim() == 4, f"pool must be [L, tokens + 1, heads, D], got shape {tuple(pool.shape)}")
    _require(pages.dim() == 5, f"pages must be [N, L, P, heads, D], got shape {tuple(pages.shape)}")
    _require(pool.dtype == pages.dtype, f"dtype mismatch: pool {pool.dtype}, pages {pages.dtype}")
    _require(parts in (1, 2), f"parts must be 1 (MLA latent) or 2 (GQA K and V), got {parts}")
    layers, slots_plus_pad, pool_heads, head_dim = pool.shape
    n_pages, page_layers, page_tokens, page_heads, page_dim = pages.shape
    _require(layers == page_layers, f"layer mismatch: pool has {layers} layers, pages have {page_layers}")
    _require(head_dim == page_dim, f"head dim mismatch: pool {head_dim}, pages {page_dim}")
    _require(
        pool_heads % parts == 0 and page_heads % parts == 0,
        f"head counts must split into {parts} parts: pool {pool_heads}, pages {page_heads}",
    )
    local_heads, global_heads = pool_heads // parts, page_heads // parts
    _require(
        0 <= head_start and head_start + local_heads <= global_heads,
        f"head slice [{head_start}, {head_start + local_heads}) does not fit {global_heads} global heads per part",
    )
    check_page_size(page_tokens)
    for name, t in (("pool", pool), ("pages", pages)):
        _require(
            t.stride(-1) == 1 and t.stride(-2) == head_dim,
            f"{name} must have contiguous [heads, D] rows, got strides {t.stride()}",
        )
    _require(
        slot_table.dim() == 2 and slot_table.shape[1] == page_tokens and _is_int(slot_table),
        f"slot_table must be int32/int64 [n, {page_tokens}], got {slot_table.dtype} {tuple(slot_table.shape)}",
    )
    _require(
        page_ids.dim() == 1 and page_ids.shape[0] == slot_table.shape[0] and _is_int(page_ids),
        f"page_ids must be int32/int64 [{slot_table.shape[0]}], got {page_ids.dtype} {tuple(page_ids.shape)}",
    )
    for name, t in (("slot_table", slot_table), ("page_ids", page_ids)):
        _require(t.device == pool.device, f"{name} is on {t.device}, the pool on {pool.device}")
    if pool.device.type == "cuda" and pages.device.type == "cpu":
        _require(pages.is_pinned(), "host pages must be pinned so the kernel can reach them from the GPU")
    else:
        _require(pages.device == pool.device, f"pages are on {pages.device}, the pool on {pool.device}")

    if validate:
        tokens = slots_plus_pad - 1
        _require(
            bool(((page_ids >= -1) & (page_ids < n_pages)).all()),
            f"page ids must be in [-1, {n_pages}), got {page_ids.tolist()}",
        )
        bad = (slot_table < -1) | (slot_table >= tokens)
        _require(
            not bool(bad.any()),
            f"slot ids must be in [-1, {tokens}) (slot {tokens} is the padding slot), "
            f"got {slot_table[bad].unique().tolist()}",
        )
        active = page_ids[page_ids >= 0]
        if to_pages:
            _require(active.unique().numel() == active.numel(), f"page ids repeat: {active.tolist()}")
        else:
            moved = slot_table[(page_ids >= 0)[:, None] & (slot_table >= 0)]
            _require(moved.unique().numel() == moved.numel(), "destination slots repeat")
    return PageCopy(layers, page_tokens, parts, local_heads, global_heads, head_dim, head_start)
