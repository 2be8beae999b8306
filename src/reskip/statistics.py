"""The bootstrap over sequences that every paired comparison of the project reports with."""

from __future__ import annotations

import numpy as np


def _paired(statistic, n: int, n_boot: int, seed: int) -> dict:
    """statistic(idx) over all n sequences, with the 95% interval of its values over n_boot resamples of them (the
    same draws for every statistic of a given seed)."""
    point = statistic(np.arange(n))
    rng = np.random.default_rng(seed)
    draws = [statistic(rng.integers(0, n, n)) for _ in range(n_boot)]
    lo, hi = np.quantile(draws, [0.025, 0.975])
    return {"mean": float(point), "lo": float(lo), "hi": float(hi)}


def bootstrap_difference(full: np.ndarray, a: np.ndarray, b: np.ndarray, targets: np.ndarray,
                         n_boot: int = 1000, seed: int = 0) -> dict:
    """ppl(a)/ppl(full) - ppl(b)/ppl(full) over sequences, with its 95% bootstrap interval.

    full, a, b: per-sequence NLL sums; targets: per-sequence labelled-target counts."""
    def ratio(nll, idx):
        return np.exp((nll[idx].sum() - full[idx].sum()) / targets[idx].sum())

    return _paired(lambda idx: ratio(a, idx) - ratio(b, idx), len(full), n_boot, seed)


def bootstrap_mean_difference(a: np.ndarray, b: np.ndarray, counts: np.ndarray, n_boot: int = 1000,
                              seed: int = 0) -> dict:
    """sum(a)/sum(counts) - sum(b)/sum(counts) over sequences (a mean per position of two paired per-sequence sums:
    KL to the backbone, top-1 agreements), with its 95% bootstrap interval (the same draws as
    `bootstrap_difference`)."""
    def mean(x, idx):
        return x[idx].sum() / counts[idx].sum()

    return _paired(lambda idx: mean(a, idx) - mean(b, idx), len(counts), n_boot, seed)


def bootstrap_sum_ratio(a: np.ndarray, b: np.ndarray, n_boot: int = 1000, seed: int = 0) -> dict:
    """sum(a) / sum(b) over sequences (of two paired per-sequence sums over the same positions: one KL to the
    backbone over another), with its 95% bootstrap interval (the same draws as `bootstrap_difference`)."""
    return _paired(lambda idx: a[idx].sum() / b[idx].sum(), len(a), n_boot, seed)


def bootstrap_mean(values: np.ndarray, counts: np.ndarray | None = None, n_boot: int = 1000, seed: int = 0) -> dict:
    """sum(values) / sum(counts) over items (per-item sums and their counts; counts None: a plain mean), with its 95%
    bootstrap interval over the items (the same draws as `bootstrap_difference` for the same n and seed)."""
    counts = np.ones(len(values)) if counts is None else counts
    return _paired(lambda idx: values[idx].sum() / max(counts[idx].sum(), 1e-300), len(values), n_boot, seed)


def verdict(diff: dict) -> str:
    if diff["hi"] < 0:
        return "signal beats random"
    if diff["lo"] > 0:
        return "signal worse than random"
    return "no difference"
