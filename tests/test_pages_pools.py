"""KV pools, CPU pages and PD pages across TP degrees (states/kv_pool.py, cpu_pages.py, pd_pages.py).

Every TP pair p -> d in {1, 2, 4, 8} for GQA (8 KV heads, and 2 KV heads so that ranks replicate) and
MLA: byte-exact pages and pools with random bit patterns, sentinel-poisoned destinations, and
untouched pages / slots / padding / other ranks' heads checked byte for byte afterwards. Replica ranks
hold different bytes than their writer, so a second write of a replicated slice would show.
"""

from __future__ import annotations

import pytest
import torch

from states.presets import get_preset
from kernels.pages import slot_table
from states.cpu_pages import CPUPagePool
from states.geometry import AttnGeometry
from states.kv_pool import KVPool, head_shard, tp_group
from states.pd_pages import PDPagePool

SENTINEL = 0xCD
TPS = (1, 2, 4, 8)
TOKENS = 64
GQA8 = get_preset("tiny-gdn").attn  # 8 KV heads, head dim 16
GQA2 = AttnGeometry("gqa", layers=2, kv_heads=2, head_dim=16)
MLA = get_preset("tiny-kda").attn  # latent 32 + 16
GEOMETRIES = {"gqa8": GQA8, "gqa2": GQA2, "mla": MLA}


def random_bits(shape, dtype, gen) -> torch.Tensor:
    n = torch.Size(shape).numel() * dtype.itemsize
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen).view(dtype).view(shape)


def poison(t: torch.Tensor) -> torch.Tensor:
    t.view(torch.uint8).fill_(SENTINEL)
    return t


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def global_kv(geometry: AttnGeometry, gen, dtype=torch.bfloat16) -> torch.Tensor:
    """The KV every rank's pool is a head slice of: `[L, TOKENS + 1, parts * H, D]`."""
    parts = 2 if geometry.family == "gqa" else 1
    return random_bits((geometry.layers, TOKENS + 1, parts * geometry.kv_heads, geometry.head_dim), dtype, gen)


def source_group(geometry, tp, kv, gen) -> list[KVPool]:
    """Pools of TP `tp` holding `kv`'s slices; replica ranks hold other random bytes."""
    pools = tp_group(geometry, TOKENS, tp, dtype=kv.dtype)
    for p in pools:
        p.kv.copy_(kv[:, :, p.global_heads()] if p.shard.writes else random_bits(p.kv.shape, kv.dtype, gen))
    return pools


def poisoned_group(geometry, tp, dtype=torch.bfloat16) -> list[KVPool]:
    pools = tp_group(geometry, TOKENS, tp, dtype=dtype)
    for p in pools:
        poison(p.kv)
    return pools


def check_loaded(pools, kv, src_slots, dst_slots):
    """Each rank holds its heads of `kv[:, src_slots]` at `dst_slots`; every other slot is still poison."""
    moved = kv[:, src_slots]
    rest = torch.ones(TOKENS + 1, dtype=torch.bool)
    rest[dst_slots] = False
    for p in pools:
        assert same_bytes(p.kv[:, dst_slots], moved[:, :, p.global_heads()]), p.shard
        assert bool((p.kv[:, rest].contiguous().view(torch.uint8) == SENTINEL).all()), p.shard


def expected_pages(before, kv, table, ids, token_major=False):
    out = before.clone()
    for r, page in enumerate(ids.tolist()):
        for pos, slot in enumerate(table[r].tolist()):
            if page >= 0 and slot >= 0:
                if token_major:
                    out[page, pos] = kv[:, slot]
                else:
                    out[page, :, pos] = kv[:, slot]
    return out


def test_head_shards():
    shards = [head_shard(GQA8, 4, r) for r in range(4)]
    assert [(s.local_heads, s.head_start, s.replicas) for s in shards] == [(2, 0, 1), (2, 2, 1), (2, 4, 1), (2, 6, 1)]
    shards = [head_shard(GQA2, 8, r) for r in range(8)]  # 4 replicas of each head, the first one writes
    assert [s.head_start for s in shards] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [s.writes for s in shards] == [True, False, False, False] * 2
    assert [head_shard(MLA, 4, r).writes for r in range(4)] == [True, False, False, False]
    pool = KVPool.create(GQA8, 10, tp=4, rank=3)
    assert pool.kv.shape == (2, 11, 4, 16) and pool.global_heads().tolist() == [6, 7, 14, 15]
    assert KVPool.create(MLA, 10, tp=8, rank=5).kv.shape == (2, 11, 1, 48)
    for bad_tp in (3, 12):
        with pytest.raises(ValueError, match="neither divides"):
            KVPool.create(GQA8, 10, tp=bad_tp, rank=0)
    with pytest.raises(ValueError, match="rank"):
        KVPool.create(GQA8, 10, tp=2, rank=2)
    with pytest.raises(ValueError, match="dtype"):
        KVPool.create(GQA8, 10, dtype=torch.int8)


def _requests(gen, page_size):
    """Two requests (1.5 pages and 1 page) over distinct random slots."""
    slots = torch.randperm(TOKENS, generator=gen)
    n0 = page_size + page_size // 2
    return [slots[:n0], slots[n0 : n0 + page_size]]


def _matrix(backends):
    """(family, *backend) cases of a TP matrix. The torch backend runs every family in the fast suite; the
    Triton interpreter takes seconds per family, so the fast suite runs it on GQA with 2 KV heads (ranks
    replicate heads there, the case with the most to get wrong) and the other families under `-m slow`.
    The Triton kernels themselves are compared with a loop oracle at every shape in test_pages_kernels.py."""
    return [pytest.param(family, *backend, id="-".join((family, *backend)),
                         marks=[pytest.mark.slow] if backend[0] == "triton" and family != "gqa2" else [])
            for family in GEOMETRIES for backend in backends]


# The staged path differs from direct only on the host side (its device gather is the direct kernel,
# compared with Triton in test_pages_kernels.py), so the TP matrix runs it on the torch backend.
@pytest.mark.parametrize("family, backend, variant", _matrix([("torch", "direct"), ("torch", "staged"),
                                                              ("triton", "direct")]))
def test_cpu_pages_every_tp_pair(family, backend, variant):
    geometry, gen = GEOMETRIES[family], torch.Generator().manual_seed(1)
    kv = global_kv(geometry, gen)
    src_slots = _requests(gen, 16)
    ids = [torch.tensor([4, 0]), torch.tensor([5])]
    reference = None
    for p in TPS:
        cpu = CPUPagePool(geometry, 7, page_size=16)
        poison(cpu.pages)
        before = cpu.pages.clone()
        written = cpu.offload(source_group(geometry, p, kv, gen), src_slots, ids, backend=backend, variant=variant)
        assert sorted(written.tolist()) == [0, 4, 5]
        assert cpu.ready.tolist() == [True, False, False, False, True, True, False]
        want = before
        for slots, pages in zip(src_slots, ids, strict=True):
            want = expected_pages(want, kv, slot_table(slots, 16), pages)
        assert same_bytes(cpu.pages, want), f"pages written at TP {p}"
        if reference is not None:
            assert same_bytes(cpu.pages, reference), "pages must not depend on the TP degree"
        reference = cpu.pages.clone()
        for d in TPS:
            dst = poisoned_group(geometry, d)
            dst_slots = [s.flip(0) for s in _requests(torch.Generator().manual_seed(d), 16)]
            cpu.load(dst, dst_slots, ids, backend=backend, variant=variant)
            check_loaded(dst, kv, torch.cat(src_slots), torch.cat(dst_slots))


@pytest.mark.parametrize("family, backend", _matrix([("torch",), ("triton",)]))
def test_pd_pages_every_tp_pair(family, backend):
    geometry, gen = GEOMETRIES[family], torch.Generator().manual_seed(2)
    kv = global_kv(geometry, gen)
    src_slots = _requests(gen, 16)  # 24 tokens (a full page, then 8 at the head of the next) and 16
    ids = [torch.tensor([3, 0]), torch.tensor([1])]
    reference = None
    for p in TPS:
        pd = PDPagePool(geometry, 5, page_tokens=16)
        poison(pd.pages)
        want = pd.pages.clone()
        pd.write(source_group(geometry, p, kv, gen), src_slots, ids, backend=backend)
        for slots, pages in zip(src_slots, ids, strict=True):
            want = expected_pages(want, kv, slot_table(slots, 16, align="head"), pages, token_major=True)
        assert same_bytes(pd.pages, want), f"pages written at TP {p}"
        if reference is not None:
            assert same_bytes(pd.pages, reference), "pages must not depend on the TP degree"
        reference = pd.pages.clone()
        for d in TPS:
            dst = poisoned_group(geometry, d)
            dst_slots = [s.flip(0) for s in _requests(torch.Generator().manual_seed(d), 16)]
            pd.read(dst, dst_slots, ids, backend=backend)
            check_loaded(dst, kv, torch.cat(src_slots), torch.cat(dst_slots))


@pytest.mark.parametrize("variant", ["direct", "staged"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_offload_skips_ready_and_missing_pages(backend, variant):
    gen = torch.Generator().manual_seed(3)
    kv_a, kv_b = global_kv(GQA8, gen), global_kv(GQA8, gen)
    cpu = CPUPagePool(GQA8, 6, page_size=16)
    poison(cpu.pages)
    slots = torch.randperm(TOKENS, generator=gen)[:40]
    group_a, group_b = source_group(GQA8, 2, kv_a, gen), source_group(GQA8, 2, kv_b, gen)
    assert cpu.offload(group_a, slots[:32], torch.tensor([1, 3]), backend=backend, variant=variant).tolist() == [1, 3]
    after_a = cpu.pages.clone()
    # Page 3 is ready (dedup: kept as it is), chunk 2 has no page (-1), page 5 is new.
    written = cpu.offload(group_b, slots, torch.tensor([3, -1, 5]), backend=backend, variant=variant)
    assert written.tolist() == [5]
    want = expected_pages(after_a, kv_b, slot_table(slots, 16)[2:], torch.tensor([5]))
    assert same_bytes(cpu.pages, want)
    assert cpu.ready.tolist() == [False, True, False, True, False, True]
    # Load with a -1 chunk: those slots stay poisoned; the partial last page comes from its tail.
    dst = poisoned_group(GQA8, 4)
    dst_slots = torch.randperm(TOKENS, generator=gen)[:40]
    cpu.load(dst, dst_slots, torch.tensor([1, -1, 5]), backend=backend, variant=variant)
    moved = torch.cat([dst_slots[:16], dst_slots[32:]])
    check_loaded(dst, torch.cat([kv_a[:, slots[:16]], kv_b[:, slots[32:]]], dim=1), torch.arange(24), moved)
    cpu.release(torch.tensor([3]))
    assert cpu.offload(group_b, slots[:16], torch.tensor([3]), backend=backend, variant=variant).tolist() == [3]


@pytest.mark.parametrize("page_size", [64, 256])
def test_other_page_sizes(page_size):
    gen = torch.Generator().manual_seed(page_size)
    kv = global_kv(GQA8, gen)
    cpu = CPUPagePool(GQA8, 2, page_size=page_size)
    pd = PDPagePool(GQA8, 2, page_tokens=page_size)
    slots = torch.randperm(TOKENS, generator=gen)[:50]
    for backend in ("torch", "triton"):
        poison(cpu.pages)
        poison(pd.pages)
        cpu.ready.zero_()
        cpu.offload(source_group(GQA8, 2, kv, gen), slots, torch.tensor([1]), backend=backend)
        pd.write(source_group(GQA8, 4, kv, gen), slots, torch.tensor([0]), backend=backend)
        dst_cpu, dst_pd = poisoned_group(GQA8, 8), poisoned_group(GQA8, 1)
        cpu.load(dst_cpu, slots.flip(0), torch.tensor([1]), backend=backend)
        pd.read(dst_pd, slots, torch.tensor([0]), backend=backend)
        check_loaded(dst_cpu, kv, slots, slots.flip(0))
        check_loaded(dst_pd, kv, slots, slots)
        tail = cpu.pages[1, :, : page_size - 50]
        assert bool((tail.contiguous().view(torch.uint8) == SENTINEL).all()), "the head of a partial page"


def test_fp16_and_fp32_pools():
    for dtype in (torch.float16, torch.float32):
        gen = torch.Generator().manual_seed(4)
        kv = global_kv(MLA, gen, dtype)
        cpu = CPUPagePool(MLA, 3, page_size=16, dtype=dtype)
        slots = torch.randperm(TOKENS, generator=gen)[:20]
        cpu.offload(source_group(MLA, 2, kv, gen), slots, torch.tensor([2, 0]))
        dst = poisoned_group(MLA, 4, dtype)
        cpu.load(dst, slots, torch.tensor([2, 0]))
        check_loaded(dst, kv, slots, slots)


def test_traffic_counts_moved_rows():
    gen = torch.Generator().manual_seed(5)
    slots = torch.randperm(TOKENS, generator=gen)[:40]
    ids = torch.tensor([0, 1, 2])
    # GQA 8 heads at TP 2: each rank moves 2 layers x 2 parts x 4 heads x 16 x 2 bytes = 512 bytes a token.
    group = tp_group(GQA8, TOKENS, 2)
    cpu = CPUPagePool(GQA8, 3, page_size=16)
    t = cpu.traffic(group, slots, ids, direction="to_pages")
    assert (t.tokens, t.ranks, t.host_bytes, t.device_bytes) == (40, 2, 40 * 2 * 512, 40 * 2 * 512)
    assert cpu.traffic(group, slots, ids, direction="to_pages", variant="staged").device_bytes == 3 * 40 * 2 * 512
    cpu.ready[0] = True  # a ready page is skipped by offload, still read by load
    assert cpu.traffic(group, slots, ids, direction="to_pages").tokens == 24
    assert cpu.traffic(group, slots, ids, direction="to_pool").tokens == 40
    # MLA at TP 4: one writer, four readers, 2 layers x 48 x 2 bytes = 192 bytes a token.
    mla = tp_group(MLA, TOKENS, 4)
    pd = PDPagePool(MLA, 2, page_tokens=32)
    w = pd.traffic(mla, slots, torch.tensor([1, -1]), direction="to_pages")
    r = pd.traffic(mla, slots, torch.tensor([1, 0]), direction="to_pool")
    assert (w.tokens, w.ranks, w.host_bytes, w.device_bytes) == (32, 1, 0, 2 * 32 * 192)
    assert (r.tokens, r.ranks, r.device_bytes) == (40, 4, 2 * 40 * 4 * 192)


def _snapshot(cpu, pd, *groups):
    return [cpu.pages.clone(), cpu.ready.clone(), pd.pages.clone()] + [p.kv.clone() for g in groups for p in g]


def test_bad_input_raises_and_writes_nothing():
    gen = torch.Generator().manual_seed(6)
    kv = global_kv(GQA8, gen)
    cpu = CPUPagePool(GQA8, 4, page_size=16)
    pd = PDPagePool(GQA8, 2, page_tokens=32)
    poison(cpu.pages)
    poison(pd.pages)
    src, dst = source_group(GQA8, 2, kv, gen), poisoned_group(GQA8, 4)
    slots = torch.randperm(TOKENS, generator=gen)[:40]
    cpu.offload(src, slots[:16], torch.tensor([3]))
    three, two = torch.tensor([0, 1, 2]), torch.tensor([0, 1])  # pages for 40 tokens: CPU (16), PD (32)
    bad_pools = {
        "geometry": (tp_group(GQA2, TOKENS, 2), "geometry"),
        "layers": (tp_group(AttnGeometry("gqa", 3, 8, 16), TOKENS, 2), "geometry"),
        "head dim": (tp_group(AttnGeometry("gqa", 2, 8, 32), TOKENS, 2), "geometry"),
        "dtype": (tp_group(GQA8, TOKENS, 2, dtype=torch.float16), "dtype mismatch"),
        "group": (src[1:], "ranks 0..1"),
    }
    padding = torch.cat([slots[:-1], torch.tensor([TOKENS])])
    high = torch.cat([slots[:-1], torch.tensor([TOKENS + 9])])
    cases = [(name, pools, slots, three, two, match) for name, (pools, match) in bad_pools.items()]
    cases += [
        ("padding slot", src, padding, three, two, "padding slot"),
        ("slot high", src, high, three, two, "slot ids"),
        ("page high", src, slots, torch.tensor([0, 1, 4]), torch.tensor([0, 2]), "page ids must be in"),
        ("page low", src, slots, torch.tensor([0, -2, 1]), torch.tensor([-2, 1]), "page ids must be in"),
        ("page count", src, slots, two, two[:1], "need"),
        ("repeat", src, slots, torch.tensor([0, 1, 0]), torch.tensor([1, 1]), "repeat"),
        ("slot dtype", src, slots.float(), three, two, "int32/int64"),
        ("page id dtype", src, slots, three.float(), two.float(), "page ids"),
    ]
    for name, pools, s, cpu_ids, pd_ids, match in cases:
        before = _snapshot(cpu, pd, src, dst, pools)
        with pytest.raises(ValueError, match=match):
            cpu.offload(pools, s, cpu_ids)
        with pytest.raises(ValueError, match=match):
            pd.write(pools, s, pd_ids)
        assert all(same_bytes(a, b) for a, b in zip(before, _snapshot(cpu, pd, src, dst, pools), strict=True)), name
    before = _snapshot(cpu, pd, src, dst)
    with pytest.raises(ValueError, match="not ready"):
        cpu.load(dst, slots[:16], torch.tensor([2]))
    with pytest.raises(ValueError, match="page ids must be in"):
        pd.read(dst, slots, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="destination slots repeat"):
        cpu.load(dst, torch.cat([slots[:15], slots[:1]]), torch.tensor([3]))
    with pytest.raises(ValueError, match="triton backend only"):
        cpu.load(dst, slots[:16], torch.tensor([3]), backend="torch", programs=4)
    assert all(same_bytes(a, b) for a, b in zip(before, _snapshot(cpu, pd, src, dst), strict=True))
    for bad in (8, 24, 2048):
        with pytest.raises(ValueError, match="power of two"):
            CPUPagePool(GQA8, 2, page_size=bad)
        with pytest.raises(ValueError, match="power of two"):
            PDPagePool(GQA8, 2, page_tokens=bad)


def test_host_memory_is_labelled():
    cpu = CPUPagePool(MLA, 1, page_size=16)
    assert cpu.pinned == torch.cuda.is_available() == cpu.pages.is_pinned()
    assert cpu.memory == ("pinned" if cpu.pinned else "pageable (no CUDA device: plain CPU memory)")
