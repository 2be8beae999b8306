"""The research layer: the source design's pipeline (`pipeline`: train the side-channel, calibrate ReSkip, evaluate,
diagnose, report), its calibration (`calibrate`), the analyses that could refute its claims (`analysis`), the
experiments that compare it with what a user would do instead (`experiments`), the lab (`lab`) and the run report
(`report`). It uses the core below it (the one trainer, the one evaluator, the retrofit and ReSkip's runtime) and
the product (`reskip.compress`), never the other way."""
