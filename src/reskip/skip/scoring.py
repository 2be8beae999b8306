"""Scoring with a skip policy (whole text or chunks) and generation under a policy.

Scoring in chunks runs with the exact KV cache of skipped layers; `reskip.ar_retrofit.kv_cache`
says what "exact" means and holds the cache-free reference (`reference_logits`) that the
tests compare these runs with.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .. import compat
from ..ar_retrofit.model import ReskipModel
from ..backbones.devices import model_device
from ..errors import ReskipError
from .device_runtime import DeviceRowsRuntime
from .policies import PlannedSkip, SkipPolicy
from .runtime import RowsRuntime, StepTrace


def on_model(model: ReskipModel, *tensors):
    """`tensors` (None kept) on the model's device: every scoring and generation function takes its inputs from
    wherever they were made (a tokenizer's and the packed data's are on the host) and computes where the model is."""
    device = model_device(model)
    moved = tuple(None if t is None else t.to(device) for t in tensors)
    return moved if len(moved) > 1 else moved[0]


def _steps(model: ReskipModel, input_ids, chunk_size: int | None, attention_mask=None) -> torch.Tensor:
    """Logits (B, T, V) of the passes under whatever runtime the caller set: one step for the whole text
    (no cache), or one step per chunk with a cache."""
    if chunk_size is None or chunk_size >= input_ids.shape[1]:
        return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    cache, parts = DynamicCache(), []
    for lo in range(0, input_ids.shape[1], chunk_size):
        hi = lo + chunk_size
        mask = attention_mask[:, :hi] if attention_mask is not None else None
        out = model(input_ids=input_ids[:, lo:hi], attention_mask=mask, use_cache=True, **{compat.cache_kwarg(): cache})
        parts.append(out.logits)
    return torch.cat(parts, dim=1)


@torch.no_grad()
def score(model: ReskipModel, input_ids, policy: SkipPolicy, window: int, chunk_size: int | None = None,
          attention_mask=None, track_all: bool = False, on_device: bool | None = None
          ) -> tuple[torch.Tensor, list[StepTrace]]:
    """Logits (B, T, V) under `policy`: one step for the whole text, or one step per chunk (with a cache).
    track_all: every block's w_recent in the trace, not only the ones the policy reads. on_device: the runtime's
    state on the model's device (`ReskipModel.skipping`; None: unless that is the CPU)."""
    input_ids, attention_mask = on_model(model, input_ids, attention_mask)
    with model.skipping(policy, window, track_all, on_device) as runtime:
        return _steps(model, input_ids, chunk_size, attention_mask), list(runtime.trace)


def _planned_steps(plans: list[PlannedSkip], B: int, T: int, chunk_size: int):
    """The steps (j, lo, hi) of B sequences of T tokens in chunks, each with every row's skipped blocks."""
    if len(plans) != B:
        raise ValueError(f"{len(plans)} plans for {B} sequences")
    return [(j, lo, min(T, lo + chunk_size), [p.steps[j] for p in plans])
            for j, lo in enumerate(range(0, T, chunk_size))]


def _traces(steps, B: int) -> list[list[StepTrace]]:
    return [[StepTrace(j, lo, hi - lo, sorted(rows[b])) for j, lo, hi, rows in steps] for b in range(B)]


@torch.no_grad()
def score_planned(model: ReskipModel, input_ids, plans: list[PlannedSkip], chunk_size: int
                  ) -> tuple[torch.Tensor, list[list[StepTrace]]]:
    """Logits (B, T, V) of B sequences scored together in chunks with the exact cache, row b making the
    decisions `plans[b]` (one set of skipped blocks per chunk): what `score` computes for each row alone
    under that plan, in one batched pass (a CPU runs a batch of 4 at about twice a single row's speed
    per row). At each step a block every row skips does not run (its K/V come from `append_kv`, as in
    `score`); a block only some rows skip runs, and acts as identity on those rows (`skipping_positions`:
    its K/V there are those of its unchanged input, which is what the exact cache holds). Equal to `score`
    row by row up to float rounding (batched matrix products), which the tests bound."""
    input_ids = on_model(model, input_ids)
    B, T = input_ids.shape
    steps = _planned_steps(plans, B, T, chunk_size)
    cache = DynamicCache() if T > chunk_size else None  # one step: no cache, as `score`
    parts = []
    for _, lo, hi, rows in steps:
        everywhere = frozenset.intersection(*rows)
        some = sorted(frozenset.union(*rows) - everywhere)
        masks = {n: torch.tensor([n in r for r in rows], device=input_ids.device)[:, None].expand(B, hi - lo)
                 for n in some}  # (B, chunk)
        with model.blocks_skipped(*everywhere), model.skipping_positions(masks):
            out = model(input_ids=input_ids[:, lo:hi], use_cache=cache is not None, **{compat.cache_kwarg(): cache})
        parts.append(out.logits)
    return torch.cat(parts, dim=1), _traces(steps, B)


@torch.no_grad()
def score_planned_whole(model: ReskipModel, input_ids, plans: list[PlannedSkip], chunk_size: int
                        ) -> tuple[torch.Tensor, list[list[StepTrace]]]:
    """`score_planned`'s logits and traces from one cache-free pass over the whole text: the reference that
    the exact cache is exact against (`ar_retrofit.kv_cache`), block n the identity on row b at the positions
    of the steps `plans[b]` skips it at. A block every row skips at every step does not run at all. Equal to
    `score_planned` up to float rounding (the tests bound it); the time is that of one pass of large matrix
    products instead of one pass per chunk of small ones (in bfloat16 on a CPU, several times less)."""
    input_ids = on_model(model, input_ids)
    B, T = input_ids.shape
    steps = _planned_steps(plans, B, T, chunk_size)
    everywhere = frozenset.intersection(*(r for *_, rows in steps for r in rows))
    masks = _step_masks(steps, B, T, input_ids.device, leave_out=everywhere)  # block -> (B, T)
    with model.blocks_skipped(*everywhere), model.skipping_positions(masks):
        logits = model(input_ids=input_ids, use_cache=False).logits
    return logits, _traces(steps, B)


def _step_masks(steps, B: int, T: int, device, leave_out=frozenset()) -> dict[int, torch.Tensor]:
    """Per block (not in `leave_out`), the (B, T) mask of the positions whose step skips it on that row
    (`steps` from `_planned_steps`)."""
    masks: dict[int, torch.Tensor] = {}
    for _, lo, hi, rows in steps:
        for b, r in enumerate(rows):
            for n in r - leave_out:
                mask = masks.setdefault(n, torch.zeros(B, T, dtype=torch.bool, device=device))  # (B, T)
                mask[b, lo:hi] = True
    return masks


@torch.no_grad()
def score_rows(model: ReskipModel, input_ids, policy: SkipPolicy, window: int, chunk_size: int,
               on_device: bool | None = None) -> tuple[torch.Tensor, list[list[StepTrace]]]:
    """Logits (B, T, V) of B sequences scored together in chunks with the exact cache under a policy that
    reads the routers' signal, each row deciding from its own signal (`runtime.RowsRuntime`): what `score`
    computes for each row alone, in one batched pass. A block every row skips at a step does not run; one
    some rows skip runs and is the identity on them (as in `score_planned`). A row's decisions read its own
    alpha, equal to the lone row's up to the batched products' rounding: a w_recent within that rounding
    of tau_n could decide otherwise (the tests compare decisions and logits row by row). on_device: the rows'
    decisions as masks on the model's device (`device_runtime.DeviceRowsRuntime`: no host read in the block
    loop, every block runs; None: unless the model is on the CPU, where a host read costs nothing and a block
    every row skips is left out)."""
    input_ids = on_model(model, input_ids)
    kind = DeviceRowsRuntime if model.runtime_on_device(on_device) else RowsRuntime
    runtime = kind(policy, window, input_ids.shape[0])
    with model.stepping(runtime):
        return _steps(model, input_ids, chunk_size), runtime.traces


@torch.no_grad()
def generate(model: ReskipModel, input_ids, policy: SkipPolicy, window: int, attention_mask=None,
             on_device: bool | None = None, **kwargs):
    """`generate()` under a policy. Returns (generate output, trace); trace[i] produced new token i. on_device: as
    in `score`."""
    input_ids, attention_mask = on_model(model, input_ids, attention_mask)
    with model.skipping(policy, window, on_device=on_device) as runtime:
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return out, list(runtime.trace)


def encode_prompt(tokenizer, prompt: str, raw: bool, limit: int | None, max_new_tokens: int):
    """The prompt through the chat template (unless `raw` or the tokenizer has none), refused when it and the new
    tokens need more positions than the model has (`limit`)."""
    if tokenizer.chat_template and not raw:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    else:
        text = prompt
    enc = tokenizer(text, return_tensors="pt", add_special_tokens=not tokenizer.chat_template or raw)
    wanted = enc.input_ids.shape[1] + max_new_tokens
    if limit is not None and wanted > limit:
        raise ReskipError(f"the prompt ({enc.input_ids.shape[1]} tokens) and max_new_tokens "
                          f"({max_new_tokens}) need {wanted} positions; this model has "
                          f"{limit}: shorten the prompt or ask for fewer tokens")
    return enc


def generate_text(model: ReskipModel, tokenizer, prompt: str, policy: SkipPolicy, window: int, raw: bool = False,
                  seed: int = 0, **generate_kwargs) -> tuple[str, list[int]]:
    """Generate a reply to `prompt` (through the chat template, unless `raw` or the tokenizer has none);
    returns (the new text, blocks skipped at each step that produced a new token; prefill first)."""
    enc = encode_prompt(tokenizer, prompt, raw, getattr(model.base_model.config, "max_position_embeddings", None),
                        generate_kwargs.get("max_new_tokens", 0))
    torch.manual_seed(seed)
    out, trace = generate(model, enc.input_ids, policy, window, attention_mask=enc.attention_mask,
                          pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, **generate_kwargs)
    new = out[0, enc.input_ids.shape[1]:].cpu()
    return tokenizer.decode(new, skip_special_tokens=True), [len(t.skipped) for t in trace[: len(new)]]
