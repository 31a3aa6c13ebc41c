"""Run directories: writing one (`RunWriter`) and reading one back (`load_run`, `latest_run`).

A run lives in `<root>/<run-id>/` (SPEC §9):

    manifest.json      what ran, where, with which code (harness.env.manifest) + run_id, finished_utc
    throughput.csv     one row per case x mode x backend (results.schema.COLUMNS), validated
    equivalence.json   every comparison (harness.equivalence.Comparison.to_dict records)
    equivalence.md     the same, grouped by scenario and contract
    autotune.jsonl     one record per autotune candidate
    oom.jsonl          one record per out-of-memory case or candidate
    figures/*.png

Atomicity: the writer builds everything in `<root>/<run-id>.partial/` and renames it to
`<root>/<run-id>/` only in `finish()`. Until then rows and comparisons are also appended to
`rows.jsonl` / `equivalence.jsonl` there, so a crash loses nothing. A run that fails (an exception
inside `with RunWriter(...)`, or rows that break the schema at `finish`) keeps its `.partial`
directory, with `FAILED.txt` saying why, for forensics (a traceback; for Ctrl-C, in words: where the
run was and what it holds so far); `load_run` refuses `.partial` directories, saying what is known of
one (`describe_partial`), and `latest_run` skips them, so nothing incomplete is ever read as a run.

Run ids sort by time: `20261202T153045Z-<tag>-<6 hex>` (UTC, then a short scenario tag, then a
random suffix so two runs started in the same second do not collide).
"""

from __future__ import annotations

import datetime
import json
import re
import secrets
import traceback
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from harness.equivalence import Comparison, EquivalenceReport
from results.schema import COLUMN_NAMES, COLUMNS_BY_NAME, SchemaError, pandas_dtypes, round_bytes, validate_rows

PARTIAL_SUFFIX = ".partial"
INTERRUPTED = "interrupted at"  # FAILED.txt's first line after Ctrl-C: `interrupted at <phase> of <case>`
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def new_run_id(tag: str = "run", now: datetime.datetime | None = None) -> str:
    """`<UTC timestamp>-<tag>-<random hex>`; the tag is lower-cased and reduced to [a-z0-9-]."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    clean = re.sub(r"[^a-z0-9]+", "-", tag.lower()).strip("-")[:24] or "run"
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{clean}-{secrets.token_hex(3)}"


class RunWriter:
    """Builds one run directory; use as a context manager so a failure is recorded.

    Example:
        with RunWriter("results/runs", manifest=env.manifest(...), tag="decode") as run:
            run.add_row({...})
            run.add_equivalence(comparison)
        # left the block normally: finished and renamed; with an exception: .partial + FAILED.txt
    """

    def __init__(self, root: str | Path, run_id: str | None = None, *, manifest: dict, tag: str = "run") -> None:
        self.run_id = run_id or new_run_id(tag)
        if not _RUN_ID.match(self.run_id) or self.run_id.endswith(PARTIAL_SUFFIX):
            raise ValueError(f"run id {self.run_id!r} must match {_RUN_ID.pattern} and not end in {PARTIAL_SUFFIX}")
        self.root = Path(root)
        self.final_dir = self.root / self.run_id
        self.partial_dir = self.root / (self.run_id + PARTIAL_SUFFIX)
        for existing in (self.final_dir, self.partial_dir):
            if existing.exists():
                raise FileExistsError(f"run directory {existing} already exists")
        (self.partial_dir / "figures").mkdir(parents=True)
        for name in ("rows.jsonl", "equivalence.jsonl", "autotune.jsonl", "oom.jsonl"):
            (self.partial_dir / name).touch()
        self._manifest = dict(manifest)
        self._rows: list[dict] = []
        self._report = EquivalenceReport()
        self._state = "open"  # open | finished | failed

    @property
    def path(self) -> Path:
        """The run's directory now: `.partial` until `finish()`, the final one after."""
        return self.final_dir if self._state == "finished" else self.partial_dir

    def add_row(self, row: dict) -> None:
        """One throughput row; `run_id` is filled in. Unknown columns are rejected at once."""
        self._check_open()
        unknown = sorted(set(row) - set(COLUMNS_BY_NAME))
        if unknown:
            raise SchemaError(f"unknown columns {unknown} in row {row}")
        row = {**round_bytes(row), "run_id": self.run_id}
        self._rows.append(row)
        self._append("rows.jsonl", row)

    def add_rows(self, rows: Iterable[dict]) -> None:
        for row in rows:
            self.add_row(row)

    def add_equivalence(self, item: Comparison | EquivalenceReport | Iterable[Comparison]) -> None:
        self._check_open()
        if isinstance(item, EquivalenceReport):
            comparisons = item.comparisons
        elif isinstance(item, Comparison):
            comparisons = [item]
        else:
            comparisons = list(item)
        for c in comparisons:
            self._report.add(c)
            self._append("equivalence.jsonl", c.to_dict())

    def add_ceiling(self, name: str, entry: dict) -> None:
        """A ceiling measured during the run (e.g. a PD link), written with the manifest's others."""
        self._check_open()
        self._manifest["ceilings"] = {**(self._manifest.get("ceilings") or {}), name: entry}

    def add_autotune(self, record: dict) -> None:
        self._check_open()
        self._append("autotune.jsonl", record)

    def add_oom(self, record: dict) -> None:
        self._check_open()
        self._append("oom.jsonl", record)

    def figure_path(self, name: str) -> Path:
        """Where figure `name` (e.g. `decode-gdn-throughput.png`) goes in this run."""
        if "/" in name or name.startswith("."):
            raise ValueError(f"figure name {name!r} must be a plain file name")
        return self.path / "figures" / name

    @property
    def equivalence(self) -> EquivalenceReport:
        return self._report

    def finish(self) -> Path:
        """Validate and write the final files, then rename `.partial` to the run id; returns the run path."""
        self._check_open()
        try:
            rows = validate_rows(pd.DataFrame(self._rows, columns=COLUMN_NAMES))
            rows.to_csv(self.partial_dir / "throughput.csv", index=False)
            (self.partial_dir / "equivalence.json").write_text(self._report.to_json())
            (self.partial_dir / "equivalence.md").write_text(self._report.to_markdown())
            finished = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            manifest = {
                **self._manifest, "run_id": self.run_id, "finished_utc": finished,
                "rows": len(rows), "equivalence_passed": self._report.passed,
            }  # fmt: skip
            (self.partial_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, default=_jsonable))
            for name in ("rows.jsonl", "equivalence.jsonl"):
                (self.partial_dir / name).unlink()
            self.partial_dir.rename(self.final_dir)
        except BaseException as exc:
            self.abort(exc)
            raise
        self._state = "finished"
        return self.final_dir

    def abort(self, error: BaseException | str) -> Path:
        """Mark the run failed: it stays `.partial` with `FAILED.txt`; returns that directory. Ctrl-C
        (KeyboardInterrupt) is no bug: FAILED.txt says in words where it struck and what is kept."""
        if self._state == "failed":
            return self.partial_dir
        if isinstance(error, KeyboardInterrupt):
            text = self._interrupted_text(error)
        elif isinstance(error, BaseException):
            text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        else:
            text = error + "\n"
        (self.partial_dir / "FAILED.txt").write_text(text)
        self._state = "failed"
        return self.partial_dir

    def _interrupted_text(self, error: KeyboardInterrupt) -> str:
        from harness.phases import interrupted_at

        when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return (f"{INTERRUPTED} {interrupted_at(error) or 'an unknown phase'}\n\n"
                f"The run was interrupted (Ctrl-C, SIGINT) at {when} and did not finish. Kept so far: "
                f"{_known(self.partial_dir)}. No throughput.csv or equivalence.json was written; "
                "`harness report` on this folder says the same.\n")

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            if self._state == "open":
                self.abort(exc)
            if self._state == "failed" and isinstance(exc, KeyboardInterrupt):
                exc.harness_run_dir = (self.partial_dir, False)  # the CLI's line says where it is
        elif self._state == "open":
            self.finish()

    def _check_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"run {self.run_id} is {self._state}; nothing more can be added")

    def _append(self, name: str, record: dict) -> None:
        with open(self.partial_dir / name, "a") as f:
            f.write(json.dumps(record, default=_jsonable) + "\n")


def update_manifest(path: str | Path, fields: dict) -> None:
    """Add `fields` to the manifest of the finished run at `path` (what is only known after finish(),
    such as the run's wall-time profile including its figures)."""
    manifest_path = Path(path) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.update(fields)
    manifest_path.write_text(json.dumps(manifest, indent=1, default=_jsonable))


@dataclass
class Run:
    """A finished run read back. `throughput` is typed by the schema; the others are plain frames."""

    path: Path
    manifest: dict
    throughput: pd.DataFrame
    equivalence: pd.DataFrame
    comparisons: list[Comparison]
    autotune: pd.DataFrame
    oom: pd.DataFrame

    @property
    def run_id(self) -> str:
        return self.manifest.get("run_id", self.path.name)

    def equivalence_report(self) -> EquivalenceReport:
        return EquivalenceReport(self.comparisons)


def load_run(path: str | Path) -> Run:
    """Read the run directory at `path` (a finished run, or a curated reference run).

    Only `manifest.json` and `throughput.csv` are required; missing optional files read as empty.

    Raises:
        ValueError: `path` is a `.partial` (unfinished or failed) run.
        FileNotFoundError: a required file is missing.
        SchemaError: `throughput.csv` breaks the schema.
    """
    path = Path(path)
    if path.name.endswith(PARTIAL_SUFFIX):
        raise ValueError(describe_partial(path))
    for required in ("manifest.json", "throughput.csv"):
        if not (path / required).is_file():
            raise FileNotFoundError(f"{path} is not a run directory: {required} is missing")
    manifest = json.loads((path / "manifest.json").read_text())
    # Only empty cells are missing: "none" / "NA" are legitimate values (e.g. accept=none).
    raw = pd.read_csv(path / "throughput.csv", dtype=pandas_dtypes(), keep_default_na=False, na_values=[""])
    throughput = validate_rows(raw)
    comparisons = []
    if (path / "equivalence.json").is_file():
        comparisons = EquivalenceReport.from_json((path / "equivalence.json").read_text()).comparisons
    return Run(
        path=path,
        manifest=manifest,
        throughput=throughput,
        equivalence=pd.DataFrame([asdict(c) for c in comparisons]),
        comparisons=comparisons,
        autotune=_read_jsonl(path / "autotune.jsonl"),
        oom=_read_jsonl(path / "oom.jsonl"),
    )


def describe_partial(path: Path) -> str:
    """One line on a `.partial` run directory: why it is not a run, and what it holds so far."""
    failed = path / "FAILED.txt"
    if failed.is_file():
        lines = [line for line in failed.read_text(errors="replace").splitlines() if line.strip()]
        why = lines[0].strip() if lines and lines[0].startswith(INTERRUPTED) else (
            lines[-1].strip() if lines else "FAILED.txt is empty")  # a traceback's last line is the error
        state = f"a failed run (FAILED.txt: {why})"
    elif path.is_dir():
        changed = max((f.stat().st_mtime for f in path.iterdir()), default=path.stat().st_mtime)
        when = datetime.datetime.fromtimestamp(changed, datetime.timezone.utc).isoformat(timespec="seconds")
        state = (f"an unfinished run without FAILED.txt (killed, e.g. kill -9 or out of memory, or still running; "
                 f"last written {when})")
    else:
        return f"{path} does not exist"
    return f"{path} is {state}; it holds {_known(path)}; not a finished run to read"


def _known(path: Path) -> str:
    """What a `.partial` directory holds so far, in words: its rows and comparisons (failed ones counted)."""
    def records(name: str) -> list[dict]:
        try:
            text = (path / name).read_text(errors="replace")
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line cut short by the kill
                pass
        return out

    rows, comparisons = records("rows.jsonl"), records("equivalence.jsonl")
    failed = sum(not c.get("passed", True) for c in comparisons)
    last = next((c["case"] for c in reversed(comparisons) if c.get("case")), None)
    where = f", the last of case {last}" if last else ""
    return (f"{len(rows)} rows in rows.jsonl and {len(comparisons)} comparisons in equivalence.jsonl "
            f"({failed} failed{where})")


def latest_run(root: str | Path) -> Run:
    """The newest finished run under `root` (run ids sort by time); `.partial` directories are skipped."""
    root = Path(root)
    candidates = root.iterdir() if root.is_dir() else []
    runs = sorted(p for p in candidates if not p.name.endswith(PARTIAL_SUFFIX) and (p / "manifest.json").is_file())
    if not runs:
        raise FileNotFoundError(f"no finished run under {root}")
    return load_run(runs[-1])


def _read_jsonl(path: Path) -> pd.DataFrame:
    if not path.is_file():
        return pd.DataFrame()
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return pd.DataFrame(records)


def _jsonable(value: object) -> object:
    # numpy / torch scalars and paths, which json cannot write by itself
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} {value!r} to JSON")
