"""Evaluation: methods side by side, multiple choice, FLOPs, result tables, the evaluate stage
(which owns results.json) and the lm-evaluation-harness plug-in."""
