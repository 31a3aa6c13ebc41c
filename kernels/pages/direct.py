"""Direct page copies in Triton: one kernel launch per direction, no staging buffer.

The pages may be pinned host memory (CPU pages: CUDA maps pinned memory under UVA, so the kernel
reads and writes host memory over PCIe itself) or device memory (PD staging pages). A token-major
page `[N, P, L, heads, D]` is passed as its `transpose(1, 2)` view; the kernel only sees strides.

Work is a persistent grid: item `(page row, layer, token block)` copies a `[BT, HL * D]` tile of each
part (K then V, or the MLA latent); programs stride over items. All address arithmetic is int64.
The data moves as integers of the element size, so any 1/2/4/8-byte dtype (fp8 included) is a copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pages.layout import PageCopy, check_page_copy

BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
LAUNCH_KEYS = ("programs", "block_tokens", "block_cols", "num_warps")


def check_launch(launch: dict[str, int | None]) -> None:
    """ValueError for unknown launch parameters or tile sizes that are not powers of two."""
    unknown = sorted(set(launch) - set(LAUNCH_KEYS))
    if unknown:
        raise ValueError(f"unknown launch parameters {unknown}; choose from {', '.join(LAUNCH_KEYS)}")
    for key in LAUNCH_KEYS:
        value = launch.get(key)
        if value is not None and (value < 1 or (key != "programs" and value & (value - 1))):
            raise ValueError(f"{key} must be {'>= 1' if key == 'programs' else 'a power of two'}, got {value}")


def default_launch(copy: PageCopy, device: torch.device) -> dict[str, int]:
    """Launch parameters when the caller gives none: tiles of about 4K elements, 4 programs per SM."""
    chunk = copy.chunk
    # The largest power of two dividing the row keeps every tile full (576 -> 64, 1024 -> 1024).
    block_cols = min(chunk & -chunk, 1024)
    block_tokens = min(copy.page_tokens, max(1, 4096 // block_cols))
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return {"programs": 4 * sms, "block_tokens": block_tokens, "block_cols": block_cols, "num_warps": 4}


# n_rows only bounds the item loop: as a plain argument (not specialized to a constant when it is 1) a
# transfer of one page row shares the binary of every other row count (issue 23: fewer gate compiles)
@triton.jit(do_not_specialize=["n_rows"])
def page_copy_kernel(
    pool,
    pages,
    slot_table,
    page_ids,
    n_rows,
    L,
    stride_pool_l,
    stride_pool_s,
    stride_page_n,
    stride_page_l,
    stride_page_t,
    page_head_offset,
    P: tl.constexpr,
    PARTS: tl.constexpr,
    CHUNK: tl.constexpr,
    POOL_PART: tl.constexpr,
    PAGE_PART: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    TO_PAGES: tl.constexpr,
):
    NTB: tl.constexpr = (P + BT - 1) // BT
    n_items = n_rows * L * NTB
    for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
        i_tb = item % NTB
        i_l = ((item // NTB) % L).to(tl.int64)
        i_r = (item // (NTB * L)).to(tl.int64)
        page = tl.load(page_ids + i_r).to(tl.int64)
        if page >= 0:
            o_t = i_tb * BT + tl.arange(0, BT)
            m_t = o_t < P
            slot = tl.load(slot_table + i_r * P + o_t, mask=m_t, other=-1).to(tl.int64)
            m_t = m_t & (slot >= 0)
            p_pool = pool + i_l * stride_pool_l + slot[:, None] * stride_pool_s
            p_page = (
                pages
                + page * stride_page_n
                + i_l * stride_page_l
                + o_t.to(tl.int64)[:, None] * stride_page_t
                + page_head_offset
            )
            for part in tl.static_range(PARTS):
                for c0 in tl.range(0, CHUNK, BC):
                    o_c = c0 + tl.arange(0, BC)
                    m = m_t[:, None] & (o_c < CHUNK)[None, :]
                    src = p_pool + part * POOL_PART + o_c[None, :]
                    dst = p_page + part * PAGE_PART + o_c[None, :]
                    if TO_PAGES:
                        tl.store(dst, tl.load(src, mask=m), mask=m)
                    else:
                        tl.store(src, tl.load(dst, mask=m), mask=m)


def _launch(
    pool: torch.Tensor,
    pages: torch.Tensor,
    slot_table: torch.Tensor,
    page_ids: torch.Tensor,
    parts: int,
    head_start: int,
    *,
    to_pages: bool,
    validate: bool,
    launch: dict[str, int | None],
) -> None:
    check_launch(launch)
    c = check_page_copy(
        pool, pages, slot_table, page_ids, parts=parts, head_start=head_start, to_pages=to_pages, validate=validate
    )
    n_rows = slot_table.shape[0]
    if n_rows == 0:
        return
    cfg = default_launch(c, pool.device)
    cfg.update({k: v for k, v in launch.items() if v is not None})
    n_items = n_rows * c.layers * triton.cdiv(c.page_tokens, cfg["block_tokens"])
    grid = (min(cfg["programs"], n_items),)
    bits = BITS[pool.element_size()]
    page_copy_kernel[grid](
        pool.view(bits),
        pages.view(bits),
        slot_table.contiguous(),
        page_ids.contiguous(),
        n_rows,
        c.layers,
        pool.stride(0),
        pool.stride(1),
        pages.stride(0),
        pages.stride(1),
        pages.stride(2),
        head_start * c.head_dim,
        P=c.page_tokens,
        PARTS=parts,
        CHUNK=c.chunk,
        POOL_PART=c.chunk,
        PAGE_PART=c.global_heads * c.head_dim,
        BT=cfg["block_tokens"],
        BC=cfg["block_cols"],
        TO_PAGES=to_pages,
        num_warps=cfg["num_warps"],
    )


def pool_to_pages(
    pool: torch.Tensor,
    pages: torch.Tensor,
    slot_table: torch.Tensor,
    page_ids: torch.Tensor,
    *,
    parts: int,
    head_start: int = 0,
    validate: bool = True,
    programs: int | None = None,
    block_tokens: int | None = None,
    block_cols: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Write the pool's token rows into pages (CPU offload, PD write), one kernel launch.

    Args:
        pool: `[L, tokens + 1, parts * HL, D]` one rank's KV pool (read), on the launch device.
        pages: `[N, L, P, parts * HG, D]` same dtype (written): device memory, or pinned host memory
            when the pool is on CUDA. Layer-major view; pass `pd_page.transpose(1, 2)` for token-major.
        slot_table: `[n, P]` int32/int64 on the pool's device,
            `# slot_table: [page row, position] -> pool slot, -1 = position not moved`.
        page_ids: `[n]` int32/int64 on the pool's device,
            `# page_ids: [page row] -> page index in pages, -1 = row skipped`.
        parts: 2 for GQA (K heads then V heads), 1 for MLA (one latent).
        head_start: first global head of this rank's slice within each part.
        validate: also check the index values (reads them: a device sync).
        programs, block_tokens, block_cols, num_warps: launch parameters (`default_launch` fills gaps):
            persistent programs, tokens and columns per tile (powers of two), warps per program.
    """
    launch = {"programs": programs, "block_tokens": block_tokens, "block_cols": block_cols, "num_warps": num_warps}
    _launch(pool, pages, slot_table, page_ids, parts, head_start, to_pages=True, validate=validate, launch=launch)


def pages_to_pool(
    pool: torch.Tensor,
    pages: torch.Tensor,
    slot_table: torch.Tensor,
    page_ids: torch.Tensor,
    *,
    parts: int,
    head_start: int = 0,
    validate: bool = True,
    programs: int | None = None,
    block_tokens: int | None = None,
    block_cols: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Scatter page token rows into arbitrary pool slots (CPU load, PD read), one kernel launch.

    Arguments as `pool_to_pages`; here the pages are read and the pool is written.
    """
    launch = {"programs": programs, "block_tokens": block_tokens, "block_cols": block_cols, "num_warps": num_warps}
    _launch(pool, pages, slot_table, page_ids, parts, head_start, to_pages=False, validate=validate, launch=launch)
