"""Peak memory of the retrofit's stages against a plain frozen step and a LoRA-style fine-tuning step.

One process, one batch, the cases in turn; each case's peak is measured above the memory held just
before it (freed memory handed back to the system between cases), so the model's own weights are
not counted. CPU: the resident set, sampled every 0.5 ms by a thread (psutil, which accelerate
already requires); CUDA: torch.cuda.max_memory_allocated. Prints one JSON line.

Cases:
  frozen      - forward + CE + backward through the frozen backbone (gradients reach the input
                embeddings only), as benchmarks/train_throughput.py;
  lora        - a LoRA-style fine-tuning step: rank-r adapters on the attention projections
                (q, k, v, o; PEFT's defaults would be q and v), forward + CE + backward;
  train_step  - the retrofit's training step: teacher pass, full path, skip branch, the loss terms
                of the default recipe, backward (train_step_chunked: the same with CE and KL computed
                from the LM head in chunks of --loss-chunk positions; train_step_chunked_recompute:
                also with activation checkpointing of the frozen layers);
  calibrate   - one calibration batch (`reskip.skip.calibration.calibrate` on batch-size sequences:
                the full pass with alphas, every block's ablation pass);
  validate    - the training loop's validation (`reskip.train.validation.evaluate`) on the batch, in
                batches of --val-batch sequences (the loop's: the micro-batch);
  eval_seq    - one evaluation sequence (`reskip.evaluate.methods.evaluate_methods` with the
                backbone, the retrofit and static:1 scored in chunks).

    python benchmarks/memory.py [--batch 8] [--seq-len 256]             # the bundled model
    python benchmarks/memory.py --random-config Qwen3-0.6B              # a large vocabulary, random weights
    python benchmarks/memory.py --random-config Qwen3-4B --dtype bfloat16 --device cuda --batch 8 --seq-len 2048
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import json
import threading
import time

import psutil
import torch
from transformers import AutoModelForCausalLM

from reskip import load_backbone, retrofit
from reskip.backbones.architectures import architecture_config
from reskip.backbones.dtypes import resolve_dtype_name
from reskip.data.packing import Packed
from reskip.evaluate.methods import Method, evaluate_methods
from reskip.research.calibrate.calibration import calibrate
from reskip.skip.policies import NoSkip, StaticSkip
from reskip.skip.spec import Spec
from reskip.train.objective import RetrofitObjective
from reskip.train.validation import validation_metrics
from reskip.train_config import TrainConfig


def _release() -> None:
    gc.collect()
    try:  # glibc keeps freed blocks mapped; hand them back so each case starts from what is live
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


class PeakRSS:
    """Highest resident set size seen while the block runs, sampled by a thread."""

    def __init__(self, interval: float = 0.0005):
        self.interval, self.proc, self.peak = interval, psutil.Process(), 0
        self._stop = threading.Event()

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self):
        self.start = self.peak = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def peak_above_start(fn, device: str) -> float:
    """GiB above what was held before `fn` ran, at its peak."""
    _release()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - start) / 2**30
    with PeakRSS() as m:
        fn()
    return (m.peak - m.start) / 2**30


class LoRAHooks:
    """Rank-r updates on the attention projections, as forward hooks: y + (x A^T) B^T * alpha / r,
    B zero at init (LoRA's own init), A and B the only trainable weights."""

    def __init__(self, model, rank: int, names=("q_proj", "k_proj", "v_proj", "o_proj")):
        self.params, self.handles = [], []
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in names:
                a = torch.nn.Parameter(torch.randn(rank, module.in_features, dtype=module.weight.dtype,
                                                   device=module.weight.device) / module.in_features**0.5)
                b = torch.nn.Parameter(torch.zeros(module.out_features, rank, dtype=module.weight.dtype,
                                                   device=module.weight.device))
                self.params += [a, b]
                self.handles.append(module.register_forward_hook(
                    lambda mod, inp, out, a=a, b=b: out + (inp[0] @ a.T) @ b.T * (16.0 / rank)))

    def remove(self):
        for h in self.handles:
            h.remove()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="memory.py")
    ap.add_argument("--model", default=None, help="a backbone (default: the bundled SmolLM2-135M-Instruct)")
    ap.add_argument("--random-config", default=None, help="instead: a shipped architecture with random weights")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="auto: bfloat16 on CUDA and on CPUs with AMX or AVX512-BF16, else float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rank", type=int, default=None, help="adapter rank (default: the retrofit's)")
    ap.add_argument("--loss-chunk", type=int, default=64, help="positions per chunk of the chunked-loss step")
    ap.add_argument("--val-batch", type=int, default=None, help="sequences per validation batch (default: --batch)")
    args = ap.parse_args(argv)
    args.dtype = resolve_dtype_name(args.dtype, args.device)
    dtype = getattr(torch, args.dtype)

    torch.manual_seed(0)
    if args.random_config:
        model = AutoModelForCausalLM.from_config(architecture_config(args.random_config), dtype=dtype)
        label = f"random {args.random_config}"
    else:
        model, _ = load_backbone(args.model, dtype=dtype)
        label = args.model or "smollm2-135m-instruct"
    model = model.to(args.device).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (args.batch, args.seq_len), generator=g).to(args.device)
    labels = ids.clone()
    n_tokens = ids.numel()
    weights_gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30

    def frozen():
        x = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        model(inputs_embeds=x, labels=labels, use_cache=False).loss.backward()

    # The default training recipe's retrofit (its skip shortcuts included) and loss weights.
    recipe = TrainConfig(retrofit={} if args.rank is None else {"rank": args.rank})
    rm = retrofit(model, recipe.retrofit_config())
    rank = next(iter(rm.side_channel.per_block.values())).correction.down.out_features  # the retrofit's adapter rank

    def lora():
        hooks = LoRAHooks(model, rank)
        try:
            model(input_ids=ids, labels=labels, use_cache=False).loss.backward()
        finally:
            hooks.remove()

    rm.set_curriculum(1.0)
    def train_step(loss_chunk=None, recompute=False):
        objective = RetrofitObjective.of(rm, dataclasses.replace(recipe, loss_chunk=loss_chunk, recompute=recompute))
        terms = objective(ids, labels, 2, 1.0 / n_tokens, 1.0 / n_tokens)
        terms["loss"].backward()
        rm.side_channel.zero_grad(set_to_none=True)

    data = Packed(ids.cpu(), labels.cpu(), ["x"] * len(ids))

    def calibration_batch():
        with torch.no_grad():
            calibrate(rm, Packed(ids, labels, ["x"] * len(ids)), delta=1.0, batch_size=len(ids))

    def validation():
        validation_metrics(rm, Packed(ids, labels, data.sources), batch_size=args.val_batch or args.batch)

    def eval_sequence():
        one = Packed(data.input_ids[:1].to(args.device), data.labels[:1].to(args.device), ["x"])
        evaluate_methods(rm, one, [Method("backbone", None, Spec("backbone", "backbone")),
                                   Method("retrofit", NoSkip(), Spec("none", "retrofit")),
                                   Method("static:1", StaticSkip({2}), Spec("static", "static:1", k=1))],
                         window=1, chunk_size=32)

    cases = {}
    with rm.side_channel_disabled():
        cases["frozen"] = peak_above_start(frozen, args.device)
        cases["lora"] = peak_above_start(lora, args.device)
    cases["train_step"] = peak_above_start(train_step, args.device)
    cases["train_step_chunked"] = peak_above_start(lambda: train_step(args.loss_chunk), args.device)
    cases["train_step_chunked_recompute"] = peak_above_start(lambda: train_step(args.loss_chunk, True), args.device)
    cases["calibrate"] = peak_above_start(calibration_batch, args.device)
    cases["validate"] = peak_above_start(validation, args.device)
    cases["eval_seq"] = peak_above_start(eval_sequence, args.device)
    logits_gib = n_tokens * vocab * 4 / 2**30  # one (B, T, V) float32 tensor
    print(json.dumps({
        "model": label, "dtype": args.dtype, "device": args.device, "batch": args.batch, "seq_len": args.seq_len,
        "vocab": vocab, "weights_gib": round(weights_gib, 3), "one_logits_tensor_gib": round(logits_gib, 3),
        "peak_gib": {k: round(v, 3) for k, v in cases.items()},
        # None where a baseline's peak is below what the sampler resolves (tiny models)
        "train_step_vs_frozen": round(cases["train_step"] / cases["frozen"], 2) if cases["frozen"] > 0 else None,
        "train_step_vs_lora": round(cases["train_step"] / cases["lora"], 2) if cases["lora"] > 0 else None,
        "train_step_chunked_vs_frozen": (round(cases["train_step_chunked"] / cases["frozen"], 2)
                                         if cases["frozen"] > 0 else None),
        "train_step_chunked_recompute_vs_frozen": (round(cases["train_step_chunked_recompute"] / cases["frozen"], 2)
                                                   if cases["frozen"] > 0 else None),
        "loss_chunk": args.loss_chunk,
        "target_train_step_vs_frozen_max": 2.0,
    }))


if __name__ == "__main__":
    main()
