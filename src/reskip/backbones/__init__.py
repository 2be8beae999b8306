"""Backbones: loading the bundled, packaged and user-named models (loading), parameter accounting
without weights (accounting, archs/), and the pipeline's parity stage (parity_stage)."""
