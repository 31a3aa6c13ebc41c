"""results.headline: the modes-side-by-side frame and the README headline table of a run."""

import subprocess
import sys
from pathlib import Path

import pytest

from results.headline import headline_markdown, main, modes_side_by_side
from results.store import RunWriter, load_run

COMMAND = "harness run mtp-fixed --device cuda --batch 4,8"
MANIFEST = {"command": COMMAND, "gpu_name": "NVIDIA H200", "sm_count": 132}
MEDIAN_US = {"native": 100.0, "compact": 50.0, "replay": 200.0}
BYTES = {"native": 3 << 20, "compact": 1 << 20, "replay": 2 << 20}
CEILING_PCT = {"native": 40.0, "compact": 80.0, "replay": 20.0}  # of a 4000 GB/s d2d copy


def _row(mode: str, batch: int, status: str = "passed") -> dict:
    row = {
        "scenario": "mtp-fixed", "family": "gdn", "mode": mode, "backend": "triton", "preset": "qwen3-next",
        "device": "cuda:0", "batch": batch, "drafts": 3, "width": 4, "accept": "all", "state_dtype": "fp32",
        "act_dtype": "bf16", "layers": 2, "status": status, "ceiling_name": "d2d-copy", "ceiling_gbps": 4000.0,
        "bytes_per_request_predicted": BYTES[mode], "bytes_per_request_measured": BYTES[mode],
    }  # fmt: skip
    if mode == "replay":
        row |= {"history_len": 8, "history_dtype": "bf16"}
    if status != "passed":
        return row | {"reason": "out of memory"}
    us = MEDIAN_US[mode] * batch / 4
    return row | {
        "timer": "cuda-graph", "samples": 10, "median_us": us, "p20_us": us * 0.9, "p80_us": us * 1.1,
        "noise_pct": 1.0, "tokens_per_s": batch * 4 / us * 1e6, "achieved_gbps": CEILING_PCT[mode] * 40,
        "ceiling_pct": CEILING_PCT[mode],
    }  # fmt: skip


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """batch 4: every mode passed (compact 2x native, replay 0.5x); batch 8: replay ran out of memory."""
    with RunWriter(tmp_path, manifest=MANIFEST, tag="mtp-fixed") as writer:
        writer.add_rows(_row(mode, 4) for mode in MEDIAN_US)
        writer.add_rows([_row("native", 8), _row("compact", 8), _row("replay", 8, status="oom")])
    return writer.path


def _table(markdown: str) -> list[dict[str, str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[2:]]


def test_modes_side_by_side_has_native_as_the_speedup_baseline(run_dir: Path) -> None:
    wide = modes_side_by_side(load_run(run_dir).throughput)
    assert list(wide.index.get_level_values("batch")) == [4, 8]
    speedup = wide["speedup"]
    assert list(speedup.columns) == ["compact", "replay (Lh 8, bf16 history)"]  # no native-vs-native column
    assert speedup.loc[speedup.index[0]].tolist() == [2.0, 0.5]
    assert speedup.iloc[1, 0] == 2.0 and speedup.iloc[1].isna().iloc[1]  # the oom replay has no speedup


def test_headline_names_the_run_and_quotes_every_mode(run_dir: Path) -> None:
    text = headline_markdown(load_run(run_dir))
    first = text.splitlines()[0]
    assert first == f"run `{run_dir.name}` · NVIDIA H200 (132 SMs) · `{COMMAND}`"
    replay = "replay (Lh 8, bf16 history)"
    rows = _table(text)
    assert list(rows[0]) == [
        "scenario", "preset", "state/act dtype", "batch", "drafts",
        "native us", "compact us", f"{replay} us", "compact: x faster than native", f"{replay}: x faster than native",
        "native % d2d-copy", "compact % d2d-copy", f"{replay} % d2d-copy",
        "native bytes/req", "compact bytes/req", f"{replay} bytes/req",
    ]  # fmt: skip
    assert rows[0] == {
        "scenario": "mtp-fixed", "preset": "qwen3-next", "state/act dtype": "fp32/bf16", "batch": "4", "drafts": "3",
        "native us": "100", "compact us": "50.0", f"{replay} us": "200",
        "compact: x faster than native": "2.00x", f"{replay}: x faster than native": "0.50x",
        "native % d2d-copy": "40%", "compact % d2d-copy": "80%", f"{replay} % d2d-copy": "20%",
        "native bytes/req": "3.0 MiB", "compact bytes/req": "1.0 MiB", f"{replay} bytes/req": "2.0 MiB",
    }  # fmt: skip
    # a mode that did not pass shows its status, never a number
    assert (rows[1]["batch"], rows[1][f"{replay} us"], rows[1][f"{replay}: x faster than native"]) == ("8", "OOM", "-")


@pytest.mark.slow  # a second interpreter (2 s) for what the tests above check in-process
def test_headline_cli_prints_the_table_and_rejects_an_unknown_scenario(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = [sys.executable, "-m", "results.headline", str(run_dir), "--scenario", "mtp-fixed"]
    done = subprocess.run(cli, capture_output=True, text=True, check=True)
    assert done.stdout == headline_markdown(load_run(run_dir))
    with pytest.raises(SystemExit) as exit_info:  # in-process: a second interpreter would only re-import torch
        main([str(run_dir), "--scenario", "decode"])
    assert exit_info.value.code == 2
    assert "has no decode rows; it has mtp-fixed" in capsys.readouterr().err
