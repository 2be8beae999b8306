"""lm-evaluation-harness plug-in: `--model reskip --model_args adapter=RUN,policy=reskip`.

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

import torch
from lm_eval.__main__ import cli_evaluate
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM  # imports the harness's model table first: a registry
# that is not empty is never filled with the harness's own models, so ours must come after them

from ..skip.inference_run import open_run
from ..skip.spec import parse_spec


@register_model("reskip")
class ReskipLM(HFLM):
    def __init__(self, adapter: str, policy: str = "reskip", model: str | None = None, window: int | None = None,
                 dtype: str = "auto", seed: int = 0, device: str | None = None, **kwargs):
        # The harness hands model_args over as strings: this is where they become objects. Its --device places the
        # model (the harness then computes where the model is); its default is cuda:0, which it drops itself for
        # the CPU where torch sees no GPU, and so does this.
        if device and device.startswith("cuda") and not torch.cuda.is_available():
            device = None
        opened = open_run(adapter, [parse_spec(policy, allow_path=True)], model=model, dtype=dtype,
                          device=device or "auto", window=int(window) if window else None, seed=int(seed),
                          dense_fallback=True)
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


def main() -> None:
    """`reskip-lm-eval`: the harness's CLI with the `reskip` model registered."""
    cli_evaluate()  # the name "reskip" was registered when this module was imported


if __name__ == "__main__":
    main()
