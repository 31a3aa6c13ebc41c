"""Triton backend of the native and compact state modes (SPEC §2, §3, §5; the fla baseline: tests/test_baselines.py).

Contracts checked here:
* triton compact == triton native, bit for bit: outputs, committed states and conv windows, every
  round (fp32 and bf16 state, fixed and dynamic widths with idle rows, several acceptance patterns);
* triton vs the torch backend: RMS ratio within `TORCH_RMS` (fp32 state: measured <= 2e-7, bound 1e-5;
  bf16 state: a rounding flip moves a state element by one bf16 ulp, measured <= 3.2e-4, bound 2e-3);
  conv windows bitwise equal (they are copies of the inputs);
* triton vs the fp64 reference of kernels/*/naive.py per round, from the pool's own accepted state:
  RMS ratio <= 1e-5 with fp32 state (SPEC §5), <= `BF16_REF_RMS` with bf16 state;
* untouched slots byte-identical, padding output rows zero, every valid output row written.

Runs in the interpreter on CPU tensors (tests/conftest.py). The interpreter cannot show fp-contraction
effects, so the bitwise contract is only really judged on a GPU: with TRITON_INTERPRET=0 on a CUDA
machine the same tests run there.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from kernels.common.triton_cpu import interpreting
from kernels.gdn.naive import naive_recurrent_gdn
from kernels.kda.naive import naive_recurrent_kda
from kernels.ssm.compact import CompactPool, compact_commit, compact_verify
from kernels.ssm.configs import NATIVE_VERIFY, default_config, for_step_kernels
from kernels.ssm.native import native_verify
from states import StateConfig, make_state
from states.params import TokenInputs, make_params, make_token_inputs
from states.presets import get_preset

DEVICE = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
# the interpreter converts loaded index scalars with __index__ on 1-element arrays, which numpy deprecates
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
SLOW = pytest.mark.slow  # more cases in the interpreter, for `pytest -m slow` (tests/conftest.py)
DRAFTS, CAP = 3, 5
W = DRAFTS + 1
TORCH_RMS = {torch.float32: 1e-5, torch.bfloat16: 2e-3}
BF16_REF_RMS = 5e-3  # bf16 state rounds every token: measured <= 2.3e-3 per round on these shapes
SMALL_STEP = {"BV": 8, "num_warps": 1, "num_stages": 1}
SMALL_BLOCKS = {**for_step_kernels(SMALL_STEP), "conv": {"BC": 32, "num_warps": 1, "num_stages": 1}}
# another layout of the state block (one V block over two warps): the bitwise contracts hold across configs
WIDE_BLOCKS = {**for_step_kernels({"BV": 16, "num_warps": 2, "num_stages": 1}),
               "conv": {"BC": 64, "num_warps": 2, "num_stages": 1}}

# (widths, accepted) per round for 3 batch rows, -1 marking an idle row: a fixed-width round, then
# dynamic ones with idle rows first, in the middle and last; all, none and some drafts accepted
ROUNDS = [([W, W, W], [W - 1, 0, 2]), ([W, 2, 0], [1, 1, -1]), ([1, 0, 3], [0, -1, 2])]


def _geom(family: str):
    return get_preset(f"tiny-{family}").ssm


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of `t`, so that equality is bitwise (NaNs and signed zeros included)."""
    return t.contiguous().view(torch.uint8)


@dataclass
class Trace:
    """What a pool did over some rounds: per round, the accepted state before it, outputs per layer,
    the inputs per layer, and the accepted state after it."""

    before: list[tuple[torch.Tensor, torch.Tensor]]
    outputs: list[list[torch.Tensor]]
    inputs: list[list[TokenInputs]]
    after: list[tuple[torch.Tensor, torch.Tensor]]


def _run(mode, backend, family, state_dtype, rounds, act_dtype=torch.bfloat16, configs=None, drafts=DRAFTS, seed=0,
         variant=""):
    geom = _geom(family)
    params = make_params(geom, act_dtype, torch.Generator().manual_seed(seed))
    cfg = StateConfig(mode=mode, max_requests=CAP, drafts=drafts, state_dtype=state_dtype, act_dtype=act_dtype,
                      variant=variant, backend=backend, device=DEVICE)
    state = make_state(geom, params, cfg)
    if configs:
        state.set_kernel_configs(configs)
    slots = torch.tensor([4, 1, 2], device=DEVICE)  # the last pool row included, scrambled order
    state.alloc(CAP)
    gen = torch.Generator().manual_seed(seed + 1)
    # a non-zero accepted state to start from
    state.load(slots, torch.randn(3, geom.layers, geom.value_heads, geom.head_k_dim, geom.head_v_dim,
                                  generator=gen).mul(0.3).to(state_dtype).to(DEVICE),
               torch.randn(3, geom.layers, geom.conv_dim, geom.conv_kernel - 1, generator=gen).to(act_dtype).to(DEVICE))
    trace = Trace([], [], [], [])
    for widths, accepted in rounds:
        # nothing runs between rounds: the state before a round is the one after the last (a deferred
        # snapshot is a commit kernel in the interpreter, so it is taken once)
        trace.before.append(trace.after[-1] if trace.after else state.snapshot(slots))
        state.begin_round(slots, widths)
        inputs = [make_token_inputs(geom, len(widths) * (drafts + 1), act_dtype, gen).to(DEVICE)
                  for _ in range(geom.layers)]
        trace.outputs.append([state.forward(layer, inputs[layer]) for layer in range(geom.layers)])
        trace.inputs.append(inputs)
        state.accept(accepted)
        trace.after.append(state.snapshot(slots))
    return trace, state


def _reference_errors(trace: Trace, state, rounds) -> tuple[float, float]:
    """RMS ratios (outputs, accepted states) of a trace against the fp64 reference, round by round."""
    geom, p = state.geom, state.params
    got_o, ref_o, got_s, ref_s = [], [], [], []
    for i, (widths, accepted) in enumerate(rounds):
        (ssm0, conv0), (ssm1, _) = trace.before[i], trace.after[i]
        cu = [0]
        for w in widths:
            cu.append(cu[-1] + w)
        for r, (w, a) in enumerate(zip(widths, accepted)):
            if w == 0:
                continue
            for layer in range(geom.layers):
                x = trace.inputs[i][layer]
                rows = slice(cu[r], cu[r] + w)
                args = (x.mixed_qkv[rows].cpu(), x.a[rows].cpu(), x.b[rows].cpu(), conv0[r, layer].cpu(),
                        ssm0[r, layer].cpu(), p.conv_weight[layer].cpu(), p.A_log[layer].cpu(), p.dt_bias[layer].cpu(),
                        geom.key_heads)
                o, states, _ = (naive_recurrent_gdn(*args) if geom.family == "gdn"
                                else naive_recurrent_kda(*args, lower_bound=geom.lower_bound))
                got_o.append(trace.outputs[i][layer][rows].cpu())
                ref_o.append(o)
                got_s.append(ssm1[r, layer].cpu().float())
                ref_s.append(states[a])
    return _rms(torch.cat(got_o), torch.cat(ref_o)), _rms(torch.stack(got_s), torch.stack(ref_s))


# The interpreter takes 12-24 CPU seconds a case (GDN's 4 value heads are twice KDA's programs). The fast suite
# runs kda-fp32-deferred: three rounds of fixed and dynamic widths with idle rows, deferred's pending records
# through snapshots and the next verify, native and compact on different launch configs, the fp64 reference
# at 1e-5. The others run under `-m slow`. Fast tests below hold the rest at one round or in decode: compact
# == native with bf16 state too (test_compact_equals_native_with_fp32_activations), triton vs torch and vs
# fp64 at 1e-5 on GDN as well (test_decode_with_fp32_activations), the commit of every layer with idle rows
# left alone (test_commit_skips_idle_rows_and_covers_every_layer).
@pytest.mark.parametrize(("family", "state_dtype", "variant"), [
    pytest.param("gdn", torch.float32, "accept", marks=SLOW),
    pytest.param("gdn", torch.bfloat16, "deferred", marks=SLOW),
    ("kda", torch.float32, "deferred"),
    pytest.param("kda", torch.bfloat16, "accept", marks=SLOW),
], ids=["gdn-fp32-accept", "gdn-bf16-deferred", "kda-fp32-deferred", "kda-bf16-accept"])
def test_compact_equals_native_and_tracks_references(family, state_dtype, variant):
    """Both commit variants: deferred's snapshots (taken between rounds, `before` / `after`) apply the
    pending records into a copy, and its next round applies them from the verify kernel's registers."""
    rounds = ROUNDS
    # native and compact run different launch configs (two V blocks on one warp against one on two warps):
    # the step's arithmetic does not depend on the config, so the bits must not either (judged on a GPU)
    native, native_state = _run("native", "triton", family, state_dtype, rounds, configs=SMALL_BLOCKS)
    compact, _ = _run("compact", "triton", family, state_dtype, rounds, configs=WIDE_BLOCKS, variant=variant)
    torch_native, _ = _run("native", "torch", family, state_dtype, rounds)

    for i in range(len(rounds)):
        for layer, (o_n, o_c) in enumerate(zip(native.outputs[i], compact.outputs[i])):
            assert torch.equal(_bytes(o_n), _bytes(o_c)), f"round {i} layer {layer}: compact outputs != native"
        for part, (a, b) in zip(("ssm", "conv"), zip(native.after[i], compact.after[i])):
            assert torch.equal(_bytes(a), _bytes(b)), f"round {i}: committed {part} of compact != native"
        o_ratio = _rms(torch.cat(native.outputs[i]), torch.cat(torch_native.outputs[i]))
        s_ratio = _rms(native.after[i][0].float(), torch_native.after[i][0].float())
        bound = TORCH_RMS[state_dtype]
        assert o_ratio <= bound and s_ratio <= bound, f"round {i}: triton vs torch RMS o={o_ratio:.2e} S={s_ratio:.2e}"
        assert torch.equal(native.after[i][1], torch_native.after[i][1]), f"round {i}: conv windows differ from torch"

    o_err, s_err = _reference_errors(native, native_state, rounds)
    bound = 1e-5 if state_dtype == torch.float32 else BF16_REF_RMS
    assert o_err <= bound and s_err <= bound, f"vs fp64 reference: outputs {o_err:.2e}, states {s_err:.2e}"


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_decode_with_fp32_activations(family):
    """Plain decode (S = 0: one snapshot updated in place) over several rounds, fp32 activations."""
    rounds = [([1, 1, 0], [0, 0, -1]), ([1, 0, 1], [0, -1, 0]), ([1, 1, 1], [0, 0, 0])]
    tri, state = _run("native", "triton", family, torch.float32, rounds, act_dtype=torch.float32, drafts=0)
    ref, _ = _run("native", "torch", family, torch.float32, rounds, act_dtype=torch.float32, drafts=0)
    for i in range(len(rounds)):
        assert _rms(torch.cat(tri.outputs[i]), torch.cat(ref.outputs[i])) <= TORCH_RMS[torch.float32]
        assert _rms(tri.after[i][0], ref.after[i][0]) <= TORCH_RMS[torch.float32]
    o_err, s_err = _reference_errors(tri, state, rounds)
    assert o_err <= 1e-5 and s_err <= 1e-5, f"vs fp64 reference: outputs {o_err:.2e}, states {s_err:.2e}"


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_compact_equals_native_with_fp32_activations(state_dtype):
    rounds = [([W, 3, W], [1, 2, 3])]
    compact, _ = _run("compact", "triton", "kda", state_dtype, rounds, act_dtype=torch.float32)
    native, _ = _run("native", "triton", "kda", state_dtype, rounds, act_dtype=torch.float32)
    assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(compact.outputs[0], native.outputs[0]))
    assert torch.equal(_bytes(compact.after[0][0]), _bytes(native.after[0][0]))


# compact-accept's commit leaving idle rows alone is also test_commit_skips_idle_rows_and_covers_every_layer's
@pytest.mark.parametrize(("mode", "variant"), [("native", ""), pytest.param("compact", "accept", marks=SLOW),
                                               ("compact", "deferred")])
def test_untouched_slots_stay_byte_identical(mode, variant):
    """Every pool byte outside the round's active rows survives two rounds, its idle row included (a
    deferred idle row keeps its pending records and state for later)."""
    geom = _geom("gdn")
    gen = torch.Generator().manual_seed(7)
    params = make_params(geom, torch.bfloat16, gen)
    cfg = StateConfig(mode=mode, max_requests=CAP, drafts=DRAFTS, state_dtype=torch.bfloat16, backend="triton",
                      device=DEVICE, variant=variant)
    state = make_state(geom, params, cfg)
    state.alloc(CAP)
    state.fill_slot_rows(torch.arange(CAP), gen)
    active = torch.tensor([4, 0], device=DEVICE)
    state.load(active, torch.randn(2, geom.layers, geom.value_heads, geom.head_k_dim, geom.head_v_dim,
                                   generator=gen).to(torch.bfloat16).to(DEVICE),
               torch.randn(2, geom.layers, geom.conv_dim, geom.conv_kernel - 1, generator=gen).to(torch.bfloat16)
               .to(DEVICE))
    slots = torch.tensor([4, 2, 0], device=DEVICE)  # slot 2 is an idle row of the batch
    keep = [1, 2, 3]
    before = {name: t.clone() for name, t in state.slot_rows(keep).items()}
    for _ in range(2):
        state.begin_round(slots, [W, 0, 2])
        for layer in range(geom.layers):
            out = state.forward(layer, make_token_inputs(geom, 3 * W, torch.bfloat16, gen).to(DEVICE))
            assert torch.isfinite(out).all()
        state.accept([2, -1, 1])
    for name, t in state.slot_rows(keep).items():
        assert torch.equal(_bytes(t), _bytes(before[name])), f"{mode}: {name} of an untouched slot changed"


def _direct_inputs(family: str, gen: torch.Generator, widths: list[int]):
    geom = _geom(family)
    n, H, HV, K, V = len(widths), geom.key_heads, geom.value_heads, geom.head_k_dim, geom.head_v_dim
    T = n * W
    qkv = torch.randn(T, geom.conv_dim, generator=gen).to(torch.bfloat16)
    a = torch.randn(T, HV, *([K] if family == "kda" else []), generator=gen).to(torch.bfloat16)
    b = torch.randn(T, HV, generator=gen).to(torch.bfloat16)
    A_log = torch.empty(HV).uniform_(-2.0, 0.5, generator=gen)
    dt_bias = torch.empty(HV * (K if family == "kda" else 1)).uniform_(-1, 1, generator=gen)
    widths_t = torch.tensor(widths, dtype=torch.int32)
    cu = torch.zeros(n + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(widths_t, 0)
    slots = torch.tensor([3, 0, 2][:n])
    tensors = [qkv, a, b, A_log, dt_bias, slots, widths_t, cu]
    return geom, [t.to(DEVICE) for t in tensors]


@pytest.mark.parametrize("mode", ["native", "compact"])
# GDN under `-m slow` (twice KDA's programs): the launchers and their padding are the same for both families
@pytest.mark.parametrize("family", [pytest.param("gdn", marks=SLOW), "kda"])
def test_outputs_into_poisoned_buffer(family, mode):
    """Padding rows come out zero and every valid row is written, whatever the buffer held."""
    gen = torch.Generator().manual_seed(3)
    widths = [2, 0, W]
    geom, (qkv, a, b, A_log, dt_bias, slots, widths_t, cu) = _direct_inputs(family, gen, widths)
    L, H, HV, K, V = geom.layers, geom.key_heads, geom.value_heads, geom.head_k_dim, geom.head_v_dim
    offset = torch.randint(0, W, (CAP,), dtype=torch.int32, generator=gen).to(DEVICE)
    native_pool = torch.randn(L, CAP, W, HV, K, V, generator=gen).to(DEVICE)
    compact_ssm = native_pool[:, :, 0].contiguous()
    config = SMALL_STEP

    def run(out: torch.Tensor) -> torch.Tensor:  # on a fresh copy of the pool: native overwrites snapshots
        if mode == "native":
            return native_verify(native_pool.clone(), 1, qkv, a, b, A_log, dt_bias, offset, slots, widths_t, cu,
                                 config, out=out)
        pool = CompactPool(compact_ssm.clone(), torch.zeros(L, CAP, H, W, K, dtype=torch.bfloat16, device=DEVICE),
                           torch.zeros(L, CAP, HV, W, V, dtype=torch.bfloat16, device=DEVICE),
                           torch.zeros(L, CAP, HV, W, *([K] if family == "kda" else []), device=DEVICE),
                           torch.zeros(L, CAP, HV, W, device=DEVICE))
        return compact_verify(pool, 1, qkv, a, b, A_log, dt_bias, slots, widths_t, cu, config, out=out)

    T, total = 3 * W, sum(widths)
    clean = run(torch.zeros(T, HV, V, device=DEVICE))
    poisoned = run(torch.full((T, HV, V), float("nan"), device=DEVICE))
    assert torch.equal(poisoned[total:], torch.zeros_like(poisoned[total:])), "padding rows were not zeroed"
    assert torch.isfinite(poisoned[:total]).all(), "a valid output row was not written"
    assert torch.equal(poisoned, clean), "the outputs depend on what the buffer held"


def test_commit_skips_idle_rows_and_covers_every_layer():
    """accepted = -1 writes nothing; the one launch commits every layer of the other rows."""
    gen = torch.Generator().manual_seed(5)
    geom = _geom("kda")
    L, H, HV, K, V = geom.layers, geom.key_heads, geom.value_heads, geom.head_k_dim, geom.head_v_dim
    pool = CompactPool(
        torch.randn(L, CAP, HV, K, V, generator=gen).to(DEVICE),
        torch.randn(L, CAP, H, W, K, generator=gen).to(torch.bfloat16).to(DEVICE),
        torch.randn(L, CAP, HV, W, V, generator=gen).to(torch.bfloat16).to(DEVICE),
        torch.rand(L, CAP, HV, W, K, generator=gen).to(DEVICE),
        torch.rand(L, CAP, HV, W, generator=gen).to(DEVICE),
    )
    before = pool.ssm.clone()
    slots = torch.tensor([1, 3], device=DEVICE)
    compact_commit(pool, slots, torch.tensor([-1, 0], dtype=torch.int32, device=DEVICE), default_config(
        NATIVE_VERIFY, head_k_dim=K, head_v_dim=V, conv_dim=geom.conv_dim))
    assert torch.equal(_bytes(pool.ssm[:, [0, 1, 2, 4]]), _bytes(before[:, [0, 1, 2, 4]])), "an idle row was written"
    for layer in range(L):
        assert not torch.equal(pool.ssm[layer, 3], before[layer, 3]), f"layer {layer} was not committed"


def test_launchers_reject_bad_inputs():
    gen = torch.Generator().manual_seed(9)
    geom, (qkv, a, b, A_log, dt_bias, slots, widths_t, cu) = _direct_inputs("gdn", gen, [1, 2, 3])
    HV, K, V = geom.value_heads, geom.head_k_dim, geom.head_v_dim
    ssm = torch.zeros(2, CAP, W, HV, K, V, device=DEVICE)
    offset = torch.zeros(CAP, dtype=torch.int32, device=DEVICE)
    config = SMALL_STEP
    with pytest.raises(ValueError, match="inputs|shape"):
        native_verify(ssm, 0, qkv, a[:, :1], b, A_log, dt_bias, offset, slots, widths_t, cu, config)
    with pytest.raises(ValueError, match="out"):
        native_verify(ssm, 0, qkv, a, b, A_log, dt_bias, offset, slots, widths_t, cu, config,
                      out=torch.zeros(3 * W, HV, V, dtype=torch.bfloat16, device=DEVICE))
    with pytest.raises(ValueError, match="layer 2"):
        native_verify(ssm, 2, qkv, a, b, A_log, dt_bias, offset, slots, widths_t, cu, config)
    with pytest.raises(ValueError, match="num_warps"):
        native_verify(ssm, 0, qkv, a, b, A_log, dt_bias, offset, slots, widths_t, cu, {**config, "num_warps": 3})
    L, H = 2, geom.key_heads
    with pytest.raises(ValueError, match="rec_v"):
        CompactPool(torch.zeros(L, CAP, HV, K, V), torch.zeros(L, CAP, H, W, K), torch.zeros(L, CAP, HV, W + 1, V),
                    torch.zeros(L, CAP, HV, W), torch.zeros(L, CAP, HV, W))
    state = make_state(geom, make_params(geom, torch.bfloat16, gen),
                       StateConfig(mode="native", max_requests=2, drafts=1, backend="triton", device=DEVICE))
    with pytest.raises(ValueError, match="unknown SSM kernel"):
        state.set_kernel_configs({"stepp": config})


@pytest.mark.cuda
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device with TRITON_INTERPRET=0 (a pool above 2^31 elements)")
def test_pool_above_int32_offsets():
    """A native pool of more than 2^31 elements: the last slot's snapshots lie past 2^31 and must be
    addressed with 64-bit offsets. The result must equal the same round on a one-slot pool."""
    geom = get_preset("qwen3.5-tp4").ssm
    HV, K, V = geom.value_heads, geom.head_k_dim, geom.head_v_dim
    per_slot = W * HV * K * V
    cap = (2**31) // per_slot + 2
    gen = torch.Generator().manual_seed(13)
    big = torch.zeros(1, cap, W, HV, K, V, dtype=torch.bfloat16, device=DEVICE)
    assert big.numel() > 2**31
    state0 = torch.randn(1, 1, W, HV, K, V, generator=gen).to(torch.bfloat16).to(DEVICE)
    big[:, cap - 1] = state0[:, 0]
    small = state0.clone()
    T = W
    qkv = torch.randn(T, geom.conv_dim, generator=gen).to(torch.bfloat16).to(DEVICE)
    a = torch.randn(T, HV, generator=gen).to(torch.bfloat16).to(DEVICE)
    b = torch.randn(T, HV, generator=gen).to(torch.bfloat16).to(DEVICE)
    A_log = torch.zeros(HV, device=DEVICE)
    dt_bias = torch.zeros(HV, device=DEVICE)
    widths = torch.tensor([W], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, W], dtype=torch.int32, device=DEVICE)
    config = default_config(NATIVE_VERIFY, head_k_dim=K, head_v_dim=V, conv_dim=geom.conv_dim)
    off_big = torch.zeros(cap, dtype=torch.int32, device=DEVICE)
    off_big[cap - 1] = 1
    off_small = torch.ones(1, dtype=torch.int32, device=DEVICE)
    o_big = native_verify(big, 0, qkv, a, b, A_log, dt_bias, off_big, torch.tensor([cap - 1], device=DEVICE), widths,
                          cu, config)
    o_small = native_verify(small, 0, qkv, a, b, A_log, dt_bias, off_small, torch.tensor([0], device=DEVICE), widths,
                            cu, config)
    assert torch.equal(o_big, o_small)
    assert torch.equal(big[:, cap - 1], small[:, 0])
    assert not big[:, : cap - 1].any(), "a write landed in another slot (32-bit wrap-around)"


@pytest.mark.cuda
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device with TRITON_INTERPRET=0 (CUDA graph capture)")
@pytest.mark.parametrize("mode", ["native", "compact"])
def test_round_captures_in_one_cuda_graph(mode):
    """begin_round(validate=False) + every layer + accept(validate=False) has no host sync: it captures
    in one CUDA graph, and replaying it equals running the rounds eagerly, bit for bit."""
    geom = _geom("kda")
    gen = torch.Generator().manual_seed(17)
    params = make_params(geom, torch.bfloat16, gen)
    ssm0 = torch.randn(3, geom.layers, geom.value_heads, geom.head_k_dim, geom.head_v_dim, generator=gen).to(DEVICE)
    conv0 = torch.randn(3, geom.layers, geom.conv_dim, geom.conv_kernel - 1, generator=gen).to(torch.bfloat16)
    conv0 = conv0.to(DEVICE)
    slots = torch.tensor([4, 1, 2], device=DEVICE)
    widths = torch.tensor([W, 2, 0], dtype=torch.int32, device=DEVICE)
    accepted = torch.tensor([2, 1, -1], dtype=torch.int32, device=DEVICE)
    states = []
    for _ in range(3):  # warm-up (compiles the kernels), captured, eager
        st = make_state(geom, params, StateConfig(mode=mode, max_requests=CAP, drafts=DRAFTS, backend="triton",
                                                  device=DEVICE))
        st.alloc(CAP)
        st.load(slots, ssm0, conv0)
        states.append(st)
    inputs = [make_token_inputs(geom, 3 * W, torch.bfloat16, gen).to(DEVICE) for _ in range(geom.layers)]

    def round_(st):
        st.begin_round(slots, widths, validate=False)
        outs = [st.forward(layer, inputs[layer]) for layer in range(geom.layers)]
        st.accept(accepted, validate=False)
        return outs

    round_(states[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = round_(states[1])
    for step in range(2):
        if step:
            for x in inputs:  # new round inputs into the captured buffers
                x.mixed_qkv.copy_(torch.randn(x.mixed_qkv.shape, generator=gen).to(torch.bfloat16))
        graph.replay()
        eager = round_(states[2])
        torch.cuda.synchronize()
        for o_graph, o_eager in zip(captured, eager):
            assert torch.equal(o_graph, o_eager)
        assert all(torch.equal(a, b) for a, b in zip(states[1].snapshot(slots), states[2].snapshot(slots)))
