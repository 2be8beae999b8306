"""ReSkip: policy specs (spec), policies, the step-by-step runtime, policy files, calibration,
scoring under a policy, and opening a run for inference (session)."""
