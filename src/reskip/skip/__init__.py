"""ReSkip's inference path: policy specs (spec), policies, the step-by-step runtime, the window mean (window),
policy files, scoring and generation under a policy, and opening a run for inference (inference_run)."""
