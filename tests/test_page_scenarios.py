"""The KV page scenarios end to end on CPU (Triton in its interpreter, tiny shapes): cpu-page-restore and
pd-roundtrip through the CLI, bad input, the page autotune sweeps, and the gate catching broken
transfers (scenarios/cpu_page_restore.py, pd_roundtrip.py, page_options.py, page_tuning.py)."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import kernels.pages
from harness.autotune import AutotuneCache, Level, tune
from harness.cli import app
from harness.gate import page_cases, run_gate
from harness.tune import run_autotune
from kernels.pages import check_launch, default_launch
from results.store import load_run
from scenarios import page_tuning
from states import presets
from states.cpu_pages import CPUPagePool
from states.presets import get_attn_preset

runner = CliRunner()


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a loaded CI box every parallel region can
    stall on a descheduled worker (measured: an 8 ms 393 KB copy on 2 busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


ROW_BYTES_TINY_GDN = 2 * 2 * 8 * 16 * 2  # layers x (K, V) x 8 heads x 16 x bf16: one token, all heads


def _run(args: list[str], out) -> pd.DataFrame:
    result = runner.invoke(app, ["run", *args, "--warmup", "1", "--rep", "5", "--out", str(out)],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = [p for p in out.iterdir() if p.is_dir()]
    return load_run(path)


def test_cpu_page_restore_run(tmp_path):
    run = _run(["cpu-page-restore", "--preset", "tiny-gdn", "--backend", "torch,triton", "--tp", "2",
                "--page-size", "16", "--variant", "direct,staged", "--pages", "1"], tmp_path)
    df = run.throughput
    assert set(df["status"]) == {"passed"}, df[["direction", "status", "reason"]]
    kv = df[df["family"] == "gqa"]
    want = {"d2h", "h2d", "d2h-staged", "h2d-staged", "gather", "scatter"}
    assert set(kv[kv["backend"] == "triton"]["direction"]) == set(kv[kv["backend"] == "torch"]["direction"]) == want
    # the state page of tiny-gdn's GDN layers, at TP 2
    (state,) = df[df["family"] == "gdn"].itertuples()
    assert state.direction == "roundtrip" and state.tp_prefill == 2 and "state page" in state.reason
    # every timed row moved the page (16 tokens, both ranks' heads once) and knows its ceiling
    host = kv[kv["direction"].isin(["d2h", "h2d", "d2h-staged", "h2d-staged"])]
    assert (host["bytes_moved"] == 16 * ROW_BYTES_TINY_GDN).all()
    assert (kv[kv["direction"] == "gather"]["bytes_moved"] == 2 * 16 * ROW_BYTES_TINY_GDN).all()
    assert (kv["median_us"] > 0).all() and (kv["samples"] == 5).all()
    assert (kv["ceiling_name"] == "cpu-memcpy").all() and (kv["timer"] == "cpu-wall").all()
    configs = [json.loads(c) for c in kv["config"]]
    assert {c["variant"] for c in configs} == {"direct", "staged"}
    assert {c["chunk_bytes"] for c in configs} == {16 * 2 * 8 * 16 * 2} and {c["pages"] for c in configs} == {1}
    triton = kv[kv["backend"] == "triton"]
    assert set(triton["config_source"]) == {"default"} and all("programs" in json.loads(c) for c in triton["config"])
    assert set(kv[kv["backend"] == "torch"]["config_source"]) == {"fixed"}
    assert "--variant staged" in kv[kv["direction"] == "gather"]["repro"].iloc[0]

    comparisons = run.equivalence_report().comparisons
    assert comparisons and all(c.passed and c.bitwise_equal for c in comparisons)
    names = {(c.name, c.contract) for c in comparisons}
    assert {("offloaded pages", "4"), ("ready flags", "4"), ("loaded slots", "4"), ("untouched pages", "5"),
            ("untouched slots and padding row", "5"), ("source pools", "5"), ("state page bytes", "4"),
            ("ssm state", "4"), ("conv window", "4")} <= names
    lhs = {c.lhs for c in comparisons}
    assert {"direct/torch tp2", "staged/torch tp2", "direct/triton tp2", "staged/triton tp2"} <= lhs
    assert (run.path / "figures" / "cpu-page-restore-gqa-page-bandwidth.png").stat().st_size > 5000


def test_pd_roundtrip_run(tmp_path):
    run = _run(["pd-roundtrip", "--preset", "tiny-kda", "--backend", "torch,triton", "--tp-pairs", "2:1,1:2",
                "--page-tokens", "16", "--pages", "1"], tmp_path)
    df = run.throughput
    kv = df[df["family"] == "mla"]
    assert set(kv["status"]) == {"passed"} and len(kv) == 2 * 2 * 2  # pairs x backends x (export, import)
    assert set(kv["direction"]) == {"export", "import"}
    # MLA: one writer at any TP; every decode rank reads the whole latent (a page of 16 tokens, 2 layers x 48 bf16),
    # each byte read and written in device memory
    row = 2 * 48 * 2
    imports = kv[kv["direction"] == "import"].set_index(["backend", "tp_decode"])["bytes_moved"]
    assert imports[("triton", 2)] == 2 * 16 * row * 2 and imports[("torch", 1)] == 2 * 16 * row
    assert (kv[kv["direction"] == "export"]["bytes_moved"] == 2 * 16 * row).all()
    state = df[df["family"] == "kda"].set_index("tp_decode")
    assert set(state["status"]) == {"passed"}  # TP 1 and 2 split the 2 KDA heads (TP 4 is refused: bad input)
    comparisons = run.equivalence_report().comparisons
    assert all(c.passed for c in comparisons)
    assert {"exported pages", "imported slots", "untouched pages", "untouched slots and padding row",
            "prefill pools", "state page re-packed at TP 1"} <= {c.name for c in comparisons}
    assert {"triton tp2->tp1", "torch tp1->tp2"} <= {c.lhs for c in comparisons}
    assert (run.path / "figures" / "pd-roundtrip-mla-page-bandwidth.png").stat().st_size > 5000


@pytest.fixture
def tiny_gqa2(monkeypatch):
    """tiny-gdn with Qwen3-Next's 2 KV heads: the same replication at a size whose state page is small. Its
    SSM layers get 8 key and value heads so that TP 8, like Qwen3-Next's 16 / 32, splits them."""
    base = presets.PRESETS["tiny-gdn"]
    attn = dataclasses.replace(base.attn, kv_heads=2)
    ssm = dataclasses.replace(base.ssm, key_heads=8, value_heads=8)
    monkeypatch.setitem(presets.PRESETS, "tiny-gqa2", dataclasses.replace(base, name="tiny-gqa2", attn=attn, ssm=ssm))


@pytest.mark.parametrize("preset", [
    "tiny-gqa2",
    # the real preset: the state page of its 36 GDN layers takes most of the run's time
    pytest.param("qwen3-next", marks=pytest.mark.slow),
])
@pytest.mark.usefixtures("light_runs")
def test_pd_roundtrip_replicated_gqa_heads(tmp_path, tiny_gqa2, preset):
    """Qwen3-Next has 2 KV heads: at TP 4 and 8 ranks replicate them and only one per head writes."""
    run = _run(["pd-roundtrip", "--preset", preset, "--tp-pairs", "8:2,1:4", "--page-tokens", "16",
                "--pages", "1"], tmp_path)
    kv = run.throughput[run.throughput["family"] == "gqa"].set_index(["tp_prefill", "direction"])["bytes_moved"]
    attn = presets.get_attn_preset(preset).attn
    assert attn.kv_heads == 2
    one_page = 16 * attn.layers * 2 * 2 * attn.head_dim * 2  # tokens x layers x (K, V) x 2 heads x D x bf16
    assert kv[(8, "export")] == kv[(1, "export")] == 2 * one_page  # two writers of 1 head each, or one of 2
    assert kv[(1, "import")] == 2 * 2 * one_page  # four ranks read one head each: every head twice
    assert all(c.passed for c in run.equivalence_report().comparisons)


@pytest.mark.parametrize(
    "args, message",
    [
        (["cpu-page-restore", "--page-size", "24"], "--page-size: page size must be a power of two"),
        (["cpu-page-restore", "--page-size", "16,2048"], "power of two in [16, 1024]"),
        (["pd-roundtrip", "--page-tokens", "8"], "--page-tokens: page size must be a power of two"),
        (["cpu-page-restore", "--pages", "0"], "--pages must be an integer in [1, 65536]"),
        (["pd-roundtrip", "--pages", "70000"], "--pages must be an integer in [1, 65536]"),
        (["cpu-page-restore", "--preset", "tiny-xyz"], "unknown preset 'tiny-xyz'"),
        (["cpu-page-restore", "--preset", "llama-3-8b", "--tp", "3"], "TP 3 neither divides nor is a multiple"),
        (["cpu-page-restore", "--tp", "0"], "TP degrees must be >= 1"),
        (["pd-roundtrip", "--tp-pairs", "1:2,12:1"], "TP 12 neither divides nor is a multiple of 8 KV heads"),
        (["pd-roundtrip", "--tp-pairs", "1-2"], "prefill:decode pairs"),
        (["cpu-page-restore", "--variant", "zero-copy"], "unknown variant"),
        (["pd-roundtrip", "--backend", "fla"], "unknown backend 'fla'"),
        (["cpu-page-restore", "--device", "cuda"], "needs CUDA"),
        (["pd-roundtrip", "--device", "cuda", "--backend", "triton"], "needs CUDA"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_run(tmp_path, args, message):
    result = runner.invoke(app, ["run", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not any(tmp_path.iterdir())


def test_tuning_jobs_cover_every_kernel_with_valid_candidates():
    jobs = page_tuning.tuning_jobs({"preset": "tiny-gdn", "page_size": "16,64", "tp": "2", "batch": "3"})
    assert [(j.kernel, j.static_key["page_size"]) for j in jobs] == [
        (k, size) for size in (16, 64) for k in page_tuning.KERNELS]
    for job in jobs:
        geometry = page_tuning.page_geometry(job.kernel, get_attn_preset("tiny-gdn").attn, 2, job.static_key["page_size"])
        assert job.batch == 3 and len(job.candidates) >= 2
        assert job.default == default_launch(geometry, torch.device("cpu"))
        for c in job.candidates:
            check_launch(c)
        # a rank at TP 2 holds 4 of the 8 KV heads; a staging buffer holds only those
        assert job.static_key["local_heads"] == 4
        assert job.static_key["global_heads"] == (4 if job.kernel in ("pages-gather", "pages-scatter") else 8)
    assert [j.batch for j in page_tuning.tuning_jobs({"preset": "tiny-kda"})] == [2] * 6  # CPU auto pages
    with pytest.raises(ValueError, match="neither divides"):
        page_tuning.tuning_jobs({"preset": "llama-3-8b", "tp": "3"})
    with pytest.raises(ValueError, match="unknown page kernel"):
        page_tuning.tuning_jobs({"kernel": "pages-sideways"})


# a sweep of every candidate in the interpreter, then a run (3 s): the sweep machinery is test_autotune.py's
# (a Triton kernel under the interpreter included), the page jobs and their check are tested above and below
@pytest.mark.slow
def test_autotune_sweep_records_every_candidate_and_runs_use_the_winner(tmp_path):
    cache = tmp_path / "cache.json"
    options = {"preset": "tiny-gdn", "device": "cpu", "page_size": "16", "batch": "1", "kernel": "pages-load",
               "level": "force", "autotune_cache": str(cache)}
    outcome = run_autotune("pages", options, argv=["harness", "autotune", "pages"], out_root=tmp_path / "runs")
    (choice,) = outcome.choices
    assert choice["source"] == "tuned" and choice["kernel"] == "pages-load"
    records = [json.loads(line) for line in (outcome.path / "autotune.jsonl").read_text().splitlines()]
    (job,) = page_tuning.tuning_jobs(options)
    assert [r["config"] for r in records] == job.candidates
    assert {r["status"] for r in records} == {"ok"} and {r["detail"] for r in records} == {"byte-exact"}
    # a run at the same shape now loads with the tuned config, and says so
    run = _run(["cpu-page-restore", "--page-size", "16", "--backend", "triton", "--variant", "direct", "--pages", "1",
                "--autotune-cache", str(cache)], tmp_path / "scenario")
    load = run.throughput.set_index("direction").loc["h2d"]
    assert load["config_source"] == "cached" and load["status"] == "passed"
    assert {k: v for k, v in json.loads(load["config"]).items() if k in choice["config"]} == choice["config"]
    assert run.throughput.set_index("direction").loc["d2h", "config_source"] == "default"


def test_autotune_check_rejects_a_candidate_that_drops_a_row(tmp_path, monkeypatch):
    (job,) = page_tuning.tuning_jobs({"page_size": "16", "batch": "2", "kernel": "pd-write"})
    monkeypatch.setitem(page_tuning._COPY, ("to_pages", "triton"), _dropping(page_tuning._COPY["to_pages", "triton"]))
    records = []
    with pytest.raises(RuntimeError, match="no valid config"):
        tune(job.kernel, job.static_key, job.batch, job.candidates, build=job.build, run=job.run, check=job.check,
             cache=AutotuneCache(tmp_path / "c.json"), level=Level.FORCE, sink=records.append)
    assert [r.status for r in records] == ["mismatch"] * len(job.candidates)
    assert "differ from the torch reference" in records[0].detail


def _dropping(copy):
    """A page copy that leaves out the last token row it should move."""

    def broken(pool, pages, table, ids, **kw):
        table = table.clone()
        r, c = (table >= 0).nonzero()[-1].tolist()
        table[r, c] = -1
        copy(pool, pages, table, ids, **kw)

    return broken


def _scribbling(copy):
    """A page copy that also writes the pool's padding row."""

    def broken(pool, pages, table, ids, **kw):
        copy(pool, pages, table, ids, **kw)
        pool[:, -1] = pool[:, 0]

    return broken


GATE_CASES = [
    ("cpu-page-restore", {"preset": "tiny-gdn", "page_size": "16", "tp": "2", "variant": "direct"}),
    ("pd-roundtrip", {"preset": "tiny-kda", "page_tokens": "16", "tp_pairs": "2:1"}),
]


def test_gate_page_cases_pass_on_every_tp_pair(tmp_path):
    """tiny-gdn's 2 SSM key heads take TP 1 and 2; Llama-3-8B (GQA only, 8 KV heads) every degree to 8."""
    cases = page_cases(("tiny-gdn", "llama-3-8b"), page_size=16)
    assert {name for name, _ in cases} == {"cpu-page-restore", "pd-roundtrip"}
    assert [o["tp"] for n, o in cases if n == "cpu-page-restore"] == ["1,2", "1,2,4,8"]
    outcome = run_gate(device="cpu", backends="torch", cases=cases, out_root=tmp_path)
    assert outcome.passed, outcome.lines
    md = (outcome.path / "equivalence.md").read_text()
    for p in (1, 2, 4, 8):
        assert f"direct/torch tp{p}" in md and f"staged/torch tp{p}" in md
        assert all(f"torch tp{p}->tp{d}" in md for d in (1, 2, 4, 8))


@pytest.mark.parametrize(
    "broken, direction, fails",
    [
        (_dropping, "to_pool", ["contract 4 transfer/restore: {} loaded slots:",
                                "contract 4 transfer/restore: {} imported slots:"]),
        (_dropping, "to_pages", ["contract 4 transfer/restore: {} offloaded pages:",
                                 "contract 4 transfer/restore: {} exported pages:"]),
        (_scribbling, "to_pool", ["contract 5 untouched slots: {} untouched slots and padding row:"]),
    ],
)
def test_gate_catches_a_broken_transfer(tmp_path, monkeypatch, broken, direction, fails):
    original = kernels.pages._DIRECT["torch", direction]
    monkeypatch.setitem(kernels.pages._DIRECT, ("torch", direction), broken(original))
    outcome = run_gate(device="cpu", backends="torch", cases=GATE_CASES, out_root=tmp_path)
    assert not outcome.passed
    for what in fails:  # `{}`: the pair (lhs vs rhs) between the contract and the tensor
        head, tail = what.split("{}")
        assert any(head in line and tail in line and line.index(head) < line.index(tail)
                   for line in outcome.lines), outcome.lines


def test_gate_catches_an_offload_that_rewrites_a_ready_page(tmp_path, monkeypatch):
    monkeypatch.setattr(CPUPagePool, "_skip_ready", lambda self, ids: ids)
    outcome = run_gate(device="cpu", backends="torch", cases=GATE_CASES[:1], out_root=tmp_path)
    assert not outcome.passed
    assert any("contract 4 transfer/restore: " in line and " offloaded pages: " in line for line in outcome.lines), \
        outcome.lines
    assert any("contract 4 transfer/restore: " in line and " loaded slots: " in line for line in outcome.lines), \
        outcome.lines


def _out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.usefixtures("light_runs")
def test_a_transfer_that_does_not_fit_is_an_oom_row(tmp_path, monkeypatch):
    from scenarios import cpu_page_restore, pd_roundtrip

    monkeypatch.setattr(cpu_page_restore, "_time", _out_of_memory)  # the big timed transfer
    run = _run(["cpu-page-restore", "--page-size", "16", "--variant", "direct"], tmp_path / "cpu")
    rows = run.throughput.set_index("family")
    assert list(rows.loc["gqa", "status"]) == ["oom", "oom"] and rows.loc["gdn", "status"] == "passed"
    assert "Tried to allocate 2.00 GiB" in rows.loc["gqa", "reason"].iloc[0] and rows["median_us"].isna().all()
    (record,) = [json.loads(line) for line in (run.path / "oom.jsonl").read_text().splitlines()]
    assert record["wanted_bytes"] == 2 << 30 and record["direction"] == "d2h"

    monkeypatch.setattr(pd_roundtrip.po, "source_group", _out_of_memory)  # the prefill pools
    run = _run(["pd-roundtrip", "--tp-pairs", "1:2", "--page-tokens", "16"], tmp_path / "pd")
    kv = run.throughput[run.throughput["family"] == "gqa"]
    assert list(kv["status"]) == ["oom", "oom"] and (run.path / "oom.jsonl").read_text().count("\n") == 1
