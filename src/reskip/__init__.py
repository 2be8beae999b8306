"""reskip: AR-Retrofit (attention residuals on a frozen LLM) and ReSkip (block skipping)."""

__version__ = "0.1.0"

from .config import RetrofitConfig  # noqa: E402
from .errors import AdapterError, ModelNotFoundError, ReskipError, UnsupportedModelError  # noqa: E402
from .model import ReskipModel, ReskipOutput, alpha_entropy, retrofit  # noqa: E402
from .adapter_io import load_adapter, save_adapter  # noqa: E402
from .backbones import load_backbone  # noqa: E402

__all__ = [
    "RetrofitConfig", "ReskipModel", "ReskipOutput", "retrofit", "alpha_entropy",
    "save_adapter", "load_adapter", "load_backbone",
    "ReskipError", "AdapterError", "ModelNotFoundError", "UnsupportedModelError",
]
