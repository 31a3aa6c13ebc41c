"""The README's H200 section, generated from the committed reference runs (never typed by hand).

Reads results/reference/<dir>/: modes/<run>/throughput.csv (the harness's own rows, tuned and untuned),
modes/times.txt (autotune and run wall seconds), gate-model/gate.md, gpu-gate-times.json (or the older
gpu-gate-times.txt), the newest gate-timed/<pass>/gpu-gate-times.json with its gate manifests,
pytest-cuda/pytest-cuda.log, pages/<run>/throughput.csv, gate-timed/ (times, logs, the model gate's
manifest and gate.md) and, where scripts/gpu_peers.sh's runs are there, peers/<run>/ (throughput.csv and
equivalence.json: ours beside the best peer row per mode, and each peer's error against fp64), and prints
markdown. With --write, replaces
the text between `<!-- h200:begin -->` and `<!-- h200:end -->` in README.md; tests/test_h200_summary.py
checks that the README holds what this prints.

    python3 scripts/h200_summary.py --write
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference" / "h200-2026-12-03"
# the newest session's runs (tuned rows of every variant, where a row's time goes, the conv), shown first; the
# one before (every SSM kernel alone, rows on the shipped configs); the newest peer runs (the field's kernels)
LATEST = ROOT / "results" / "reference" / "h200-2026-12-04c"
PREVIOUS = ROOT / "results" / "reference" / "h200-2026-12-04b"
PEERS = ROOT / "results" / "reference" / "h200-2026-12-03c"
BEGIN, END = "<!-- h200:begin -->", "<!-- h200:end -->"
# what issue 25 asks of the rows (Qwen3-Next mtp-fixed, batch 128 and 256, W = 4, fp32 state; each mode's best
# variant that holds the fp32 contract)
TARGETS_25 = {"compact accept": 1.5, "compact deferred": 2.0, "replay (best variant)": 2.5}
# the rows' variant columns first in this order, then any other variant a run has, by name
MODE_COLUMNS = ("compact accept", "compact accept-precompute-bf16x3", "compact deferred",
                "compact deferred-precompute-bf16x3", "replay inline", "replay precompute",
                "replay precompute-bf16x3", "replay matrix", "replay matrix-bf16x3")
# variants outside the fp32 contract (plain TF32 products: scenarios/tolerances.py TENSOR_CORE_OUTPUT_RMS) never
# count as a mode's best; they are reported beside
OUTSIDE_CONTRACT = ("-tf32",)
# what issue 13 asks of the rows: mode label -> minimum speed-up over native (native: % of roofline)
TARGETS = {"compact accept": 1.4, "compact deferred": 1.8, "replay (best variant)": 2.0}


def _rows(run: Path) -> list[dict]:
    with open(run / "throughput.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["status"]]


def _label(r: dict) -> str:
    return f"{r['mode']} {r['variant']}".strip() if r["mode"] != "native" else "native"


def _times(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"(\S+) rc=\S+ (\d+) s|(\S+) (\d+) s", line)
        if m:
            out[m.group(1) or m.group(3)] = int(m.group(2) or m.group(4))
    return out


def gate_times(folder: Path) -> dict:
    """The steps of one `make gpu-gate` run in `folder`: `{"cold": bool | None, "total_s": int | None,
    "steps": {name: {"rc", "seconds", "verdict"}}}`. From gpu-gate-times.json, which scripts/gpu_gate.sh
    writes (issue 23); an older reference folder has only gpu-gate-times.txt (`gate-model rc=0 178 s`),
    which gives the seconds alone (rc where the line has it, no verdict, cache state unknown)."""
    import json

    path = folder / "gpu-gate-times.json"
    if path.is_file():
        data = json.loads(path.read_text())
        return {"cold": data["cold"], "total_s": data["total_s"],
                "steps": {s["name"]: {k: s[k] for k in ("rc", "seconds", "verdict")} for s in data["steps"]}}
    steps = {}
    for line in (folder / "gpu-gate-times.txt").read_text().splitlines():
        m = re.match(r"(\S+) (?:rc=(\S+) )?(\d+) s", line)
        if m:  # a step listed twice (re-run) keeps its last line, as the text file was read before
            steps[m.group(1)] = {"rc": int(m.group(2)) if m.group(2) else None, "seconds": int(m.group(3)),
                                 "verdict": None}
    return {"cold": None, "total_s": None, "steps": steps}


def _gate_runs(folder: Path) -> dict[str, dict]:
    """`shapes -> manifest` of the gate run directories in `folder` (the tiny and model gates' own)."""
    import json

    out = {}
    for manifest in sorted(folder.glob("*-gate-*/manifest.json")):
        m = json.loads(manifest.read_text())
        argv = m.get("argv") or []
        shapes = argv[argv.index("--shapes") + 1] if "--shapes" in argv[:-1] else "tiny"
        out[shapes] = m
    return out


def gate_passes(folder: Path) -> list[str]:
    """scripts/gpu_gate_timed.sh's passes in `folder` (`<pass>/gpu-gate-times.json`): per pass its Triton
    cache state, each step's seconds and verdict, the total against SPEC §7's 5 minutes, then the gates'
    wall-time profiles and what each case still compiled on first launch."""
    passes = sorted((p for p in folder.iterdir() if (p / "gpu-gate-times.json").is_file()),
                    key=lambda p: (p.name != "cold", p.name))
    lines = ["| pass | Triton cache | gate-tiny | gate-model | pytest-cuda | total |", "| --- | --- | --- | --- | --- | --- |"]
    profiles = []
    for p in passes:
        t = gate_times(p)
        cells = []
        for name in ("gate-tiny", "gate-model", "pytest-cuda"):
            s = t["steps"].get(name)
            cells.append(f"{s['seconds']} s, {s['verdict'].split(';')[0]}" if s else "did not finish")
        over = "under" if t["total_s"] < 300 else "over"
        # a pass cut short (a step missing) has no total to hold against the 5 minutes
        total = (f"{t['total_s']} s ({over} 300)" if len(cells) == sum(c != "did not finish" for c in cells)
                 else f"incomplete ({t['total_s']} s of finished steps)")
        lines.append(f"| {p.name} | {'cold' if t['cold'] else 'warm'} | " + " | ".join(cells) + f" | {total} |")
        for shapes, m in sorted(_gate_runs(p).items(), reverse=True):
            wall, first = m.get("wall_s", {}), m.get("compiles", {}).get("first_launch", {})
            ahead = m.get("compiles", {}).get("ahead", {})
            parts = ", ".join(f"{k} {v:.0f}" for k, v in wall.items() if k != "total" and v >= 1)
            profiles.append(f"* {p.name} {shapes} gate: {wall.get('total', 0):.0f} s ({parts}); compiled ahead "
                            f"{ahead.get('specializations', '-')} specializations in {ahead.get('seconds', '-')} s, "
                            f"then {first.get('compiled', '-')} compiled on first launch "
                            f"({first.get('compile_s', '-')} s) and {first.get('loaded', '-')} loaded from the cache.")
    return lines + [""] + profiles


def newest_gate_timed() -> Path | None:
    """The newest reference folder's gate-timed/ that holds scripts/gpu_gate_timed.sh's JSON, if any."""
    found = sorted((ROOT / "results" / "reference").glob("*/gate-timed/*/gpu-gate-times.json"))
    return found[-1].parent.parent if found else None


def modes_table(ref: Path) -> list[str]:
    """One line per case: native's time and % of roofline, each other mode's speed-up, tuned vs untuned."""
    cases = sorted(p for p in (ref / "modes").iterdir() if p.is_dir() and not p.name.startswith("autotune"))
    lines = ["| case | config | native us (% roofline) | compact accept | compact deferred | replay inline | "
             "replay precompute |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for run in cases:
        rows = {(_label(r)): r for r in _rows(run) if r["backend"] == "triton" and r["status"] == "passed"}
        native = rows.get("native")
        if native is None:
            continue
        base = float(native["median_us"])
        cells = []
        for label in ("compact accept", "compact deferred", "replay inline", "replay precompute"):
            r = rows.get(label)
            cells.append(f"{base / float(r['median_us']):.2f}x" if r else "-")
        case, _, tuning = run.name.rpartition("-")
        lines.append(f"| {case} | {tuning} | {base:.0f} ({float(native['ceiling_pct']):.1f}%) | " + " | ".join(cells)
                     + " |")
    return lines


def targets_table(ref: Path) -> list[str]:
    """Issue 13's targets against the tuned Qwen3-Next batch-128 rows."""
    rows = {_label(r): r for r in _rows(ref / "modes" / "mtp-fixed-qwen3-next-b128-tuned")
            if r["backend"] == "triton" and r["status"] == "passed"}
    base = float(rows["native"]["median_us"])
    got = {"compact accept": base / float(rows["compact accept"]["median_us"]),
           "compact deferred": base / float(rows["compact deferred"]["median_us"]),
           "replay (best variant)": max(base / float(rows[k]["median_us"])
                                        for k in ("replay inline", "replay precompute"))}
    lines = ["| Qwen3-Next, batch 128, W = 4 | goal | measured | |", "| --- | --- | --- | --- |",
             f"| native, % of its roofline | >= 80% | {float(rows['native']['ceiling_pct']):.1f}% | "
             f"{'met' if float(rows['native']['ceiling_pct']) >= 80 else 'missed'} |"]
    for label, goal in TARGETS.items():
        lines.append(f"| {label} | >= {goal:.1f}x native | {got[label]:.2f}x | "
                     f"{'met' if got[label] >= goal else f'missed by {goal - got[label]:.2f}x'} |")
    return lines


def pages_table(ref: Path) -> list[str]:
    """CPU pages: GB/s (% of the pinned or d2d ceiling) per direction and page size; PD pages: export and
    import per TP pair."""
    lines = ["| run | direction | 16-token pages | 256 | 1024 |", "| --- | --- | --- | --- | --- |"]
    pd = ["| PD pages (Llama-3-8B, 128-token pages) | TP p:d | export | import |", "| --- | --- | --- | --- |"]
    for run in sorted(p for p in (ref / "pages").iterdir() if p.is_dir()):
        cells: dict[str, dict[str, str]] = {}
        for r in _rows(run):
            if r["status"] != "passed" or not r["direction"]:
                continue
            cell = f"{float(r['achieved_gbps']):.1f} GB/s ({float(r['ceiling_pct']):.0f}%)"
            if run.name.startswith("pd-"):
                cells.setdefault(f"{r['tp_prefill']}:{r['tp_decode']}", {})[r["direction"]] = cell
            else:
                cells.setdefault(r["direction"], {})[r["page_size"]] = cell
        for key, by in cells.items():
            if run.name.startswith("pd-"):
                pd.append(f"| {run.name} | {key} | {by.get('export', '-')} | {by.get('import', '-')} |")
            elif any(size in by for size in ("16", "256", "1024")):
                lines.append(f"| {run.name} | {key} | " + " | ".join(by.get(s, "-") for s in ("16", "256", "1024")) + " |")
    return lines + [""] + pd


def gate_timed(folder: Path) -> list[str]:
    """`make gpu-gate` with the gate's compile-ahead (scripts/gpu_gate_timed.sh): step times of the cold pass,
    the model gate's wall-time profile, how far each tiny gate got before its step limit."""
    import json

    steps = {}
    for line in (folder / "times.txt").read_text().splitlines():
        m = re.match(r"(\w+) (\S+) (\d+) s", line)
        if m:
            steps[(m.group(1), m.group(2))] = int(m.group(3))
    wall = json.loads((folder / "manifest.json").read_text())["wall_s"]
    verdict = next(line for line in (folder / "gate.md").read_text().splitlines() if "PASS" in line
                   or "FAIL" in line).strip("* ")
    reached = {}
    for name in ("cold", "warm"):
        log = (folder / f"{name}.log").read_text()
        tiny = log.split("--shapes tiny", 1)[1].split("== ", 1)[0] if "--shapes tiny" in log else ""
        counts = re.findall(r"gate cases: (\d+)/(\d+) after (\d+) s", tiny)
        reached[name] = f"{counts[-1][0]} of {counts[-1][1]} cases after {counts[-1][2]} s" if counts else "no case"
    return [
        f"With the gate's compile-ahead (every Triton specialization compiled in 16 processes first; "
        f"`scripts/gpu_gate_timed.sh`): the cold model gate {verdict.split(';')[0]} in {wall['total']:.0f} s "
        f"(setup {wall['setup']:.0f}, compile {wall['compile']:.0f}, rollout {wall['rollout']:.0f}, compare "
        f"{wall['compare']:.0f}), {wall['total'] - 120:.0f} s over its 2-minute target; the cold tiny gate reached "
        f"{reached['cold']} (step {steps.get(('cold', 'gate-tiny'), '-')} s, stopped) and the warm one "
        f"{reached['warm']} before the call ended, so a whole warm `make gpu-gate` is not measured yet."]


OURS = ("triton", "torch")  # results/schema.py OUR_BACKENDS: every other backend is a peer's kernels


def _speed(ours: float, peer: float) -> str:
    return f"{peer / ours:.2f}x faster" if peer >= ours else f"{ours / peer:.2f}x slower"


def peers_table(ref: Path) -> list[str]:
    """Per run, mode and batch of peers/: our fastest passed variant beside the fastest passed peer row of
    the same mode, and how ours compares; then each peer variant's worst RMS error against the fp64
    reference (outputs and accepted states, over the run's rounds and layers). Nothing without peers/."""
    folder = ref / "peers"
    if not folder.is_dir():
        return []
    import json

    lines = ["| run | mode | batch | ours us (variant) | best peer us (peer) | ours vs the peer |",
             "| --- | --- | --- | --- | --- | --- |"]
    errors: dict[str, dict[str, float]] = {}
    for run in sorted(p for p in folder.iterdir() if (p / "throughput.csv").is_file()):
        rows = [r for r in _rows(run) if r["status"] == "passed" and r["median_us"]]
        for mode in ("native", "compact", "replay"):
            for batch in sorted({r["batch"] for r in rows if r["mode"] == mode}, key=int):
                here = [r for r in rows if r["mode"] == mode and r["batch"] == batch]
                ours = min((r for r in here if r["backend"] in OURS), key=lambda r: float(r["median_us"]), default=None)
                peer = min((r for r in here if r["backend"] not in OURS), key=lambda r: float(r["median_us"]),
                           default=None)
                if ours is None or peer is None:
                    continue
                name = " ".join(x for x in (peer["backend"], peer["variant"]) if x)
                o, p = float(ours["median_us"]), float(peer["median_us"])
                lines.append(f"| {run.name} | {mode} | {batch} | {o:.1f} ({_label(ours)}) | {p:.1f} ({name}) | "
                             f"{_speed(o, p)} |")
        eq = run / "equivalence.json"
        for c in json.loads(eq.read_text())["comparisons"] if eq.is_file() else []:
            if c["contract"] == "baseline" and c["rhs"] == "fp64-reference":
                worst = errors.setdefault(c["lhs"], {})
                value = float(c["rms_ratio_max"] or c["rms_ratio"])
                worst[c["name"]] = max(worst.get(c["name"], 0.0), value)
    lines += ["", "| peer variant | outputs: worst RMS vs fp64 | accepted states: worst RMS vs fp64 |",
              "| --- | --- | --- |"]
    lines += [f"| {lhs} | {e.get('o', float('nan')):.2g} | {e.get('ssm', float('nan')):.2g} |"
              for lhs, e in sorted(errors.items())]
    return lines


def _by_batch(run: Path) -> dict[str, dict[str, dict]]:
    """batch -> {mode label: row} of a run's passed triton rows."""
    out: dict[str, dict[str, dict]] = {}
    for r in _rows(run):
        if r["backend"] == "triton" and r["status"] == "passed":
            out.setdefault(r["batch"], {})[_label(r)] = r
    return out


def _outside_contract(label: str) -> bool:
    return label.endswith(OUTSIDE_CONTRACT)


def latest_modes(ref: Path) -> list[str]:
    """One line per (run, batch): native's time and % of roofline, each other variant's speed-up (a column per
    variant any run has: `MODE_COLUMNS` first)."""
    runs = sorted(p for p in (ref / "modes").iterdir() if p.is_dir())
    seen = {k for run in runs for rows in _by_batch(run).values() for k in rows if k != "native"}
    labels = [k for k in MODE_COLUMNS if k in seen] + sorted(seen - set(MODE_COLUMNS))
    lines = ["| case | batch | native us (% roofline) | " + " | ".join(labels) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in labels) + " |"]
    for run in runs:
        for batch, rows in sorted(_by_batch(run).items(), key=lambda kv: int(kv[0])):
            native = rows.get("native")
            if native is None:
                continue
            base = float(native["median_us"])
            cells = [f"{base / float(rows[k]['median_us']):.2f}x" if k in rows else "-" for k in labels]
            lines.append(f"| {run.name.rpartition('-')[0]} | {batch} | {base:.0f} ({float(native['ceiling_pct']):.1f}%) | "
                         + " | ".join(cells) + " |")
    return lines


def latest_targets(ref: Path) -> list[str]:
    """Issue 25's targets against the Qwen3-Next mtp-fixed rows, per batch."""
    run = next(p for p in (ref / "modes").iterdir() if p.name.startswith("mtp-fixed-qwen3-next"))
    lines = ["| Qwen3-Next mtp-fixed, W = 4 | batch | goal | measured | |", "| --- | --- | --- | --- | --- |"]
    for batch, rows in sorted(_by_batch(run).items(), key=lambda kv: int(kv[0])):
        base = float(rows["native"]["median_us"])
        # each the best of its variants that hold the fp32 contract (accept and accept-precompute*, deferred and
        # deferred-precompute*, every replay variant), never one outside it (plain tf32)
        def best(prefix: str) -> float:
            return max(base / float(r["median_us"]) for k, r in rows.items()
                       if k.startswith(prefix) and not _outside_contract(k))

        got = {"compact accept": best("compact accept"), "compact deferred": best("compact deferred"),
               "replay (best variant)": best("replay")}
        for label, goal in TARGETS_25.items():
            verdict = "met" if got[label] >= goal else f"missed by {goal - got[label]:.2f}x"
            lines.append(f"| {label} | {batch} | >= {goal:.1f}x native | {got[label]:.2f}x | {verdict} |")
    return lines


def precompute_kernels(ref: Path, folder: str = "precompute") -> list[str]:
    """The matrix-form kernels alone per dot precision beside the token loops, each at its best config
    (scripts/gpu_precompute.sh's sweep in `ref / folder`)."""
    with open(ref / folder / "kernels.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    best: dict[str, dict] = {}
    for r in rows:
        key = r["kernel"] + (f" `{r['precision']}`" if r["precision"] else "")
        if key not in best or float(r["median_us"]) < float(best[key]["median_us"]):
            best[key] = r
    lines = ["| kernel (batch 128, one layer) | us | % of copy ceiling | config |", "| --- | --- | --- | --- |"]
    for key, r in sorted(best.items(), key=lambda kv: float(kv[1]["median_us"])):
        extra = f", BK {r['BK']}" if r["BK"] else ""
        lines.append(f"| {key} | {float(r['median_us']):.1f} | {float(r['ceiling_pct']):.1f} | BV {r['BV']}, "
                     f"{r['warps']} warps{extra} |")
    return lines


def _gate_verdict(ref: Path) -> str:
    return next(line for line in (ref / "gate-model" / "gate.md").read_text().splitlines() if "PASS" in line
                or "FAIL" in line).strip("* ")


def profile_table(ref: Path) -> list[str]:
    """scripts/profile_rows.py's per-kernel device time of each profiled variant (`ref/profile/profile.csv`):
    the row's round time, then each kernel that takes at least 1% of it, per launch and launches a round."""
    with open(ref / "profile" / "profile.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    lines = ["| variant (batch 128) | row us a round | kernels: us a launch x launches a round |", "| --- | --- | --- |"]
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant and float(r["share"]) >= 0.01]
        parts = ", ".join(f"{r['kernel'].removesuffix('_kernel')} {float(r['us_per_round']) / float(r['launches_per_round']):.1f}"
                          f" x {float(r['launches_per_round']):.0f}" for r in mine)
        lines.append(f"| {variant.rsplit(' batch', 1)[0]} | {float(mine[0]['row_median_us']):.0f} | {parts} |")
    return lines


def latest(ref: Path = LATEST) -> list[str]:
    return [
        f"**Latest** (`{ref.relative_to(ROOT)}/`, its README says what ran): the harness's rows, tuned "
        "(`scripts/gpu_modes.sh`: `harness autotune ssm` at both dot precisions, then `harness run` with that cache; "
        "fp32 state, speed-up = native's time over the mode's), every variant of each mode:",
        "",
        *latest_modes(ref),
        "",
        *latest_targets(ref),
        "",
        "Where a row's round goes (`scripts/profile_rows.py`, the same rounds profiled eagerly after the row's "
        "timing, on the tree before the conv rewrite; 36 layers a round):",
        "",
        *profile_table(ref),
        "",
        f"**Ours beside the field's kernels** (`{PEERS.relative_to(ROOT)}/peers/`, `scripts/gpu_peers.sh`: fla, "
        "SGLang and FlashInfer as baseline backends of the same runs, same rounds; their errors against fp64 are "
        "reported, not gated):",
        "",
        *peers_table(PEERS),
        "",
        f"**The session before** (`{PREVIOUS.relative_to(ROOT)}/`), its rows on the shipped configs of then (the "
        "matrix-form kernels on their defaults):",
        "",
        *latest_modes(PREVIOUS),
        "",
        "Each SSM kernel alone, one layer, at its best config of a sweep and per dot precision "
        "(`scripts/gpu_precompute.sh`):",
        "",
        *precompute_kernels(PREVIOUS, "precompute"),
        "",
        "**Before that** (`results/reference/h200-2026-12-03/`):",
        "",
    ]


def summary(ref: Path = REFERENCE) -> str:
    times = _times(ref / "modes" / "times.txt")
    gate_steps = gate_times(ref)["steps"]
    verdict = _gate_verdict(ref)
    pytest_line = (ref / "pytest-cuda" / "pytest-cuda.log").read_text().strip().splitlines()[-1]
    rel = ref.relative_to(ROOT)
    timed = newest_gate_timed()
    gate = [f"**`make gpu-gate`** (`scripts/gpu_gate_timed.sh`, `{timed.relative_to(ROOT)}/`: from a cold Triton cache, "
            "then warm; SPEC §7: under 5 minutes, the model gate under 2):", "", *gate_passes(timed), ""] if timed else []
    out = [
        f"Generated by `scripts/h200_summary.py` from `{LATEST.relative_to(ROOT)}/` and `{rel}/` (their READMEs say "
        "what ran, on which commit).",
        "",
        *gate,
        *(latest() if LATEST.exists() else []),
        "**The modes, in the harness's own rows** (`scripts/gpu_modes.sh`: per-kernel `harness autotune ssm`, then "
        "`harness run` with that cache, `tuned`, and with `--autotune off`, `untuned`; fp32 state, 36 (Qwen3-Next) or "
        "34 (GLM) layers a round, median of CUDA-graph replays; speed-up = native's time over the mode's):",
        "",
        *modes_table(ref),
        "",
        *targets_table(ref),
        "",
        f"Autotune wall time (8 kernels, one batch): Qwen3-Next {times.get('autotune-qwen3-next-d3', '-')} s, "
        f"GLM-5.3-Flash {times.get('autotune-glm-5.3-flash-tp8-d3', '-')} s, Qwen3-Next decode "
        f"{times.get('autotune-qwen3-next-d0', '-')} s.",
        "",
        f"**Model-shape gate** (`harness gate --device cuda --shapes model`): {verdict}; "
        f"{gate_steps.get('gate-model', {}).get('seconds', '-')} s from a cold Triton cache. `pytest -m cuda`: "
        f"{pytest_line}. The tiny gate did not finish in {gate_steps.get('gate-tiny', {}).get('seconds', '-')} s "
        "(compiles; see the run's README).",
        "",
        *gate_timed(ref / "gate-timed"),
        "",
        "**KV pages** (`scripts/gpu_pages_bench.sh`, Llama-3-8B GQA and DeepSeek-V3 MLA, 64 MiB transfers, ceilings "
        "measured in the same run):",
        "",
        *pages_table(ref),
    ]
    peers = peers_table(ref)
    if peers:
        out += ["", "**Ours beside the field's kernels** (`scripts/gpu_peers.sh`: fla, SGLang and FlashInfer as "
                "baseline backends of the same runs, same rounds; their errors against fp64 are reported, not gated):",
                "", *peers]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="replace the README's generated section")
    args = ap.parse_args()
    text = summary()
    if not args.write:
        sys.stdout.write(text)
        return
    readme = ROOT / "README.md"
    body = readme.read_text()
    if BEGIN not in body or END not in body:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} section")
    head, rest = body.split(BEGIN, 1)
    readme.write_text(head + BEGIN + "\n" + text + END + rest.split(END, 1)[1])


if __name__ == "__main__":
    main()
