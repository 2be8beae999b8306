"""lm-evaluation-harness plug-in: `--model reskip --model_args adapter=RUN,policy=reskip` (a retrofit run under a
skip policy), and `--model reskip-healed --model_args run=RUN,depth=K` (a healing run as the plain model it exports;
a nested healing run at depth K).

`ReskipLM` subclasses the harness's own `HFLM` and hands it the retrofitted model (its
decoder layers are wrapped in place, so HFLM's forward and generate run through the
side-channel); the only additions are the skip policy around every model call and
loading by run folder. In a batch, all sequences share one skip decision per step.

lm-eval 0.4.13 has no plug-in discovery for model names: its own mechanism is `register_model`,
which this module calls when it is imported. So `reskip-lm-eval` (this module's `main`, the same
arguments as `lm_eval`) runs the harness with `--model reskip`; in Python, hand
`lm_eval.simple_evaluate` a `ReskipLM` instance. Nothing runs at interpreter start: installing
reskip adds no .pth file.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import torch
from lm_eval.__main__ import cli_evaluate
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM  # imports the harness's model table first: a registry

# that is not empty is never filled with the harness's own models, so ours must come after them
from peft import PeftModel

from ..compress.healing_run import layers_removed_by, load_healed_model, read_healing_run
from ..device_names import DEVICE_PATTERN
from ..errors import ReskipError
from ..options import DTYPE_NAMES
from ..skip.inference_run import open_run
from ..skip.spec import parse_spec


def _whole(name: str, value, low: int) -> int | None:
    """A model_args value that must be a whole number >= low (the harness hands every value over as text)."""
    if value is None or value == "":
        return None
    try:
        number = int(str(value))
    except ValueError:
        raise ReskipError(f"--model_args {name}={value}: a whole number >= {low}") from None
    if number < low:
        raise ReskipError(f"--model_args {name}={value}: a whole number >= {low}")
    return number


def _placement(dtype: str, device: str | None) -> str:
    """The harness's --device (default cuda:0, dropped where torch sees no GPU, as the harness does) -> ours."""
    if str(dtype) not in DTYPE_NAMES:
        raise ReskipError(f"--model_args dtype={dtype}: one of {', '.join(DTYPE_NAMES)}")
    if device and device.startswith("cuda") and not torch.cuda.is_available():
        device = None
    if device and not DEVICE_PATTERN.fullmatch(device):
        raise ReskipError(f"--device {device}: cpu, cuda or cuda:N")
    return device or "auto"


def _check_model_args(kwargs: dict, name: str, own: tuple[str, ...]) -> None:
    """Every model_arg is one this model or the harness's own hf model names (HFLM would take an unknown one into
    its **kwargs and go on without it): one error naming it."""
    harness = [k for k, v in inspect.signature(HFLM.__init__).parameters.items()
               if k not in ("self", "pretrained", "tokenizer") and v.kind is not inspect.Parameter.VAR_KEYWORD]
    unknown = sorted(set(kwargs) - set(harness))
    if unknown:
        raise ReskipError(f"--model_args of {name}: unknown {', '.join(unknown)}; its own are {', '.join(own)}, and "
                          f"the harness's hf model takes {', '.join(harness)}")


@register_model("reskip")
class ReskipLM(HFLM):
    def __init__(self, adapter: str | None = None, policy: str = "reskip", model: str | None = None,
                 window: int | None = None, dtype: str = "auto", seed: int = 0, device: str | None = None, **kwargs):
        # The harness hands model_args over as strings: this is where they become objects, each checked once.
        if not adapter:
            raise ReskipError("--model_args needs adapter=RUN (a trained retrofit run folder)")
        _check_model_args({k: v for k, v in kwargs.items() if k != "pretrained"}, "reskip",
                          ("adapter", "policy", "model", "window", "dtype", "seed", "device"))
        opened = open_run(adapter, [parse_spec(policy, allow_path=True)], model=model, dtype=dtype,
                          device=_placement(dtype, device), window=_whole("window", window, 1),
                          seed=_whole("seed", seed, 0) or 0, dense_fallback=True)
        self.reskip_model = opened.model
        self.skip_policy = opened.policy()
        self.skip_window = opened.window
        self.skipped_per_step: list[int] = []
        kwargs.pop("pretrained", None)
        super().__init__(pretrained=opened.model.base_model, tokenizer=opened.tokenizer, **kwargs)

    def _model_call(self, inps, attn_mask=None, labels=None):
        with self.reskip_model.skipping(self.skip_policy, self.skip_window) as runtime:
            logits = super()._model_call(inps, attn_mask, labels)
        self.skipped_per_step.extend(runtime.skipped_per_step())
        return logits

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        with self.reskip_model.skipping(self.skip_policy, self.skip_window) as runtime:
            out = super()._model_generate(context, max_length, stop, **generation_kwargs)
        self.skipped_per_step.extend(runtime.skipped_per_step())
        return out


@register_model("reskip-healed")
class ReskipHealedLM(HFLM):
    """A healing run (`reskip experiment baselines`, `nested`) as the plain model `reskip export` writes: the
    layers removed (a nested healing run's at `depth`), the LoRA merged, in memory."""

    def __init__(self, run: str | None = None, depth: int | None = None, dtype: str = "auto",
                 device: str | None = None, **kwargs):
        if not run:
            raise ReskipError("--model_args needs run=RUN (a healing run's folder)")
        _check_model_args({k: v for k, v in kwargs.items() if k != "pretrained"}, "reskip-healed",
                          ("run", "depth", "dtype", "device"))
        depth = _whole("depth", depth, 0)
        _, recorded = read_healing_run(Path(run))
        layers_removed_by(recorded, Path(run), depth)  # a depth the healing does not serve: refused before loading
        model, tokenizer = load_healed_model(Path(run), dtype, _placement(dtype, device), depth=depth)
        model = model.merge_and_unload() if isinstance(model, PeftModel) else model
        kwargs.pop("pretrained", None)
        super().__init__(pretrained=model, tokenizer=tokenizer, **kwargs)


def main() -> None:
    """`reskip-lm-eval`: the harness's CLI with the `reskip` and `reskip-healed` models registered; a bad argument is
    one line and exit 2."""
    try:
        cli_evaluate()  # the names were registered when this module was imported
    except ReskipError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
