"""Backbones: loading the bundled, packaged and user-named models (loading), their configs without weights
(architectures, archs/), and the names of their compute dtypes (dtypes)."""
