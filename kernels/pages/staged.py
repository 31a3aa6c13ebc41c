"""Staged page copies, the comparison path: gather on the device into a contiguous staging buffer,
then one bulk DMA per run of pages (and the reverse), so no SM touches host memory.

A rank's slice of a page is `HL * D` contiguous elements per `(layer, token, part)` row, rows spaced
`HG * D` apart, so each bulk copy is one `cudaMemcpy2DAsync` on the current stream (a plain memcpy
when the rank holds every head). Consecutive full pages merge into one copy; a partial page copies
its valid token range layer by layer. The CUDA runtime is the one PyTorch loaded (found in the
process map), never a hard-coded path; every return code is checked. On CPU tensors the bulk copy
is `Tensor.copy_` over the same views, so the CPU tests exercise the same page runs.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from kernels.pages.direct import check_launch, pages_to_pool, pool_to_pages
from kernels.pages.layout import PageCopy, check_page_copy
from kernels.pages.naive import pages_to_pool_ref, pool_to_pages_ref

CUDA_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction follows from the UVA pointers
# (backend, to pages) -> the device-side half of the transfer
GATHER = {
    ("triton", True): pool_to_pages,
    ("triton", False): pages_to_pool,
    ("torch", True): pool_to_pages_ref,
    ("torch", False): pages_to_pool_ref,
}


@functools.cache
def _cudart() -> ctypes.CDLL:
    """The libcudart PyTorch loaded: dlopen of the mapped path returns that same library."""
    torch.cuda.init()
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libcudart" in line.rsplit("/", 1)[-1]})
    if not paths:
        raise RuntimeError("staged copy: PyTorch's CUDA runtime (libcudart) is not mapped in this process")
    lib = ctypes.CDLL(paths[0])
    lib.cudaMemcpy2DAsync.restype = ctypes.c_int
    lib.cudaMemcpy2DAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
    lib.cudaMemcpy2DAsync.argtypes += [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    lib.cudaGetErrorString.argtypes = [ctypes.c_int]
    return lib


def _bulk_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy `src` into `dst` (same shape `[..., HL, D]`, rows evenly spaced) as one DMA."""
    if not (dst.is_cuda or src.is_cuda):
        dst.copy_(src)
        return
    width = dst.shape[-2] * dst.shape[-1]
    # view (never reshape): a copy here would send the DMA to a temporary.
    d2, s2 = dst.view(-1, width), src.view(-1, width)
    size = dst.element_size()
    device = dst.device if dst.is_cuda else src.device
    lib = _cudart()
    stream = torch.cuda.current_stream(device).cuda_stream
    dst_pitch, src_pitch = d2.stride(0) * size, s2.stride(0) * size
    rc = lib.cudaMemcpy2DAsync(
        d2.data_ptr(), dst_pitch, s2.data_ptr(), src_pitch, width * size, d2.shape[0], CUDA_MEMCPY_DEFAULT, stream
    )
    if rc:
        raise RuntimeError(f"cudaMemcpy2DAsync failed: {lib.cudaGetErrorString(rc).decode()} ({rc})")


def _page_runs(slot_table: torch.Tensor, page_ids: torch.Tensor) -> tuple[list[int], list[tuple[int, ...]]]:
    """Plan a staged transfer: the active page rows, and its bulk copies.

    Active rows have a page id >= 0 and at least one token; the j-th active row goes through
    staging page j. A copy is `(staging row, page, pages, first position, end position)`; runs of
    full pages with consecutive ids merge. ValueError when a page's tokens are not one consecutive
    range of positions (the staged path copies ranges, not single rows).
    """
    table, ids = slot_table.cpu(), page_ids.tolist()
    page_tokens = table.shape[1]
    active: list[int] = []
    runs: list[tuple[int, ...]] = []
    for r, page in enumerate(ids):
        positions = (table[r] >= 0).nonzero().flatten().tolist() if page >= 0 else []
        if not positions:
            continue
        t0, t1 = positions[0], positions[-1] + 1
        if t1 - t0 != len(positions):
            raise ValueError(f"staged copy: page row {r} holds tokens at non-consecutive positions {positions}")
        last = runs[-1] if runs else None
        if (t0, t1) == (0, page_tokens) and last and last[3:] == (0, page_tokens) and last[1] + last[2] == page:
            runs[-1] = (last[0], last[1], last[2] + 1, 0, page_tokens)
        else:
            runs.append((len(active), page, 1, t0, t1))
        active.append(r)
    return active, runs


def _rank_slice(pages: torch.Tensor, c: PageCopy) -> torch.Tensor:
    """`[N, L, P, parts, HL, D]` view of this rank's heads in every page."""
    heads = pages.unflatten(3, (c.parts, c.global_heads))
    return heads[:, :, :, :, c.head_start : c.head_start + c.local_heads]


def _dma(pages: torch.Tensor, staging: torch.Tensor, c: PageCopy, runs, to_pages: bool) -> None:
    page_view = _rank_slice(pages, c)
    stage_view = staging.unflatten(3, (c.parts, c.local_heads))
    for row, page, count, t0, t1 in runs:
        if (t0, t1) == (0, c.page_tokens):
            pairs = [(page_view[page : page + count], stage_view[row : row + count])]
        else:
            pairs = [(page_view[page, layer, t0:t1], stage_view[row, layer, t0:t1]) for layer in range(c.layers)]
        for host_side, device_side in pairs:
            if to_pages:
                _bulk_copy(host_side, device_side)
            else:
                _bulk_copy(device_side, host_side)


def _staged(
    pool: torch.Tensor,
    pages: torch.Tensor,
    slot_table: torch.Tensor,
    page_ids: torch.Tensor,
    parts: int,
    head_start: int,
    to_pages: bool,
    backend: str,
    staging: torch.Tensor | None,
    validate: bool,
    launch: dict,
) -> None:
    c = check_page_copy(
        pool, pages, slot_table, page_ids, parts=parts, head_start=head_start, to_pages=to_pages, validate=validate
    )
    if backend not in ("triton", "torch"):
        raise ValueError(f"unknown backend {backend!r}; choose triton or torch")
    if backend == "torch" and launch:
        raise ValueError(f"launch parameters {sorted(launch)} apply to the triton backend only")
    check_launch(launch)
    if not pages.is_contiguous():
        raise ValueError("staged copy needs contiguous pages (its bulk copies span whole page rows)")
    active, runs = _page_runs(slot_table, page_ids)
    shape = (len(active), c.layers, c.page_tokens, parts * c.local_heads, c.head_dim)
    if staging is None:
        staging = torch.empty(shape, dtype=pool.dtype, device=pool.device)
    elif staging.dtype != pool.dtype or staging.device != pool.device or not staging.is_contiguous():
        raise ValueError(f"staging must be a contiguous {pool.dtype} tensor on {pool.device}")
    elif staging.shape[0] < shape[0] or tuple(staging.shape[1:]) != shape[1:]:
        raise ValueError(f"staging must be at least {list(shape)}, got {list(staging.shape)}")
    if not active:
        return
    table = slot_table[torch.tensor(active, device=slot_table.device)]
    # staging_ids: [active row] -> staging page
    staging_ids = torch.arange(len(active), device=slot_table.device)
    gather = GATHER[backend, to_pages]
    if not to_pages:
        _dma(pages, staging, c, runs, to_pages=False)
    gather(pool, staging, table, staging_ids, parts=parts, validate=False, **launch)
    if to_pages:
        _dma(pages, staging, c, runs, to_pages=True)


def pool_to_pages_staged(
    pool: torch.Tensor,
    pages: torch.Tensor,
    slot_table: torch.Tensor,
    page_ids: torch.Tensor,
    *,
    parts: int,
    head_start: int = 0,
    backend: str = "triton",
    staging: torch.Tensor | None = None,
    validate: bool = True,
    **launch: int,
) -> None:
    """Offload through a device staging buffer: gather kernel, then bulk DMAs into the pages.

    Args:
        pool, pages, slot_table, page_ids, parts, head_start, validate: as `direct.pool_to_pages`;
            `pages` must be contiguous and each page row's tokens one consecutive range of positions.
        backend: `triton` or `torch`, the gather implementation.
        staging: optional reusable buffer `[>= active rows, L, P, parts * HL, D]`, pool dtype and device
            (allocated per call otherwise).
        launch: launch parameters of the Triton gather (`programs`, `block_tokens`, ...).
    """
    _staged(pool, pages, slot_table, page_ids, parts, head_start, True, backend, staging, validate, launch)


def pages_to_pool_staged(
    pool: torch.Tensor,
    pages: torch.Tensor,
    slot_table: torch.Tensor,
    page_ids: torch.Tensor,
    *,
    parts: int,
    head_start: int = 0,
    backend: str = "triton",
    staging: torch.Tensor | None = None,
    validate: bool = True,
    **launch: int,
) -> None:
    """Load through a device staging buffer: bulk DMAs from the pages, then the scatter kernel.

    Arguments as `pool_to_pages_staged`; here the pages are read and the pool is written.
    """
    _staged(pool, pages, slot_table, page_ids, parts, head_start, False, backend, staging, validate, launch)
