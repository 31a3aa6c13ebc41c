"""The columns of `throughput.csv` and the rules a run's rows obey (SPEC §9).

One tidy row per case x mode x backend. `COLUMNS` is the single list of columns with their type,
group and meaning; docs, validation and the loader all read it. Axes a scenario does not have are
left empty. Timing and the numbers derived from it appear only on `passed` rows; every other
status carries a `reason`.

Integer columns hold integers. Byte counts (the `_bytes` columns) may come out of a cost model or a
measurement as a mean (replay's bytes per round averaged over its fold cycle, a pool's storage over
its slots); they are rounded to the nearest whole byte once, when the row is written
(`round_bytes`), and nowhere else. Any other non-integral value in an integer column is a bug and
fails the row naming the column.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import pandas as pd


# The harness's own backends (states/base.py BACKENDS); every other backend in a row is a peer's kernels
# run as a baseline (kernels/ssm/baselines).
OUR_BACKENDS = ("torch", "triton")


class Status(str, enum.Enum):
    passed = "passed"
    mismatch = "mismatch"
    oom = "oom"
    unsupported = "unsupported"
    error = "error"


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "str" | "int" | "float"
    group: str  # identity | axis | config | status | timing | derived | cost | memory | repro
    meaning: str
    unit: str = ""  # appears in the name: us, bytes, gbps, pct, per_s


COLUMNS: list[Column] = [
    # identity: which case this row is
    Column("run_id", "str", "identity", "run directory name"),
    Column("scenario", "str", "identity",
           "decode | mtp-fixed | mtp-dynamic | checkpoint-restore | cpu-page-restore | pd-roundtrip"),
    Column("family", "str", "identity", "gdn | kda | gqa | mla"),
    Column("mode", "str", "identity", "native | compact | replay (empty for KV page rows)"),
    Column("variant", "str", "identity",
           "the mode's variant: compact accept | deferred, replay inline | precompute (empty for native and pages)"),
    Column("backend", "str", "identity", "triton | torch, or a peer's kernels as a baseline: fla | sglang | flashinfer"),
    Column("preset", "str", "identity", "model geometry preset (states/presets.py)"),
    Column("device", "str", "identity", "torch device the case ran on (cpu, cuda:0)"),
    # shape axes
    Column("batch", "int", "axis", "requests in the batch"),
    Column("drafts", "int", "axis", "draft tokens S per verify round"),
    Column("width", "int", "axis", "tokens per request per round, W = 1 + S (the max for mtp-dynamic)"),
    Column("accept", "str", "axis", "acceptance model: all | none | fixed:k | geometric:p | trace"),
    Column("state_dtype", "str", "axis", "SSM state dtype: fp32 | bf16"),
    Column("act_dtype", "str", "axis", "activation dtype: bf16 | fp32"),
    Column("history_len", "int", "axis", "replay history half-ring length Lh"),
    Column("history_dtype", "str", "axis", "replay derived-history dtype"),
    Column("gates", "str", "axis", "SSM gate inputs when not the default random: long-memory (--gates)"),
    Column("layers", "int", "axis", "layers in the case"),
    Column("tp_prefill", "int", "axis", "prefill-side tensor-parallel degree (pd-roundtrip)"),
    Column("tp_decode", "int", "axis", "decode-side tensor-parallel degree (pd-roundtrip)"),
    Column("page_size", "int", "axis", "tokens per CPU / PD page"),
    Column("direction", "str", "axis", "transfer and variant: d2h | h2d (direct), d2h-staged | h2d-staged, gather | scatter "
           "(staging page on the device), export | import (PD pages, SSM snapshots)"),
    # kernel config
    Column("config", "str", "config",
           "launch configs as JSON: {kernel: {block sizes, warps, stages}} for every kernel the row ran (SSM), "
           "or the page kernel's launch"),
    Column("config_source", "str", "config",
           "where the config came from: cached (the run's autotune cache) | shipped (tuned on this GPU model, "
           "harness/shipped_configs.json) | default (untuned) | fixed (no launch config), joined with + when a "
           "row's kernels differ"),
    # outcome
    Column("status", "str", "status", "passed | mismatch | oom | unsupported | error"),
    Column("reason", "str", "status", "why the row is not passed (required then); optional note otherwise"),
    # timing (passed rows only)
    Column("timer", "str", "timing", "cuda-graph | cuda-event | cpu-wall (CPU timings are labelled as such)"),
    Column("samples", "int", "timing", "timed samples"),
    Column("median_us", "float", "timing", "median time of one round/transfer", "us"),
    Column("p20_us", "float", "timing", "20th percentile time", "us"),
    Column("p80_us", "float", "timing", "80th percentile time", "us"),
    Column("noise_pct", "float", "timing", "the p20-p80 spread as a percentage of the median", "pct"),
    # derived from timing (passed rows only)
    Column("tokens_per_s", "float", "derived", "tokens processed per second at the median time", "per_s"),
    Column("achieved_gbps", "float", "derived", "bytes_moved / median time, in 1e9 bytes/s", "gbps"),
    Column("ceiling_pct", "float", "derived", "achieved_gbps as a percentage of ceiling_gbps", "pct"),
    # cost model and the ceiling it is judged against (any status)
    Column("bytes_moved", "int", "cost", "bytes read + written per timed call (the scenario's cost model; a mean "
           "over a fold cycle for replay), rounded to a whole byte", "bytes"),
    Column("ceiling_name", "str", "cost", "ceiling compared against (a key of the manifest's ceilings): d2d-copy "
           "| h2d-pinned | d2h-pinned | cpu-memcpy, ` xN` for N processes' copies, or a PD link measured in the run"),
    Column("ceiling_gbps", "float", "cost", "that ceiling, measured in the same run", "gbps"),
    # memory (any status: an oom row still says what it wanted)
    Column("bytes_per_request_predicted", "int", "memory", "state bytes per request from the mode's formula (docs/REPORTS.md)", "bytes"),
    Column("bytes_per_request_measured", "int", "memory", "state bytes per request, measured (allocator storage "
           "over the pool's slots), rounded to a whole byte", "bytes"),
    Column("max_concurrency", "int", "memory", "requests that fit the memory budget in this mode"),
    # reproduction
    Column("repro", "str", "repro", "command line that reruns exactly this case"),
]  # fmt: skip

COLUMN_NAMES = [c.name for c in COLUMNS]
COLUMNS_BY_NAME = {c.name: c for c in COLUMNS}
REQUIRED = ["run_id", "scenario", "family", "backend", "preset", "device", "status"]
TIMING = [c.name for c in COLUMNS if c.group == "timing"]
DERIVED = [c.name for c in COLUMNS if c.group == "derived"]
AXES = [c.name for c in COLUMNS if c.group == "axis"]
# What makes a row the same case across runs (compare matches on these).
KEY = [c.name for c in COLUMNS if c.group in ("identity", "axis") and c.name != "run_id"]

BYTE_COLUMNS = [c.name for c in COLUMNS if c.unit == "bytes"]

_PANDAS_DTYPE = {"str": "string", "int": "Int64", "float": "float64"}


def round_bytes(row: dict) -> dict:
    """`row` with its byte columns rounded to whole bytes (the one place they are rounded)."""
    out = dict(row)
    for name in BYTE_COLUMNS:
        value = out.get(name)
        if isinstance(value, float) and math.isfinite(value):
            out[name] = round(value)
    return out


class SchemaError(ValueError):
    """Rows that break the schema; the message lists every problem found."""


def pandas_dtypes() -> dict[str, str]:
    """Column -> pandas dtype used to read and normalize `throughput.csv` (nullable ints and strings)."""
    return {c.name: _PANDAS_DTYPE[c.kind] for c in COLUMNS}


def validate_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Check `df` against the schema and return it with every column, typed, in schema order.

    Rules: no unknown columns; required identity columns and `status` filled; `status` one of
    `Status`; `reason` filled on non-passed rows; timing and derived columns empty on non-passed
    rows; on passed rows timing is all-or-nothing, derived columns need timing, and
    `p20_us <= median_us <= p80_us`; no two rows share the same case key.

    Raises:
        SchemaError: listing every broken rule with the offending row numbers.
    """
    unknown = [c for c in df.columns if c not in COLUMNS_BY_NAME]
    if unknown:
        raise SchemaError(f"unknown columns {unknown}; the schema has {COLUMN_NAMES}")
    rows = df.reindex(columns=COLUMN_NAMES).reset_index(drop=True)
    for name, dtype in pandas_dtypes().items():
        try:
            rows[name] = rows[name].astype(dtype)
        except (TypeError, ValueError) as exc:
            bad = [i for i, v in rows[name].items() if not _fits(v, COLUMNS_BY_NAME[name].kind)]
            raise SchemaError(f"column {name} ({COLUMNS_BY_NAME[name].kind}) does not hold its schema type in rows "
                              f"{bad[:10]}: {exc}") from exc

    problems: list[str] = []

    def check(mask: pd.Series, what: str) -> None:
        bad = list(mask[mask.fillna(False)].index)
        if bad:
            problems.append(f"{what}: rows {bad[:10]}{' ...' if len(bad) > 10 else ''}")

    for name in REQUIRED:
        check(_empty(rows[name]), f"{name} is empty")
    known = {s.value for s in Status}
    check(~rows["status"].isin(known) & ~_empty(rows["status"]), f"status outside {sorted(known)}")
    passed = rows["status"] == Status.passed.value
    failed = ~passed & ~_empty(rows["status"])
    check(failed & _empty(rows["reason"]), "reason is empty on a non-passed row")
    for name in TIMING + DERIVED:
        check(failed & ~_empty(rows[name]), f"{name} is set on a non-passed row")
    has_timing = ~_empty(rows[TIMING]).any(axis=1)
    any_timing = ~_empty(rows[TIMING]).all(axis=1)
    check(passed & any_timing & ~has_timing, f"timing columns {TIMING} are partly filled")
    check(passed & ~_empty(rows[DERIVED]).any(axis=1) & ~has_timing, "derived columns set without timing")
    order = (rows["p20_us"] <= rows["median_us"]) & (rows["median_us"] <= rows["p80_us"])
    check(has_timing & ~order.fillna(False), "p20_us <= median_us <= p80_us does not hold")
    for name in ("median_us", "p20_us", "p80_us", "samples", "bytes_moved"):
        check(rows[name] < 0, f"{name} is negative")
    keys = rows[KEY].astype("string").fillna("")
    check(keys.duplicated(keep=False), "rows share the same case key")

    if problems:
        raise SchemaError("throughput rows break the schema:\n  " + "\n  ".join(problems))
    return rows


def _fits(value: object, kind: str) -> bool:
    if is_blank(value) or kind == "str":
        return True
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return kind == "float" or number.is_integer()


def _empty(values: pd.Series | pd.DataFrame) -> pd.Series | pd.DataFrame:
    blank = values.isna()
    if isinstance(values, pd.DataFrame):
        for name in values.columns:
            if COLUMNS_BY_NAME[name].kind == "str":
                blank[name] = blank[name] | (values[name] == "").fillna(False)
        return blank
    if COLUMNS_BY_NAME[values.name].kind == "str":
        return blank | (values == "").fillna(False)
    return blank


def column_docs() -> str:
    """The schema as a markdown table (for README / docs)."""
    lines = ["| column | type | group | meaning |", "| --- | --- | --- | --- |"]
    lines += [f"| `{c.name}` | {c.kind} | {c.group} | {c.meaning} |" for c in COLUMNS]
    return "\n".join(lines)


def is_blank(value: object) -> bool:
    """True for None, NaN, pandas NA and the empty string (how missing cells read back)."""
    if value is None or value is pd.NA or value == "":
        return True
    return isinstance(value, float) and math.isnan(value)
