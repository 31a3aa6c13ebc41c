"""Triton conv kernel (kernels/ssm/conv.py) against the torch conv, and the kernel config spaces.

Runs in the interpreter on CPU tensors (tests/conftest.py); with TRITON_INTERPRET=0 on a CUDA machine
the same tests run on the GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.common.triton_cpu import interpreting
from kernels.conv.naive import causal_conv
from kernels.ssm.configs import CONV, KERNELS, NATIVE_VERIFY, check_config, config_space, default_config, default_configs
from kernels.ssm.conv import NEAR_ULPS, causal_conv_update, silu_rounded

DEVICE = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
KERNEL, C, S, CAP = 4, 96, 3, 6  # C = 96 is not a power of two: the last channel block is partial


def _poison(shape, dtype, gen) -> torch.Tensor:
    """Random bits (NaNs included) of `dtype`."""
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen).view(dtype).view(shape).to(DEVICE)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in representable values (same-sign finite values)."""
    return int((_bits(a).long() - _bits(b).long()).abs().max()) if a.numel() else 0


@pytest.mark.parametrize("act_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("block", [32, 128])
def test_conv_matches_torch_and_advances_windows(act_dtype, block):
    gen = torch.Generator().manual_seed(11 + block)
    KW = KERNEL - 1 + S
    W = S + 1
    conv = torch.randn(CAP, C, KW, generator=gen).to(act_dtype).to(DEVICE)
    conv_offset = torch.randint(0, S + 1, (CAP,), dtype=torch.int32, generator=gen).to(DEVICE)
    weight = (torch.randn(C, KERNEL, generator=gen) / 2).to(act_dtype).to(DEVICE)
    # batch rows in scrambled pool order, the last slot included; widths cover full, partial and idle rows
    slots = torch.tensor([5, 0, 3, 2], device=DEVICE)
    widths = torch.tensor([W, 2, 0, 1], dtype=torch.int32, device=DEVICE)
    n = slots.shape[0]
    cu = torch.zeros(n + 1, dtype=torch.int32, device=DEVICE)
    cu[1:] = torch.cumsum(widths, 0)
    x = torch.randn(n * W, C, generator=gen).to(act_dtype).to(DEVICE)
    # signed zeros must keep their sign through the window and the outputs: a channel of -0.0 inputs (its
    # SiLU is -0.0) and -0.0 values in the window where other inputs are not zero
    x[:, 7] = -0.0
    conv[:, 7] = -0.0
    conv[:, 9, 1] = -0.0
    y = _poison((n * W, C), act_dtype, gen)
    y_poison = y.clone()
    before = conv.clone()

    causal_conv_update(x, conv, conv_offset, weight, slots, widths, cu, {"BC": block, "num_warps": 1, "num_stages": 1},
                       out=y)

    max_ulp = 0
    for r in range(n):
        s, w, bos = int(slots[r]), int(widths[r]), int(cu[r])
        off = int(conv_offset[s])
        window = before[s, :, off : off + KERNEL - 1]
        xr = x[bos : bos + W]  # a full padded row block: positions past w are junk the reference ignores
        y_ref, full = causal_conv(window[None], xr[None], weight)
        if w == 0:
            assert torch.equal(_bits(conv[s]), _bits(before[s])), f"idle row {r} changed its conv window"
            continue
        got = y[bos : bos + w]
        if act_dtype == torch.bfloat16:
            bad = (_bits(got) != _bits(y_ref[0, :w])).nonzero().tolist()
            assert not bad, f"row {r}: bf16 conv outputs differ from torch at (token, channel) {bad[:6]}"
        max_ulp = max(max_ulp, _ulps(got, y_ref[0, :w]))
        stored = KERNEL - 2 + w
        assert torch.equal(_bits(conv[s, :, :stored]), _bits(full[0, :, 1 : 1 + stored])), f"row {r}: next window wrong"
        assert torch.equal(_bits(conv[s, :, stored:]), _bits(before[s, :, stored:])), f"row {r}: later columns moved"
        # accepting a drafts puts the window at columns [a, a + kernel - 1): the inputs ending at token a
        for a in range(w):
            assert torch.equal(conv[s, :, a : a + KERNEL - 1], full[0, :, a + 1 : a + KERNEL])
    # fp32: tl.exp (numpy in the interpreter, ex2.approx on a GPU) is not torch's exp; SiLU keeps it to a few ulps
    assert max_ulp <= (0 if act_dtype == torch.bfloat16 else 4), f"conv outputs {max_ulp} ulps from torch"

    untouched = [s for s in range(CAP) if s not in slots.tolist()]
    assert torch.equal(_bits(conv[untouched]), _bits(before[untouched])), "slots outside the batch changed"
    total = int(cu[-1])
    assert torch.equal(_bits(y[total:]), _bits(y_poison[total:])), "padding rows of the output were written"


@triton.jit
def _silu_probe(x, y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(y + o, silu_rounded(tl.load(x + o, mask=m, other=0.0), tl.bfloat16), mask=m)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + torch.exp(-x))


def _near_bf16_midpoints(gen: torch.Generator, count: int) -> torch.Tensor:
    """fp32 inputs whose fp64 SiLU lies a few fp32 ulps from a bf16 rounding midpoint, on both sides: where
    the fp32 SiLU's error could change a bf16 rounding, so the kernel must take its fp64 path there."""
    x0 = (torch.rand(count, generator=gen, dtype=torch.float64) * 2 - 1) * 16
    bits = _silu(x0).float().view(torch.int32)
    target = ((bits & ~0xFFFF) | 0x8000) + torch.randint(-24, 25, (count,), generator=gen, dtype=torch.int32)
    y = target.view(torch.float32).double()
    x = x0.clone()
    for _ in range(30):  # Newton on silu(x) = y, from a point a bf16 ulp away
        s = torch.sigmoid(x)
        x = x - (_silu(x) - y) / (s * (1 + x * (1 - s)))
    steep = (torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x)))).abs() > 0.05  # away from silu's minimum
    return x[steep & (x.abs() <= 16)].float()


def test_silu_rounded_has_the_fp64_bits_where_the_fp32_silu_could_round_either_way():
    """The conv's SiLU against torch's `F.silu(x.double()).to(bf16)`, bit for bit: at random values, at the
    edges of its fast path (0, tiny, |x| > 16) and at inputs built to land within a few fp32 ulps of a bf16
    midpoint, where only the fp64 path gives torch's bits."""
    gen = torch.Generator().manual_seed(5)
    near = _near_bf16_midpoints(gen, 40000)
    low = (F.silu(near.double()).float().view(torch.int32) & 0xFFFF) - 0x8000
    assert int((low.abs() <= NEAR_ULPS.value).sum()) > 0.5 * near.numel(), "the probe inputs are not near bf16 midpoints"
    edges = torch.tensor([0.0, -0.0, 1e-35, -1e-35, 1e-30, 15.99, -15.99, 16.01, -16.01, 40.0, -40.0, 90.0, -90.0,
                          -104.0, 200.0, -200.0])
    x = torch.cat([near, torch.randn(20000, generator=gen) * 4, edges]).to(DEVICE)
    y = _poison((x.numel(),), torch.bfloat16, gen)
    _silu_probe[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    want = F.silu(x.double()).to(torch.bfloat16)
    bad = (_bits(y) != _bits(want)).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} SiLU values differ from torch's, e.g. x={x[bad[:4]].tolist()}"


ON_GPU = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device with TRITON_INTERPRET=0")


@pytest.mark.cuda
@ON_GPU
def test_silu_rounded_on_the_gpu():
    """The same on a GPU (`pytest -m cuda`), where the fast path runs libdevice's expf, whose error bound
    NEAR_ULPS rests on (the interpreter has numpy's exp)."""
    test_silu_rounded_has_the_fp64_bits_where_the_fp32_silu_could_round_either_way()


@pytest.mark.cuda
@ON_GPU
@pytest.mark.parametrize("block", [32, 256])
def test_conv_on_the_gpu(block):
    """The conv against torch's on a GPU, bf16 bit for bit."""
    test_conv_matches_torch_and_advances_windows(torch.bfloat16, block)


def test_conv_rejects_bad_shapes():
    conv = torch.zeros(CAP, C, KERNEL - 1 + S, dtype=torch.bfloat16, device=DEVICE)
    offset = torch.zeros(CAP, dtype=torch.int32, device=DEVICE)
    weight = torch.zeros(C, KERNEL, dtype=torch.bfloat16, device=DEVICE)
    slots = torch.tensor([0, 1], device=DEVICE)
    widths = torch.ones(2, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)
    cfg = default_config(CONV, head_k_dim=16, head_v_dim=16, conv_dim=C)
    with pytest.raises(ValueError, match="do not make a round"):  # 2 rows x W = 5 > S + 1
        causal_conv_update(torch.zeros(10, C, dtype=torch.bfloat16, device=DEVICE), conv, offset, weight, slots, widths,
                           cu, cfg)
    with pytest.raises(ValueError, match="do not fit"):
        causal_conv_update(torch.zeros(8, C + 1, dtype=torch.bfloat16, device=DEVICE), conv, offset, weight, slots,
                           widths, cu, cfg)
    with pytest.raises(ValueError, match="dtype"):
        causal_conv_update(torch.zeros(8, C, dtype=torch.float32, device=DEVICE), conv, offset, weight, slots, widths,
                           cu, cfg)
    with pytest.raises(ValueError, match="BC"):
        causal_conv_update(torch.zeros(8, C, dtype=torch.bfloat16, device=DEVICE), conv, offset, weight, slots, widths,
                           cu, {"BC": 48, "num_warps": 1, "num_stages": 1})


@pytest.mark.parametrize("dims", [(16, 16, 128), (128, 128, 6144), (100, 60, 1000)])
def test_config_spaces_hold_their_defaults(dims):
    K, V, conv_dim = dims
    for kernel in KERNELS:
        space = config_space(kernel, head_k_dim=K, head_v_dim=V, conv_dim=conv_dim)
        assert space and all(check_config(kernel, c) == c for c in space)
        assert default_config(kernel, head_k_dim=K, head_v_dim=V, conv_dim=conv_dim) in space
    step = config_space(NATIVE_VERIFY, head_k_dim=K, head_v_dim=V, conv_dim=conv_dim)
    assert max(c["BV"] for c in step) <= max(8, 1 << (V - 1).bit_length()), "BV must be capped by V"
    assert set(default_configs(KERNELS, head_k_dim=K, head_v_dim=V, conv_dim=conv_dim)) == set(KERNELS)


def test_model_geometry_defaults_are_the_measured_best_configs():
    """At Qwen3-Next shape each kernel's untuned default is its fastest config on the H200
    (results/reference/h200-2026-12-03/kernels-fma): native and replay forward BV 64 on 2 warps,
    compact verify BV 32 on one warp, commit and deferred verify BV 16 on one warp."""
    dims = {"head_k_dim": 128, "head_v_dim": 128, "conv_dim": 8192}
    assert default_config(NATIVE_VERIFY, **dims) == {"BV": 64, "num_warps": 2, "num_stages": 1}
    assert default_config("compact-verify", **dims) == {"BV": 32, "num_warps": 1, "num_stages": 1}
    assert default_config("compact-commit", **dims) == {"BV": 16, "num_warps": 1, "num_stages": 1}


def test_check_config_rejects_unknown_kernels_and_values():
    with pytest.raises(ValueError, match="unknown SSM kernel 'step'"):
        check_config("step", {"BV": 8, "num_warps": 1, "num_stages": 1})
    with pytest.raises(ValueError, match="must set exactly"):
        check_config(NATIVE_VERIFY, {"BV": 8, "num_warps": 1})
    with pytest.raises(ValueError, match="BV=12"):
        check_config(NATIVE_VERIFY, {"BV": 12, "num_warps": 1, "num_stages": 1})
