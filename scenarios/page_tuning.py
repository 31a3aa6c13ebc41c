"""Autotune sweeps of the KV page kernels (`harness autotune pages`, SPEC §8), and the config lookup the
page scenarios make, so a tuned config is what their rows run.

The page kernel is one Triton kernel (`kernels.pages.direct.page_copy_kernel`) used six ways, each
tuned and looked up under its own name, because where the pages live changes what is fastest:

    pages-offload  pool -> pinned host pages (CPU offload, direct variant: the kernel writes over PCIe)
    pages-load     pinned host pages -> pool (CPU load, direct variant)
    pages-gather   pool -> contiguous device staging (the device half of a staged offload)
    pages-scatter  device staging -> pool (the device half of a staged load)
    pd-write       pool -> token-major PD pages in device memory (prefill export)
    pd-read        PD pages -> pool (decode import)

Static key: the kernel's geometry as one rank sees it (family, layers, local and global heads per
part, head dim), the page size and the dtype. Batch: pages per transfer, tuned per power-of-two
bucket. Candidates: programs (persistent grid size), block_tokens x block_cols tiles and num_warps,
pruned to what `check_launch` accepts and to tiles that fit the page. A job's inputs are disposable
(a random pool, random pages, shuffled slots and page ids of its own); `run` is one transfer and
`check` compares a candidate's destination byte for byte with the PyTorch reference's.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.autotune import config_space
from kernels.pages import (
    PageCopy,
    check_launch,
    default_launch,
    pages_to_pool,
    pages_to_pool_ref,
    pool_to_pages,
    pool_to_pages_ref,
    slot_table,
)
from scenarios.base import RunContext, TuneJob
from scenarios.page_options import (
    KV_DTYPE,
    PageCase,
    check_tp,
    page_bytes,
    parse_page_sizes,
    poison,
    random_bits,
)
from scenarios.options import check_device, given, parse_int_list, split_list
from states.geometry import AttnGeometry
from states.kv_pool import head_shard, kv_parts
from states.presets import get_attn_preset

# kernel -> (direction, where the pages live: host | staging | pd)
KERNELS: dict[str, tuple[str, str]] = {
    "pages-offload": ("to_pages", "host"),
    "pages-load": ("to_pool", "host"),
    "pages-gather": ("to_pages", "staging"),
    "pages-scatter": ("to_pool", "staging"),
    "pd-write": ("to_pages", "pd"),
    "pd-read": ("to_pool", "pd"),
}
_COPY = {("to_pages", "triton"): pool_to_pages, ("to_pool", "triton"): pages_to_pool,
         ("to_pages", "torch"): pool_to_pages_ref, ("to_pool", "torch"): pages_to_pool_ref}


def kernel_name(direction: str, variant: str, pd: bool) -> str:
    """The kernel whose config a transfer uses (the staged variant's launch parameters are its gather's)."""
    if pd:
        return "pd-write" if direction == "to_pages" else "pd-read"
    if variant == "staged":
        return "pages-gather" if direction == "to_pages" else "pages-scatter"
    return "pages-offload" if direction == "to_pages" else "pages-load"


def page_geometry(kernel: str, g: AttnGeometry, tp: int, page_size: int) -> PageCopy:
    """What one rank's copy looks like to the kernel (rank 0; every rank of a TP group has the same
    shape). A staging buffer holds only the rank's heads, so its global heads are the local ones."""
    shard = head_shard(g, tp, 0)
    global_heads = shard.local_heads if KERNELS[kernel][1] == "staging" else g.kv_heads
    return PageCopy(g.layers, page_size, kv_parts(g), shard.local_heads, global_heads, g.head_dim, 0)


def static_key(copy: PageCopy, family: str, dtype: torch.dtype = KV_DTYPE) -> dict[str, Any]:
    return {"family": family, "layers": copy.layers, "local_heads": copy.local_heads,
            "global_heads": copy.global_heads, "head_dim": copy.head_dim, "page_size": copy.page_tokens,
            "dtype": dtype}


def launch_config(ctx: RunContext, case: PageCase, kernel: str, tp: int, pages: int) -> tuple[dict[str, int], str]:
    """`(launch parameters, config source)` for a triton transfer of `pages` pages: the cached config of
    the nearest pages bucket, else `default_launch` (source `default`)."""
    g = case.attn
    copy = page_geometry(kernel, g, tp, case.page_size)
    default = default_launch(copy, torch.device(ctx.device))
    return ctx.kernel_config(kernel, static_key(copy, g.family), pages, default)


def candidates(copy: PageCopy, device: torch.device) -> list[dict[str, int]]:
    """Launch configs to sweep: programs x tiles (block_tokens x block_cols) x num_warps.

    Column blocks are powers of two up to the largest one that divides the rank's row (wider blocks
    leave masked lanes in every tile); tiles of 2K to 8K elements keep a program busy without
    spilling. On CPU (the Triton interpreter: correctness, not speed) two configs: 1 and 4 programs.
    """
    widest = min(copy.chunk & -copy.chunk, 1024)
    if device.type != "cuda":
        tokens = min(copy.page_tokens, max(1, 512 // widest))
        return [{"programs": n, "block_tokens": tokens, "block_cols": widest, "num_warps": 4} for n in (1, 4)]
    sms = torch.cuda.get_device_properties(device).multi_processor_count

    def keep(c: dict[str, int]) -> bool:
        try:
            check_launch(c)
        except ValueError:
            return False
        return 2048 <= c["block_tokens"] * c["block_cols"] <= 8192

    try:
        return config_space(programs=[2 * sms, 4 * sms, 8 * sms],
                            block_tokens=[1 << i for i in range(copy.page_tokens.bit_length())],
                            block_cols=sorted({min(widest, c) for c in (64, 256, 1024)}), num_warps=[4, 8],
                            keep=keep)
    except ValueError:  # no tile in range fits the page: the default alone
        return [default_launch(copy, device)]


def _job(kernel: str, g: AttnGeometry, tp: int, page_size: int, batch: int, device: torch.device,
         seed: int) -> TuneJob:
    direction, where = KERNELS[kernel]
    copy = page_geometry(kernel, g, tp, page_size)
    to_pages = direction == "to_pages"

    def build(bucket: int) -> dict[str, Any]:
        """A disposable rank pool and `bucket` full pages between shuffled slots and shuffled pages."""
        gen = torch.Generator(device=device).manual_seed(seed)
        tokens = bucket * page_size
        pool = random_bits((copy.layers, tokens + 1, copy.parts * copy.local_heads, copy.head_dim), KV_DTYPE,
                           gen, str(device))
        heads = copy.parts * copy.global_heads
        if where == "pd":
            token_major = random_bits((bucket, page_size, copy.layers, heads, copy.head_dim), KV_DTYPE, gen,
                                      str(device))
            pages = token_major.transpose(1, 2)
        else:
            on_host = where == "host"
            pages = torch.empty((bucket, copy.layers, page_size, heads, copy.head_dim), dtype=KV_DTYPE,
                                device="cpu" if on_host else device, pin_memory=on_host and device.type == "cuda")
            pages.view(torch.uint8).copy_(random_bits(pages.shape, KV_DTYPE, gen, str(device)).view(torch.uint8))
        perm = torch.randperm(tokens, generator=gen, device=device)
        table = slot_table(perm, page_size)
        ids = torch.randperm(bucket, generator=gen, device=device)
        return {"pool": pool, "pages": pages, "table": table, "ids": ids}

    def transfer(fn, config: dict[str, int], x: dict[str, Any]) -> None:
        fn(x["pool"], x["pages"], x["table"], x["ids"], parts=copy.parts, validate=False, **config)

    def run(config: dict[str, int], x: dict[str, Any]) -> None:
        transfer(_COPY[direction, "triton"], config, x)

    def check(config: dict[str, int], x: dict[str, Any]) -> tuple[bool, str]:
        """The candidate and the torch reference each write a poisoned destination; same bytes?"""
        dst = x["pages"] if to_pages else x["pool"]
        got = []
        for fn, cfg in ((_COPY[direction, "triton"], config), (_COPY[direction, "torch"], {})):
            poison(dst)
            transfer(fn, cfg, x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the kernel writes pinned host pages asynchronously
            got.append(dst.contiguous().view(torch.uint8).clone())
        differ = int((got[0] != got[1]).sum())
        return differ == 0, f"{differ} destination bytes differ from the torch reference" if differ else "byte-exact"

    return TuneJob(kernel=kernel, static_key=static_key(copy, g.family), batch=batch,
                   candidates=candidates(copy, device), default=default_launch(copy, device),
                   build=build, run=run, check=check)


def tuning_jobs(options: dict[str, Any]) -> list[TuneJob]:
    """One sweep per kernel x page size x pages bucket for `options["preset"]` (default tiny-gdn's GQA
    layers) at TP `options["tp"]` (default 1, rank 0's shape).

    Options: `page_size` (comma list, default 256), `batch` (pages per transfer, comma list; default
    what `harness run cpu-page-restore` times at each page size: about 64 MiB per transfer on CUDA),
    `device`, `kernel` (comma list of `KERNELS`, default all).
    """
    device = given(options.get("device"), "cpu")
    check_device(device, ["triton"])
    preset = get_attn_preset(given(options.get("preset"), "tiny-gdn"))
    g = preset.attn
    tps = parse_int_list(given(options.get("tp"), "1"), "--tp")
    if len(tps) != 1:
        raise ValueError(f"--tp takes one TP degree per autotune run, got {tps}")
    tp = tps[0]
    check_tp(preset.name, tp)
    kernels = split_list(given(options.get("kernel"), ",".join(KERNELS)), "--kernel")
    for k in kernels:
        if k not in KERNELS:
            raise ValueError(f"unknown page kernel {k!r}; choose from {', '.join(KERNELS)}")
    sizes = parse_page_sizes(given(options.get("page_size"), "256"), "--page-size")
    explicit = parse_int_list(options["batch"], "--batch") if options.get("batch") is not None else None
    if explicit and min(explicit) < 1:
        raise ValueError(f"--batch (pages per transfer) must be >= 1, got {explicit}")
    jobs = []
    for size in sizes:
        case = PageCase("cpu-page-restore", preset.name, ("triton",), ("direct",), size, tp, tp, None, {})
        for batch in explicit or [case.timed_pages(page_bytes(g, size), device)]:
            jobs += [_job(k, g, tp, size, batch, torch.device(device), seed=size * 7919 + batch) for k in kernels]
    return jobs
