"""Every stage's hot path on a second device, simulated on the CPU (`simulated_device`): a tensor made on the host
and met with the model's fails here, as it would on a user's GPU; the host reads of device values are counted."""

from types import SimpleNamespace

import pytest
import torch

from helpers import VOCAB, tiny_model
from reskip import RetrofitConfig, retrofit
from reskip.data.packing import Packed
from reskip.evaluate.methods import evaluate_methods, parse_methods
from reskip.evaluate.multiple_choice import Question, mc_accuracy
from reskip.research.analysis.cost_probe import fit_probes
from reskip.research.analysis.signal_test import signal_test
from reskip.research.calibrate.budget import calibrate_budgets
from reskip.research.calibrate.calibration import calibrate
from reskip.research.report.diagnostics import dilution, token_trace
from reskip.skip.policies import ReSkip, StaticSkip
from reskip.skip.scoring import generate, score, score_rows
from reskip.skip.spec import METHOD_KINDS, parse_specs
from reskip.train.objective import RetrofitObjective
from reskip.train.validation import validation_metrics
from simulated_device import DeviceMismatch, SimulatedDevice


@pytest.fixture()
def model():
    rm = retrofit(tiny_model("llama", init_std=0.3), RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    return rm


def _data(n: int = 4, t: int = 16) -> Packed:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (n, t), generator=g)
    return Packed(ids, ids.clone(), ["a"] * n)


def test_the_mode_catches_a_host_tensor_and_counts_host_reads(model):
    sim = SimulatedDevice().put(model)
    with sim, pytest.raises(DeviceMismatch, match="host tensor"):
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))  # ids never moved to the model's device
    with sim:
        out = model(input_ids=torch.zeros(1, 4, dtype=torch.long).to(torch.device("cpu")))
        out.logits.sum().item()
        assert not sim.is_on(torch.zeros(3)) and sim.is_on(torch.zeros(3, device=out.logits.device))
    assert sim.total_syncs() == 1


def test_scoring_and_generation_take_host_inputs(model):
    ids = _data().input_ids
    policy = ReSkip({2: 0.3, 3: 0.3}, {2, 3}, 1)
    with SimulatedDevice().put(model):
        score(model, ids, policy, 4)
        score(model, ids, policy, 4, chunk_size=4, attention_mask=torch.ones_like(ids))
        score(model, ids, StaticSkip({2}), 4, chunk_size=4)
        score_rows(model, ids, policy, 4, 4)
        generate(model, ids[:1], policy, 4, attention_mask=torch.ones_like(ids[:1]), max_new_tokens=3, do_sample=False)


def test_training_step_validation_and_calibration_on_the_device(model):
    data = _data()
    sim = SimulatedDevice().put(model)
    objective = RetrofitObjective(model, 1.0, 0.01, lambda_signal=1.0)
    with sim:
        ids, labels = next(data.batches(2, torch.device("cpu")))
        terms = objective(ids, labels, 2, 1.0 / ids.numel(), 1.0 / ids.numel())
        terms["loss"].backward()
        validation_metrics(model, data, batch_size=2)
        policy = calibrate(model, data, delta=1.0, window=2, batch_size=2)
        policy.data["budgets"] = calibrate_budgets(model, data, [0.5, 1.0], 2, 4)
    assert all(p.grad is not None for p in model.trainable_parameters())
    methods = parse_methods(parse_specs(["backbone", "retrofit", "reskip", "static:1", "reskip:budget=1", "random:0.3"], METHOD_KINDS),
                            policy, seed=0)
    with sim:
        evaluate_methods(model, data, methods, 2, 4, policy, seed=0)


def test_diagnostics_and_multiple_choice_on_the_device(model):
    data = _data(8)

    class Tokens:  # what mc_accuracy asks of a tokenizer: ids of a text, a padding id
        pad_token_id = eos_token_id = 0

        def __call__(self, text, add_special_tokens=True):
            return SimpleNamespace(input_ids=[ord(c) % VOCAB for c in text])

    questions = [Question("ab c", [" d", " e f"], 1), Question("g h", [" i", " j"], 0)]
    with SimulatedDevice().put(model):
        signal_test(model, data, [2, 3], window=2, batch_size=4, n_boot=10)
        fit_probes(model, data, [2, 3], window=2, batch_size=4)
        dilution(model, data.input_ids)
        token_trace(model, data.input_ids[:1, :6], ReSkip({2: 0.3}, {2}, 1), 2)
        mc_accuracy(model, Tokens(), questions, StaticSkip({2}), 2)
        mc_accuracy(model, Tokens(), [Question("ab c", [" d", " e"], 1)], None, 2)  # the one-token fast path


def _simulated_loading(monkeypatch, sim: SimulatedDevice, module) -> None:
    """`module`'s load_backbone puts what it loads on the simulated device."""
    real = module.load_backbone

    def load(*args, **kwargs):
        base, tok = real(*args, **kwargs)
        sim.put(base)
        return base, tok

    monkeypatch.setattr(module, "load_backbone", load)


def test_the_training_loops_on_the_device(tmp_path, monkeypatch):
    """The side-channel's training (its steps, validations, checkpoints and resume) and a LoRA baseline's."""
    import reskip.compress.trainee as lora_trainee
    import reskip.train.loop as loop
    import reskip.train.trainee as trainee
    from helpers import save_tiny, write_corpus
    from reskip.compress.healing_run import HealingConfig
    from reskip.compress.train import train_lora
    from reskip.train.run import train_run
    from reskip.train_config import TrainConfig

    sim = SimulatedDevice()
    _simulated_loading(monkeypatch, sim, loop)
    real_retrofit = trainee.retrofit
    monkeypatch.setattr(trainee, "retrofit", lambda *a, **k: _put(sim, real_retrofit(*a, **k)))
    real_add_lora = lora_trainee.add_lora  # modules built inside the mode: marked as the device's once built
    monkeypatch.setattr(lora_trainee, "add_lora", lambda *a, **k: _put(sim, real_add_lora(*a, **k)))
    cfg = TrainConfig(model=str(save_tiny(tmp_path / "model")), data=[str(write_corpus(tmp_path / "corpus"))],
                      seq_len=16, steps=2, batch_size=2, eval_every=1, save_every=1, eval_sequences=2,
                      lambda_signal=1.0, retrofit={"block_size": 2, "rank": 8})
    with sim:
        train_run(tmp_path / "run", cfg, show_progress=False)
        train_run(tmp_path / "run", cfg, resume=True, show_progress=False)
        train_lora(cfg, HealingConfig(params=1000), tmp_path / "lora", show_progress=False)


def _put(sim: SimulatedDevice, model):
    sim.put(model)
    return model
