"""Triton backend of the replay mode (kernels/ssm/replay.py through states/replay.py), SPEC §3 and §5.

Checked against the torch replay backend (same semantics, fp32 reassociation apart), the fp64
reference of SPEC §2 (contract 3) and the triton native backend (contract 2: a fold with fp32 state
is native's state bit for bit). Runs under TRITON_INTERPRET=1 on CPU tensors (tests/conftest.py), or
on a GPU with TRITON_INTERPRET=0, where the bitwise checks are the real ones: the interpreter cannot
show fp-contraction effects.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

import states.replay as replay_state
from kernels.common.triton_cpu import interpreting
from kernels.gdn.naive import naive_recurrent_gdn
from kernels.kda.naive import naive_recurrent_kda
from kernels.ssm.configs import for_step_kernels
from kernels.ssm.replay import ReplayPool, replay_fold, replay_forward
from kernels.ssm.replay_precompute import replay_precompute_forward
from states import make_state
from states.base import StateConfig
from states.params import make_params, make_token_inputs
from states.presets import get_preset
from states.replay import ReplayState

DEVICE = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
DRAFTS, LH = 2, 4  # W = 3, so a row folds every one or two rounds
W = DRAFTS + 1
ROWS = [3, 1]  # batch row -> pool slot, out of order
IDLE = [0, 2]  # allocated, never in a round
FREE = [4]  # never allocated
CAPACITY = 5
ROUNDS = 5
# V = 16 in the tiny presets: BV 8 gives two V blocks (records of key heads and per-head scalars are
# written by one block only), BV 16 one block; the interpreter's cost grows with the programs.
WIDE = {"BV": 16, "num_warps": 1, "num_stages": 1}
NARROW = {"BV": 8, "num_warps": 1, "num_stages": 1}
FP32_RMS = 1e-6  # triton vs torch replay, outputs and folded states, fp32 state and history
# One bf16 rounding of d or of the checkpoint that lands on the other side of a tie between backends
# moves the RMS by ~2^-8 / sqrt(elements); measured 0 to 5e-8 on these shapes.
BF16_RMS = 1e-4
# A matrix fold (matrix*, inline-matrix*) into a bf16 checkpoint: the backends' fp32 folds differ by ~1e-6
# relative (products reassociated), and every element that straddles a bf16 rounding boundary lands one bf16 ulp
# (2^-8) apart, on every fold; measured 1.09e-4 on an H100 (tiny-gdn, inline-matrix-bf16x3, the final snapshot;
# results/reference/h100-2026-12-07c/inline-matrix/tests.txt). About 10x that.
MATRIX_FOLD_BF16_RMS = 1e-3
REFERENCE_RMS = 1e-5  # SPEC §5 contract 3, fp32 state: outputs with fp32 history, folded states always
# bf16 history rounds each record's k and d (2^-9 relative) before outputs use them; folds replay raw
# records, so only outputs carry it. Measured up to 2.4e-3 on these shapes.
BF16_HISTORY_REFERENCE_RMS = 5e-3


@dataclass(frozen=True)
class Case:
    preset: str
    state_dtype: torch.dtype
    history_dtype: torch.dtype
    widths: str  # fixed | dynamic (idle rows included)
    step_bv: int = 16
    materialize_at: int | None = None  # round after which both backends materialize
    variant: str = "inline"

    def __str__(self) -> str:
        name = {torch.float32: "fp32", torch.bfloat16: "bf16"}
        return (f"{self.preset}-state_{name[self.state_dtype]}-hist_{name[self.history_dtype]}-{self.widths}-"
                f"bv{self.step_bv}-{self.variant}")


# The fast suite runs one case per forward variant, both on KDA (2 value heads: half GDN's interpreter time):
# fp32 state against the fp64 reference, dynamic widths with idle rows, a materialize, untouched slots.
# The other four (GDN, bf16 state, fp32 history, two V blocks) take 8-12 s each and run under `-m slow`.
SLOW = pytest.mark.slow
CASES = [
    pytest.param(Case("tiny-gdn", torch.float32, torch.float32, "fixed"), marks=SLOW),
    pytest.param(Case("tiny-gdn", torch.bfloat16, torch.bfloat16, "dynamic", materialize_at=2), marks=SLOW),
    Case("tiny-kda", torch.float32, torch.bfloat16, "dynamic"),
    pytest.param(Case("tiny-kda", torch.bfloat16, torch.float32, "fixed", step_bv=8, materialize_at=2), marks=SLOW),
    # precompute: tensor-core projections (tf32x3 on a GPU), folds by the step config (two V blocks)
    pytest.param(Case("tiny-gdn", torch.float32, torch.float32, "dynamic", step_bv=8, variant="precompute"),
                 marks=SLOW),
    Case("tiny-kda", torch.float32, torch.bfloat16, "fixed", materialize_at=2, variant="precompute"),
    # matrix: the precompute forward and the matrix fold (fp32 history only); the torch backend folds the same way
    Case("tiny-kda", torch.float32, torch.float32, "fixed", materialize_at=2, variant="matrix"),
    pytest.param(Case("tiny-gdn", torch.bfloat16, torch.float32, "fixed", step_bv=8, variant="matrix-bf16x3"),
                 marks=SLOW),
    # inline-matrix: the inline forward with the matrix fold inside it; BV 8 folds over 16 columns with the
    # other program's 8 masked off (two V blocks), BV 16 over exactly its own
    Case("tiny-kda", torch.float32, torch.float32, "dynamic", step_bv=8, variant="inline-matrix"),
    pytest.param(Case("tiny-gdn", torch.bfloat16, torch.float32, "fixed", variant="inline-matrix-bf16x3"),
                 marks=SLOW),
]
PRECOMPUTE_RMS = 1e-5  # tf32x3 products: about fp32 accuracy, reassociated


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _bytes(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone().contiguous().view(torch.uint8) for name, t in tensors.items()}


def _assert_same_bytes(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], what: str) -> None:
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert not changed, f"{what}: bytes changed in {changed}"


def _build(preset: str, mode: str, backend: str, state_dtype: torch.dtype, history_dtype: torch.dtype,
           seed: int, step: dict = WIDE, variant: str = ""):
    geom = get_preset(preset).ssm
    params = make_params(geom, torch.bfloat16, torch.Generator().manual_seed(seed))
    cfg = StateConfig(mode, max_requests=CAPACITY, drafts=DRAFTS, state_dtype=state_dtype, act_dtype=torch.bfloat16,
                      history_len=LH, history_dtype=history_dtype, variant=variant, backend=backend, device=DEVICE)
    state = make_state(geom, params, cfg)
    if backend == "triton":
        state.set_kernel_configs(for_step_kernels(step))
    state.alloc(CAPACITY - len(FREE))
    return state


def _start(states: list, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Load the same random accepted state into ROWS of every state; poison the untouched slots."""
    geom = states[0].geom
    gen = torch.Generator().manual_seed(seed)
    n = len(ROWS)
    ssm = torch.randn(n, geom.layers, geom.value_heads, geom.head_k_dim, geom.head_v_dim, generator=gen) * 0.3
    conv = torch.randn(n, geom.layers, geom.conv_dim, geom.conv_kernel - 1, generator=gen).to(torch.bfloat16)
    for state in states:
        state.load(torch.tensor(ROWS), ssm.to(state.cfg.state_dtype), conv)
        state.fill_slot_rows(torch.tensor(IDLE + FREE), gen)
    return ssm, conv


def _plan(kind: str, rnd: int, gen: torch.Generator) -> tuple[list[int], list[int]]:
    """Widths and accepted drafts of round `rnd`: patterns all / none / random in turn."""
    n = len(ROWS)
    widths = [W] * n if kind == "fixed" else torch.randint(2, W + 1, (n,), generator=gen).tolist()
    if kind == "dynamic" and rnd % 2:
        widths[rnd // 2 % n] = 0
    pattern = ("all", "none", "random")[rnd % 3]
    accepted = []
    for w in widths:
        if w == 0:
            accepted.append(-1)
        elif pattern == "random":
            accepted.append(int(torch.randint(0, w, (1,), generator=gen)))
        else:
            accepted.append(w - 1 if pattern == "all" else 0)
    return widths, accepted


def _run_round(state, inputs: list, widths: list[int], accepted: list[int]) -> torch.Tensor:
    state.begin_round(torch.tensor(ROWS), widths)
    outs = torch.stack([state.forward(layer, inputs[layer].to(DEVICE)) for layer in range(state.geom.layers)])
    state.accept(accepted)
    return outs


class Fp64Reference:
    """SPEC §2 in fp64 per request: accepted state and conv window, advanced through each round."""

    def __init__(self, state, ssm: torch.Tensor, conv: torch.Tensor) -> None:
        self.geom, self.params = state.geom, state.params
        self.ssm, self.conv = ssm.double().clone(), conv.clone()

    def run(self, inputs: list, widths: list[int], accepted: list[int]) -> torch.Tensor:
        g, p = self.geom, self.params
        out = torch.zeros(g.layers, len(ROWS) * W, g.value_heads, g.head_v_dim, dtype=torch.float64)
        bos = 0
        for r, (w, a) in enumerate(zip(widths, accepted, strict=True)):
            for layer in range(g.layers):
                if w == 0:
                    continue
                x = inputs[layer]
                args = (x.mixed_qkv[bos:bos + w], x.a[bos:bos + w], x.b[bos:bos + w], self.conv[r, layer],
                        self.ssm[r, layer], p.conv_weight[layer].cpu(), p.A_log[layer].cpu(), p.dt_bias[layer].cpu(),
                        g.key_heads)
                if g.family == "gdn":
                    o, states, windows = naive_recurrent_gdn(*args)
                else:
                    o, states, windows = naive_recurrent_kda(*args, g.lower_bound)
                out[layer, bos:bos + w] = o
                self.ssm[r, layer], self.conv[r, layer] = states[a], windows[a]
            bos += w
        return out


@pytest.mark.parametrize("case", CASES, ids=str)
def test_triton_replay_matches_torch_replay_and_fp64(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = 11
    # the torch backend runs the variant's fold (the matrix one for `matrix*`), its forward is the same for all
    ref_state = _build(case.preset, "replay", "torch", case.state_dtype, case.history_dtype, seed,
                       variant=case.variant)
    state = _build(case.preset, "replay", "triton", case.state_dtype, case.history_dtype, seed,
                   step={**WIDE, "BV": case.step_bv}, variant=case.variant)
    geom, slots = state.geom, torch.tensor(ROWS)
    ssm0, conv0 = _start([ref_state, state], seed)
    untouched = _bytes(state.slot_rows(torch.tensor(IDLE + FREE)))
    reference = Fp64Reference(state, ssm0, conv0) if case.state_dtype == torch.float32 else None

    def poisoned(forward):
        def run(*args, **kwargs):
            T = args[2].shape[0]
            kwargs["out"] = torch.full((T, geom.value_heads, geom.head_v_dim), float("nan"), device=DEVICE)
            return forward(*args, **kwargs)
        return run

    monkeypatch.setattr(replay_state, "replay_forward", poisoned(replay_forward))
    monkeypatch.setattr(replay_state, "replay_precompute_forward", poisoned(replay_precompute_forward))
    tol = FP32_RMS if case.state_dtype == case.history_dtype == torch.float32 else BF16_RMS
    if case.variant != "inline":
        tol = max(tol, PRECOMPUTE_RMS)
    if "matrix" in case.variant and case.state_dtype == torch.bfloat16:
        tol = max(tol, MATRIX_FOLD_BF16_RMS)
    gen = torch.Generator().manual_seed(seed + 1)
    P = 2 * LH
    folds, phases = [0] * len(ROWS), [set() for _ in ROWS]
    for rnd in range(ROUNDS):
        widths, accepted = _plan(case.widths, rnd, gen)
        inputs = [make_token_inputs(geom, len(ROWS) * W, torch.bfloat16, gen) for _ in range(geom.layers)]
        for r, (c, w) in enumerate(zip(state.cursor[ROWS].tolist(), widths, strict=True)):
            folds[r] += c % P + w > LH
        want = _run_round(ref_state, inputs, widths, accepted)
        got = _run_round(state, inputs, widths, accepted)

        real = sum(widths)
        assert torch.equal(got[:, real:].cpu(), torch.zeros_like(got[:, real:].cpu())), "padding rows not zeroed"
        assert torch.isfinite(got).all()
        assert _rms(got, want) <= tol, f"round {rnd}: outputs vs torch replay RMS {_rms(got, want):.2e}"
        if reference is not None:
            ref_out = reference.run(inputs, widths, accepted)
            bound = REFERENCE_RMS if case.history_dtype == torch.float32 else BF16_HISTORY_REFERENCE_RMS
            assert _rms(got.cpu(), ref_out) <= bound, f"round {rnd}: outputs vs fp64 RMS {_rms(got.cpu(), ref_out):.2e}"
        assert torch.equal(state.cursor.cpu()[ROWS], ref_state.cursor.cpu()[ROWS])
        for r, c in enumerate(state.cursor[ROWS].tolist()):
            phases[r].add(c // P)

        if rnd == 0:  # with pending history: the snapshot folds into scratch and writes nothing of the pool
            pool = _bytes(state._pool_tensors())
            snap, conv = state.snapshot(slots)
            _assert_same_bytes(pool, _bytes(state._pool_tensors()), "snapshot")
            want_snap, want_conv = ref_state.snapshot(slots)
            assert _rms(snap.float(), want_snap.float()) <= tol
            assert torch.equal(conv, want_conv)
        if rnd == case.materialize_at:
            snap, _ = state.snapshot(slots)
            state.materialize(slots)
            ref_state.materialize(slots)
            assert torch.equal(state.ssm[:, ROWS].transpose(0, 1), snap), "materialize differs from the snapshot"
            assert torch.equal(state.cursor.cpu()[ROWS], ref_state.cursor.cpu()[ROWS])
            assert (state.cursor[ROWS] % P == 0).all()

    assert min(folds) >= 1 and sum(folds) >= 3 and all(p == {0, 1} for p in phases), (
        f"folds per row {folds}, phases {phases}: the rounds do not exercise both halves of the ring")
    snap, conv = state.snapshot(slots)
    want_snap, want_conv = ref_state.snapshot(slots)
    assert _rms(snap.float(), want_snap.float()) <= tol
    assert torch.equal(conv, want_conv)
    if reference is not None:
        assert _rms(snap.cpu(), reference.ssm) <= REFERENCE_RMS
    # records at the same ring positions (positions never written hold the zeros of the load)
    got_rows, want_rows = state.slot_rows(slots), ref_state.slot_rows(slots)
    for name in ("hist_k", "hist_d", "hist_g", "raw_k", "raw_v", "raw_beta"):
        torch.testing.assert_close(got_rows[name].float(), want_rows[name].float(), rtol=1e-2, atol=1e-6, msg=name)
    _assert_same_bytes(untouched, _bytes(state.slot_rows(torch.tensor(IDLE + FREE))), "untouched slots")


@SLOW  # 12 s in the interpreter; folds inside the forward run in every fast replay case too
def test_fold_inside_forward_equals_a_materialize_before_the_round() -> None:
    """A row that must fold is folded by each layer's forward (from the block it loads anyway, two V
    blocks here); materializing before the round (one launch over every layer) must give the same
    checkpoints, records and cursors bit for bit."""
    seed = 23
    inline = _build("tiny-kda", "replay", "triton", torch.float32, torch.float32, seed, step=NARROW)
    early = _build("tiny-kda", "replay", "triton", torch.float32, torch.float32, seed, step=NARROW)
    _start([inline, early], seed)
    geom = inline.geom
    gen = torch.Generator().manual_seed(seed + 1)
    folded = 0
    for rnd in range(ROUNDS):
        widths, accepted = _plan("fixed", rnd, gen)
        inputs = [make_token_inputs(geom, len(ROWS) * W, torch.bfloat16, gen) for _ in range(geom.layers)]
        before = inline.ssm.clone()
        counts, _ = early._count_base(torch.tensor(ROWS, device=DEVICE))
        due = [r for r, c, w in zip(ROWS, counts.tolist(), widths, strict=True) if c + w > LH]
        if due:
            early.materialize(torch.tensor(due))
        outs = [_run_round(s, inputs, widths, accepted) for s in (inline, early)]
        folded += int((inline.ssm != before).any())
        got_rows = early.slot_rows(torch.tensor(ROWS))
        for name, t in inline.slot_rows(torch.tensor(ROWS)).items():
            assert torch.equal(t, got_rows[name]), f"round {rnd}: {name} differs between fold placements"
        assert _rms(outs[1], outs[0]) <= FP32_RMS
    assert folded >= 2, "the rounds did not fold"


@pytest.mark.parametrize("preset", [pytest.param("tiny-gdn", marks=SLOW), "tiny-kda"])
def test_replay_snapshot_equals_triton_native_state_bitwise(preset: str) -> None:
    seed = 31
    # different launch configs on purpose: the step's arithmetic does not depend on them (kernels/ssm/step.py)
    native = _build(preset, "native", "triton", torch.float32, torch.float32, seed, step=WIDE)
    state = _build(preset, "replay", "triton", torch.float32, torch.float32, seed, step=NARROW)
    _start([native, state], seed)
    gen = torch.Generator().manual_seed(seed + 1)
    for rnd in range(2):  # round 0 leaves 3 records, round 1 folds them first
        widths, accepted = _plan("fixed", rnd, gen)
        inputs = [make_token_inputs(state.geom, len(ROWS) * W, torch.bfloat16, gen) for _ in range(state.geom.layers)]
        want = _run_round(native, inputs, widths, accepted)
        got = _run_round(state, inputs, widths, accepted)
        assert _rms(got, want) <= FP32_RMS
        snap, want_snap = state.snapshot(torch.tensor(ROWS))[0], native.snapshot(torch.tensor(ROWS))[0]
        assert torch.equal(snap, want_snap), f"round {rnd}: replay fold differs from native, max {(snap - want_snap).abs().max():.2e}"


@pytest.mark.cuda
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device with TRITON_INTERPRET=0 (CUDA graph capture)")
def test_round_captures_in_one_cuda_graph() -> None:
    seed = 41
    state = _build("tiny-gdn", "replay", "triton", torch.float32, torch.float32, seed)
    eager = _build("tiny-gdn", "replay", "triton", torch.float32, torch.float32, seed)
    _start([state, eager], seed)
    geom, gen = state.geom, torch.Generator().manual_seed(seed + 1)
    slots = torch.tensor(ROWS, device=DEVICE)
    widths = torch.full((len(ROWS),), W, dtype=torch.int32, device=DEVICE)
    accepted = torch.full((len(ROWS),), W - 1, dtype=torch.int32, device=DEVICE)
    static = [make_token_inputs(geom, len(ROWS) * W, torch.bfloat16, gen).to(DEVICE) for _ in range(geom.layers)]

    def round_(s):
        s.begin_round(slots, widths, validate=False)
        outs = torch.stack([s.forward(layer, static[layer]) for layer in range(geom.layers)])
        s.accept(accepted, validate=False)
        return outs

    for s in (state, eager):  # compile every kernel outside the capture
        round_(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = round_(state)
    for _ in range(3):  # folds happen inside the replays: count 3 + width 3 > Lh
        fresh = [make_token_inputs(geom, len(ROWS) * W, torch.bfloat16, gen).to(DEVICE) for _ in range(geom.layers)]
        for dst, src in zip(static, fresh):
            for name in ("mixed_qkv", "a", "b"):
                getattr(dst, name).copy_(getattr(src, name))
        graph.replay()
        want = round_(eager)
        assert torch.equal(captured, want)
        got_rows = state.slot_rows(slots)
        for name, t in eager.slot_rows(slots).items():
            assert torch.equal(got_rows[name], t), name


def test_bad_options_are_rejected_and_change_nothing() -> None:
    state = _build("tiny-gdn", "replay", "triton", torch.float32, torch.float32, 5)
    with pytest.raises(ValueError, match="unknown replay variant"):
        ReplayState(state.geom, state.params, replace(state.cfg, variant="sometimes"))
    with pytest.raises(ValueError, match="replay-forward config BV=12"):
        state.set_kernel_configs({"replay-forward": {"BV": 12, "num_warps": 1, "num_stages": 1}})
    cursor = state.cursor.clone()
    state.begin_round(torch.tensor(ROWS), [W] * len(ROWS))
    with pytest.raises(ValueError, match="during a round"):
        state.snapshot(torch.tensor(ROWS))
    with pytest.raises(ValueError, match="during a round"):
        state.materialize(torch.tensor(ROWS))
    state.round = None  # abandon the round: prepare moved no cursor (nothing was due to fold)
    assert torch.equal(state.cursor, cursor)

    pool = ReplayPool(state.ssm, state.hist_k, state.hist_d, state.hist_g, state.raw_k, state.raw_v,
                      state.raw_beta, state.cursor)
    slots = torch.tensor(ROWS, device=DEVICE)
    with pytest.raises(ValueError, match="fold destination"):
        replay_fold(pool, slots, state.cursor[slots], WIDE, dst=torch.empty(3, 1, device=DEVICE))
    g, n = state.geom, len(ROWS)
    x = make_token_inputs(g, n * W, torch.bfloat16, torch.Generator().manual_seed(0)).to(DEVICE)
    cu = torch.arange(n + 1, dtype=torch.int32, device=DEVICE) * W
    widths = torch.full((n,), W, dtype=torch.int32, device=DEVICE)
    fold_none = torch.full((n,), -1, dtype=torch.int32, device=DEVICE)
    p = state.params
    with pytest.raises(ValueError, match="qkv has shape"):
        replay_forward(pool, 0, x.mixed_qkv[:, 1:].contiguous(), x.a, x.b, p.A_log[0], p.dt_bias[0], slots, widths, cu,
                       fold_none, WIDE)
    with pytest.raises(ValueError, match="history length"):
        wide = make_token_inputs(g, n * (LH + 1), torch.bfloat16, torch.Generator().manual_seed(0)).to(DEVICE)
        replay_forward(pool, 0, wide.mixed_qkv, wide.a, wide.b, p.A_log[0], p.dt_bias[0], slots, widths, cu,
                       fold_none, WIDE)
