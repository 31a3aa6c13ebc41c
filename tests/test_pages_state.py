"""Hybrid state pages (states/state_pages.py): pack at TP p, unpack at TP d, byte-exact; the global
layout and its 16-byte alignment; placement after a request's KV pages; bad input writes nothing."""

from __future__ import annotations

import pytest
import torch

from states.cpu_pages import CPUPagePool
from states.geometry import AttnGeometry, SSMGeometry
from states.state_pages import (
    StatePageLayout,
    pack_state_pages,
    read_state_bytes,
    state_page_count,
    unpack_state_pages,
    write_state_bytes,
)

SENTINEL = 0xEE
# Global geometries: 4 key / 8 value heads split over TP 1, 2, 4; K != V so q/k and v blocks differ.
GDN = SSMGeometry("gdn", layers=2, key_heads=4, value_heads=8, head_k_dim=8, head_v_dim=4)
KDA = SSMGeometry("kda", layers=3, key_heads=4, value_heads=4, head_k_dim=4, head_v_dim=4, conv_kernel=3)
TPS = (1, 2, 4)
N = 3


def random_bits(shape, dtype, gen) -> torch.Tensor:
    n = torch.Size(shape).numel() * dtype.itemsize
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen).view(dtype).view(shape)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def global_state(g: SSMGeometry, state_dtype, act_dtype, gen):
    ssm = random_bits((N, g.layers, g.value_heads, g.head_k_dim, g.head_v_dim), state_dtype, gen)
    conv = random_bits((N, g.layers, g.conv_dim, g.conv_kernel - 1), act_dtype, gen)
    return ssm, conv


def split(g: SSMGeometry, ssm, conv, tp):
    """What rank r of TP `tp` holds, built from the SPEC's channel order (q | k | v, heads split)."""
    h, hv = g.key_heads // tp, g.value_heads // tp
    qk, v = h * g.head_k_dim, hv * g.head_v_dim
    q0, k0, v0 = 0, g.key_heads * g.head_k_dim, 2 * g.key_heads * g.head_k_dim
    ssm_r = [ssm[:, :, r * hv : (r + 1) * hv] for r in range(tp)]
    blocks = [(q0, qk), (k0, qk), (v0, v)]  # (global start, width per rank) of q, k, v
    conv_r = [torch.cat([conv[:, :, s + r * w : s + (r + 1) * w] for s, w in blocks], dim=2) for r in range(tp)]
    return ssm_r, conv_r


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("g", [GDN, KDA], ids=["gdn", "kda"])
def test_pack_at_p_unpack_at_d(g, dtypes):
    state_dtype, act_dtype = dtypes
    gen = torch.Generator().manual_seed(0)
    ssm, conv = global_state(g, state_dtype, act_dtype, gen)
    layout = StatePageLayout.of(g, state_dtype, act_dtype)
    pages = {}
    for p in TPS:
        pages[p] = pack_state_pages(*split(g, ssm, conv, p), g, p)
        assert pages[p].shape == (N, layout.nbytes) and pages[p].dtype == torch.uint8
        conv_view, ssm_view = layout.views(pages[p])
        assert same_bytes(conv_view, conv) and same_bytes(ssm_view, ssm), "global numbering"
        gap = pages[p][:, layout.conv_bytes : layout.ssm_offset]
        end = pages[p][:, layout.ssm_offset + layout.ssm_bytes :]
        assert not gap.any() and not end.any(), "fresh pages pad with zeros"
    assert all(same_bytes(pages[p], pages[1]) for p in TPS), "a page does not depend on the TP it was packed at"
    for p in TPS:
        for d in TPS:
            got_ssm, got_conv = unpack_state_pages(pages[p], g, d, state_dtype=state_dtype, act_dtype=act_dtype)
            want_ssm, want_conv = split(g, ssm, conv, d)
            assert len(got_ssm) == len(got_conv) == d
            for r in range(d):
                assert same_bytes(got_ssm[r], want_ssm[r]) and same_bytes(got_conv[r], want_conv[r]), (p, d, r)
                assert got_ssm[r].is_contiguous() and got_conv[r].is_contiguous()


def test_layout_is_16_byte_aligned_and_out_padding_untouched():
    g = SSMGeometry("gdn", layers=1, key_heads=1, value_heads=1, head_k_dim=3, head_v_dim=5)  # conv: 11 x 3 bf16
    layout = StatePageLayout.of(g, torch.float32, torch.bfloat16)
    assert (layout.conv_bytes, layout.ssm_offset, layout.ssm_bytes, layout.nbytes) == (66, 80, 60, 144)
    gen = torch.Generator().manual_seed(1)
    ssm, conv = global_state(g, torch.float32, torch.bfloat16, gen)
    out = torch.full((N, layout.nbytes), SENTINEL, dtype=torch.uint8)
    assert pack_state_pages([ssm], [conv], g, 1, out=out) is out
    assert bool((out[:, 66:80] == SENTINEL).all()) and bool((out[:, 140:] == SENTINEL).all())
    got_ssm, got_conv = unpack_state_pages(out, g, 1, state_dtype=torch.float32, act_dtype=torch.bfloat16)
    assert same_bytes(got_ssm[0], ssm) and same_bytes(got_conv[0], conv)


def test_state_page_follows_kv_pages_in_cpu_pages():
    gen = torch.Generator().manual_seed(2)
    ssm, conv = global_state(GDN, torch.float32, torch.bfloat16, gen)
    layout = StatePageLayout.of(GDN, torch.float32, torch.bfloat16)
    cpu = CPUPagePool(AttnGeometry("gqa", layers=1, kv_heads=2, head_dim=16), 8, page_size=16)  # 2 KiB pages
    cpu.pages.view(torch.uint8).fill_(SENTINEL)
    state = pack_state_pages(*split(GDN, ssm, conv, 2), GDN, 2)[1]  # request 1
    kv_pages = [5, 1]
    count = state_page_count(layout, cpu.page_bytes)
    assert count == -(-layout.nbytes // cpu.page_bytes) and count >= 2
    state_pages = [6, 0, 3, 7, 2, 4][:count]
    write_state_bytes(cpu.pages, state_pages, state)
    flat = cpu.pages.view(torch.uint8).view(8, -1)
    for page in kv_pages + [p for p in range(8) if p not in kv_pages + state_pages]:
        assert bool((flat[page] == SENTINEL).all()), page
    assert bool((flat[state_pages[-1], layout.nbytes - (count - 1) * cpu.page_bytes :] == SENTINEL).all())
    back = read_state_bytes(cpu.pages, state_pages, layout.nbytes, "cpu")
    got_ssm, got_conv = unpack_state_pages(back[None], GDN, 4, state_dtype=torch.float32, act_dtype=torch.bfloat16)
    want_ssm, want_conv = split(GDN, ssm[1:2], conv[1:2], 4)
    assert all(same_bytes(a, b) for a, b in zip(got_ssm + got_conv, want_ssm + want_conv, strict=True))


def test_bad_input_raises_and_writes_nothing():
    gen = torch.Generator().manual_seed(3)
    ssm, conv = global_state(GDN, torch.float32, torch.bfloat16, gen)
    layout = StatePageLayout.of(GDN, torch.float32, torch.bfloat16)
    ssm2, conv2 = split(GDN, ssm, conv, 2)
    out = torch.full((N, layout.nbytes), SENTINEL, dtype=torch.uint8)
    dtypes = {"state_dtype": torch.float32, "act_dtype": torch.bfloat16}
    one_page_more = torch.zeros(layout.nbytes + 1, dtype=torch.uint8)
    cases = [
        ("tp 3", lambda: pack_state_pages(ssm2, conv2, GDN, 3, out=out), "TP 3 must divide"),
        ("tp 8", lambda: pack_state_pages(ssm2, conv2, GDN, 8, out=out), "TP 8 must divide"),
        ("ranks", lambda: pack_state_pages(ssm2[:1], conv2[:1], GDN, 2, out=out), "needs 2"),
        ("shape", lambda: pack_state_pages([ssm2[0], ssm2[1][:, :1]], conv2, GDN, 2, out=out), "rank 1 ssm"),
        ("dtype", lambda: pack_state_pages(ssm2, [conv2[0], conv2[1].float()], GDN, 2, out=out), "rank 1 conv"),
        ("out", lambda: pack_state_pages(ssm2, conv2, GDN, 2, out=out[:, 16:]), "out must be"),
        ("pages", lambda: unpack_state_pages(out[:, 16:], GDN, 2, **dtypes), "state pages must be"),
        ("unpack tp", lambda: unpack_state_pages(out, GDN, 3, **dtypes), "TP 3 must divide"),
        ("page count", lambda: write_state_bytes(out, [0], one_page_more), "need"),
        ("page ids", lambda: write_state_bytes(out, [0, 0], one_page_more), "distinct"),
    ]
    for name, call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
        assert bool((out == SENTINEL).all()), name
