"""`reskip experiment variants`: the recipe against the three designs the first source document says
"do not work", each a `RetrofitConfig.variant` of the same modules, trained with the same loss, data,
seed and training length. The document's predictions, confronted with what the arms measure:

- direct interpolation (x_n = (1 - gamma) h_{n-1} + gamma r_n) degrades as gamma rises;
- the gamma-free adapter (no gate, no curriculum) dents perplexity early;
- observer-only routing (alpha trained, never used) ends up uncorrelated with block importance,
  "because nothing in the loss makes them correspond to block importance": judged on `observer_source_loss`,
  the observer trained with the document's own three terms (no signal term, so only the entropy term
  reaches its router). `observer` keeps reskip's signal term, which trains a router on the measured skip
  cost whether or not its output is used: the pair tests that mechanism (the signal term, not the forward
  pass, is what ties an observer's routing to skip cost);
- the recipe does neither: no damage on the way, and a routing signal that means something.

Thresholds (a verdict needs a margin beyond the validation set's rounding, not a significance test:
every arm is scored on the same fixed validation sequences): "degrades" is a worst perplexity 5% above
the recipe's worst with perplexity rising with c(t) over the ramp (the validations up to c's first maximum;
after it c stays put and the curve is recovery); a "dent" is 2% above the recipe at the same step
in the first half of training; "uncorrelated" is no block where the signal test finds w_recent better
than random at choosing positions to skip."""

from __future__ import annotations

from ..report.diagnostics import spearman
from .arm_set import ArmSet, run_arms
from .arms import Arm, beats_random
from .record import claim

DEGRADE = 1.05
DENT = 1.02

ARMS = [
    Arm("recipe", note="x_n = h_{n-1} + gamma_n A_n(r_n - h_{n-1}), gamma_n = c(t) g_n"),
    Arm("observer", retrofit={"variant": "observer"}, note="x_n = h_{n-1}; alpha trained by the loss's own terms"),
    Arm("observer_source_loss", retrofit={"variant": "observer"}, train={"lambda_signal": 0.0},
        note="x_n = h_{n-1}; the document's three-term loss (no signal term): only the entropy term reaches alpha"),
    Arm("interpolate", retrofit={"variant": "interpolate"}, note="x_n = (1 - gamma_n) h_{n-1} + gamma_n r_n"),
    Arm("gamma_free", retrofit={"variant": "gamma_free"}, note="x_n = h_{n-1} + A_n(r_n - h_{n-1}) from step 0"),
]


def _ramp(curve: list[dict]) -> list[dict]:
    """The validations while gamma rises: up to the first at the largest c(t) (after it c stays put, and
    what perplexity does then is recovery, not the rise)."""
    top = max(e["c"] for e in curve)
    end = next(i for i, e in enumerate(curve) if e["c"] == top)
    return curve[: end + 1]


def _early(arm: dict) -> list[dict]:
    last = arm["curve"][-1]["step"]
    return [e for e in arm["curve"] if e["step"] <= last / 2]


def claims(arms: dict) -> list[dict]:
    rec, obs, itp, free = arms["recipe"], arms["observer"], arms["interpolate"], arms["gamma_free"]
    out = []

    ramp = _ramp(itp["curve"])
    cs, ps = [e["c"] for e in ramp], [e["ppl"] for e in ramp]
    rho = spearman(cs, ps)
    worse = itp["worst_ppl"] / rec["worst_ppl"]
    out.append(claim(
        "Direct interpolation toward r_n degrades the frozen blocks as gamma rises",
        f"interpolate: val ppl {ps[0]:.3f} at c = {cs[0]:.2f}, worst {itp['worst_ppl']:.3f} at step {itp['worst_step']}, "
        f"final {itp['final_ppl']:.3f} (backbone {itp['ppl_backbone']:.3f}); Spearman(c(t), ppl) over the ramp "
        f"(steps {ramp[0]['step']}-{ramp[-1]['step']}) = "
        f"{'n/a' if rho is None else f'{rho:.2f}'}; its worst is {worse:.3f} x the recipe's worst ({rec['worst_ppl']:.3f})",
        None if rho is None else bool(worse > DEGRADE and rho > 0)))

    steps = {e["step"]: e["ppl"] for e in rec["curve"]}
    dents = [(e["ppl"] / steps[e["step"]], e["step"]) for e in _early(free) if e["step"] in steps]
    dent, at = max(dents) if dents else (None, None)
    out.append(claim(
        "The gamma-free adapter (no gate, no curriculum) dents perplexity early",
        ("no shared early validation step" if dent is None else
         f"gamma_free / recipe val ppl at the same step, first half of training: at most {dent:.3f} (step {at}); "
         f"worst {free['worst_ppl']:.3f} at step {free['worst_step']} vs the recipe's {rec['worst_ppl']:.3f}; "
         f"final {free['final_ppl']:.3f} vs {rec['final_ppl']:.3f}"),
        None if dent is None else bool(dent > DENT)))

    doc = arms["observer_source_loss"]
    ob, sb, rb = beats_random(obs), beats_random(doc), beats_random(rec)
    p = max(doc["signal_test"]["rates"])
    out.append(claim(
        "Observer-only routing ends up uncorrelated with block importance (the document's loss: nothing in it "
        "ties alpha to importance)",
        f"observer_source_loss, signal test at p = {p}: w_recent beats random on blocks {sb or 'none'} (the recipe: "
        f"{rb or 'none'}); Spearman(I(n), A(n)) over blocks {_fmt(doc['spearman_I_vs_A'])} vs "
        f"{_fmt(rec['spearman_I_vs_A'])} (recipe)",
        not sb))
    out.append(claim(
        "With reskip's signal term, an observer's routing does tell where skipping is cheap: the term, not the "
        "forward pass, is what ties alpha to skip cost",
        f"observer (signal term on): w_recent beats random on blocks {ob or 'none'}, Spearman(I(n), A(n)) "
        f"{_fmt(obs['spearman_I_vs_A'])}; observer_source_loss (off): blocks {sb or 'none'}",
        bool(ob) and not sb))

    out.append(claim(
        "The recipe bridges from the backbone without damage and gives a routing signal that means something",
        f"recipe: worst val ppl {rec['worst_ppl']:.3f} at step {rec['worst_step']} (backbone {rec['ppl_backbone']:.3f}), "
        f"final {rec['final_ppl']:.3f}; w_recent beats random on blocks {rb or 'none'}",
        bool(rec["worst_ppl"] <= rec["ppl_backbone"] * (1 + 1e-6) and rb)))
    return out


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def run(options, folder, show=print) -> dict | None:
    """The four variants, trained side by side (`arm_set.run_arms`)."""
    return run_arms(ArmSet(arms=lambda options, base: ARMS, claims=claims), options, folder, show)
