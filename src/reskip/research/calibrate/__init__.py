"""The calibrate stage: per-block thresholds and budgets on the calibration split -> RUN/policy.json (`calibrate_run`)."""
