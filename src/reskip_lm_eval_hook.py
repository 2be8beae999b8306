"""Makes `lm_eval --model reskip` work: registers the model name with lm-evaluation-harness.

lm-eval 0.4.13 knows model names only from its own table (`lm_eval.models.MODEL_MAPPING`)
and has no plug-in discovery. The reskip wheel therefore puts `reskip-lm-eval.pth` in
site-packages, which imports this module when the interpreter starts. It must stay cheap
and must never fail: it imports nothing heavy, only adds one meta-path finder that waits
for `lm_eval.api.registry` to load and then registers `reskip` as a lazy "module:Class"
string (torch and transformers load only when the harness builds the model).

An editable install (`pip install -e`) does not install .pth files of a package; there
`reskip-lm-eval` (the same arguments as `lm_eval`) registers the name and runs the harness.
"""

from __future__ import annotations

import importlib
import sys
from importlib.abc import Loader, MetaPathFinder

REGISTRY_MODULE = "lm_eval.api.registry"
MODEL_NAME = "reskip"
MODEL_TARGET = "reskip.evaluate.lm_eval_model:ReskipLM"


def register() -> None:
    """Register `reskip` next to the harness's own models (imported first: the harness imports
    its model table only while its registry is empty, and ours would make it non-empty)."""
    try:
        importlib.import_module("lm_eval.models")
        from lm_eval.api.registry import model_registry

        if MODEL_NAME not in model_registry:
            model_registry.register(MODEL_NAME, target=MODEL_TARGET)
    except Exception as exc:  # a broken or different lm-eval must not break the harness itself
        print(f"reskip: could not register the lm-eval model name {MODEL_NAME!r}: {exc}", file=sys.stderr)


class _RegisterAfterExec(Loader):
    """The registry module's own loader, plus `register()` once the module has run."""

    def __init__(self, inner: Loader):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        register()

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _WatchRegistry(MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != REGISTRY_MODULE:
            return None
        sys.meta_path.remove(self)  # its one job: later imports no longer pass through it
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisterAfterExec(spec.loader)
                return spec
        return None


def install() -> None:
    if REGISTRY_MODULE in sys.modules:
        register()
    elif not any(isinstance(f, _WatchRegistry) for f in sys.meta_path):
        sys.meta_path.insert(0, _WatchRegistry())


install()
