"""Every bad invocation is one line naming the option, exit code 2, no traceback, nothing written.

Table-driven: each case is the arguments after `harness` (with placeholders for the fixtures below) and
the option its error line must name. Validation happens before any work (no inputs built, no ceilings
measured), so each case takes milliseconds.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from harness.cli import app

runner = CliRunner()

BAD = [
    # lists: empty, empty items, repeats, values
    ("run decode --batch ''", "--batch"),
    ("run decode --batch 2,,4", "--batch"),
    ("run decode --batch 0", "--batch"),
    ("run decode --batch -3", "--batch"),
    ("run decode --batch two", "--batch"),
    ("run decode --batch 2,2", "--batch"),
    ("run decode --modes ''", "--modes"),
    ("run decode --modes native,sideways", "--modes"),
    ("run decode --modes native,native", "--modes"),
    ("run decode --modes compact", "--modes"),
    ("run decode --backend cuda", "--backend"),
    ("run decode --backend torch,", "--backend"),
    ("run decode --backend triton", "--device"),  # Triton on CPU needs TRITON_INTERPRET=1
    # ranges
    ("run decode --rounds 0", "--rounds"),
    ("run decode --rounds -1", "--rounds"),
    ("run decode --rounds abc", "--rounds"),
    ("run decode --check-requests 0", "--check-requests"),
    ("run decode --batch 4 --check-requests 100", "--check-requests"),
    ("run mtp-fixed --batch 2,8 --check-requests 4", "--check-requests"),
    ("run decode --memory-budget-gib -1", "--memory-budget-gib"),
    ("run decode --memory-budget-gib 0", "--memory-budget-gib"),
    ("run decode --memory-budget-gib nan", "--memory-budget-gib"),
    ("run decode --seed -1", "--seed"),
    ("run decode --seed 99999999999999999999", "--seed"),
    ("run decode --warmup -1", "--warmup"),
    ("run decode --rep 1", "--rep"),
    ("run decode --snapshot-every 0", "--snapshot-every"),
    ("run decode --history-len 0", "--history-len"),
    ("run decode --history-len 6", "--history-len"),
    ("run mtp-fixed --drafts 7 --history-len 4", "--history-len"),
    ("run mtp-fixed --drafts 0", "--drafts"),
    ("run mtp-fixed --drafts -1", "--drafts"),
    ("run mtp-fixed --accept fixed:5", "--accept"),
    ("run mtp-fixed --accept geometric:1.5", "--accept"),
    ("run mtp-fixed --accept sometimes", "--accept"),
    ("run mtp-fixed --accept trace", "--accept"),
    ("run checkpoint-restore --rounds 2", "--rounds"),
    ("run checkpoint-restore --dump {dir}", "--dump"),  # checkpoint-restore dumps nothing: not an option
    ("run decode --drafts 2", "--drafts"),  # decode verifies one token: not an option
    # dtypes, presets, devices, autotune
    ("run decode --state-dtype fp16", "--state-dtype"),
    ("run decode --act-dtype int8", "--act-dtype"),
    ("run decode --act-dtype ''", "--act-dtype"),
    ("run mtp-fixed --history-dtype fp64", "--history-dtype"),
    ("run decode --preset nope", "--preset"),
    ("run decode --preset llama-3-8b", "--preset"),
    ("run decode --device gpu", "--device"),
    ("run decode --device cuda:99", "--device"),
    ("run decode --autotune force", "--autotune"),
    ("run decode --autotune sometimes", "--autotune"),
    ("run decode --autotune-cache {dir}", "--autotune-cache"),
    ("run decode --autotune-cache {garbage}", "--autotune-cache"),
    # where output goes
    ("run decode --out {file}", "--out"),
    ("run decode --out {file}/runs", "--out"),
    ("run decode --out /proc/x", "--out"),
    ("run decode --out /sys/x", "--out"),
    ("run decode --dump {file}", "--dump"),
    ("run decode --dump /proc/x", "--dump"),
    ("run mtp-fixed --dump /proc/self/x", "--dump"),
    ("gate --junit /proc/x/j.xml", "--junit"),
    ("gate --junit {dir}", "--junit"),
    ("gate --out {file}", "--out"),
    ("gate --shapes huge", "--shapes"),
    ("autotune ssm --out /proc/x", "--out"),
    ("TRITON_INTERPRET=1 autotune ssm --batch ''", "--batch"),
    ("autotune ssm --batch ''", "--batch"),  # checked before the restart into the interpreter
    ("autotune ssm --autotune-cache /proc/nope/x.json", "--autotune-cache"),
    ("autotune ssm --autotune-cache {dir}", "--autotune-cache"),
    ("autotune ssm --level sometimes", "--level"),
    ("TRITON_INTERPRET=1 autotune pages --page-size 2,,4", "--page-size"),
    # memory: predicted before allocating
    ("run decode --batch 1000000000", "--batch"),
    ("run checkpoint-restore --batch 100000000", "--batch"),
    ("run cpu-page-restore --preset deepseek-v3 --page-size 1024 --pages 65536", "--pages"),
    # traces: options a trace fixes, and every field of the file
    ("run mtp-dynamic --trace {trace} --rounds 3", "--rounds"),
    ("run mtp-dynamic --trace {trace} --act-dtype fp32", "--act-dtype"),
    ("run mtp-dynamic --trace {trace} --state-dtype bf16", "--state-dtype"),
    ("run mtp-dynamic --trace {trace} --batch 3", "--batch"),
    ("run mtp-dynamic --trace {trace} --drafts 3", "--drafts"),
    ("run mtp-dynamic --trace {trace} --accept all", "--accept"),
    ("run decode --trace {trace}", "--trace"),  # a drafts-2 trace is not decode
    ("run mtp-fixed --trace {trace}", "--trace"),  # its widths vary: mtp-dynamic
    ("run mtp-dynamic --preset tiny-kda --trace {trace}", "--trace"),  # another geometry
    ("run mtp-dynamic --trace {missing}", "--trace"),
    ("run mtp-dynamic --trace {dir}", "--trace"),
    ("run mtp-dynamic --trace {garbage}", "--trace"),
    ("run mtp-dynamic --trace {bad_dtype}", "--trace"),
    ("run mtp-dynamic --trace {bad_missing}", "--trace"),
    ("run mtp-dynamic --trace {bad_width}", "--trace"),
    ("run mtp-dynamic --trace {bad_accepted}", "--trace"),
    ("run mtp-dynamic --trace {bad_nan}", "--trace"),
    ("run mtp-dynamic --trace {bad_int}", "--trace"),
    ("run mtp-dynamic --trace {bad_drafts}", "--trace"),
    ("run mtp-dynamic --trace {bad_rounds}", "--trace"),
    # KV page scenarios
    ("run cpu-page-restore --page-size 100", "--page-size"),
    ("run cpu-page-restore --page-size ''", "--page-size"),
    ("run cpu-page-restore --page-size 16,,32", "--page-size"),
    ("run cpu-page-restore --pages 0", "--pages"),
    ("run cpu-page-restore --pages lots", "--pages"),
    ("run cpu-page-restore --tp 3", "--tp"),
    ("run cpu-page-restore --tp 0", "--tp"),
    ("run cpu-page-restore --tp 1,1", "--tp"),
    ("run cpu-page-restore --variant teleport", "--variant"),
    ("run cpu-page-restore --preset tiny-gdn,tiny-gdn", "--preset"),
    ("run cpu-page-restore --preset nope", "--preset"),
    ("run cpu-page-restore --backend fla", "--backend"),
    ("run cpu-page-restore --seed -5", "--seed"),
    ("run cpu-page-restore --rep 0", "--rep"),
    ("run pd-roundtrip --tp-pairs 1-2", "--tp-pairs"),
    ("run pd-roundtrip --tp-pairs 1:3", "--tp-pairs"),
    ("run pd-roundtrip --page-tokens 8", "--page-tokens"),
    ("run pd-roundtrip --out {file}", "--out"),
    ("run pd-roundtrip --tp 2", "--tp"),  # pd-roundtrip takes --tp-pairs
    # issue 17: the option the line names is the one to change
    ("run mtp-fixed --drafts 100", "--drafts"),  # the default history is fine; the drafts are too many
    ("run mtp-fixed --drafts 100 --history-len 16", "--history-len"),  # asked for both: the history is short
    ("run decode --rounds 100000000", "--rounds"),  # memory: the rounds, not the default batch
    ("run pd-roundtrip --transport carrier-pigeon", "--transport"),
    ("run mtp-dynamic --trace {file}", "--trace"),  # not a torch.save file at all
    ("run mtp-dynamic --trace {trace} --check-requests 3", "--check-requests"),
    ("run decode --autotune-cache /proc/nope/x.json", "--autotune-cache"),  # checked like --out
    ("run decode --autotune-cache {file}/cache.json", "--autotune-cache"),
    ("run pd-roundtrip --tp-pairs 1:16", "--tp-pairs"),  # 8 KV heads replicate, 2 SSM key heads cannot split
    ("run pd-roundtrip --preset tiny-kda --tp-pairs 4:1", "--tp-pairs"),
    ("run cpu-page-restore --tp 4", "--tp"),  # tiny-gdn's SSM layers have 2 key heads
    # issue 24: output paths that took hours to fail, or wrote where nobody meant
    ("gate --junit /dev/full", "--junit"),  # took the probe, then ENOSPC after every case had run
    ("gate --junit {dir}/no-such-folder/gate.xml", "--junit"),
    ("gate --junit ''", "--junit"),
    ("run decode --out ''", "--out"),  # Path('') is the current folder
    ("run decode --dump ''", "--dump"),
    ("run decode --dump {dump}", "--dump"),  # holds a dump: two runs' rounds would mix
    ("run decode --foo", "--foo"),
    ("run decode --autotune maybe", "--autotune"),
]


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory, make_trace) -> dict[str, Path]:
    """The placeholders: a plain file, a folder, a missing path, a good trace and broken copies of it."""
    root = tmp_path_factory.mktemp("inputs")
    (root / "file.txt").write_text("not a folder")
    (root / "garbage.bin").write_bytes(b"\x00not json, not a trace")
    trace = make_trace(root / "good.trace")  # tiny-gdn, batch 2, drafts 2, 4 rounds, widths vary
    (root / "dump").mkdir()
    (root / "dump" / "round-00000.pt").write_bytes(b"a round of an earlier dump")
    out = {"file": root / "file.txt", "dir": root, "missing": root / "missing.trace", "trace": trace,
           "garbage": root / "garbage.bin", "dump": root / "dump"}

    def broken(name: str, edit) -> None:
        data = torch.load(trace, weights_only=True)
        edit(data)
        torch.save(data, root / f"{name}.trace")
        out[name] = root / f"{name}.trace"

    first = lambda d: d["rounds"][0]  # noqa: E731
    broken("bad_dtype", lambda d: first(d).update(mixed_qkv=first(d)["mixed_qkv"].float()))
    broken("bad_missing", lambda d: d.pop("params"))
    broken("bad_width", lambda d: first(d)["widths"].__setitem__(0, 9))
    broken("bad_accepted", lambda d: d["rounds"][1].update(widths=torch.tensor([2, 2], dtype=torch.int32),
                                                            accepted=torch.tensor([0, 2], dtype=torch.int32)))
    broken("bad_nan", lambda d: first(d)["a"].view(-1).__setitem__(0, math.nan))
    broken("bad_int", lambda d: first(d).update(widths=first(d)["widths"].float()))
    broken("bad_drafts", lambda d: d.update(drafts=-1))
    broken("bad_rounds", lambda d: d.update(rounds=[]))
    return out


def test_the_table_is_large_enough():
    assert len(BAD) >= 40
    assert len({args for args, _ in BAD}) == len(BAD)


@pytest.mark.parametrize(("args", "flag"), BAD, ids=[a for a, _ in BAD])
def test_bad_invocation(args: str, flag: str, paths: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    import shlex

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # as a user's shell has it, unless the case sets it
    if args.startswith("TRITON_INTERPRET=1 "):
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        args = args.removeprefix("TRITON_INTERPRET=1 ")
    out = tmp_path / "out"
    argv = shlex.split(args.format(**{k: str(v) for k, v in paths.items()}))
    if "--out" not in argv:
        argv += ["--out", str(out)]
    start = time.perf_counter()
    result = runner.invoke(app, argv)
    took = time.perf_counter() - start
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and flag in lines[0], lines[0]
    named = re.findall(r"--[a-z][a-z-]*", lines[0])
    assert named and named[0] == flag, f"the first option named should be {flag}: {lines[0]}"
    assert "Traceback" not in result.output and "KeyError" not in result.output
    assert not out.exists() or not any(out.iterdir())
    assert took < 10, f"{took:.1f} s: validation must fail before any work"


def test_bad_invocation_of_the_real_program_is_one_line(tmp_path: Path) -> None:
    """The installed entry point too (a fresh process, stderr apart from stdout)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "harness", "run", "decode", "--batch", "2,,4", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["error: --batch has an empty item in '2,,4'"]
    assert not (tmp_path / "out").exists()


def test_the_batch_of_a_trace_is_named_as_the_traces(paths: dict[str, Path], tmp_path: Path) -> None:
    """With --trace the batch came from the file, so the line must not send the user to --batch."""
    result = runner.invoke(app, ["run", "mtp-dynamic", "--trace", str(paths["trace"]), "--check-requests", "3",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip().endswith("(the trace's batch)"), result.output


def test_out_empty_writes_nothing_into_the_current_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", "decode", "--out", ""])
    assert result.exit_code == 2 and list(tmp_path.iterdir()) == []
    assert result.output.startswith("error: Invalid value for '--out': an empty path")


def test_usage_errors_suggest_only_what_the_command_takes() -> None:
    """`--foo` was answered "Possible options: --out" (the shared `--` made them look alike) and `--autotune
    maybe` suggested levels that `harness run` then refuses."""
    foo = runner.invoke(app, ["run", "decode", "--foo"]).output
    assert foo.startswith("error: No such option: --foo (see ") and "Possible" not in foo
    near = runner.invoke(app, ["run", "decode", "--round", "3"]).output
    assert "(Possible options: --rounds)" in near
    maybe = runner.invoke(app, ["run", "decode", "--autotune", "maybe"]).output
    assert maybe.strip() == "error: --autotune takes cache-only or off in a run, got 'maybe'"
    force = runner.invoke(app, ["run", "decode", "--autotune", "force"]).output
    assert "takes cache-only or off in a run, got 'force' (tuning is `harness autotune" in force


def test_a_junit_write_that_fails_at_the_end_is_one_line_after_the_verdict(tmp_path: Path, monkeypatch) -> None:
    """The disk can still fill while the gate runs: the verdict is printed, then one line, exit 1."""
    import harness.gate as gate

    monkeypatch.setattr(gate, "tiny_cases", lambda: [("mtp-fixed", {"preset": "tiny-gdn", "batch": "2", "drafts": 1,
                                                                     "rounds": 3, "history_len": 4})])

    def full(verdict, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gate, "write_junit", full)
    junit = tmp_path / "gate.xml"
    result = runner.invoke(app, ["gate", "--backend", "torch", "--junit", str(junit), "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("PASS: ") and "Traceback" not in result.output
    assert result.stderr.splitlines()[-1] == f"error: --junit {junit} not written: [Errno 28] No space left on device"


def test_junit_may_go_into_the_out_folder_the_gate_makes(tmp_path: Path) -> None:
    from harness.writable import check_output_file_in

    out = tmp_path / "runs"
    check_output_file_in(out / "gate.xml", "--junit", made=out)  # .ci/run on a clean checkout
    with pytest.raises(ValueError, match="does not exist; make it first"):
        check_output_file_in(out / "sub" / "gate.xml", "--junit", made=out)
