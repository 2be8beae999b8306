"""Signal health: does a router's alpha_{n-1 -> n}, and the w_recent(n) read off it, depend on the input?

A router whose weights are the same for every token is a third degenerate case beside flat and
collapsed routing: a threshold tau_n then splits tokens on noise, and ReSkip behaves like random
skipping. This module measures the token-level spread (std and the 5-95% range) of both signals
and flags a w_recent whose 5-95% range is below `INPUT_INDEPENDENT_RANGE`.

Why 0.02: w_recent is a routing weight in [0, 1]; a policy that skips at a quantile of it moves
its decision on differences inside that range. Below two hundredths of routing weight (the default
recipe measured 0.0024-0.0040) the ordering of tokens is set by the adapters' small drift, not by
what the router reads. It is a reporting threshold, not a proof of a signal: the signal test
(`signal_test.signal_test`) is the experiment that can refute one.
"""

from __future__ import annotations

import numpy as np

INPUT_INDEPENDENT_RANGE = 0.02


def spread(values) -> dict:
    """std and 5/95% quantiles of a 1-D sample, and the 5-95% range."""
    v = np.asarray(values, dtype=np.float64).ravel()
    p05, p95 = np.quantile(v, [0.05, 0.95])
    return {"std": float(v.std()), "p05": float(p05), "p95": float(p95), "range": float(p95 - p05),
            "mean": float(v.mean())}


def signal_health(alpha_prev, w_recent) -> dict:
    """alpha_prev: alpha_{n-1 -> n} per token; w_recent: its causal window mean per token (both 1-D)."""
    a, w = spread(alpha_prev), spread(w_recent)
    status = "ok"
    if w["range"] < INPUT_INDEPENDENT_RANGE:
        status = (f"INPUT-INDEPENDENT: w_recent's 5-95% range is {w['range']:.4f} < {INPUT_INDEPENDENT_RANGE}; "
                  "a threshold on it splits tokens on noise")
    return {"alpha_prev": a, "w_recent": w, "status": status}
