"""The run folder, in one place: what a run folder holds and where (`layout.RunFolder`), the format version of each
JSON file in it and the upgrades from older ones (`versions`), and the one-writer lock a process holds while it
writes there (`lock.writing`). A training run's settings are its config.yaml (`train_config.TrainConfig`); a run
opened for inference is `skip.inference_run`."""

from .layout import RunFolder

__all__ = ["RunFolder"]
