"""Training checkpoints: the trainee's weights (`Trainee.save_weights`: the side-channel's adapter files, or a
LoRA's PEFT folder) + optimizer state + step, written atomically.

A checkpoint folder is first written under a temporary name and renamed into place,
then `checkpoints/latest` is replaced atomically; a run killed at any moment leaves
the previous checkpoint intact. Trainer state is read with `weights_only=True`:
tensors and plain containers only, never arbitrary objects.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import torch

from ..errors import ReskipError
from ..io_atomic import atomic_write_text, with_umask
from ..run_folder import RunFolder

STATE_NAME = "trainer_state.pt"
CHECKPOINT_NAME = re.compile(r"step-\d{6}")
KEEP = 2


def checkpoints_dir(run_dir: Path) -> Path:
    return RunFolder(run_dir).checkpoints


def identity_digest(identity: dict) -> str:
    """The run's identity (what it trains: `builder.identity(cfg)`) as a short digest a checkpoint carries."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_checkpoint(run_dir: Path, step: int, trainee, optimizer, tokens_seen: int,
                    identity: dict | None = None) -> Path:
    root = checkpoints_dir(run_dir)
    if root.is_symlink():
        raise ReskipError(f"{root} is a link: a run's checkpoints are its own; remove the link and train again")
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        trainee.save_weights(tmp, step)
        state = {
            "step": step,
            "tokens_seen": tokens_seen,
            "optimizer": optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            **({"identity": identity_digest(identity)} if identity is not None else {}),
        }
        torch.save(state, tmp / STATE_NAME)
    except (OSError, RuntimeError) as e:
        # a full disk reaches torch.save as a RuntimeError ("unexpected pos ..."): the half-written temporary goes,
        # so it does not keep filling the disk, and the previous checkpoint stays the newest
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, RuntimeError) and not _looks_like_io(e):
            raise
        last = latest_checkpoint(run_dir)
        raise ReskipError(f"could not write the checkpoint of step {step} into {root} ({_first_line(e)}); is the disk "
                          f"full? Nothing half-written was left; the newest checkpoint is {last or 'none'}: free some "
                          "space and resume") from None
    with_umask(tmp)  # a library's 0600 weights readable where the user's umask lets them
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    atomic_write_text(root / "latest", final.name)
    for old in sorted(p for p in root.glob("step-*") if p != final)[:-(KEEP - 1) or None]:
        shutil.rmtree(old)
    return final


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:200]


def _looks_like_io(e: RuntimeError) -> bool:
    """torch.save's writer reports a failed write (ENOSPC, EIO) as a RuntimeError of its own."""
    text = str(e).lower()
    return any(w in text for w in ("unexpected pos", "write", "no space", "file", "i/o", "errno"))


def latest_checkpoint(run_dir: Path, state_name: str = STATE_NAME) -> Path | None:
    """The newest complete checkpoint of this run: the one `checkpoints/latest` names when it names a checkpoint
    folder of this run's own (`step-NNNNNN`, nothing outside it) holding its trainer state; else the newest such
    folder there is (a pointer cut short or edited is not followed); None when there is none."""
    root = checkpoints_dir(run_dir)
    pointer = root / "latest"
    try:
        name = pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else ""
    except (UnicodeDecodeError, OSError):
        name = ""
    if CHECKPOINT_NAME.fullmatch(name) and (root / name / state_name).is_file():
        return root / name
    complete = sorted(p for p in root.glob("step-*") if CHECKPOINT_NAME.fullmatch(p.name) and (p / state_name).is_file())
    return complete[-1] if complete else None


def load_checkpoint(path: Path, trainee, optimizer, identity: dict | None = None) -> dict:
    """Restore the trainee's weights and the optimizer state in place; returns {'step', 'tokens_seen'}. A
    checkpoint of a LoRA healing run trained before the one loop has no tokens count or RNG state: its tokens are its
    steps' (the caller's), its RNG the seed's."""
    try:
        state = torch.load(path / STATE_NAME, weights_only=True, map_location="cpu")  # the optimizer moves it to its parameters
        trainee.load_weights(path)
    except ReskipError:
        raise
    except Exception as e:  # noqa: BLE001 - any unreadable checkpoint gets the same clear message
        raise ReskipError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e}); delete it to use an older one") from e
    if identity is not None and "identity" in state and state["identity"] != identity_digest(identity):
        raise ReskipError(f"checkpoint {path} was written by a run of other settings (a seed, a recipe or data other "
                          "than this run's config.yaml): it is not this run's; train into another --out")
    optimizer.load_state_dict(state["optimizer"])
    if "torch_rng" in state:
        torch.set_rng_state(state["torch_rng"])
    return {"step": state["step"], "tokens_seen": state.get("tokens_seen")}
