"""The three SSM state modes on the torch backend: SPEC §3 behaviour, §5 contracts, validation, memory."""

from __future__ import annotations

import pytest
import torch

from kernels.gdn.naive import naive_recurrent_gdn
from kernels.kda.naive import naive_recurrent_kda
from states import MODES, StateConfig, make_state
from states.params import make_params, make_token_inputs
from states.presets import get_preset

MiB = 2**20


def _rollout(preset: str, state_dtype: torch.dtype, drafts: int, rounds: int, seed: int, history_len: int = 4):
    """Run native, compact and replay side by side on random widths/acceptances; return per-round data."""
    geom = get_preset(preset).ssm
    gen = torch.Generator().manual_seed(seed)
    params = make_params(geom, torch.bfloat16, gen)
    n = 3
    modes = ["native", "replay"] + (["compact"] if drafts else [])
    states = {
        m: make_state(geom, params, StateConfig(mode=m, max_requests=n + 1, drafts=drafts, state_dtype=state_dtype,
                                                history_len=history_len))
        for m in modes
    }
    slots = {m: st.alloc(n) for m, st in states.items()}
    ssm0 = (torch.randn(n, geom.layers, geom.value_heads, geom.head_k_dim, geom.head_v_dim, generator=gen) * 0.2).to(state_dtype)
    conv0 = torch.randn(n, geom.layers, geom.conv_dim, geom.conv_kernel - 1, generator=gen).to(torch.bfloat16)
    for m, st in states.items():
        st.load(slots[m], ssm0, conv0)
    history = []
    for _ in range(rounds):
        widths = torch.randint(0, drafts + 2, (n,), generator=gen)
        accepted = torch.tensor([int(torch.randint(0, int(w), (1,), generator=gen)) if w else -1 for w in widths])
        inputs = [make_token_inputs(geom, n * (drafts + 1), torch.bfloat16, gen) for _ in range(geom.layers)]
        outs = {}
        for m, st in states.items():
            st.begin_round(slots[m], widths)
            outs[m] = torch.stack([st.forward(layer, inputs[layer]) for layer in range(geom.layers)])
            st.accept(accepted)
        snaps = {m: st.snapshot(slots[m]) for m, st in states.items()}
        history.append((widths, accepted, inputs, outs, snaps))
    return geom, params, ssm0, conv0, history


@pytest.mark.parametrize("preset", ["tiny-gdn", "tiny-kda"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_modes_agree_round_by_round(preset, state_dtype):
    _, _, _, _, history = _rollout(preset, state_dtype, drafts=3, rounds=10, seed=1)
    for widths, _, _, outs, snaps in history:
        assert torch.equal(outs["compact"], outs["native"])  # contract 1, outputs
        assert torch.equal(snaps["compact"][0], snaps["native"][0])  # contract 1, state
        assert torch.equal(snaps["compact"][1], snaps["native"][1])
        assert torch.equal(snaps["replay"][1], snaps["native"][1])
        if state_dtype == torch.float32:
            assert torch.equal(snaps["replay"][0], snaps["native"][0])  # contract 2, state
        rms = (outs["replay"] - outs["native"]).norm() / outs["native"].norm()
        assert rms < (2e-3 if state_dtype == torch.float32 else 2 * 2.0**-8)
        assert int(widths.sum()) * outs["native"].shape[-1] > 0


@pytest.mark.parametrize("preset", ["tiny-gdn", "tiny-kda"])
def test_native_matches_fp64_reference_along_the_accepted_path(preset):
    geom, params, ssm0, conv0, history = _rollout(preset, torch.float32, drafts=2, rounds=6, seed=2)
    fn = naive_recurrent_gdn if geom.family == "gdn" else naive_recurrent_kda
    extra = {} if geom.family == "gdn" else {"lower_bound": geom.lower_bound}
    S, win = ssm0.double().clone(), conv0.clone()
    for widths, accepted, inputs, outs, snaps in history:
        starts = torch.cumsum(widths, 0) - widths
        for r in range(widths.shape[0]):
            w = int(widths[r])
            if not w:
                continue
            rows = slice(int(starts[r]), int(starts[r]) + w)
            for layer in range(geom.layers):
                x = inputs[layer]
                o, states, wins = fn(x.mixed_qkv[rows], x.a[rows], x.b[rows], win[r, layer], S[r, layer],
                                     params.conv_weight[layer], params.A_log[layer], params.dt_bias[layer],
                                     geom.key_heads, **extra)
                got = outs["native"][layer, rows]
                assert ((got.double() - o).norm() / o.norm()) < 2e-3
                S[r, layer], win[r, layer] = states[int(accepted[r])], wins[int(accepted[r])]
        ssm, conv = snaps["native"]
        assert ((ssm.double() - S).norm() / S.norm()) < 2e-3
        assert torch.equal(conv, win)


def test_snapshot_does_not_mutate_and_load_restores():
    geom = get_preset("tiny-kda").ssm
    gen = torch.Generator().manual_seed(3)
    params = make_params(geom, torch.bfloat16, gen)
    st = make_state(geom, params, StateConfig(mode="replay", max_requests=2, drafts=1, history_len=4))
    slots = st.alloc(2)
    st.fill_slot_rows(slots, gen)
    st.cursor[slots] = 0  # valid bookkeeping over random-bit records: the snapshot folds nothing yet
    st.conv_offset[slots] = 0
    before = {k: v.clone() for k, v in st._pool_tensors().items()}
    st.snapshot(slots)
    for k, v in st._pool_tensors().items():
        assert torch.equal(v.view(torch.uint8), before[k].view(torch.uint8)), k
    for _ in range(3):  # pending history, then a snapshot must still not touch anything
        st.begin_round(slots, [2, 1])
        for layer in range(geom.layers):
            st.forward(layer, make_token_inputs(geom, 4, torch.bfloat16, gen))
        st.accept([1, 0])
    before = {k: v.clone() for k, v in st._pool_tensors().items()}
    ssm, conv = st.snapshot(slots)
    for k, v in st._pool_tensors().items():
        assert torch.equal(v.view(torch.uint8), before[k].view(torch.uint8)), k
    other = make_state(geom, params, StateConfig(mode="native", max_requests=3, drafts=1))
    s2 = other.alloc(3)[1:]
    other.load(s2, ssm, conv)
    ssm2, conv2 = other.snapshot(s2)
    assert torch.equal(ssm2.view(torch.uint8), ssm.view(torch.uint8))  # byte-exact, NaN patterns included
    assert torch.equal(conv2.view(torch.uint8), conv.view(torch.uint8))


def test_bytes_per_request_formula_equals_allocation():
    for preset in ("tiny-gdn", "tiny-kda"):
        geom = get_preset(preset).ssm
        params = make_params(geom, torch.bfloat16, torch.Generator().manual_seed(0))
        for mode in MODES:
            for drafts, sd, hist in [(1, torch.float32, torch.float32), (3, torch.bfloat16, torch.bfloat16)]:
                cfg = StateConfig(mode=mode, max_requests=5, drafts=drafts, state_dtype=sd, history_dtype=hist)
                st = make_state(geom, params, cfg)
                assert st.footprint_bytes() == 5 * MODES[mode].bytes_per_request(geom, cfg)["total"]


def test_published_reference_points_qwen35_tp4():
    """Qwen3.5 at TP4, bf16 state: 18 MiB per checkpoint, native MTP3 72 MiB, replay Lh 8 ~ 24.07 MiB."""
    geom = get_preset("qwen3.5-tp4").ssm
    bf16 = torch.bfloat16
    native = MODES["native"].bytes_per_request(geom, StateConfig("native", 1, drafts=3, state_dtype=bf16))
    replay = MODES["replay"].bytes_per_request(
        geom, StateConfig("replay", 1, drafts=3, state_dtype=bf16, history_len=8, history_dtype=bf16))
    assert native["ssm"] == 72 * MiB
    assert replay["ssm"] == 18 * MiB
    assert abs(replay["ssm"] + replay["history"] - 24.07 * MiB) < 0.01 * MiB


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (dict(mode="compact", drafts=0), "needs drafts"),
        (dict(mode="replay", history_len=6), "power of two"),
        (dict(mode="replay", history_len=2), "power of two"),
        (dict(mode="replay", drafts=7, history_len=4), "shorter than the verify width"),
        (dict(mode="native", state_dtype=torch.float16), "state dtype"),
        (dict(mode="native", device="cuda"), "CUDA is not available"),
        (dict(mode="native", backend="cuda-magic"), "unknown backend"),
    ],
)
def test_config_validation(cfg, message):
    geom = get_preset("tiny-gdn").ssm
    params = make_params(geom, torch.bfloat16, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=message):
        make_state(geom, params, StateConfig(max_requests=2, **cfg))


def test_round_validation_changes_nothing():
    geom = get_preset("tiny-gdn").ssm
    gen = torch.Generator().manual_seed(4)
    params = make_params(geom, torch.bfloat16, gen)
    st = make_state(geom, params, StateConfig(mode="native", max_requests=4, drafts=2))
    slots = st.alloc(2)
    st.fill_slot_rows(slots, gen)
    st.conv_offset[slots] = torch.tensor([1, 2], dtype=torch.int32)
    before = {k: v.clone() for k, v in st._pool_tensors().items()}
    with pytest.raises(ValueError, match="outside \\[0, 3\\]"):
        st.begin_round(slots, [4, 1])
    with pytest.raises(ValueError, match="not allocated"):
        st.begin_round(torch.tensor([0, 3]), [1, 1])
    with pytest.raises(ValueError, match="out of range"):
        st.snapshot(torch.tensor([9]))
    with pytest.raises(ValueError, match="do not match the geometry"):
        st.load(slots, torch.zeros(2, 1, 1, 1, 1), torch.zeros(2, 1, 1, 1, dtype=torch.bfloat16))
    st.begin_round(slots, [3, 0])
    with pytest.raises(ValueError, match="has shape"):
        st.forward(0, make_token_inputs(geom, 5, torch.bfloat16, gen))
    with pytest.raises(ValueError, match="accept before every layer ran"):
        st.accept([0, -1])
    for layer in range(geom.layers):
        st.forward(layer, make_token_inputs(geom, 6, torch.bfloat16, gen))
    with pytest.raises(ValueError, match="accepted\\[0\\] = 3 outside \\[0, 2\\]"):
        st.accept([3, -1])
    with pytest.raises(ValueError, match="accepted\\[1\\] = 0 outside \\[-1, -1\\]"):
        st.accept([0, 0])
    # the rejected accepts changed no bookkeeping (offsets move only on a valid accept)
    assert torch.equal(st.conv_offset, before["conv_offset"])
    st.accept([2, -1])
    assert st.conv_offset[slots].tolist() == [2, 2]


@pytest.mark.parametrize("preset", ["tiny-gdn", "tiny-kda"])
def test_token_prep_bits_do_not_depend_on_the_batch_size(preset):
    """Gates, beta and conv outputs of a request are the same bits in a batch of 7 as alone in a batch
    of 3 (odd sizes put elements in the vector loops' scalar tails): a restored request must replay bit
    for bit in a smaller batch."""
    from kernels.conv.naive import causal_conv
    from kernels.gdn.naive import gdn_gate
    from kernels.kda.naive import kda_gate

    geom = get_preset(preset).ssm
    gen = torch.Generator().manual_seed(5)
    params = make_params(geom, torch.bfloat16, gen)
    x = make_token_inputs(geom, 7 * 3, torch.bfloat16, gen)
    a = x.a.reshape(7, 3, *x.a.shape[1:])
    gate = (lambda t: gdn_gate(t, params.A_log[0], params.dt_bias[0])) if geom.family == "gdn" else (
        lambda t: kda_gate(t, params.A_log[0], params.dt_bias[0], geom.lower_bound))
    assert torch.equal(gate(a)[:3], gate(a[:3]))
    b = x.b.reshape(7, 3, -1)
    assert torch.equal(torch.sigmoid(b.double()).float()[:3], torch.sigmoid(b[:3].double()).float())
    window = torch.randn(7, geom.conv_dim, geom.conv_kernel - 1, generator=gen).to(torch.bfloat16)
    mixed = x.mixed_qkv.reshape(7, 3, -1)
    full, _ = causal_conv(window, mixed, params.conv_weight[0])
    part, _ = causal_conv(window[:3], mixed[:3], params.conv_weight[0])
    assert torch.equal(full[:3], part)
