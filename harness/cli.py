"""`harness`: run state-mode and KV-page scenarios, gate equivalence, report and compare runs.

\b
    harness list                          scenarios, modes, presets, kernels
    harness run decode                    the embedded default: tiny-gdn, torch backend, CPU
    harness run mtp-fixed --preset tiny-kda --drafts 3 --accept geometric:0.7
    harness gate --device cpu             every equivalence contract (docs/CONTRACTS.md); exit 1 on a failure
    harness report RUN | compare A B | plot RUN
    harness advise RUN... --preset P      which mode and drafts to run per batch and memory budget

Bad input exits with code 2 and one line naming the problem; nothing is written. A run writes
results/runs/<run-id>/ (manifest.json, throughput.csv, equivalence.json/.md, autotune.jsonl,
oom.jsonl, figures/); `harness report` renders it.
"""

# No `from __future__ import annotations` here: Typer reads the Annotated option metadata at runtime.
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from harness.progress import progress_reporter
from harness.repro import CliOption, Repro
from harness.usage import OneLineUsage
from kernels.ssm.dot_precision import DEFAULT_PRECISION, PRECISIONS

app = typer.Typer(help=__doc__, no_args_is_help=True, rich_markup_mode=None, add_completion=False, cls=OneLineUsage)
run_app = typer.Typer(help="Run one scenario: compare every mode and backend, then time them.", no_args_is_help=True)
app.add_typer(run_app, name="run")
# Piped output gets a wide console so result tables stay readable in logs.
console = Console(width=None if sys.stdout.isatty() else 160)


def print_table(console: Console, table: Any) -> None:
    from results.tables import print_table as whole  # pandas and the results package only when a table prints

    whole(console, table)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)  # one line, never wrapped
    raise typer.Exit(2)


def _guarded(fn: Callable[[], Any]) -> Any:
    """Run `fn`; bad input (ValueError) becomes one line and exit code 2, without a traceback."""
    try:
        return fn()
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))


def _interrupted(exc: KeyboardInterrupt) -> None:
    """Ctrl-C: one line saying where the run was and what it left (the runner marks both on the
    exception), then exit code 130, as a shell reports a SIGINT, without a traceback. Called once the
    progress display has stopped, so the line stands alone."""
    from harness.phases import interrupted_at

    where = interrupted_at(exc)
    line = f"interrupted at {where}" if where else "interrupted"
    if hasattr(exc, "harness_run_dir"):
        kept = exc.harness_run_dir
        if kept is None:
            line += "; nothing written"
        elif kept[1]:
            line += f"; the run had finished and is kept at {kept[0]} (figures may be missing: harness plot {kept[0]})"
        else:
            line += f"; partial run kept at {kept[0]}"
    typer.echo(line, err=True)
    raise typer.Exit(130)


# ------------------------------------------------------------------------------------------- options
def _path(value: str) -> Path:
    """Every path option's parser: `--out ''` read as Path('') is the current folder, which nobody means
    (it wrote a run into the working directory), so an empty path is refused like any bad value."""
    if not str(value).strip():
        raise typer.BadParameter("an empty path; give a folder or file name")
    return Path(value)


Preset = Annotated[str, typer.Option(help="model geometry (harness list presets)")]
Modes = Annotated[str | None, typer.Option(help="comma list of native,compact,replay (default: all three)")]
Backend = Annotated[str, typer.Option(help="comma list of torch,triton and the peers' fla,sglang,flashinfer "
                                             "(all but torch need --device cuda)")]
Device = Annotated[str, typer.Option(help="cpu or cuda[:i]")]
Batch = Annotated[str | None, typer.Option(help="comma list of batch sizes, one case each (default 4)")]
StateDtype = Annotated[str, typer.Option(help="SSM state dtype: fp32 | bf16")]
RunStateDtype = Annotated[str | None, typer.Option(help="SSM state dtype: fp32 | bf16 (default fp32, or the trace's)")]
ActDtype = Annotated[str | None, typer.Option(help="activation dtype: bf16 | fp32 (default bf16, or the trace's)")]
Seed = Annotated[int, typer.Option(help="seed of every generated input, 0 .. 2**31 - 1")]
Rounds = Annotated[int | None, typer.Option(help="rounds in the compared rollout (>= 1; a trace has its own)")]
Drafts = Annotated[int | None, typer.Option(help="draft tokens S per round, W = 1 + S (default 3)")]
Accept = Annotated[str | None, typer.Option(help="all | none | fixed:k | geometric:p | trace")]
HistoryLen = Annotated[int | None, typer.Option(help="replay history Lh (power of two, >= 4, >= W; default 16)")]
CompactCommit = Annotated[str | None, typer.Option(
    help="comma list of compact variants (default accept,deferred,accept-precompute-bf16x3,deferred-precompute-bf16x3): accept (commit replays the "
         "accepted records in one launch at accept) | deferred (the next forward of each layer applies them from the tile "
         "it loads anyway) | accept-precompute (accept, its verify outputs as matrix products at "
         f"{DEFAULT_PRECISION}; states bitwise, outputs by tolerance) | "
         f"{' | '.join('accept-precompute-' + p for p in PRECISIONS if p != DEFAULT_PRECISION)} (the same at that dot "
         "precision; tf32 is outside the fp32 contract) | deferred-precompute, deferred-precompute-<precision> (deferred, "
         "its verify outputs as matrix products after the bitwise commit of the pending records)")]
ReplayForward = Annotated[str | None, typer.Option(
    help="comma list of replay forward variants (default inline,matrix-bf16x3) (decode adds inline-matrix-bf16x3): inline (token by token) | precompute (the round's "
         f"products on tensor cores at {DEFAULT_PRECISION}, fp32-contract accuracy; outputs compared by tolerance only) | "
         f"{' | '.join('precompute-' + p for p in PRECISIONS if p != DEFAULT_PRECISION)} (the same at that dot precision; "
         "tf32 is outside the fp32 contract and reported beside) | matrix (precompute, and the history folds as matrix "
         "products too: states by tolerance, not bitwise; fp32 history only) | "
         f"{' | '.join('matrix-' + p for p in PRECISIONS if p not in (DEFAULT_PRECISION, 'tf32'))} (the same at that "
         "dot precision) | inline-matrix, inline-matrix-<precision> (inline, folding in matrix form inside its forward: "
         "states by tolerance; fp32 history only)")]
HistoryDtype = Annotated[str, typer.Option(help="replay derived-history dtype: fp32 | bf16")]
Gates = Annotated[str | None, typer.Option(
    help="gate inputs (default random): random (decays ~0.5..1, short memory) | long-memory (every per-token decay 0.995..0.9997, "
         "where bf16 state drifts most)")]
Trace = Annotated[Path | None, typer.Option(parser=_path, help="take every input from this trace file (docs/TRACE_FORMAT.md)")]
Dump = Annotated[Path | None, typer.Option(parser=_path, help="write each mode's per-round outputs and accepted states here")]
SnapshotEvery = Annotated[int, typer.Option(
    help="compare (and --dump) accepted states every N rounds and after the last (docs/TRACE_FORMAT.md)")]
CheckRequests = Annotated[int | None, typer.Option(
    help="requests compared against the fp64 reference per case, 1 .. batch (default 4, at most the batch)")]
Budget = Annotated[float, typer.Option(help="memory budget (GiB, > 0) for the max-concurrency column")]
Out = Annotated[Path | None, typer.Option(parser=_path, help="root folder of run directories (default results/runs)")]
AutotuneLevel = Annotated[str, typer.Option("--autotune", help="kernel configs: cache-only (cached, else default) | off")]
AutotuneCache = Annotated[Path | None, typer.Option(parser=_path, help="config cache file (default results/autotune/cache.json)")]
Warmup = Annotated[int, typer.Option(help="untimed calls before the samples")]
Rep = Annotated[int, typer.Option(help="timed samples per row (median, p20, p80, noise)")]
JsonOut = Annotated[bool, typer.Option("--json", help="print the rows as JSON instead of tables")]


def cli_options(scenario: str) -> tuple[CliOption, ...]:
    """The options of `harness run <scenario>`, read off the command itself (what repro lines are made of)."""
    import typer.main

    group = typer.main.get_command(app)
    try:
        command = group.commands["run"].commands[scenario]
    except KeyError:
        raise ValueError(f"`harness run` has no scenario {scenario!r}") from None
    out = []
    for p in command.params:
        if p.param_type_name != "option":
            continue
        annotation = getattr(getattr(p, "type_descriptor", None), "annotation", None)
        out.append(CliOption(p.name, p.opts[0], p.default, bool(p.is_flag), annotation is Path))
    return tuple(out)


def repro() -> Repro:
    """What the runner builds repro lines with: every `harness run` command's options (handed to it, so the
    runner never imports this module)."""
    import typer.main

    return Repro({name: cli_options(name) for name in typer.main.get_command(app).commands["run"].commands})


def _run(scenario: str, options: dict[str, Any], out: Path | None, as_json: bool) -> None:
    from harness.runner import DEFAULT_OUT, run_scenario
    from results.store import load_run
    from results.tables import render_rich

    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in options.items()}
    run = run_scenario
    if options.get("transport") == "dist":  # pd-roundtrip over a process group: harness/dist.py
        from harness.dist import run_dist as run
    try:
        with progress_reporter() as progress:
            outcome = _guarded(
                lambda: run(
                    scenario, options, argv=["harness", *sys.argv[1:]], out_root=out or DEFAULT_OUT, progress=progress,
                    repro=repro(),
                )
            )
    except KeyboardInterrupt as e:
        _interrupted(e)
    if outcome is None:  # a torchrun rank other than 0: rank 0 reports the run
        return
    if as_json:
        print(json.dumps({"run": str(outcome.path), "rows": outcome.rows}, default=str, indent=1))
    else:
        render_rich(load_run(outcome.path), console)
        # absolute, whatever --out was: the line is copied into other commands run from elsewhere
        console.print(f"run directory: {outcome.path.absolute()}", markup=False, highlight=False)
    if not outcome.equivalence.passed:
        raise typer.Exit(1)


def _own_options(values: dict[str, Any], command: Callable[..., None]) -> dict[str, Any]:
    """A run command's own options, by name (the locals() of a closure also hold what it closes over,
    which must not pass for options); `--out` and `--json` say where output goes and are not options."""
    code = command.__code__
    return {k: values[k] for k in code.co_varnames[: code.co_argcount] if k not in ("out", "as_json")}


def _ssm_command(scenario: str, drop: tuple[str, ...], rounds_help: str):
    """Register `harness run <scenario>` for an SSM scenario (the same options, scenario defaults); the
    options in `drop` mean nothing to the scenario and are left out, so `--help` is exact and giving
    one is an error rather than silently ignored."""

    def command(
        preset: Preset = "tiny-gdn",
        modes: Modes = None,
        backend: Backend = "torch",
        device: Device = "cpu",
        batch: Batch = None,
        state_dtype: RunStateDtype = None,
        act_dtype: ActDtype = None,
        seed: Seed = 0,
        rounds: Rounds = None,
        drafts: Drafts = None,
        accept: Accept = None,
        history_len: HistoryLen = None,
        history_dtype: HistoryDtype = "fp32",
        compact_commit: CompactCommit = None,
        replay_forward: ReplayForward = None,
        gates: Gates = None,
        trace: Trace = None,
        dump: Dump = None,
        snapshot_every: SnapshotEvery = 8,
        check_requests: CheckRequests = None,
        memory_budget_gib: Budget = 64.0,
        autotune: AutotuneLevel = "cache-only",
        autotune_cache: AutotuneCache = None,
        warmup: Warmup = 5,
        rep: Rep = 30,
        out: Out = None,
        as_json: JsonOut = False,
    ) -> None:
        options = {k: v for k, v in _own_options(locals(), command).items() if k not in drop}
        _run(scenario, options, out, as_json)

    import inspect

    from scenarios import SCENARIOS

    command.__doc__ = f"{SCENARIOS[scenario].help} {rounds_help}"
    sig = inspect.signature(command)
    command.__signature__ = sig.replace(parameters=[p for name, p in sig.parameters.items() if name not in drop])
    run_app.command(scenario)(command)


_ssm_command("decode", ("drafts", "accept"), "Default 64 rounds.")
_ssm_command("mtp-fixed", (), "Default 32 rounds, 3 drafts, geometric:0.7 acceptance.")
_ssm_command("mtp-dynamic", (), "Default 32 rounds, 3 drafts, geometric:0.7 acceptance.")
# checkpoint-restore compares modes with each other (not with the fp64 reference) and dumps no rounds
_ssm_command("checkpoint-restore", ("dump", "snapshot_every", "check_requests"),
             "Default 24 rounds, 3 drafts, geometric:0.7 acceptance.")


# ------------------------------------------------------------------------------------------ KV pages
PagePreset = Annotated[str, typer.Option(help="comma list of presets with GQA or MLA layers (harness list presets)")]
PageBackend = Annotated[str, typer.Option(help="comma list of torch,triton (triton needs --device cuda)")]
PageSize = Annotated[str, typer.Option(help="tokens per CPU page: comma list of powers of two, 16..1024, a case each")]
PageTokens = Annotated[str, typer.Option(help="tokens per PD page: comma list of powers of two, 16..1024, a case each")]
Pages = Annotated[str, typer.Option(help="pages per timed transfer, or auto (about 64 MiB per call on CUDA)")]
Tp = Annotated[str, typer.Option(help="comma list of TP degrees of the GPU pools (every rank simulated), a case each")]
TpPairs = Annotated[str | None, typer.Option(
    help="comma list of prefill:decode TP pairs, e.g. 1:2,8:1 (default: every pair of 1,2,4,8 the heads allow)")]
Variant = Annotated[str, typer.Option(help="comma list of direct,staged (kernel on host memory | gather + bulk DMA)")]
Transport = Annotated[str | None, typer.Option(
    help="local (default: every rank simulated in this process) | dist (ranks are processes of one torch.distributed "
         "group: prefill rank i in process i, decode rank j in process N-1-j; a pair needs max(p, d) processes)")]
Nproc = Annotated[int | None, typer.Option(
    help="dist: processes to start (one GPU each with --device cuda); default: torchrun's world size, else the "
         "GPU count, else 2 on CPU. Pairs needing more are unsupported rows (an error if asked by --tp-pairs)")]
DistBackend = Annotated[str | None, typer.Option(help="dist: auto (nccl on cuda, gloo on cpu) | nccl | gloo")]


def _page_command(scenario: str, drop: tuple[str, ...]):
    """Register `harness run <scenario>` for a KV page scenario (options it does not take are dropped)."""

    def command(
        preset: PagePreset = "tiny-gdn",
        backend: PageBackend = "torch",
        device: Device = "cpu",
        page_size: PageSize = "256",
        page_tokens: PageTokens = "256",
        pages: Pages = "auto",
        tp: Tp = "1",
        tp_pairs: TpPairs = None,
        variant: Variant = "direct,staged",
        transport: Transport = None,
        nproc: Nproc = None,
        dist_backend: DistBackend = None,
        seed: Seed = 0,
        autotune: AutotuneLevel = "cache-only",
        autotune_cache: AutotuneCache = None,
        warmup: Warmup = 5,
        rep: Rep = 30,
        out: Out = None,
        as_json: JsonOut = False,
    ) -> None:
        options = {k: v for k, v in _own_options(locals(), command).items() if k not in drop}
        _run(scenario, options, out, as_json)

    import inspect

    from scenarios import SCENARIOS

    command.__doc__ = SCENARIOS[scenario].help
    sig = inspect.signature(command)
    command.__signature__ = sig.replace(parameters=[p for name, p in sig.parameters.items() if name not in drop])
    run_app.command(scenario)(command)


_page_command("cpu-page-restore", drop=("page_tokens", "tp_pairs", "transport", "nproc", "dist_backend"))
_page_command("pd-roundtrip", drop=("page_size", "tp", "variant"))


# ---------------------------------------------------------------------------------------------- list
@app.command("list")
def list_cmd(
    what: Annotated[str, typer.Argument(help="scenarios | modes | presets | kernels | all")] = "all",
    as_json: JsonOut = False,
) -> None:
    """List scenarios, state modes, presets and kernels."""
    from harness.catalog import catalog

    data = _guarded(lambda: catalog(what))
    if as_json:
        print(json.dumps(data, indent=1))
        return
    from rich.table import Table

    for section, items in data.items():
        table = Table(title=section, title_justify="left")
        for col in items[0]:
            table.add_column(col)
        for item in items:
            table.add_row(*(str(v) for v in item.values()))
        print_table(console, table)


# ---------------------------------------------------------------------------------------------- gate
@app.command()
def gate(
    device: Device = "cpu",
    backend: Annotated[str | None, typer.Option(help="comma list; default torch, plus triton when it can run")] = None,
    shapes: Annotated[str, typer.Option(help="tiny | model (model: real preset shapes, CUDA)")] = "tiny",
    junit: Annotated[Path | None, typer.Option(parser=_path, help="also write a JUnit XML report here")] = None,
    out: Out = None,
) -> None:
    """Check every equivalence contract at gate shapes (docs/CONTRACTS.md: the contracts by name, their
    tolerances, what the gate refuses); exit 1 on a broken contract, a missing or failed variant,
    or a comparison without a partner. On CPU the Triton kernels run in the interpreter (--backend torch
    skips them)."""
    from harness.runner import DEFAULT_OUT
    from harness.writable import check_output_dir, check_output_file_in

    # bad input is one line before anything else, the interpreter restart included; where the gate
    # writes is checked before its cases run, not after them
    if shapes not in ("tiny", "model"):
        _fail(f"--shapes must be tiny or model, got {shapes!r}")
    _guarded(lambda: check_output_dir(out or DEFAULT_OUT, "--out"))
    if junit is not None:  # its folder may be --out's, which the gate makes
        _guarded(lambda: check_output_file_in(junit, "--junit", made=out or DEFAULT_OUT))
    _interpret_triton_on_cpu(device, backend)
    from harness.gate import run_gate

    try:
        with progress_reporter() as progress:
            outcome = _guarded(
                lambda: run_gate(device=device, backends=backend, shapes=shapes, junit=junit, out_root=out,
                                 progress=progress, argv=["harness", *sys.argv[1:]], repro=repro())
            )
    except KeyboardInterrupt as e:
        _interrupted(e)
    for line in outcome.lines:
        console.print(line, markup=False, highlight=False)
    console.print(f"gate report: {outcome.path}", markup=False, highlight=False)
    if outcome.junit_error:  # the verdict stands above; the report it was to go into could not be written
        typer.echo(f"error: --junit {junit} not written: {outcome.junit_error}", err=True)
        raise typer.Exit(1)
    if not outcome.passed:
        raise typer.Exit(1)


def _interpret_triton_on_cpu(device: str, backend: str | None) -> None:
    """On CPU the gate is complete only with the Triton kernels, which run there only in the interpreter."""
    import os

    wants_triton = backend is None or "triton" in backend.split(",")
    if device != "cpu" or not wants_triton or os.environ.get("TRITON_INTERPRET") == "1":
        return
    _restart_interpreted("gate", "(--backend torch skips them)")


def _restart_interpreted(command: str, note: str = "") -> None:
    """Start this command again with TRITON_INTERPRET=1, once, saying so: Triton picks interpreter or
    compiler when a kernel is defined (at import, done by now)."""
    import os

    typer.echo(f"{command}: restarting with TRITON_INTERPRET=1 so the Triton kernels run in the interpreter"
               + (f" {note}" if note else ""), err=True)
    sys.stdout.flush(), sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "harness", *sys.argv[1:]],
              {**os.environ, "TRITON_INTERPRET": "1"})


# ------------------------------------------------------------------------------------------ autotune
@app.command("autotune")
def autotune_cmd(
    target: Annotated[str, typer.Argument(help="ssm (state-mode kernels) | pages (KV page kernels)")],
    preset: Annotated[str | None, typer.Option(help="model geometry (default: the target's tiny preset)")] = None,
    batch: Annotated[str | None, typer.Option(
        help="comma list of batch sizes, one bucket each (ssm default: 4 on CUDA, 2 on CPU)")] = None,
    device: Device = "cpu",
    drafts: Drafts = None,
    history_len: Annotated[int | None, typer.Option(
        help="ssm: replay history length Lh the runs use (default 16, at least W); keys the replay kernels")] = None,
    state_dtype: StateDtype = "fp32",
    precision: Annotated[str | None, typer.Option(
        help="ssm: comma list of tl.dot precisions to tune the matrix-form kernels at, each its own cache key "
             f"({' | '.join(PRECISIONS)}; default: the ones the default run variants use)")] = None,
    page_size: Annotated[str | None, typer.Option(help="pages: comma list of page sizes in tokens (default 256)")] = None,
    tp: Annotated[str | None, typer.Option(help="pages: TP degree whose rank-0 shape is tuned (default 1)")] = None,
    level: Annotated[str, typer.Option(help="tune-missing | force | cache-only | off")] = "tune-missing",
    autotune_cache: AutotuneCache = None,
    out: Out = None,
    as_json: JsonOut = False,
) -> None:
    """Sweep kernel configs on disposable inputs; record every candidate (ok, out_of_resources,
    compile_error, mismatch, oom) and cache the fastest valid one per static key and batch bucket.

    On CPU the kernels run in the Triton interpreter (the command restarts itself with TRITON_INTERPRET=1)
    and each sweep is two candidates, the default and one other: a check of the configs and of the cache,
    not a tuning (interpreter times say nothing about a GPU). It writes only the run directory under --out
    and the cache file."""
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in _own_options(locals(), autotune_cmd).items()
               if k != "target"}
    import os

    from harness.runner import DEFAULT_OUT
    from harness.tune import plan_autotune, run_autotune

    restart = device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1"
    if restart:  # validate as the restarted process will run: kernels in the interpreter
        os.environ["TRITON_INTERPRET"] = "1"
    _guarded(lambda: plan_autotune(target, options, out or DEFAULT_OUT))  # bad input: one line, before anything
    if restart:
        _restart_interpreted("autotune")
    try:
        with progress_reporter() as progress:
            outcome = _guarded(lambda: run_autotune(target, options, argv=["harness", *sys.argv[1:]],
                                                    out_root=out or DEFAULT_OUT, progress=progress))
    except KeyboardInterrupt as e:
        _interrupted(e)
    if as_json:
        print(json.dumps({"run": str(outcome.path), "cache": str(outcome.cache), "choices": outcome.choices},
                         indent=1, default=str))
        return
    from rich.table import Table

    table = Table(title=f"autotune {target}: {outcome.cache}", title_justify="left")
    for col in ("kernel", "batch", "config", "source", "median us"):
        table.add_column(col)
    for c in outcome.choices:
        us = "-" if c["median_us"] is None else f"{c['median_us']:.1f}"
        table.add_row(c["kernel"], str(c["batch"]), json.dumps(c["config"]), c["source"], us)
    print_table(console, table)
    console.print(f"run directory: {outcome.path}", markup=False, highlight=False)


# --------------------------------------------------------------------------------- report / compare
RunArg = Annotated[Path, typer.Argument(parser=_path, help="a run directory (results/runs/<run-id>)")]


@app.command()
def report(run: RunArg, as_json: JsonOut = False, markdown: Annotated[bool, typer.Option(help="print markdown")] = False) -> None:
    """Render a run's throughput tables (native as the baseline column) and equivalence summary."""
    from results.store import load_run
    from results.tables import render_markdown, render_rich

    loaded = _guarded(lambda: load_run(run))
    if as_json:
        print(loaded.throughput.to_json(orient="records", indent=1))
    elif markdown:
        print(render_markdown(loaded))
    else:
        render_rich(loaded, console)


@app.command()
def compare(run_a: RunArg, run_b: RunArg, as_json: JsonOut = False) -> None:
    """Say same / faster / slower / ambiguous per row of B against A, from the timing spread.

    Exit code 2, with one line, when the two runs share no case (nothing to compare)."""
    from results.compare import compare_runs, comparison_table, no_common_case
    from results.store import load_run

    a, b = _guarded(lambda: (load_run(run_a), load_run(run_b)))
    df = compare_runs(a, b)
    _guarded(lambda: no_common_case(a, b, df))
    if as_json:
        print(df.to_json(orient="records", indent=1))
    else:
        print_table(console, comparison_table(df, f"{a.run_id} (A) vs {b.run_id} (B)").to_rich())


@app.command()
def plot(run: RunArg) -> None:
    """Write a run's figures (throughput, memory, speedup, bandwidth) into its figures/ folder."""
    from results.plots import plot_run
    from results.store import load_run

    made = plot_run(_guarded(lambda: load_run(run)))
    for name, what in made.items():
        console.print(f"{name}: {what}", markup=False, highlight=False)


# ---------------------------------------------------------------------------------------------- advise
@app.command()
def advise(
    runs: Annotated[list[Path], typer.Argument(parser=_path, help="run directories with decode (drafts 0) and mtp-fixed rows")],
    preset: Annotated[str, typer.Option(help="the preset whose rows are judged (harness list presets)")],
    accept: Annotated[str | None, typer.Option(help="acceptance: geometric:p (default geometric:0.7)")] = None,
    accept_profile: Annotated[str | None, typer.Option(
        help="per-position acceptance instead: a comma list such as 0.84,0.60,0.39,0.27, or a file of them")] = None,
    budget_gib: Annotated[float | None, typer.Option(
        help="memory for state (GiB); default the device's memory from the manifests (none on CPU)")] = None,
    batch: Annotated[str | None, typer.Option(
        help="comma list of batches to judge (default the measured ones; others are interpolated or not measured)")] = None,
    rest_us: Annotated[str | None, typer.Option(
        help="A,B: the rest of the model takes A + B * W us a round (W = 1 + drafts); default 0,0")] = None,
    figures: Annotated[Path | None, typer.Option(parser=_path, help="write the choice map and the frontier (PNG) into this folder")] = None,
    allow_mixed: Annotated[bool, typer.Option(help="judge runs of different devices or presets together")] = False,
    markdown: Annotated[bool, typer.Option(help="print markdown")] = False,
    as_json: JsonOut = False,
) -> None:
    """Which mode, variant, drafts and state dtype to run at each batch: every candidate that fits the memory
    budget, ranked by expected accepted tokens/s per request of the linear-attention layers (results/advise.py
    says how). Batches or drafts the rows lack are interpolated (linearly in batch) or not measured, never guessed."""
    from harness.writable import check_output_dir
    from results.advise import advise_runs

    if figures is not None:
        _guarded(lambda: check_output_dir(figures, "--figures"))
    advice = _guarded(lambda: advise_runs(runs, preset, accept=accept, accept_profile=accept_profile,
                                          budget_gib=budget_gib, batch=batch, rest_us=rest_us, allow_mixed=allow_mixed))
    made = {}
    if figures is not None:
        from results.advise_plots import write_figures

        made = write_figures(advice, figures)
    if as_json:
        print(json.dumps({**advice.to_dict(), "figures": {k: str(v) for k, v in made.items()}}, indent=1))
        return
    from results.advise_tables import render_markdown, render_rich

    if markdown:
        print(render_markdown(advice))
    else:
        render_rich(advice, console)
    for name, what in made.items():
        console.print(f"{name}: {what}", markup=False, highlight=False)
