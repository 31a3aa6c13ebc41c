"""Page-copy kernels (kernels/pages): Triton (interpreter on CPU) == PyTorch reference == a plain loop
oracle, byte for byte, for both directions and both variants; bad input raises and writes nothing."""

from __future__ import annotations

import pytest
import torch

from kernels.pages import page_copy, slot_table

SENTINEL = 0xAB
DIRECTIONS = ("to_pages", "to_pool")
VARIANTS = ("direct", "staged")


def random_bits(shape, dtype, gen) -> torch.Tensor:
    """Random bytes viewed as `dtype`: NaN, Inf and denormal patterns included."""
    n = torch.Size(shape).numel() * dtype.itemsize
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen).view(dtype).view(shape)


def poisoned(shape, dtype) -> torch.Tensor:
    n = torch.Size(shape).numel() * dtype.itemsize
    return torch.full((n,), SENTINEL, dtype=torch.uint8).view(dtype).view(shape)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def loop_oracle(pool, pages, table, ids, *, parts, head_start, to_pages):
    """What a copy must leave behind, one token row at a time (independent of the implementations)."""
    pool, pages = pool.clone(), pages.clone()
    local, glob = pool.shape[2] // parts, pages.shape[3] // parts
    for r, page in enumerate(ids.tolist()):
        for pos, slot in enumerate(table[r].tolist()):
            if page < 0 or slot < 0:
                continue
            for part in range(parts):
                g0 = part * glob + head_start
                if to_pages:
                    pages[page, :, pos, g0 : g0 + local] = pool[:, slot, part * local : (part + 1) * local]
                else:
                    pool[:, slot, part * local : (part + 1) * local] = pages[page, :, pos, g0 : g0 + local]
    return pool, pages


# (parts, local heads, global heads, head start, head dim): GQA whole, GQA one slice, MLA-like latent
SHAPES = [(2, 4, 4, 0, 16), (2, 1, 4, 2, 16), (1, 1, 1, 0, 24)]
LAYERS, TOKENS, N_PAGES = 2, 96, 6


def make_case(shape, dtype, page_size, seed):
    parts, local, glob, head_start, dim = shape
    gen = torch.Generator().manual_seed(seed)
    pool = random_bits((LAYERS, TOKENS + 1, parts * local, dim), dtype, gen)
    pages = random_bits((N_PAGES, LAYERS, page_size, parts * glob, dim), dtype, gen)
    slots = torch.randperm(TOKENS, generator=gen)
    # Two requests (2.5 pages and 1 page), plus a row whose page is -1 (nothing moves).
    n0 = 2 * page_size + page_size // 2
    requests = slots[:n0], slots[n0 : n0 + page_size], slots[n0 + page_size : n0 + page_size + 3]
    table = torch.cat([slot_table(r, page_size) for r in requests])
    ids = torch.randperm(N_PAGES, generator=gen)[: table.shape[0]]
    ids[-1] = -1
    return pool, pages, table, ids


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("page_size", [16, 32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=["gqa", "gqa-slice", "mla"])
def test_backends_match_oracle(shape, dtype, page_size, direction, variant):
    pool, pages, table, ids = make_case(shape, dtype, page_size, seed=page_size)
    parts, head_start = shape[0], shape[3]
    to_pages = direction == "to_pages"
    want_pool, want_pages = loop_oracle(pool, pages, table, ids, parts=parts, head_start=head_start, to_pages=to_pages)
    assert not same_bytes(want_pool, pool) or not same_bytes(want_pages, pages), "the case must move something"
    for backend in ("torch", "triton"):
        got_pool, got_pages = pool.clone(), pages.clone()
        page_copy(direction, backend, variant)(got_pool, got_pages, table, ids, parts=parts, head_start=head_start)
        assert same_bytes(got_pool, want_pool), (backend, "pool")
        assert same_bytes(got_pages, want_pages), (backend, "pages")


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize(
    "launch",
    [
        {"programs": 1, "block_tokens": 4, "block_cols": 4, "num_warps": 1},  # one program strides over all
        {"programs": 3, "block_tokens": 16, "block_cols": 64, "num_warps": 2},  # tiles wider than a row
        # one-token tiles over many programs: the most tiles, so the interpreter's slowest (5 s a direction)
        pytest.param({"programs": 64, "block_tokens": 1, "block_cols": 8}, marks=pytest.mark.slow),
    ],
)
def test_launch_parameters_do_not_change_bytes(direction, launch):
    pool, pages, table, ids = make_case(SHAPES[1], torch.bfloat16, 16, seed=7)
    to_pages = direction == "to_pages"
    want_pool, want_pages = loop_oracle(pool, pages, table, ids, parts=2, head_start=2, to_pages=to_pages)
    for variant in VARIANTS:
        got_pool, got_pages = pool.clone(), pages.clone()
        page_copy(direction, "triton", variant)(got_pool, got_pages, table, ids, parts=2, head_start=2, **launch)
        assert same_bytes(got_pool, want_pool) and same_bytes(got_pages, want_pages), variant


@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_launch_parameters_raise_before_writing(variant):
    pool, pages, table, ids = make_case(SHAPES[0], torch.bfloat16, 16, seed=8)
    before = (pool.clone(), pages.clone())
    for launch, match in [
        ({"block_cols": 48}, "power of two"),
        ({"block_tokens": 0}, "power of two"),
        ({"programs": 0}, ">= 1"),
        ({"grid": 4}, "grid"),  # a TypeError from the direct signature, a ValueError from the staged **launch
    ]:
        for direction in DIRECTIONS:
            with pytest.raises((ValueError, TypeError), match=match):
                page_copy(direction, "triton", variant)(pool, pages, table, ids, parts=2, **launch)
    assert same_bytes(pool, before[0]) and same_bytes(pages, before[1])


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_direct_copy_takes_any_holes_and_token_major_pages(direction):
    """Scattered -1 positions, head-aligned partial pages, and a token-major page passed transposed."""
    gen = torch.Generator().manual_seed(3)
    pool = random_bits((LAYERS, TOKENS + 1, 4, 16), torch.bfloat16, gen)
    token_major = random_bits((3, 16, LAYERS, 8, 16), torch.bfloat16, gen)
    table = slot_table(torch.randperm(TOKENS, generator=gen)[:40], 16, align="head")
    table[0, torch.tensor([1, 5, 6, 11])] = -1
    ids = torch.tensor([2, 0, 1])
    to_pages = direction == "to_pages"
    layer_major = token_major.transpose(1, 2)
    want_pool, want_tm = loop_oracle(pool, layer_major, table, ids, parts=2, head_start=2, to_pages=to_pages)
    for backend in ("torch", "triton"):
        got_pool, got_tm = pool.clone(), token_major.clone()
        page_copy(direction, backend)(got_pool, got_tm.transpose(1, 2), table, ids, parts=2, head_start=2)
        assert same_bytes(got_pool, want_pool) and same_bytes(got_tm.transpose(1, 2), want_tm), backend


def test_slot_table_tail_and_head():
    slots = torch.arange(100, 137)  # 37 tokens over pages of 16: 16 + 16 + 5
    tail = slot_table(slots, 16)
    assert tail.shape == (3, 16) and tail.dtype == torch.int64
    assert tail[:2].flatten().tolist() == list(range(100, 132))
    assert tail[2].tolist() == [-1] * 11 + list(range(132, 137))
    head = slot_table(slots, 16, align="head")
    assert head[2].tolist() == list(range(132, 137)) + [-1] * 11
    assert slot_table(torch.arange(32), 16).tolist() == torch.arange(32).view(2, 16).tolist()
    with pytest.raises(ValueError, match="align"):
        slot_table(slots, 16, align="middle")


def test_staged_needs_consecutive_positions():
    pool, pages, table, ids = make_case(SHAPES[0], torch.bfloat16, 16, seed=5)
    table[0, 3] = -1
    for direction in DIRECTIONS:
        before = (pool.clone(), pages.clone())
        with pytest.raises(ValueError, match="non-consecutive"):
            page_copy(direction, "triton", "staged")(pool, pages, table, ids, parts=2)
        assert same_bytes(pool, before[0]) and same_bytes(pages, before[1])


def test_staged_reuses_a_given_staging_buffer_and_checks_it():
    pool, pages, table, ids = make_case(SHAPES[0], torch.bfloat16, 16, seed=6)
    want_pool, want_pages = loop_oracle(pool, pages, table, ids, parts=2, head_start=0, to_pages=True)
    staging = torch.empty(8, LAYERS, 16, 8, 16, dtype=torch.bfloat16)
    page_copy("to_pages", "triton", "staged")(pool, pages, table, ids, parts=2, staging=staging)
    assert same_bytes(pages, want_pages) and same_bytes(pool, want_pool)
    before = pages.clone()
    with pytest.raises(ValueError, match="staging must be at least"):
        page_copy("to_pages", "triton", "staged")(pool, pages, table, ids, parts=2, staging=staging[:1])
    assert same_bytes(pages, before)


def _bad_inputs():
    """(name, pool, pages, table, ids, kwargs, match) each invalid in exactly one way."""
    pool, pages, table, ids = make_case(SHAPES[1], torch.bfloat16, 16, seed=11)
    kw = {"parts": 2, "head_start": 2}
    dup_pages = ids.clone()
    dup_pages[1] = dup_pages[0]
    dup_slots = table.clone()
    dup_slots[1, 0] = dup_slots[0, 0]
    long_pages = random_bits((N_PAGES, LAYERS, 24, 8, 16), torch.bfloat16, torch.Generator().manual_seed(0))
    return [
        ("dtype", pool.view(torch.float16), pages, table, ids, kw, "dtype mismatch"),
        ("layers", pool[:1], pages, table, ids, kw, "layer mismatch"),
        ("head dim", pool[..., :8], pages[..., :12], table, ids, kw, "head dim mismatch"),
        ("heads", pool, pages, table, ids, {"parts": 2, "head_start": 4}, "head slice"),
        ("parts", pool, pages, table, ids, {"parts": 3, "head_start": 0}, "parts"),
        ("page size", pool, long_pages, torch.full((4, 24), -1), ids, kw, "power of two"),
        ("page id high", pool, pages, table, torch.where(ids == ids[0], N_PAGES, ids), kw, "page ids must be in"),
        ("page id low", pool, pages, table, torch.where(ids == ids[0], -2, ids), kw, "page ids must be in"),
        ("padding slot", pool, pages, torch.where(table == table[0, 0], TOKENS, table), ids, kw, "padding slot"),
        ("slot low", pool, pages, torch.where(table == table[0, 0], -5, table), ids, kw, "slot ids must be in"),
        ("table dtype", pool, pages, table.float(), ids, kw, "slot_table must be"),
        ("ids shape", pool, pages, table, ids[:2], kw, "page_ids must be"),
        ("rows", torch.cat([pool, pool], dim=-1)[..., :16], pages, table, ids, kw, "contiguous"),
        ("repeat pages", pool, pages, table, dup_pages, kw, "page ids repeat"),  # races writing pages only
        ("repeat slots", pool, pages, dup_slots, ids, kw, "destination slots repeat"),  # races writing the pool only
    ]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_bad_input_raises_and_writes_nothing(direction, backend, variant):
    for name, pool, pages, table, ids, kw, match in _bad_inputs():
        if name == f"repeat {'slots' if direction == 'to_pages' else 'pages'}":
            continue  # a repeated read source is fine
        before = (pool.clone(), pages.clone())
        with pytest.raises(ValueError, match=match):
            page_copy(direction, backend, variant)(pool, pages, table, ids, **kw)
        assert same_bytes(pool, before[0]) and same_bytes(pages, before[1]), name


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError, match="backend"):
        page_copy("to_pages", "cuda")
    with pytest.raises(ValueError, match="variant"):
        page_copy("to_pages", "triton", "zero-copy")
    with pytest.raises(ValueError, match="direction"):
        page_copy("sideways")
