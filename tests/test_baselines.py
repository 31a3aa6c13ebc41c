"""The peers' kernels as baselines (kernels/ssm/baselines, scenarios/ssm_baselines.py; SPEC §5 last paragraph).

What is checked here, on CPU:

* each adapter's layout mapping: our states into the peer's pool and back (bitwise), and rounds through
  the adapter against an independent fp64 reference of §2 with random data (dynamic widths, idle rows,
  slots out of order), spare slots untouched:
  - fla: fla-core's real kernel in the Triton interpreter (fla-core is in the dev extra);
  - SGLang: its real kernel file in the interpreter where sglang 0.5.23 is installed (skipped, saying so,
    where it is not); its ring read-back (our accepted state from checkpoint + ring) always, on hand-made
    rings that wrap;
  - FlashInfer: its CuTe DSL kernels need a GPU, so under a torch model of its documented API
    (tests/peer_doubles.py);
* a peer missing, or at another version than pinned, makes the rows `unsupported` saying so; the pins
  agree with pyproject's extras.

On a CUDA box (TRITON_INTERPRET=0; `pytest -m cuda`, scripts/gpu_peers.sh) the same drives run the real
kernels there, FlashInfer's CuTe DSL ones and SGLang's KDA commit (whose loop index Triton's interpreter
cannot run) included.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from harness.cli import app
from kernels.common.triton_cpu import interpreting
from kernels.ssm.baselines import BASELINES, Dims, PoolSpec
from kernels.ssm.baselines.base import Peer, from_k_last, k_last
from kernels.ssm.baselines.flashinfer import FlashInferPool
from kernels.ssm.baselines.sglang import SGLangGDNPool
from peer_doubles import FlashInferGDNDouble

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
ON_GPU = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device with TRITON_INTERPRET=0")
# the interpreter converts loaded index scalars with __index__ on 1-element arrays, which numpy deprecates
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
GDN = Dims("gdn", layers=2, key_heads=2, value_heads=4, head_k_dim=16, head_v_dim=16)
KDA = Dims("kda", layers=2, key_heads=2, value_heads=2, head_k_dim=16, head_v_dim=16)
SLOTS = [3, 0, 2]  # out of order, not 0..n-1; slot 1 and 4 stay spare
CAP = 5
W = 4
# (widths, accepted) per round: fixed width, then dynamic widths with an idle row first, middle and last
ROUNDS = [([W, W, W], [W - 1, 0, 2]), ([W, 2, 0], [1, 1, -1]), ([1, 0, 3], [0, -1, 2]), ([W, W, 1], [3, 2, 0])]
DECODE = [([1, 1, 1], [0, 0, 0]), ([1, 0, 1], [0, -1, 0]), ([0, 1, 1], [-1, 0, 0])]


# ------------------------------------------------------------------------------------------- reference
def _norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _reference_round(S, dims: Dims, qkv, a, b, A_log, dt_bias, widths, accepted):
    """fp64 §2 on the conv outputs of one layer: outputs `[rows, HV, V]` of the valid tokens (packed) and the
    accepted states `[n, HV, K, V]`; written with plain einsum, independent of kernels/."""
    H, HV, K, V = dims.key_heads, dims.value_heads, dims.head_k_dim, dims.head_v_dim
    x = qkv.double()
    q = _norm(x[:, : H * K].reshape(-1, H, K)) * K**-0.5
    k = _norm(x[:, H * K : 2 * H * K].reshape(-1, H, K))
    v = x[:, 2 * H * K :].reshape(-1, HV, V)
    q, k = q.repeat_interleave(HV // H, 1), k.repeat_interleave(HV // H, 1)
    if dims.family == "gdn":
        y = a.double() + dt_bias.double()
        g = (-torch.exp(A_log.double()) * torch.where(y > 20, y, torch.log1p(torch.exp(y))))[..., None]
    else:
        y = torch.exp(A_log.double())[:, None] * (a.double() + dt_bias.double().reshape(HV, K))
        g = dims.lower_bound * torch.sigmoid(y)
    beta = torch.sigmoid(b.double())
    outs, S = [], S.clone()
    start = 0
    for r, (w, acc) in enumerate(zip(widths, accepted, strict=True)):
        s = S[r]
        for t in range(w):
            i = start + t
            s = torch.exp(g[i])[..., None] * s
            d = beta[i][:, None] * (v[i] - torch.einsum("hkv,hk->hv", s, k[i]))
            s = s + k[i][:, :, None] * d[:, None, :]
            outs.append(torch.einsum("hkv,hk->hv", s, q[i]))
            if t == acc:
                S[r] = s
        start += w
    return torch.stack(outs), S


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _drive(pool, dims: Dims, plan, out_tol: float, state_tol: float, seed: int = 0, act=torch.bfloat16) -> None:
    """Load random states into SLOTS, check the read-back is exact, run `plan`'s rounds through the pool
    against the fp64 reference (outputs every layer, states every round), spare slots untouched."""
    gen = torch.Generator().manual_seed(seed)
    dev = pool.spec.device
    L, H, HV, K, V, C = (dims.layers, dims.key_heads, dims.value_heads, dims.head_k_dim, dims.head_v_dim,
                         dims.conv_dim)
    slots = torch.tensor(SLOTS, device=dev)
    spare = torch.tensor([s for s in range(CAP) if s not in SLOTS], device=dev)
    for name, t in pool.tensors().items():  # poison everything first: the spare rows must keep these bits
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype) if t.is_floating_point() else t)
    before = {name: (t[spare] if t.dim() == 1 else t[:, spare]).clone() for name, t in pool.tensors().items()}
    S0 = torch.randn(L, len(SLOTS), HV, K, V, generator=gen) * 0.3
    pool.load(slots, S0.to(dev))
    assert torch.equal(pool.state(slots).cpu(), S0), "our states -> the peer's layout -> ours is not exact"
    ref = S0.double()
    A_log = torch.empty(L, HV).uniform_(-2.0, 0.5, generator=gen)
    dt_bias = torch.empty(L, HV * (K if dims.family == "kda" else 1)).uniform_(-1, 1, generator=gen)
    for rnd, (widths, accepted) in enumerate(plan):
        n = len(widths)
        T = n * pool.spec.width  # packed rows: a fixed shape per batch, as the harness hands every mode
        cu = torch.zeros(n + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(widths, dtype=torch.int32), 0)
        widths_t, accepted_t = torch.tensor(widths, dtype=torch.int32), torch.tensor(accepted, dtype=torch.int32)
        pool.begin_round(slots, widths_t.to(dev), cu.to(dev))
        for layer in range(L):
            # padding rows past the valid tokens hold random values too: no peer may read them
            qkv = torch.randn(T, C, generator=gen).to(act)
            a = torch.randn(T, HV, *([K] if dims.family == "kda" else []), generator=gen).to(act)
            b = torch.randn(T, HV, generator=gen).to(act)
            o = pool.forward(layer, qkv.to(dev), a.to(dev), b.to(dev), A_log[layer].to(dev),
                             dt_bias[layer].to(dev)).cpu()
            o_ref, ref[layer] = _reference_round(ref[layer], dims, qkv, a, b, A_log[layer], dt_bias[layer], widths,
                                                 accepted)
            valid = int(cu[-1])
            assert _rms(o[:valid], o_ref) <= out_tol, f"round {rnd} layer {layer}: outputs {_rms(o[:valid], o_ref):.3g}"
        pool.accept(accepted_t.to(dev))
        got = pool.state(slots).cpu()
        assert _rms(got, ref) <= state_tol, f"round {rnd}: accepted states {_rms(got, ref):.3g}"
    for name, t in pool.tensors().items():
        rows = t[spare] if t.dim() == 1 else t[:, spare]
        assert torch.equal(rows, before[name]), f"{name}: a spare slot changed"


# ------------------------------------------------------------------------------------------- layouts
def test_k_last_is_the_transpose_of_our_layout():
    S = torch.randn(2, 3, 4, 5, 6)  # [L, n, HV, K, V]
    P = k_last(S)
    assert P.shape == (2, 3, 4, 6, 5) and P[1, 2, 3, 5, 4] == S[1, 2, 3, 4, 5]
    assert torch.equal(from_k_last(P.contiguous()), S)


@pytest.mark.parametrize("family", ["gdn", pytest.param("kda", marks=pytest.mark.slow)])
def test_fla_adapter_matches_reference(family):
    """fla-core's fused_recurrent_kda_fwd through the adapter (MTP: initial state from the accepted row,
    a state written per verified token; GDN through the KDA kernel with its gate broadcast over K)."""
    pytest.importorskip("fla", reason="fla-core is the optional `fla` extra")
    dims = GDN if family == "gdn" else KDA
    pool = BASELINES["fla"].pool(dims, PoolSpec("native", CAP, W, device=DEVICE))
    # fla writes outputs in the activation dtype: one bf16 rounding (~2^-9 RMS); its states are fp32
    _drive(pool, dims, ROUNDS, out_tol=5e-3, state_tol=1e-5, act=torch.bfloat16)


def test_fla_adapter_decode_in_place():
    pytest.importorskip("fla", reason="fla-core is the optional `fla` extra")
    pool = BASELINES["fla"].pool(GDN, PoolSpec("native", CAP, 1, device=DEVICE))
    _drive(pool, GDN, DECODE, out_tol=5e-3, state_tol=1e-5)


@pytest.mark.parametrize("width, plan", [(W, ROUNDS), (1, DECODE)], ids=["mtp", "decode"])
def test_flashinfer_adapter_mapping_under_its_api_contract(width, plan):
    """The FlashInfer adapter on a torch model of gated_delta_rule_mtp / decode_pretranspose: K-last pool rows
    `slot * W + t`, read row = the accepted one, a per-token scatter row per token, -1 for idle rows, packed
    tokens gathered into [B, T] and the bf16 outputs put back into packed rows."""
    double = FlashInferGDNDouble()
    pool = FlashInferPool(GDN, PoolSpec("native", CAP, width), double)
    _drive(pool, GDN, plan, out_tol=5e-3, state_tol=1e-5)
    assert set(double.calls) == ({"mtp"} if width > 1 else {"decode"})


def _sglang_or_skip():
    have = BASELINES["sglang"].peer.installed()
    if have != BASELINES["sglang"].peer.pin:
        pytest.skip(f"sglang {BASELINES['sglang'].peer.pin} is not installed here ({have or 'absent'}): its kernel "
                    "file runs in the interpreter only where it is (pip install --no-deps sglang==0.5.23)")
    return BASELINES["sglang"]


# L = 16 builds history up and flushes at round 4; L = 8 (= 2W) flushes every round (the slow suite's)
# (compact also runs end to end in test_a_run_with_peers_beside_ours)
@pytest.mark.parametrize("mode, history_len", [pytest.param("replay", 8, marks=pytest.mark.slow), ("replay", 16),
                                               pytest.param("compact", 16, marks=pytest.mark.slow)])
def test_sglang_kernels_in_the_interpreter(mode, history_len):
    """SGLang's own kernel file, loaded alone, through the adapter: replay with flushes every round (L = 8 =
    2W) and with history building up (L = 16), compact folding every commit. IEEE dots (the interpreter's,
    and SGLang's default off NVIDIA); fp32 rings (Triton 3.6's interpreter computes bf16 tl.dot wrongly)."""
    b = _sglang_or_skip()
    spec = PoolSpec(mode, CAP, W, history_len=history_len, variant="ieee", device=DEVICE)
    pool = b.pool(GDN, spec)
    plan = ROUNDS + ROUNDS[:2] if mode == "replay" else ROUNDS
    _drive(pool, GDN, plan, out_tol=1e-5, state_tol=1e-5)
    assert "sglang" not in sys.modules, "the kernel file's helper modules must not stay importable as SGLang's"


@pytest.mark.parametrize("mode", ["replay", "compact"])
def test_sglang_ring_read_back(mode):
    """Our accepted state from SGLang's checkpoint and ring, on hand-made rings (no kernel): the committed
    records `write_pos` long from `cache_base`, wrapping around the ring, folded onto the K-last checkpoint,
    against an fp64 fold of the same records."""
    gen = torch.Generator().manual_seed(4)
    dims = GDN
    pool = SGLangGDNPool(dims, PoolSpec(mode, CAP, W, history_len=8), kernels=None)
    L = pool.L  # replay: the history length; compact: 16, the least its commit's tl.dot takes
    assert L == (8 if mode == "replay" else 16)
    slots = torch.tensor(SLOTS)
    for t in pool.tensors().values():
        if t.is_floating_point():
            t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    pool.g.copy_(-torch.rand(pool.g.shape, generator=gen))  # log gates <= 0
    pool.write_pos[slots] = torch.tensor([5, 0, 3], dtype=torch.int32)
    pool.cache_base[slots] = torch.tensor([L - 2, 2, 0], dtype=torch.int32)  # slot 3's records wrap past the end
    group = dims.value_heads // dims.key_heads
    want = from_k_last(pool.checkpoint[:, slots]).double()
    for i, s in enumerate(SLOTS):
        for t in range(int(pool.write_pos[s])):
            p = (int(pool.cache_base[s]) + t) % L
            for layer in range(dims.layers):
                S = want[layer, i]
                g = pool.g[layer, s, :, p].double()
                if mode == "replay":
                    k = _norm(pool.rawk[layer, s, :, p].double()).repeat_interleave(group, 0)
                    v, beta = pool.rawv[layer, s, :, p].double(), pool.beta[layer, s, :, p].double()
                    S = torch.exp(g)[:, None, None] * S
                    d = beta[:, None] * (v - torch.einsum("hkv,hk->hv", S, k))
                else:
                    k = pool.k[layer, s, :, p].double().repeat_interleave(group, 0)
                    d = pool.d[layer, s, :, p].double()
                    S = torch.exp(g)[:, None, None] * S
                want[layer, i] = S + k[:, :, None] * d[:, None, :]
    assert _rms(pool.state(slots), want) <= 1e-6


# ------------------------------------------------------------------------------------------- unsupported
def test_pins_agree_with_pyproject():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for b in BASELINES.values():
        assert f"{b.peer.dist}=={b.peer.pin}" in extras[b.peer.extra], (b.name, extras[b.peer.extra])


def test_a_missing_or_other_version_peer_says_so(monkeypatch):
    peer = Peer("sglang", "0.5.23", extra="sglang")

    def version(v):
        def fake(dist):
            if v is None:
                raise importlib.metadata.PackageNotFoundError(dist)
            return v
        return fake

    monkeypatch.setattr(importlib.metadata, "version", version(None))
    with pytest.raises(ImportError, match=r"sglang==0\.5\.23 is not installed here \(pip install 'ssm-state-harness\[sglang\]'\)"):
        peer.check()
    monkeypatch.setattr(importlib.metadata, "version", version("0.5.24"))
    with pytest.raises(ImportError, match=r"sglang 0\.5\.24 is installed; the adapter is written against 0\.5\.23"):
        peer.check()


def test_rows_of_a_missing_peer_are_unsupported_with_the_reason(tmp_path, monkeypatch, light_runs):
    """`--backend torch,fla,sglang,flashinfer` on CPU with SGLang and fla-core missing: every sglang and fla row
    is unsupported, SGLang's replay and compact rows and fla's native one saying the peer is not installed,
    the rows of modes a peer lacks saying so first; every flashinfer row is unsupported (no GPU here, and no
    compact/replay on SM90); our rows pass. (Peers' rows that pass: test_a_run_with_peers_beside_ours.)"""
    real = Peer.installed
    monkeypatch.setattr(Peer, "installed", lambda self: None if self.dist in ("sglang", "fla-core") else real(self))
    result = CliRunner().invoke(app, ["run", "mtp-fixed", "--preset", "tiny-gdn",
                                      "--backend", "torch,fla,sglang,flashinfer",
                                      "--batch", "2", "--rounds", "1", "--history-len", "8", "--out", str(tmp_path),
                                      "--warmup", "0", "--rep", "2"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = next(p for p in tmp_path.iterdir() if p.is_dir())
    df = pd.read_csv(run / "throughput.csv", keep_default_na=False)
    ours, peers = df[df["backend"] == "torch"], df[df["backend"] != "torch"]
    assert set(ours["status"]) == {"passed"}
    assert set(peers["status"]) == {"unsupported"}
    why = {(r.backend, r.mode): r.reason for r in peers.itertuples()}
    assert why[("sglang", "replay")].startswith("sglang==0.5.23 is not installed here")
    assert why[("sglang", "compact")].startswith("sglang==0.5.23 is not installed here")
    assert "native verify is fla's fused_recurrent family" in why[("sglang", "native")]
    assert "K, V >= 128" in why[("flashinfer", "native")]
    assert "ReplaySSM verify needs SM100/SM103" in why[("flashinfer", "replay")]
    assert "fla-core has no replay state kernel" in why[("fla", "replay")]
    assert why[("fla", "native")].startswith("fla-core==0.6.0 is not installed here")
    # no timing on a row that did not run
    assert (peers["median_us"] == "").all()


def test_bench_peer_cases_run_or_say_why():
    """scripts/bench_kernels.py's peer cases on CPU: each one that builds runs once; FlashInfer (CUDA only)
    and any peer not installed is one line, not a crash."""
    from dataclasses import replace

    from scenarios.ssm_peer_kernels import peer_cases
    from states.params import make_params
    from states.presets import get_ssm_preset

    geom = replace(get_ssm_preset("tiny-gdn").ssm, layers=1)
    params = make_params(geom, torch.bfloat16, torch.Generator().manual_seed(0))
    said: list[str] = []
    cases = peer_cases(geom, params, 2, 3, torch.float32, "cpu", say=lambda line, **_: said.append(line))
    names = {name for name, _, _ in cases}
    assert any(line.startswith("flashinfer: no cases (FlashInfer's GDN kernels are CuTe DSL kernels for CUDA")
               for line in said), said
    assert {"fla-decode", "fla-mtp"} <= names or any(line.startswith("fla: no cases") for line in said)
    assert "sglang-verify-fp32-ieee" in names or any(line.startswith("sglang: no cases") for line in said)
    for name, run, moved in cases:
        run()
        assert moved > 0, name


def test_our_backends_and_the_peers_are_named_once():
    from results.schema import OUR_BACKENDS
    from scenarios.ssm_options import SSM_BACKENDS
    from states.base import BACKENDS

    assert set(OUR_BACKENDS) == set(BACKENDS)
    assert not set(BACKENDS) & set(BASELINES)
    assert SSM_BACKENDS == (*BACKENDS, *BASELINES)


@pytest.mark.cuda
@ON_GPU
def test_sglang_kda_compact_on_gpu():
    """SGLang's KDA ReplaySSM through the adapter (fold every commit: the recurrent verify writes the window's
    raw records into the ring, the all-layer commit replays the accepted prefix into the K-last checkpoint).
    GPU only: the commit kernel calls `.to` on its loop index, a Python int in Triton's interpreter."""
    b = _sglang_or_skip()
    pool = b.pool(KDA, PoolSpec("compact", CAP, W, device=DEVICE))
    # outputs in the activation dtype (q's): one bf16 rounding; the folded states are fp32
    _drive(pool, KDA, ROUNDS, out_tol=5e-3, state_tol=1e-5)
    assert "sglang" not in sys.modules


@pytest.mark.cuda
@ON_GPU
@pytest.mark.parametrize("width, plan", [(W, ROUNDS), (1, DECODE)], ids=["mtp", "decode"])
def test_flashinfer_adapter_on_gpu(width, plan):
    """FlashInfer's own CuTe DSL kernels through the adapter, at the head dims they take (K = V = 128)."""
    b = BASELINES["flashinfer"]
    why = b.available(DEVICE)
    if why:
        pytest.skip(why)
    dims = Dims("gdn", layers=1, key_heads=2, value_heads=4, head_k_dim=128, head_v_dim=128)
    _drive(b.pool(dims, PoolSpec("native", CAP, width, device=DEVICE)), dims, plan, out_tol=5e-3, state_tol=1e-5)


@pytest.mark.cuda
@ON_GPU
@pytest.mark.parametrize("precision, out_tol", [("ieee", 1e-5), ("tf32", 5e-3), ("bf16x3", 1e-4)])
def test_sglang_gdn_replay_on_gpu_at_its_precisions(precision, out_tol):
    """SGLang's GDN replay verify on the GPU: IEEE products within the fp32 contract, TF32 ones about 1e-3
    off (what the report shows for its default), bf16x3 in between; states fold exactly either way."""
    b = _sglang_or_skip()
    dims = Dims("gdn", layers=1, key_heads=2, value_heads=4, head_k_dim=128, head_v_dim=128)
    pool = b.pool(dims, PoolSpec("replay", CAP, W, history_len=16, variant=precision, device=DEVICE))
    _drive(pool, dims, ROUNDS + ROUNDS, out_tol=out_tol, state_tol=1e-5)


@pytest.mark.slow  # 20-40 s of interpreted peers; the fast suite runs fla's rows end to end in the test above
def test_a_run_with_peers_beside_ours(tmp_path, light_runs):
    """`--backend torch,fla,sglang` end to end: the peers' rows pass (timed, bytes counted, the kernel named in
    the reason, SGLang's dot precision as the variant), their comparisons are in the report under `baseline`
    against the fp64 reference and our native, and the tables say how ours compares with the best peer."""
    if BASELINES["sglang"].peer.installed() != BASELINES["sglang"].peer.pin:
        pytest.skip("sglang 0.5.23 is not installed here (pip install --no-deps sglang==0.5.23)")
    pytest.importorskip("fla", reason="fla-core is the optional `fla` extra")
    result = CliRunner().invoke(app, ["run", "mtp-fixed", "--preset", "tiny-gdn", "--backend", "torch,fla,sglang",
                                      "--modes", "native,compact", "--compact-commit", "accept", "--batch", "2",
                                      "--rounds", "2", "--out", str(tmp_path), "--warmup", "0", "--rep", "2"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = next(p for p in tmp_path.iterdir() if p.is_dir())
    df = pd.read_csv(run / "throughput.csv", keep_default_na=False)
    rows = {(r.backend, r.mode): r for r in df.itertuples()}
    for key in [("fla", "native"), ("sglang", "compact")]:
        r = rows[key]
        assert r.status == "passed" and r.median_us != "" and int(r.bytes_moved) > 0, key
        assert "baseline:" in r.reason, r.reason
    assert rows[("sglang", "compact")].variant == "ieee" and "ieee dots" in rows[("sglang", "compact")].reason
    assert rows[("fla", "compact")].status == "unsupported" and rows[("sglang", "native")].status == "unsupported"
    eq = (run / "equivalence.md").read_text()
    assert "baseline: a peer's kernels vs the fp64 reference and our native (reported, not gated)" in eq
    for pair in ("native/fla vs native/torch", "native/fla vs fp64-reference", "compact-ieee/sglang vs native/torch",
                 "compact-ieee/sglang vs fp64-reference"):
        assert f"| {pair} | o |" in eq and f"| {pair} | ssm |" in eq, pair
    assert "PASS" in eq.splitlines()[2]
    from results.store import load_run
    from results.tables import render_markdown

    md = render_markdown(load_run(run))
    assert "native: x faster than best peer" in md and "compact-accept: x faster than best peer" in md


def test_bench_flashinfer_cases_under_its_api_contract(monkeypatch):
    """scripts/bench_kernels.py's FlashInfer cases call its API within its documented contract (which the torch
    model asserts: dtypes, shapes, index dtypes, the scatter's exclusions), and a second call (timing repeats
    them) takes the same arguments."""
    from dataclasses import replace

    from scenarios import ssm_peer_kernels
    from states.params import make_params
    from states.presets import get_ssm_preset

    double = FlashInferGDNDouble()
    monkeypatch.setattr(BASELINES["flashinfer"], "load", lambda device: double)
    geom = replace(get_ssm_preset("tiny-gdn").ssm, layers=1)
    params = make_params(geom, torch.bfloat16, torch.Generator().manual_seed(0))
    cases = {name: run for name, run, _ in ssm_peer_kernels._flashinfer(geom, params, 2, 3, torch.float32, "cpu")}
    assert set(cases) == {"flashinfer-decode", "flashinfer-mtp-states", "flashinfer-mtp-scatter",
                          "flashinfer-mtp-readonly", "flashinfer-mtp-final"}
    for name, run in cases.items():
        run()
        run()  # a second call (timing repeats them) takes the same arguments
    assert double.calls.count("decode") == 2 and double.calls.count("mtp") == 8
