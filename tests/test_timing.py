"""harness.timing: sample statistics, the CPU wall timer, and (on a GPU) the graph and event timers."""

from __future__ import annotations

import math
import statistics
import time

import numpy as np
import pytest
import torch

from harness.timing import Timing, bench

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_summary_statistics_match_numpy():
    rng = np.random.default_rng(0)
    samples = list(rng.lognormal(3.0, 0.2, size=101))
    t = Timing.from_samples(samples, timer="cpu-wall", warmup=3)
    assert t.median_us == pytest.approx(np.percentile(samples, 50))
    assert t.p20_us == pytest.approx(np.percentile(samples, 20))
    assert t.p80_us == pytest.approx(np.percentile(samples, 80))
    p20, p50, p80 = np.percentile(samples, [20, 50, 80])
    assert t.noise_pct == pytest.approx((p80 - p20) / p50 * 100)
    assert t.n_samples == 101 and t.samples_us == tuple(samples)  # all samples, in the order taken
    assert math.isnan(Timing.from_samples([5.0], timer="cpu-wall", warmup=0).noise_pct)  # undefined, not 0
    with pytest.raises(ValueError, match="at least one sample"):
        Timing.from_samples([], timer="cpu-wall", warmup=0)


def test_noise_is_the_spread_people_read_not_blown_up_by_one_stall():
    """Issue 17: a relative standard deviation read 292% beside a p20-p80 of 113-117 us. The noise is that
    band's width over the median, so one stalled sample among thirty barely moves it."""
    samples = [113.0 + 4.0 * i / 28 for i in range(29)] + [20_000.0]
    t = Timing.from_samples(samples, timer="cpu-wall", warmup=0)
    assert 113 <= t.p20_us < t.p80_us <= 118
    assert t.noise_pct == pytest.approx((t.p80_us - t.p20_us) / t.median_us * 100) and t.noise_pct < 4
    assert np.std(samples, ddof=1) / np.mean(samples) * 100 > 250  # what the old definition said


def test_cpu_bench_counts_calls_and_times_only_fn():
    calls = {"fn": 0, "setup": 0}

    def fn():
        calls["fn"] += 1
        time.sleep(0.002)

    def setup():
        calls["setup"] += 1
        time.sleep(0.01)  # outside the timed span: must not show up in the samples

    t = bench(fn, device="cpu", warmup=2, rep=7, setup=setup)
    assert calls == {"fn": 9, "setup": 7}
    assert t.timer == "cpu-wall" and t.n_samples == 7 and t.warmup == 2
    assert 2000 <= t.median_us < 9000
    assert t.p20_us <= t.median_us <= t.p80_us


def test_cpu_bench_orders_fast_and_slow_work():
    fast = bench(lambda: time.sleep(0.001), device="cpu", warmup=1, rep=5)
    slow = bench(lambda: time.sleep(0.004), device="cpu", warmup=1, rep=5)
    assert slow.median_us > fast.median_us + 2000


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="rep >= 1"):
        bench(lambda: None, device="cpu", rep=0)
    with pytest.raises(ValueError, match="warmup >= 0"):
        bench(lambda: None, device="cpu", warmup=-1)
    with pytest.raises(ValueError, match="unknown timer"):
        bench(lambda: None, device="cpu", timer="wall")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        bench(lambda: None, device="cpu", timer="cuda-graph")
    with pytest.raises(ValueError, match="unsupported device"):
        bench(lambda: None, device="meta")


@pytest.mark.cuda
@needs_cuda
def test_cuda_graph_timer_batches_short_replays():
    x = torch.randn(1024, device="cuda")
    y = torch.empty_like(x)
    t = bench(lambda: torch.mul(x, 2.0, out=y), device="cuda", warmup=3, rep=20)
    assert t.timer == "cuda-graph" and t.fallback_reason is None
    assert t.replays_per_sample > 1  # a tiny kernel replays several times per sample
    assert 0 < t.median_us < 50
    torch.testing.assert_close(y, x * 2)


@pytest.mark.cuda
@needs_cuda
def test_cuda_timers_agree_on_a_long_kernel():
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.empty_like(a)
    graph = bench(lambda: torch.matmul(a, a, out=b), device="cuda", timer="cuda-graph", rep=10)
    event = bench(lambda: torch.matmul(a, a, out=b), device="cuda", timer="cuda-event", rep=10)
    assert graph.replays_per_sample == 1 and event.timer == "cuda-event"
    assert graph.median_us == pytest.approx(event.median_us, rel=0.25)


@pytest.mark.cuda
@needs_cuda
def test_auto_falls_back_to_events_when_capture_fails():
    x = torch.randn(1024, device="cuda")

    def not_capturable():
        torch.cuda.synchronize()  # synchronizing is illegal while capturing
        x.mul_(1.0)

    t = bench(not_capturable, device="cuda", warmup=2, rep=5)
    assert t.timer == "cuda-event" and "capture failed" in t.fallback_reason
    torch.randn(8, device="cuda")  # the failed capture left the process usable (RNG included)
    with pytest.raises(RuntimeError):
        bench(not_capturable, device="cuda", timer="cuda-graph", rep=5)
    torch.randn(8, device="cuda")
    assert bench(lambda: x.mul_(1.0), device="cuda", rep=5).timer == "cuda-graph"


@pytest.mark.cuda
@needs_cuda
def test_cuda_setup_runs_outside_the_timed_span():
    state = torch.randn(1 << 20, device="cuda")
    pristine = state.clone()
    big = torch.randn(1 << 26, device="cuda")
    scratch = torch.empty_like(big)

    def restore():
        state.copy_(pristine)
        scratch.copy_(big)  # a long copy that must not be timed

    with_setup = bench(lambda: state.mul_(0.5), device="cuda", rep=10, setup=restore)
    copy_only = bench(lambda: scratch.copy_(big), device="cuda", rep=10)
    assert with_setup.median_us < copy_only.median_us / 4
    assert statistics.median(with_setup.samples_us) == with_setup.median_us
