"""lm-evaluation-harness plug-in: `--model reskip --model_args adapter=RUN,policy=reskip`.

`ReskipLM` subclasses the harness's own `HFLM` and hands it the retrofitted model (its
decoder layers are wrapped in place, so HFLM's forward and generate run through the
side-channel); the only additions are the skip policy around every model call and
loading by run folder. In a batch, all sequences share one skip decision per step.

lm-eval 0.4.13 has no plug-in discovery for model names. The name `reskip` is registered
by `reskip_lm_eval_hook` (loaded at interpreter start by the wheel's .pth file, so the plain
`lm_eval --model reskip` command works, and imported here too). Editable installs skip .pth
files; there the `reskip-lm-eval` command (same arguments as `lm_eval`) does the same.
"""

from __future__ import annotations

import reskip_lm_eval_hook
from lm_eval.__main__ import cli_evaluate
from lm_eval.models.huggingface import HFLM

from ..skip.inference_run import open_run
from ..skip.spec import parse_spec

reskip_lm_eval_hook.install()  # registers the name "reskip" (lazily, pointing at ReskipLM below)


class ReskipLM(HFLM):
    def __init__(self, adapter: str, policy: str = "reskip", model: str | None = None, window: int | None = None,
                 dtype: str = "auto", seed: int = 0, **kwargs):
        # The harness hands model_args over as strings: this is where they become objects.
        opened = open_run(adapter, [parse_spec(policy, allow_path=True)], model=model, dtype=dtype,
                          window=int(window) if window else None, seed=int(seed), dense_fallback=True)
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
