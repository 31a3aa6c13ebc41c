"""Page copies on a CUDA device: the direct kernels reading/writing pinned host pages zero-copy, the
staged path's 2-D DMAs, PD pages in device memory, and addresses past 2^31 elements.
Skipped, with the reason, where no CUDA device exists."""

from __future__ import annotations

import pytest
import torch

from states.presets import get_preset
from kernels.pages import page_copy, slot_table
from states.cpu_pages import CPUPagePool
from states.geometry import AttnGeometry
from states.kv_pool import KVPool, tp_group
from states.pd_pages import PDPagePool

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SENTINEL = 0x5A
TPS = (1, 2, 4, 8)
TOKENS = 4096
GEOMETRIES = {
    "llama-3-8b": get_preset("llama-3-8b").attn,  # GQA 8 KV heads x 128, 32 layers
    "qwen3-next": get_preset("qwen3-next").attn,  # GQA 2 KV heads x 256: ranks replicate at TP 4, 8
    "deepseek-v3": AttnGeometry("mla", layers=4, kv_heads=1, head_dim=576, kv_lora_rank=512, rope_dim=64),
}


def random_bits(shape, dtype=torch.bfloat16, device="cuda") -> torch.Tensor:
    n = torch.Size(shape).numel() * dtype.itemsize
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device=device).view(dtype).view(shape)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def groups(geometry, tp, kv):
    src = tp_group(geometry, TOKENS, tp, device="cuda")
    for p in src:
        p.kv.copy_(kv[:, :, p.global_heads().cuda()] if p.shard.writes else random_bits(p.kv.shape))
    dst = tp_group(geometry, TOKENS, tp, device="cuda")
    for p in dst:
        p.kv.view(torch.uint8).fill_(SENTINEL)
    return src, dst


def check_loaded(pools, kv, src_slots, dst_slots):
    for p in pools:
        assert same_bytes(p.kv[:, dst_slots], kv[:, src_slots][:, :, p.global_heads().cuda()])
        rest = torch.ones(TOKENS + 1, dtype=torch.bool, device="cuda")
        rest[dst_slots] = False
        assert bool((p.kv[:, rest].contiguous().view(torch.uint8) == SENTINEL).all())


@pytest.mark.parametrize("backend, variant", [("triton", "direct"), ("triton", "staged"), ("torch", "direct")])
@pytest.mark.parametrize("family", GEOMETRIES)
def test_cpu_pages_pinned_every_tp_pair(family, backend, variant):
    geometry = GEOMETRIES[family]
    parts = 2 if geometry.family == "gqa" else 1
    kv = random_bits((geometry.layers, TOKENS + 1, parts * geometry.kv_heads, geometry.head_dim))
    perm = torch.randperm(TOKENS, device="cuda")
    src_slots = [perm[:700], perm[700:956]]  # 2.7 pages (partial tail) and 1 page of 256
    ids = [torch.tensor([7, 2, 4]), torch.tensor([5])]
    cpu = CPUPagePool(geometry, 8, page_size=256)
    assert cpu.pages.is_pinned()
    for p in TPS:
        cpu.pages.view(torch.uint8).fill_(SENTINEL)
        cpu.ready.zero_()
        src, _ = groups(geometry, p, kv)
        cpu.offload(src, src_slots, ids, backend=backend, variant=variant)
        torch.cuda.synchronize()
        for page, rows in ((7, perm[:256]), (2, perm[256:512]), (5, perm[700:956])):
            assert same_bytes(cpu.pages[page], kv[:, rows].cpu())
        assert same_bytes(cpu.pages[4, :, 68:], kv[:, perm[512:700]].cpu()), "tail of the partial page"
        untouched = cpu.pages[[0, 1, 3, 6]], cpu.pages[4, :, :68]
        assert all(bool((t.contiguous().view(torch.uint8) == SENTINEL).all()) for t in untouched)
        for d in TPS:
            _, dst = groups(geometry, d, kv)
            dst_slots = [s.flip(0) for s in src_slots]
            cpu.load(dst, dst_slots, ids, backend=backend, variant=variant)
            check_loaded(dst, kv, torch.cat(src_slots), torch.cat(dst_slots))


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("family", GEOMETRIES)
def test_pd_pages_every_tp_pair(family, backend):
    geometry = GEOMETRIES[family]
    parts = 2 if geometry.family == "gqa" else 1
    kv = random_bits((geometry.layers, TOKENS + 1, parts * geometry.kv_heads, geometry.head_dim))
    slots = torch.randperm(TOKENS, device="cuda")[:1500]  # a full page of 1024 and 476 tokens
    pd = PDPagePool(geometry, 3, page_tokens=1024, device="cuda")
    for p in TPS:
        pd.pages.view(torch.uint8).fill_(SENTINEL)
        src, _ = groups(geometry, p, kv)
        pd.write(src, slots, torch.tensor([2, 0]), backend=backend)
        assert same_bytes(pd.pages[2], kv[:, slots[:1024]].transpose(0, 1))
        assert same_bytes(pd.pages[0, :476], kv[:, slots[1024:]].transpose(0, 1))
        assert bool((pd.pages[0, 476:].contiguous().view(torch.uint8) == SENTINEL).all())
        assert bool((pd.pages[1].view(torch.uint8) == SENTINEL).all())
        for d in TPS:
            _, dst = groups(geometry, d, kv)
            pd.read(dst, slots.flip(0), torch.tensor([2, 0]), backend=backend)
            check_loaded(dst, kv, slots, slots.flip(0))


@pytest.mark.parametrize("direction", ["to_pages", "to_pool"])
def test_triton_matches_torch_on_pinned_pages(direction):
    pool = random_bits((4, TOKENS + 1, 4, 128))
    pages = random_bits((6, 4, 64, 16, 128), device="cpu").pin_memory()
    table = torch.cat([slot_table(s, 64) for s in torch.randperm(TOKENS, device="cuda")[:300].split([200, 100])])
    ids = torch.tensor([3, 0, 5, -1, 1, 2], device="cuda")
    outs = []
    for backend in ("torch", "triton"):
        for variant in ("direct", "staged"):
            got_pool, got_pages = pool.clone(), pages.clone().pin_memory()
            page_copy(direction, backend, variant)(got_pool, got_pages, table, ids, parts=2, head_start=4)
            torch.cuda.synchronize()
            outs.append((got_pool.cpu(), got_pages))
    assert all(same_bytes(a, outs[0][0]) and same_bytes(b, outs[0][1]) for a, b in outs[1:])
    assert not (same_bytes(outs[0][0], pool.cpu()) and same_bytes(outs[0][1], pages))


def test_offsets_past_int32():
    """A pool row and a page past 2^31 elements: 32-bit address arithmetic would land elsewhere."""
    need = 2 * (2**31 + 2**26) * 2 + 2**30
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free device memory")
    geometry = AttnGeometry("mla", layers=1, kv_heads=1, head_dim=576, kv_lora_rank=512, rope_dim=64)
    tokens = (2**31 + 2**26) // 576  # the last slots start past element 2^31
    pool = KVPool.create(geometry, tokens, device="cuda")
    pd = PDPagePool(geometry, (2**31 + 2**26) // (576 * 1024), page_tokens=1024, device="cuda")
    last_page = pd.pages.shape[0] - 1
    assert last_page * 1024 * 576 > 2**31 and (tokens - 1) * 576 > 2**31
    slots = torch.arange(tokens - 1000, tokens, device="cuda")
    pool.kv[:, slots] = random_bits((1, 1000, 1, 576))
    pd.pages[last_page].view(torch.uint8).fill_(SENTINEL)
    for backend in ("triton", "torch"):
        pd.write([pool], slots, torch.tensor([last_page]), backend=backend)
        assert same_bytes(pd.pages[last_page, :1000, 0], pool.kv[0, slots])
        kept = pool.kv[:, slots].clone()
        pd.read([pool], slots.flip(0), torch.tensor([last_page]), backend=backend)
        assert same_bytes(pool.kv[:, slots.flip(0)], kept)
