"""reskip: AR-Retrofit (attention residuals on a frozen LLM) and ReSkip (block skipping).

The public names below are loaded on first use (PEP 562), not at import: `import reskip`,
`reskip --help` and `reskip report` then import no torch, and importing the package changes
nothing in the user's process.
"""

from __future__ import annotations

import importlib

from .version import __version__

# public name -> module that defines it
_EXPORTS = {
    "RetrofitConfig": "reskip.ar_retrofit.config",
    "ReskipModel": "reskip.ar_retrofit.model",
    "ReskipOutput": "reskip.ar_retrofit.model",
    "retrofit": "reskip.ar_retrofit.model",
    "alpha_entropy": "reskip.ar_retrofit.model",
    "load_adapter": "reskip.ar_retrofit.model",
    "save_adapter": "reskip.ar_retrofit.adapter_io",
    "load_backbone": "reskip.backbones.loading",
    # ReSkip: a calibrated run for inference, a policy spec, scoring and generation under it, the stages
    "open_run": "reskip.skip.inference_run",
    "parse_spec": "reskip.skip.spec",
    "score": "reskip.skip.scoring",
    "generate_text": "reskip.skip.scoring",
    "calibrate_run": "reskip.research.calibrate.run",
    "CalibrateOptions": "reskip.research.calibrate.options",
    "evaluate_run": "reskip.evaluate.run",
    "EvalOptions": "reskip.evaluate.options",
    "ReskipError": "reskip.errors",
    "AdapterError": "reskip.errors",
    "ModelNotFoundError": "reskip.errors",
    "UnsupportedModelError": "reskip.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'reskip' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
