"""`reskip eval`: the backbone, the retrofit and skip policies side by side on the test split.

Each test sequence makes its own skip decisions, in chunks of `chunk_size` tokens: a chunk is one
step. A group of sequences is scored in one batch, each row making its own decisions: planned in
advance for a policy that reads no signal (static, influence, random, a budget of whole blocks) and
scored in one cache-free pass (the reference the exact cache equals), taken as it goes from the row's
own signal for ReSkip (in chunks, with the exact cache). Per method: perplexity and
its ratio to the backbone's, top-1 agreement with and KL to the backbone, blocks skipped per
step (mean and distribution), the share of layer FLOPs executed, and the margin check
(eps = max |logit change| from skipping relative to the retrofit without skipping,
Delta = its top-1 minus top-2 logit; where 2 eps < Delta the top-1 token cannot change, so
a non-zero change rate there is a bug).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from ..ar_retrofit.model import ReskipModel
from ..backbones.devices import model_device
from ..compat import decoder_body, decoder_layers, output_head
from ..data.packing import Packed
from ..errors import ReskipError
from ..fusion import fused
from ..losses import head_logits, next_token_targets, teacher_targets
from ..skip.policies import NoSkip, SkipPolicy, plan
from ..skip.policy_file import PolicyFile, make_policy
from ..skip.scoring import score, score_planned_whole, score_rows
from ..skip.spec import KINDS, METHOD_GRAMMAR, Spec
from .flops import LayerFlops, executed_share, shortcut_flops
from .scorers import ModelScorer, ScorerContext, check_model_spec, open_scorer


@dataclass
class Method:
    """One scored method: its name (as its spec was written), its typed spec, and what computes it: a skip
    policy on the retrofit, a model of its own (`scorer`, opened by `open_scorers`), or neither (the backbone,
    whose logits are the references)."""

    name: str
    policy: SkipPolicy | None
    spec: Spec
    scorer: ModelScorer | None = None

    @property
    def is_model(self) -> bool:
        return KINDS[self.spec.kind].opens == "model"

    @property
    def is_backbone(self) -> bool:
        return self.spec.kind == "backbone"

    def row(self) -> dict:
        """What a results row says of the method beside its metrics: its kind and its arguments."""
        return {"kind": self.spec.kind, "arguments": self.spec.arguments}


def parse_methods(specs: list[Spec], policy_file: PolicyFile | None, seed: int = 0) -> list[Method]:
    """Methods from parsed specs (`parse_spec(text, METHOD_KINDS)`); a method is named as its spec
    was written. `budgets` becomes reskip:budget=B for each budget of the policy file's frontier;
    `matched` is expanded later, once ReSkip's mean skips are known; a model method's folder is checked here
    and its model opened later (`open_scorers`)."""
    out: list[Method] = []
    for spec in specs:
        taken = {m.name for m in out}
        out += [m for m in EXPANSIONS.get(spec.kind, _one_method)(spec, policy_file, seed) if m.name not in taken]
    return out


def _budget_methods(spec: Spec, policy_file: PolicyFile | None, seed: int) -> list[Method]:
    if policy_file is None:
        raise ReskipError("method 'budgets' needs policy.json: run `reskip calibrate` first")
    if not policy_file.budgets():
        print("note: the policy file has no budget frontier, so 'budgets' adds no method "
              "(calibrate with --budgets to store one)", file=sys.stderr)
    return [Method(f"reskip:budget={b:g}", policy_file.budget(b), Spec("reskip", f"reskip:budget={b:g}", budget=b))
            for b in policy_file.budgets()]


def _placeholder(spec: Spec, policy_file: PolicyFile | None, seed: int) -> list[Method]:
    return [Method(spec.text, None, spec)]


def _one_method(spec: Spec, policy_file: PolicyFile | None, seed: int) -> list[Method]:
    if KINDS[spec.kind].opens != "policy":  # the backbone, or a model of its own
        if KINDS[spec.kind].scorer:
            check_model_spec(spec)
        return [Method(spec.text, None, spec)]
    if spec.needs_policy_file and policy_file is None:
        raise ReskipError(f"method {spec.text!r} needs policy.json: run `reskip calibrate` first")
    try:
        return [Method(spec.text, make_policy(spec, policy_file, seed), spec)]
    except ReskipError as e:
        raise ReskipError(f"{e} (methods: {METHOD_GRAMMAR})") from e


# The kinds of `spec.KINDS` that open as `expands`: `budgets` is one method per point of the policy file's
# frontier; `matched` is expanded once ReSkip's mean skips are known. Every other kind is one method.
EXPANSIONS = {"budgets": _budget_methods, "matched": _placeholder}


def open_scorers(methods: list[Method], ctx: ScorerContext, opened: dict | None = None) -> dict[str, ModelScorer]:
    """Open each model method's model (once per spec: `opened` holds those already open) and attach it."""
    opened = {} if opened is None else opened
    for m in methods:
        if m.is_model and not m.is_backbone:
            if m.name not in opened:
                opened[m.name] = open_scorer(m.spec, ctx)
            m.scorer = opened[m.name]
    return opened


def matched_methods(policy_file: PolicyFile, mean_skips: float, seed: int = 0) -> list[Method]:
    """static, influence and random baselines at ReSkip's mean skipped blocks per step (to 2 decimals).
    A fractional mean is matched by a mix of k and k + 1 whole blocks across steps (`StaticSkip`)."""
    eligible = policy_file.eligible()
    k = round(mean_skips, 2)
    k = int(k) if k == int(k) else k
    out = []
    if k <= len(eligible):
        out.append(Method(f"static:{k:g}", policy_file.static(k), Spec("static", f"static:{k:g}", k=k)))
    if k <= len(policy_file.blocks):
        out.append(Method(f"influence:{k:g}", policy_file.influence(k), Spec("influence", f"influence:{k:g}", k=k)))
    if eligible:
        p = round(min(1.0, mean_skips / len(eligible)), 3)
        spec = Spec("random", f"random:{p:.3f}", p=p)
        out.append(Method(spec.text, make_policy(spec, policy_file, seed), spec))
    return out


@dataclass
class Tally:
    ce: float = 0.0
    targets: int = 0
    positions: int = 0
    agree: int = 0
    kl: float = 0.0
    margin_holds: int = 0
    changed_where_holds: int = 0
    changed: int = 0
    executed: float = 0.0
    dense: float = 0.0
    skipped_per_step: list[int] = field(default_factory=list)
    margin_measured: bool = False
    seconds: float = 0.0  # wall time of this method's own passes and metrics
    # per sequence, in order (for bootstrap intervals): NLL summed over its labelled targets and their count;
    # KL to the backbone summed over its positions, the positions whose top-1 agrees with the backbone's, and
    # their count
    sequence_nll: list[float] = field(default_factory=list)
    sequence_targets: list[int] = field(default_factory=list)
    sequence_kl: list[float] = field(default_factory=list)
    sequence_agree: list[int] = field(default_factory=list)
    sequence_positions: list[int] = field(default_factory=list)

    def add(self, other: "Tally") -> None:
        """Fold one sequence's tally into this one (its wall time excluded: the caller times)."""
        for name in ("ce", "targets", "positions", "agree", "kl", "margin_holds", "changed_where_holds", "changed",
                     "executed", "dense"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("skipped_per_step", "sequence_nll", "sequence_targets", "sequence_kl", "sequence_agree",
                     "sequence_positions"):
            getattr(self, name).extend(getattr(other, name))
        self.margin_measured = self.margin_measured or other.margin_measured

    def result(self, ppl_backbone: float | None, n_blocks: int) -> dict:
        ppl = math.exp(self.ce / self.targets)
        hist = [self.skipped_per_step.count(k) for k in range(n_blocks + 1)]
        return {
            "ppl": ppl,
            "ppl_ratio": ppl / ppl_backbone if ppl_backbone else 1.0,
            "top1_agreement": self.agree / self.positions,
            "kl_to_backbone": self.kl / self.positions,
            "mean_skipped": sum(self.skipped_per_step) / max(1, len(self.skipped_per_step)),
            "skipped_histogram": hist,
            "steps": len(self.skipped_per_step),
            "flops_executed_share": self.executed / self.dense if self.dense else 1.0,
            # relative to the retrofit without skipping; not defined for the backbone
            "margin_holds_share": self.margin_holds / self.positions if self.margin_measured else None,
            "top1_change_rate_where_margin_holds": (self.changed_where_holds / max(1, self.margin_holds)
                                                    if self.margin_measured else None),
            "top1_change_rate": self.changed / self.positions if self.margin_measured else None,
            "tokens": self.positions,
            "wall_s": self.seconds,
            "per_sequence": {"nll": list(self.sequence_nll), "targets": list(self.sequence_targets),
                             "kl": list(self.sequence_kl), "agree": list(self.sequence_agree),
                             "positions": list(self.sequence_positions)},
        }


@dataclass
class References:
    """What every method of one sequence is compared with, computed once per sequence."""

    labels: torch.Tensor  # (1, T)
    z_back: torch.Tensor  # the backbone's logits (1, T, V)
    teacher: tuple  # teacher_targets(z_back)
    back_top1: torch.Tensor  # (1, T)
    z_full: torch.Tensor  # the retrofit's logits, nothing skipped (1, T, V)
    full_top1: torch.Tensor  # (1, T)
    margin: torch.Tensor  # top-1 minus top-2 of z_full (1, T)
    # the positions scored, [a, b): every position (None), or those whose next token is labelled (a chat reply:
    # one contiguous span); `teacher` then holds the span's p (1, b - a, V) and its sum of p log p
    span: tuple[int, int] | None = None


def _chunk_positions(vocab: int) -> int:
    """Positions per slice of a sequence's metrics: (c, V) float32 temporaries of at most 16 MiB, below
    glibc's largest mmap threshold (32 MiB), so their memory is reused instead of mapped, faulted and
    unmapped on every operation (measured: that had cost more than the arithmetic)."""
    return max(1, (4 << 20) // vocab)


def _chunk_metrics(z, targets, back_top1, p, z_full, full_top1, margin) -> tuple[torch.Tensor, ...]:
    """One slice of positions' sums for a method's logits z (c, V) in any dtype, read in float32: cross-entropy
    over the labelled positions, top-1 agreement with the backbone; with the teacher p (c, V), also KL's
    logsumexp(z) - sum_v p z part; with the retrofit's own logits z_full (c, V), also the positions where the margin
    condition 2 eps < Delta holds, where it holds and top-1 changed, and where top-1 changed. Compiled where it pays
    (`fusion.fused`): the (c, V) float32 copy and the temporaries are then never written."""
    zf = z.float()
    lse = zf.logsumexp(-1)  # (c,)
    has = targets != -100
    z_target = zf.gather(-1, targets.clamp_min(0)[:, None])[:, 0]  # (c,); -100 read as 0, then dropped
    ce = torch.where(has, lse - z_target, 0.0).sum()  # -log softmax(z)[target] over the labelled positions
    top1 = zf.argmax(-1)  # (c,)
    agree = (top1 == back_top1).sum()
    if p is None:
        return ce, agree
    # KL(p || q) = sum_v p log p - sum_v p z + logsumexp(z), as sum_v p = 1 (see `kl_sum`)
    kl = lse.sum() - torch.linalg.vecdot(p, zf).sum()
    if z_full is None:
        return ce, agree, kl
    eps = (zf - z_full).abs().amax(-1)  # (c,)
    holds = 2 * eps < margin
    changed = top1 != full_top1
    return ce, agree, kl, holds.sum(), (holds & changed).sum(), changed.sum()


# What a method's logits are read against: the backbone itself (no KL, no margin), a skip policy on the retrofit
# (KL and the margin check against the retrofit's own logits), a model of its own (KL; the margin check is the
# retrofit's and does not apply)
MEASURES = {"backbone": (False, False), "policy": (True, True), "model": (True, False)}


def _tally_of(z: torch.Tensor, ref: References, skipped: list, lengths: list, measure: str, cost,
              chunk: int | None = None) -> Tally:
    """One sequence's metrics of logits z (1, T, V), `chunk` positions at a time: `kl_sum`'s formula, and
    cross-entropy as logsumexp(z) - z[target], within 1e-7 of float64 (2-10e-8 measured) where torch's
    float32 `cross_entropy` (`ce_sum`) reads 2-4e-6 low on a 49k vocabulary. measure: a key of `MEASURES`.
    cost: (executed, dense) layer FLOPs of its steps."""
    with_kl, with_margin = MEASURES[measure]
    t = Tally()
    a, b = ref.span or (0, z.shape[1])
    targets = next_token_targets(ref.labels)[0, a:b]  # (T',) the scored positions' targets
    z = z[:, a:b]
    back_top1, z_full, full_top1, margin = (x[:, a:b] for x in (ref.back_top1, ref.z_full, ref.full_top1, ref.margin))
    t.targets = int((targets != -100).sum())
    t.positions = b - a
    p, neg_entropy = ref.teacher
    c = chunk or _chunk_positions(z.shape[-1])
    c = -(-z.shape[1] // -(-z.shape[1] // c))  # slices of equal size (no 1-position tail to compile anew)
    ce = kl = 0.0
    metrics = fused(_chunk_metrics, z[0].numel(), dynamic=True)
    for s in range(0, z.shape[1], c):
        sl = slice(s, s + c)
        m = metrics(z[0, sl], targets[sl], back_top1[0, sl], p[0, sl] if with_kl else None,
                    z_full[0, sl] if with_margin else None, full_top1[0, sl], margin[0, sl])
        ce += m[0].item()
        t.agree += int(m[1])
        if not with_kl:  # the backbone's KL to itself is 0 exactly, and it has no margin check
            continue
        kl += m[2].item()
        if with_margin:
            t.margin_holds += int(m[3])
            t.changed_where_holds += int(m[4])
            t.changed += int(m[5])
    t.ce = ce
    if with_kl:
        t.kl = neg_entropy.item() + kl
    t.margin_measured = with_margin
    t.sequence_nll, t.sequence_targets = [ce], [t.targets]
    t.sequence_kl, t.sequence_agree, t.sequence_positions = [t.kl], [t.agree], [t.positions]
    t.executed, t.dense = cost(skipped, lengths)
    t.skipped_per_step = [len(s) for s in skipped]
    return t


def _decisions(steps) -> tuple:
    """The blocks skipped at each step, as a key: ((2, 4), (4,), ...)."""
    return tuple(tuple(sorted(s)) for s in steps)


@dataclass
class EvalContext:
    """What every method's scoring of one data set shares: the model and data, the window and chunk size, the
    FLOP cost of a trace, the LM head, the tallies already scored (sequence, decisions per step) -> Tally, and
    the groups' final hidden states of the backbone and the retrofit."""

    model: ReskipModel
    data: Packed
    window: int
    chunk_size: int
    cost: object  # (blocks skipped per step, tokens per step) -> (executed, dense) layer FLOPs
    head: tuple
    seen: dict = field(default_factory=dict)
    hidden: dict = field(default_factory=dict)
    reference: nn.Module | None = None  # whose logits the methods are compared with (None: the run's backbone)
    positions: str = "all"  # which positions are scored: all, or labelled (those whose next token is labelled)

    @classmethod
    def of(cls, model: ReskipModel, data: Packed, window: int, chunk_size: int, seen=None, hidden=None,
           reference: nn.Module | None = None, positions: str = "all") -> "EvalContext":
        flops = LayerFlops.of(model.base_model.config)
        side = model.side_channel
        per_shortcut = shortcut_flops(side.hidden_size, side.shortcut_rank)
        shortcut = {n: per_shortcut for n in range(2, model.n_blocks)} if side.shortcuts is not None else {}
        # with a reference model (the original a pruned backbone came from), compute is a share of its layers
        scale = 1.0 if reference is None else (len(decoder_layers(reference))
                                               / len(decoder_layers(model.base_model)))

        def cost(skipped, lengths):
            executed, dense = executed_share(model.blocks, skipped, lengths, flops, shortcut)
            return executed, dense * scale

        return cls(model, data, window, chunk_size, cost, output_head(model.base_model),
                   {} if seen is None else seen, {} if hidden is None else hidden, reference, positions)

    def references(self, rows: list[int]) -> dict[int, References]:
        """The group's reference logits, each model in one batched pass over the group's sequences. Their
        final hidden states are kept (a (G, T, d) pair per group, d/V of the logits' size), so a second
        round over the same groups (the matched baselines) only reapplies the LM head: the same
        operation on the same tensors, so the same logits."""
        model, key = self.model, tuple(rows)
        if key not in self.hidden:
            ids = self.data.input_ids[rows].to(model_device(model))
            if self.reference is not None:
                h_back = decoder_body(self.reference)(input_ids=ids, use_cache=False).last_hidden_state  # (G, T, d)
            else:
                with model.side_channel_disabled():
                    h_back = model(input_ids=ids, use_cache=False, hidden_only=True).last_hidden_state
            self.hidden[key] = (h_back, model(input_ids=ids, use_cache=False, hidden_only=True).last_hidden_state)
        back_head = self.head if self.reference is None else output_head(self.reference)
        h_back, h_full = self.hidden[key]
        z_back, z_full = head_logits(h_back, back_head), head_logits(h_full, self.head)  # (G, T, V) each
        out = {}
        for b, i in enumerate(rows):
            zb, zf = z_back[b : b + 1], z_full[b : b + 1]
            top2 = zf.topk(2, dim=-1).values
            span = labelled_span(self.data.labels[i]) if self.positions == "labelled" else None
            teacher = teacher_targets(zb if span is None else zb[:, span[0] : span[1]])
            out[i] = References(self.data.labels[i : i + 1].to(zb.device), zb, teacher, zb.argmax(-1), zf,
                                zf.argmax(-1), top2[..., 0] - top2[..., 1], span)
        return out

    def tallies(self, method: Method, rows: list[int], refs: dict[int, References]) -> list[Tally]:
        """The method's tally on each sequence of `rows`, in order; planned decisions are scored in one batch."""
        model, T = self.model, self.data.input_ids.shape[1]
        if method.is_backbone and (self.reference is None or method.name == REFERENCE):
            # its logits are the reference, computed once; its compute the whole unit
            cost = self.cost if self.reference is None else _whole
            return [_tally_of(refs[i].z_back, refs[i], [[]], [T], "backbone", cost) for i in rows]
        if method.is_backbone:  # the run's own backbone, scored against another reference model
            with model.side_channel_disabled():
                z = model(input_ids=self.data.input_ids[rows].to(model_device(model)), use_cache=False).logits
            return [_tally_of(z[b : b + 1], refs[i], [[]], [T], "model", self.cost) for b, i in enumerate(rows)]
        if method.is_model:
            return self._model_tallies(method.scorer, rows, refs)
        if isinstance(method.policy, NoSkip):  # one pass, nothing skipped
            return [_tally_of(refs[i].z_full, refs[i], [[]], [T], "policy", self.cost) for i in rows]
        n_steps = 1 if self.chunk_size >= T else math.ceil(T / self.chunk_size)
        # Asked in sequence order, so a policy's state (a mix's counter, a random draw) advances as before.
        plans = {i: plan(method.policy, model.n_blocks, n_steps) for i in rows}
        if all(p is not None for p in plans.values()):
            return self._planned(plans, rows, refs)
        # A policy reading the routers' signal decides as it goes: the group in one batch, each row from its
        # own signal, when its decisions are pure functions of that signal (ReSkip); else one at a time.
        if method.policy.pure:
            z, traces = score_rows(model, self.data.input_ids[rows], method.policy, self.window, self.chunk_size)
            scored = [(z[b : b + 1], traces[b]) for b in range(len(rows))]
        else:
            scored = [score(model, self.data.input_ids[i : i + 1], method.policy, self.window, self.chunk_size)
                      for i in rows]
        out = []
        for i, (z, trace) in zip(rows, scored):
            skipped = [t.skipped for t in trace]
            one = _tally_of(z, refs[i], skipped, [t.length for t in trace], "policy", self.cost)
            self.seen[(i, _decisions(skipped))] = one
            out.append(one)
        return out

    def _planned(self, plans: dict, rows: list[int], refs: dict[int, References]) -> list[Tally]:
        """Decisions fixed in advance: the rows not already scored with exactly these decisions, in one batch
        and one cache-free pass (`scoring.score_planned_whole`: what the chunked run computes, up to rounding)."""
        keys = {i: (i, _decisions(p.steps)) for i, p in plans.items()}
        new = [i for i in rows if keys[i] not in self.seen]
        if new:
            z, traces = score_planned_whole(self.model, self.data.input_ids[new], [plans[i] for i in new],
                                            self.chunk_size)
            for b, i in enumerate(new):
                self.seen[keys[i]] = _tally_of(z[b : b + 1], refs[i], [t.skipped for t in traces[b]],
                                               [t.length for t in traces[b]], "policy", self.cost)
        return [self.seen[keys[i]] for i in rows]

    def _model_tallies(self, scorer: ModelScorer | None, rows: list[int], refs: dict[int, References]) -> list[Tally]:
        """A model of its own: the group in one batch and one cache-free pass; its blocks removed at every step,
        its compute the layers it keeps."""
        if scorer is None:
            raise ReskipError("a model method is scored after `open_scorers` has opened its model")
        T = self.data.input_ids.shape[1]
        z = scorer.logits(self.data.input_ids[rows])  # (G, T, V)

        def cost(skipped, lengths):
            return sum(lengths) * scorer.executed_share, float(sum(lengths))

        return [_tally_of(z[b : b + 1], refs[i], [list(scorer.dropped_blocks)], [T], "model", cost)
                for b, i in enumerate(rows)]


REFERENCE = "reference"  # the row of `reskip eval --reference`'s model itself


def labelled_span(labels: torch.Tensor) -> tuple[int, int]:
    """[a, b): the positions of one sequence's labels (T,) (on the host) whose next token is labelled, refused unless
    they are one contiguous span (a chat reply teacher-forced after its prompt, right-padded)."""
    where = (next_token_targets(labels[None])[0] != -100).nonzero().flatten().tolist()
    if not where or where[-1] - where[0] + 1 != len(where):
        raise ReskipError("scoring labelled positions needs one contiguous labelled span per sequence")
    return where[0], where[-1] + 1


def _whole(skipped, lengths) -> tuple[float, float]:
    """The cost of the reference model itself: all of its compute."""
    return float(sum(lengths)), float(sum(lengths))


@torch.no_grad()
def evaluate_methods(model: ReskipModel, data: Packed, methods: list[Method], window: int, chunk_size: int,
                     policy_file: PolicyFile | None = None, seed: int = 0, progress=None, group: int = 4,
                     _context: EvalContext | None = None, reference: nn.Module | None = None,
                     positions: str = "all") -> dict[str, dict]:
    """Every method on every sequence of `data`, `group` sequences at a time (their references held
    together). A method that reads no signal has its decisions planned first (`policies.plan`) and the
    group's sequences scored in one batch and one pass (`scoring.score_planned_whole`); a sequence already
    scored with exactly those decisions (by another method: static:2 and a budget of two whole blocks, static and
    influence picking the same block) is not scored again: its metrics are reused. A method that reads
    the routers' signal scores the group in one batch too, each row making its own decisions as it goes
    (`scoring.score_rows`; one sequence at a time for a policy that is not `pure`). With a `reference` model (the
    original a pruned backbone came from; the same tokenizer), the `backbone` row, KL, top-1 agreement and the
    perplexity ratio are the reference's, and compute is a share of its layers. `positions="labelled"` scores only
    the positions whose next token is labelled (one span per sequence: a chat reply after its prompt)."""
    context = _context or EvalContext.of(model, data, window, chunk_size, reference=reference, positions=positions)
    expand = any(m.spec.kind == "matched" for m in methods)
    methods = [m for m in methods if m.spec.kind != "matched"]
    if context.reference is not None and all(m.name != REFERENCE for m in methods):
        # the reference's own row (the ratios' denominator); `backbone`, when asked, is the run's backbone against it
        methods = [Method(REFERENCE, None, Spec("backbone", REFERENCE)), *methods]
    tallies = {m.name: Tally() for m in methods}
    model.eval()
    for g in range(0, len(data), group):
        rows = list(range(g, min(len(data), g + group)))
        refs = context.references(rows)
        for m in methods:
            t0 = time.perf_counter()
            for one in context.tallies(m, rows, refs):
                tallies[m.name].add(one)
            tallies[m.name].seconds += time.perf_counter() - t0
        del refs
        if progress is not None:
            progress(rows[-1] + 1, len(data))
    base = REFERENCE if context.reference is not None else "backbone"
    ppl_backbone = math.exp(tallies[base].ce / tallies[base].targets) if base in tallies else None
    results = {m.name: {**m.row(), **tallies[m.name].result(ppl_backbone, model.n_blocks)} for m in methods}
    if expand and policy_file is not None:
        _add_matched(results, context, policy_file, seed, group)
    return results


def _add_matched(results: dict, context: EvalContext, policy_file: PolicyFile, seed: int, group: int) -> None:
    """static, influence and random at every skipping ReSkip (or per-sequence) point's measured mean skips, scored in a second
    round that reuses the first round's hidden states and tallies."""
    extra = []
    for name, r in list(results.items()):
        if KINDS[r["kind"]].measured_compute and r["mean_skipped"] > 0:  # nothing to match when ReSkip never skips
            extra += [m for m in matched_methods(policy_file, r["mean_skipped"], seed) if m.name not in results
                      and m.name not in {e.name for e in extra}]
    if not extra:
        return
    backbone = Method("backbone", None, Spec("backbone", "backbone"))
    more = evaluate_methods(context.model, context.data, [backbone, *extra], context.window,
                            context.chunk_size, None, seed, group=group, _context=context)
    for m in extra:
        # `more` holds its own backbone row over the same sequences, so its ratios already hold
        results[m.name] = {**more[m.name], "matched": True}
