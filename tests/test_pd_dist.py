"""pd-roundtrip across processes (`--transport dist`, issue 10): gloo on the CPU with 2 and 4 processes at
every TP pair they allow, byte-exact and with untouched memory checked on every process; the rank to process
placement and the messages it implies; the Triton kernels in the processes; a torchrun launch; bad input
refused before any process starts; a transfer that loses a byte caught. The NCCL path is the same code on
CUDA tensors (scripts/gpu_pd_dist.sh runs it on a multi-GPU box)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import harness.dist
from harness.cli import app
from results.store import load_run
from states.pd_transport import Field, Placement, Transfer, plan_messages

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
FAST = ["--page-tokens", "16", "--pages", "1", "--warmup", "1", "--rep", "3"]
# bytes of one 16-token page: tokens x layers x (K, V) heads x D x bf16
PAGE = {"tiny-gdn": 16 * 2 * 2 * 8 * 16 * 2, "tiny-kda": 16 * 2 * 48 * 2, "llama-3-8b": 16 * 32 * 2 * 8 * 128 * 2}
KV_HEADS = {"tiny-gdn": 8, "tiny-kda": 1, "llama-3-8b": 8}
MLA = {"tiny-kda"}


def _invoke(tmp_path: Path, args: list[str]):
    return runner.invoke(app, ["run", "pd-roundtrip", *args, "--out", str(tmp_path)], catch_exceptions=False)


def _run(tmp_path: Path, args: list[str], code: int = 0):
    result = _invoke(tmp_path, ["--transport", "dist", *args, *FAST])
    assert result.exit_code == code, result.output
    (path,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return load_run(path)


def expected_bytes(preset: str, world: int, p: int, d: int) -> tuple[int, int]:
    """(link, local) bytes of moving one page from TP p to TP d, from the documented placement alone:
    prefill rank i in process i, decode rank j in process world - 1 - j; one writer per head slice."""
    heads = KV_HEADS[preset]
    per_head = PAGE[preset] // heads
    link = local = 0
    for j in range(d):
        need = range(j * heads // d, (j + 1) * heads // d) if d <= heads else [j * heads // d]
        for h in need:
            writer = h * p // heads if p <= heads else h * (p // heads)  # the first rank holding head h
            if writer == world - 1 - j:
                local += per_head
            else:
                link += per_head
    return link, local


# 2 processes already have disjoint (1:1) and shared (1:2, 2:1, 2:2) placements; 4 processes on a 2-core
# machine take as long again and add the TP 4 pairs: the slow suite runs them.
@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_every_pair_the_processes_allow_is_byte_exact(tmp_path, world):
    # the tiny presets' SSM layers (2 key heads) take TP 1 and 2; Llama-3-8B's 8 KV heads every degree to 8
    run = _run(tmp_path, ["--nproc", str(world), "--preset", "tiny-gdn,tiny-kda,llama-3-8b"])
    df = run.throughput
    degrees = {"tiny-gdn": [1, 2], "tiny-kda": [1, 2], "llama-3-8b": [1, 2, 4, 8]}
    ceilings = json.loads((run.path / "manifest.json").read_text())["ceilings"]
    kv = df[df["family"].isin(["gqa", "mla"])]
    assert {(r.preset, r.tp_prefill, r.tp_decode) for r in kv.itertuples()} == \
        {(preset, p, d) for preset, tps in degrees.items() for p in tps for d in tps}
    for (preset, p, d), rows in kv.groupby(["preset", "tp_prefill", "tp_decode"]):
        assert sorted(rows["direction"]) == ["export", "import", "transfer"], rows
        if max(p, d) > world:
            assert set(rows["status"]) == {"unsupported"} and rows["median_us"].isna().all()
            assert rows["reason"].str.contains(f"needs {max(p, d)} processes, the group has {world}").all()
            continue
        assert set(rows["status"]) == {"passed"}, rows[["direction", "status", "reason"]]
        assert (rows["median_us"] > 0).all() and (rows["samples"] == 3).all() and (rows["timer"] == "cpu-wall").all()
        by = rows.set_index("direction")
        link, local = expected_bytes(preset, world, p, d)
        config = json.loads(by.loc["transfer", "config"])
        assert (by.loc["transfer", "bytes_moved"], config["local_bytes"]) == (link, local)
        assert config["placement"] == ("disjoint" if p + d <= world else "shared")
        assert config["comm"] == "gloo" and config["processes"] == world
        # the link ceiling: the transfer's own exchange step, recorded with the run's ceilings, never beaten
        ceiling = by.loc["transfer", "ceiling_name"]
        assert ceiling == f"link-gloo {preset} tp{p}:{d} page 16 torch" and by.loc["transfer", "ceiling_gbps"] > 0
        assert ceiling in ceilings and ceilings[ceiling]["gbps"] == pytest.approx(by.loc["transfer", "ceiling_gbps"])
        assert ceilings[ceiling]["bytes"] == link and 0 < by.loc["transfer", "ceiling_pct"] <= 100
        assert (local > 0) == (f"{local} of {link + local} bytes stay within a process" in str(by.loc["transfer",
                                                                                                        "reason"]))
        writers = min(p, KV_HEADS[preset])  # one writer per head slice
        assert by.loc["export", "ceiling_name"] == f"cpu-memcpy x{writers}"
        assert by.loc["export", "bytes_moved"] == 2 * PAGE[preset]  # every head read and written once
        assert by.loc["import", "bytes_moved"] == 2 * PAGE[preset] * (d if preset in MLA else 1)
    passed = kv[kv["status"] == "passed"]
    fit = {preset: [t for t in tps if t <= world] for preset, tps in degrees.items()}
    assert len(passed) == 3 * sum(len(tps) ** 2 for tps in fit.values())  # directions x pairs
    # the state pages of the hybrid presets: every pair of TP 1 and 2 carries them
    state = df[df["family"].isin(["gdn", "kda"])].set_index(["family", "tp_prefill", "tp_decode"])
    assert len(state) == 2 * 4 and set(state["status"]) == {"passed"}

    comparisons = run.equivalence_report().comparisons
    assert comparisons and all(c.passed and c.bitwise_equal for c in comparisons)
    lhs = {c.lhs for c in comparisons}
    last = world - 1
    # every process's checks reached rank 0: the decode side of a disjoint pair lives in the last processes
    assert {"torch tp1->tp1 prefill rank 0", "torch tp1->tp1 decode rank 0", f"torch tp{world}->tp{world} "
            f"decode rank {last}", "state page tp2->tp2 decode rank 1"} <= lhs
    names = {(c.name, c.contract) for c in comparisons}
    assert {("exported pages", "4"), ("exported pages: other heads and pages", "5"), ("prefill pool", "5"),
            ("received pages", "4"), ("received pages: other heads and pages", "5"), ("imported slots", "4"),
            ("untouched slots and padding row", "5"), ("decode state page ssm", "4"), ("ssm state", "4"),
            ("conv window", "4"), ("decode state page: other heads and pages", "5")} <= names
    manifest = json.loads((run.path / "manifest.json").read_text())
    assert manifest["dist"] == {"backend": "gloo", "world_size": world}
    assert "--transport dist" in passed["repro"].iloc[0] and f"--nproc {world}" in passed["repro"].iloc[0]


# the same Triton page kernels as in one process (test_pages_pools.py) over the same transport as the torch
# ones (test_every_pair_the_processes_allow_is_byte_exact): two more processes
@pytest.mark.slow
def test_triton_kernels_in_the_processes(tmp_path):
    run = _run(tmp_path, ["--nproc", "2", "--tp-pairs", "1:2", "--backend", "torch,triton"])
    kv = run.throughput[run.throughput["family"] == "gqa"]
    assert set(kv["status"]) == {"passed"} and set(kv["backend"]) == {"torch", "triton"}
    export = kv[(kv["backend"] == "triton") & (kv["direction"] == "export")].iloc[0]
    assert "programs" in json.loads(export["config"]) and export["config_source"] == "default"
    assert {"triton tp1->tp2 decode rank 1", "triton tp1->tp2 prefill rank 0"} <= {
        c.lhs for c in run.equivalence_report().comparisons}


def test_a_transfer_that_loses_a_byte_fails_the_run(tmp_path, monkeypatch):
    original = Transfer.__call__

    def lossy(self):
        original(self)
        for link in self.recvs:  # the first byte of what each decode process received goes back to poison
            seg = link.views[0].view(torch.uint8)
            seg[(0,) * seg.dim()] = 0xA5

    monkeypatch.setattr(Transfer, "__call__", lossy)  # forked processes inherit it
    run = _run(tmp_path, ["--nproc", "2", "--tp-pairs", "1:1"], code=1)
    rows = run.throughput
    assert set(rows["status"]) == {"mismatch"} and rows["median_us"].isna().all()
    gqa = rows[rows["family"] == "gqa"]
    assert gqa["reason"].str.contains("decode rank 0: received pages vs prefill KV").all()
    failed = {(c.lhs, c.name, c.contract) for c in run.equivalence_report().failures}
    assert {("torch tp1->tp1 decode rank 0", "received pages", "4"),
            ("torch tp1->tp1 decode rank 0", "imported slots", "4")} <= failed
    assert not any("prefill" in lhs for lhs, _, _ in failed)


@pytest.mark.slow  # a third way to start the processes (torchrun's own launcher and rendezvous): 12 s
def test_a_torchrun_launch(tmp_path):
    """Every process torchrun starts joins from the environment; rank 0 alone writes the run."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "harness",
           "run", "pd-roundtrip", "--transport", "dist", "--tp-pairs", "2:1", *FAST, "--out", str(tmp_path), "--json"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    run = load_run(path)
    assert set(run.throughput["status"]) == {"passed"} and len(run.throughput) == 4  # export, transfer, import, state
    assert json.loads((path / "manifest.json").read_text())["dist"] == {"backend": "gloo", "world_size": 2}
    assert "--nproc 2" in run.throughput["repro"].iloc[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--transport", "dist", "--nproc", "2", "--preset", "llama-3-8b", "--tp-pairs", "1:1,4:1"],
         "TP pair 4:1 needs 4 processes, the group has 2 (--nproc 2)"),
        (["--transport", "dist", "--nproc", "2", "--dist-backend", "nccl"], "--dist-backend nccl needs --device cuda"),
        (["--transport", "dist", "--nproc", "2", "--dist-backend", "mpi"], "unknown --dist-backend 'mpi'"),
        (["--transport", "dist", "--nproc", "1"], "--nproc must be one integer >= 2"),
        (["--transport", "rdma"], "unknown transport 'rdma'; choose local or dist"),
        (["--nproc", "2"], "--nproc applies to --transport dist only"),
        (["--transport", "local", "--dist-backend", "gloo"], "--dist-backend applies to --transport dist only"),
        (["--transport", "dist", "--device", "cuda"], "needs CUDA"),
    ],
)
def test_bad_input_is_one_line_exit_2_before_any_process_starts(tmp_path, monkeypatch, args, message):
    def no_processes(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(harness.dist.mp, "start_processes", no_processes)
    result = _invoke(tmp_path, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not any(tmp_path.iterdir())


def test_placement_and_messages():
    """The rank -> process map users are told (--help, docs) and the messages a plan implies."""
    disjoint, shared = Placement(4, 2, 2), Placement(2, 2, 1)
    assert [disjoint.decode_process(j) for j in range(2)] == [3, 2] and not disjoint.shared
    assert [disjoint.prefill_rank(q) for q in range(4)] == [0, 1, None, None]
    assert [disjoint.decode_rank(q) for q in range(4)] == [None, None, 1, 0]
    assert shared.shared and shared.decode_rank(1) == 0 and shared.prefill_rank(1) == 1
    with pytest.raises(ValueError, match="TP pair 1:4 needs 4 processes, the group has 2"):
        Placement(2, 1, 4)
    with pytest.raises(ValueError, match="at least 2 processes"):
        Placement(1, 1, 1)
    # 8 heads: TP 2 writers, TP 4 readers; each reader gets its quarter from the writer holding it
    f = Field("kv", 4, ((0, 4), (4, 8)), ((0, 2), (2, 4), (4, 6), (6, 8)))
    assert [(m.src, m.dst, m.start, m.stop) for m in plan_messages([f])] == [
        (0, 0, 0, 2), (0, 1, 2, 4), (1, 2, 4, 6), (1, 3, 6, 8)]
    # a replica writes nothing; two writers of one head, or a head nobody wrote, are refused
    mla = Field("kv", 4, ((0, 1), None), ((0, 1), (0, 1)))
    assert [(m.src, m.dst) for m in plan_messages([mla])] == [(0, 0), (0, 1)]
    with pytest.raises(ValueError, match="two prefill ranks write heads 0..0"):
        plan_messages([Field("kv", 4, ((0, 1), (0, 1)), ((0, 1),))])
    with pytest.raises(ValueError, match="decode rank 0 needs heads 0..3, the prefill ranks wrote 2"):
        plan_messages([Field("kv", 4, ((0, 2), None), ((0, 4),))])


def test_a_process_out_of_memory_is_an_oom_row_for_all(tmp_path, monkeypatch):
    """Process 1 cannot allocate the timed transfer's pool: every process skips the timing together and
    the rows say oom, instead of the others waiting for it forever."""
    from scenarios import pd_dist

    original = pd_dist._poisoned_pool

    def short_of_memory(g, tokens, tp, rank, device):
        if tokens == 16 and torch.distributed.get_rank() == 1:  # the timed pool (one page of 16 tokens)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(g, tokens, tp, rank, device)

    monkeypatch.setattr(pd_dist, "_poisoned_pool", short_of_memory)
    run = _run(tmp_path, ["--nproc", "2", "--tp-pairs", "1:1"])
    kv = run.throughput[run.throughput["family"] == "gqa"]
    assert set(kv["status"]) == {"oom"} and kv["reason"].str.contains("Tried to allocate 2.00 GiB").all()
    assert run.throughput.set_index("family").loc["gdn", "status"] == "passed"  # the state page is not timed
    (record,) = [json.loads(line) for line in (run.path / "oom.jsonl").read_text().splitlines()]
    assert record["wanted_bytes"] == 2 << 30 and (record["tp_prefill"], record["tp_decode"]) == (1, 1)


def test_a_phased_sample_is_the_sum_of_its_phases_so_a_phase_ceiling_is_never_beaten(tmp_path):
    """The link ceiling is the exchange phase of the transfer's own samples (issue 17): whatever the noise,
    each sample of the whole is the sum of its phases', so the whole's median is never below a phase's."""
    import random
    import time

    import torch.distributed as dist

    from harness.group_timing import bench_group

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        noisy = lambda: time.sleep(random.uniform(0, 0.002))  # noqa: E731
        whole = bench_group(noisy, noisy, noisy, device="cpu", warmup=0, rep=15)
    finally:
        dist.destroy_process_group()
    assert len(whole.parts) == 3 and whole.n_samples == 15
    for i, sample in enumerate(whole.samples_us):
        assert sample == pytest.approx(sum(part.samples_us[i] for part in whole.parts))
    assert all(whole.median_us >= part.median_us for part in whole.parts)
