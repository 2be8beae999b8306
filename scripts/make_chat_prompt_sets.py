"""Write the held-out chat prompt sets (`src/reskip/chat/prompt_sets.json`): `test`, the sixteen fixed prompts and
N_TEST requests the bundled SmolLM2-135M-Instruct writes itself from its chat template under seed TEST_SEED; `val`,
N_VAL more under VAL_SEED; every request new to both sets (normalised text). The bundled model in float32 on the CPU.

    python scripts/make_chat_prompt_sets.py            # rewrites the file; prints each set's size and sha256
"""

from __future__ import annotations

import json
from pathlib import Path

from reskip.backbones.loading import load_backbone
from reskip.chat.prompt_sets import FILE, FIXED_PROMPTS, digest
from reskip.chat.sampling import batch_seed
from reskip.chat.template import normalized
from reskip.chat.user_turns import keep, sample_user_batch

N_TEST, TEST_SEED, N_VAL, VAL_SEED, BATCH = 96, 7001, 64, 7002, 32
OUT = Path(__file__).resolve().parents[1] / "src" / "reskip" / "chat" / FILE


def sampled(model, tok, n: int, seed: int, seen: set[str]) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        for w in sample_user_batch(model, tok, BATCH, batch_seed(seed, i)):
            text = keep(tok, w, seen)
            if text is not None and len(out) < n:
                out.append(text)
        i += 1
    return out


def main() -> None:
    model, tok = load_backbone(None, "float32", False, "cpu")
    seen = {normalized(p) for p in FIXED_PROMPTS}
    test = list(FIXED_PROMPTS) + sampled(model, tok, N_TEST, TEST_SEED, seen)
    val = sampled(model, tok, N_VAL, VAL_SEED, seen)
    sets = {"test": {"seed": TEST_SEED, "fixed": len(FIXED_PROMPTS), "prompts": test, "sha256": digest(test)},
            "val": {"seed": VAL_SEED, "fixed": 0, "prompts": val, "sha256": digest(val)}}
    OUT.write_text(json.dumps({"version": 1, "model": "smollm2-135m-instruct", "dtype": "float32",
                               "made_by": "python scripts/make_chat_prompt_sets.py", "sets": sets},
                              indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for name, s in sets.items():
        print(name, len(s["prompts"]), s["sha256"])


if __name__ == "__main__":
    main()
