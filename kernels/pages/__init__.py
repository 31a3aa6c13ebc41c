"""GQA / MLA page copies between one rank's KV pool and pages (SPEC §4).

Two transfer families, each with both directions and a PyTorch reference beside the Triton kernel:

* `direct`: one kernel moves token rows between the pool and the pages, which may be pinned host
  memory (CPU pages, zero-copy over PCIe) or device memory (PD staging pages, passed token-major as
  a transposed view).
* `staged`: the same kernel gathers into a contiguous device staging buffer, then bulk DMAs move
  whole page runs (and the reverse); the comparison path that leaves host traffic to the copy engine.

`layout.py` holds the layouts, the slot-table helper and the checks every backend runs first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from kernels.pages.direct import LAUNCH_KEYS, check_launch, default_launch, pages_to_pool, pool_to_pages
from kernels.pages.layout import (
    MAX_PAGE_TOKENS,
    MIN_PAGE_TOKENS,
    PageCopy,
    check_page_copy,
    check_page_size,
    slot_table,
)
from kernels.pages.naive import pages_to_pool_ref, pool_to_pages_ref
from kernels.pages.staged import pages_to_pool_staged, pool_to_pages_staged

BACKENDS = ("triton", "torch")
VARIANTS = ("direct", "staged")

# (variant, backend, direction) -> copy function; direction is `to_pages` (offload / PD write)
# or `to_pool` (load / PD read). Staged functions take the gather backend as an argument.
_DIRECT: dict[tuple[str, str], Callable[..., None]] = {
    ("triton", "to_pages"): pool_to_pages,
    ("triton", "to_pool"): pages_to_pool,
    ("torch", "to_pages"): pool_to_pages_ref,
    ("torch", "to_pool"): pages_to_pool_ref,
}
_STAGED = {"to_pages": pool_to_pages_staged, "to_pool": pages_to_pool_staged}


def page_copy(direction: str, backend: str = "triton", variant: str = "direct") -> Callable[..., None]:
    """The copy function for `direction` (`to_pages` | `to_pool`), `backend` and `variant`.

    Every returned function takes `(pool, pages, slot_table, page_ids, *, parts, head_start,
    validate, **launch)`; launch parameters are for the Triton backend only.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown page-copy variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if direction not in _STAGED:
        raise ValueError(f"unknown direction {direction!r}; choose to_pages or to_pool")
    if variant == "direct":
        return _DIRECT[backend, direction]
    return functools.partial(_STAGED[direction], backend=backend)


__all__ = [
    "BACKENDS",
    "LAUNCH_KEYS",
    "MAX_PAGE_TOKENS",
    "MIN_PAGE_TOKENS",
    "VARIANTS",
    "PageCopy",
    "check_launch",
    "check_page_copy",
    "check_page_size",
    "default_launch",
    "page_copy",
    "pages_to_pool",
    "pages_to_pool_ref",
    "pages_to_pool_staged",
    "pool_to_pages",
    "pool_to_pages_ref",
    "pool_to_pages_staged",
    "slot_table",
]
