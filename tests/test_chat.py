"""The model's own conversations and chat fidelity: the template read as data, batched sampling (resumable, the
process's random state untouched, float32 greedy the same at any batch), the held-out prompt sets, the self-written
healing data (resumed to the same bytes, held-out prompts never in it, cut replies never taught to end), loop
detection, and the chat measure (teacher-forced KL on the reply positions equal to a direct computation; greedy
agreement; the backbone's own row exact)."""

import json
import math

import pytest
import torch

from helpers import save_tiny
from reskip.backbones.loading import load_backbone
from reskip.chat.prompt_sets import FIXED_PROMPTS, SET_NAMES, digest, held_out_keys, prompt_set
from reskip.chat.sampling import Sampling, Written, write_all, write_batch
from reskip.chat.self_data import BATCHES, SUMMARY, SelfDataSettings, write_self_data
from reskip.chat.template import end_of_turn_ids, normalized, prompt_text, user_turn_prefix
from reskip.chat.user_prompts import read_prompts
from reskip.data.documents import read_user_file
from reskip.data.packing import IGNORE, document_tokens
from reskip.errors import ReskipError
from reskip.evaluate.chat_fidelity import greedy_per_prompt, original_replies, reply_sequences
from reskip.evaluate.loops import loop_span, loops


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    folder = save_tiny(tmp_path_factory.mktemp("chat") / "model", "llama", chat=True)
    model, tok = load_backbone(str(folder), "float32", False, "cpu")
    return folder, model, tok


def test_template_read_as_data(chat_model):
    _, _, tok = chat_model
    assert user_turn_prefix(tok) == "w2 "
    assert end_of_turn_ids(tok) == [tok.convert_tokens_to_ids("w1")]
    assert prompt_text(tok, "w5 w6") == "w2 w5 w6 w1 w3 "
    assert normalized("  Hello,   World! ") == "hello world"


def test_sampling_is_resumable_and_leaves_the_random_state(chat_model):
    _, model, tok = chat_model
    texts = ["w2 w5 w1 w3 ", "w2 w6 w7 w8 w1 w3 "]
    before = torch.random.get_rng_state()
    a = write_batch(model, tok, texts, Sampling(1.0, 0.95, 12), [1], seed=3)
    assert torch.equal(torch.random.get_rng_state(), before)
    b = write_batch(model, tok, texts, Sampling(1.0, 0.95, 12), [1], seed=3)
    c = write_batch(model, tok, texts, Sampling(1.0, 0.95, 12), [1], seed=4)
    assert [w.ids for w in a] == [w.ids for w in b] and [w.ids for w in a] != [w.ids for w in c]
    for w in a:  # cut at the stop token, which is kept apart
        assert 1 not in w.ids and (w.stop in (None, 1)) and w.tokens == w.ids + ([1] if w.ended else [])


def test_float32_greedy_is_the_same_batched_or_one_at_a_time(chat_model):
    """What the chat measure relies on to cache the original's replies once and let any method decode in batches."""
    _, model, tok = chat_model
    texts = [prompt_text(tok, " ".join(f"w{5 + (i * 7 + j) % 80}" for j in range(2 + i % 5))) for i in range(6)]
    batched = write_all(model, tok, texts, Sampling(max_new_tokens=20), [1], batch_size=6, show_progress=False)
    single = write_all(model, tok, texts, Sampling(max_new_tokens=20), [1], batch_size=1, show_progress=False)
    assert [(w.ids, w.stop) for w in batched] == [(w.ids, w.stop) for w in single]


def test_prompt_sets_are_whole_disjoint_and_checked():
    test, val = prompt_set("test"), prompt_set("val")
    assert len(test) >= 96 and test.prompts[:16] == FIXED_PROMPTS and len(val) >= 48
    assert test.digest == digest(list(test.prompts)) and test.first(20).digest == digest(list(test.prompts[:20]))
    keys = [normalized(p) for name in SET_NAMES for p in prompt_set(name).prompts]
    assert len(keys) == len(set(keys)) == len(held_out_keys())  # no prompt twice, across the two sets
    assert test.seed != val.seed and SelfDataSettings(1).seed not in (test.seed, val.seed)
    with pytest.raises(ReskipError, match="one of test, val"):
        prompt_set("train")


def test_loops_are_units_repeated_in_a_row():
    assert loop_span([1, 2, 3] * 4) == (0, 3, 4)
    assert loop_span([9, 8] + [5] * 12) == (2, 1, 12)
    assert not loops([1, 2, 3] * 3)  # three repeats over 9 tokens: under MIN_TOKENS
    assert not loops([5] * 11) and not loops(list(range(200)))
    assert not loops([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 8])  # repeated twice, not three times
    assert loops([7, 7] + [1, 2, 3, 4, 5, 6] * 3)


def test_greedy_agreement_per_prompt():
    tok = type("T", (), {"decode": staticmethod(lambda ids, skip_special_tokens=True: " ".join(f"w{i}" for i in ids)
                                                + (" ." if 9 in ids else ""))})()
    original = [Written([1, 2, 3], 0), Written(list(range(10, 50)), None), Written([4] * 20, None)]
    other = [Written([1, 2, 3], 0), Written(list(range(10, 45)) + [0] * 5, None), Written([4] * 20, None)]
    g = greedy_per_prompt(tok, original, other)
    assert g["prefix"] == [1.0, 35 / 40, 1.0] and g["identical"] == [1.0, 0.0, 1.0]
    assert g["first32"] == [1.0, 1.0, 1.0] and g["loops"] == [0.0, 0.0, 1.0]
    assert g["new_loop"] == [0.0, 0.0, 0.0]  # the third loops, but so does the original


def test_self_data_resumes_to_the_same_file_and_never_holds_a_held_out_prompt(chat_model, tmp_path, monkeypatch):
    _, model, tok = chat_model
    settings = SelfDataSettings(6, batch_size=4, reply_tokens=10)
    whole = write_self_data(model, tok, tmp_path / "a", settings, show_progress=False, show=lambda *_: None)
    # killed after its first batch (a half-written line after it): resumed, the same conversations
    first = (tmp_path / "a" / BATCHES).read_text().splitlines()[0]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "settings.json").write_text((tmp_path / "a" / "settings.json").read_text())
    (tmp_path / "b" / BATCHES).write_text(first + "\n" + '{"batch": 1, "conv')
    resumed = write_self_data(model, tok, tmp_path / "b", settings, show_progress=False, show=lambda *_: None)
    assert resumed.read_text() == whole.read_text()
    summary = json.loads((tmp_path / "a" / SUMMARY).read_text())
    docs = read_user_file(whole)
    assert summary["conversations"] == len(docs) == 6
    assert summary["tokens"] == sum(len(document_tokens(tok, d)[0]) - 1 for d in docs)
    # a request the model writes that is a held-out prompt is dropped (the next one kept in its place)
    first_request = docs[0].messages[0]["content"]
    monkeypatch.setattr("reskip.chat.self_data.held_out_keys", lambda: {normalized(first_request)})
    again = write_self_data(model, tok, tmp_path / "c", settings, show_progress=False, show=lambda *_: None)
    requests = [d.messages[0]["content"] for d in read_user_file(again)]
    assert first_request not in requests and len(requests) == 6
    assert requests[:5] == [d.messages[0]["content"] for d in docs[1:]]
    # another settings' folder is refused, not overwritten
    with pytest.raises(ReskipError, match="other settings"):
        write_self_data(model, tok, tmp_path / "b", SelfDataSettings(7, batch_size=4, reply_tokens=10),
                        show_progress=False, show=lambda *_: None)


def test_user_prompts_drop_held_out_and_repeated_ones(chat_model, tmp_path):
    _, model, tok = chat_model
    path = tmp_path / "p.txt"
    path.write_text(f"w5 w6 w7\n\nw5 w6 w7\n{FIXED_PROMPTS[0]}\nw8 w9\n")
    prompts = read_prompts(path)
    assert prompts == ["w5 w6 w7", FIXED_PROMPTS[0], "w8 w9"]
    settings = SelfDataSettings(10, batch_size=2, reply_tokens=6, prompts_sha256=digest(prompts))
    out = write_self_data(model, tok, tmp_path / "d", settings, prompts, show_progress=False, show=lambda *_: None)
    asked = [d.messages[0]["content"] for d in read_user_file(out)]
    assert asked == ["w5 w6 w7", "w8 w9"]  # the held-out fixed prompt is never healed on
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "w5"}\n[1, 2]\n')
    with pytest.raises(ReskipError, match="bad.jsonl:2"):
        read_prompts(bad)
    with pytest.raises(ReskipError, match="no such file"):
        read_prompts(tmp_path / "missing.txt")


def test_a_cut_reply_is_trained_but_never_taught_to_end(chat_model, tmp_path):
    _, _, tok = chat_model
    path = tmp_path / "c.jsonl"
    rows = [{"messages": [{"role": "user", "content": "w5 w6"}, {"role": "assistant", "content": "w7 w8"}],
             "open_end": flag} for flag in (False, True)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    closed, cut = read_user_file(path)
    ids, labels = document_tokens(tok, closed)
    cut_ids, cut_labels = document_tokens(tok, cut)
    w = tok.convert_tokens_to_ids
    assert ids == [w("w2"), w("w5"), w("w6"), w("w1"), w("w3"), w("w7"), w("w8"), w("w1"), w("w1")]
    assert labels[5:] == [w("w7"), w("w8"), w("w1"), w("w1")]
    assert cut_ids == [w("w2"), w("w5"), w("w6"), w("w1"), w("w3"), w("w7"), w("w8"), w("w1")]  # no end tag
    assert cut_labels[5:] == [w("w7"), w("w8"), IGNORE] and set(cut_labels[:5]) == {IGNORE}
    path.write_text(json.dumps({**rows[0], "open_end": "yes"}) + "\n")
    with pytest.raises(ReskipError, match="open_end must be true or false"):
        read_user_file(path)


def test_reply_kl_is_the_kl_on_the_reply_positions(chat_model, tmp_path, monkeypatch):
    """The evaluator's chat columns on a pruned model equal KL and top-1 computed by hand on the reply positions."""
    from reskip.chat.prompt_sets import PromptSet
    from reskip.compress.blocks import prune
    from reskip.evaluate.against_backbone import Reference
    from reskip.skip.spec import Spec

    folder, model, tok = chat_model
    monkeypatch.setenv("RESKIP_CACHE", str(tmp_path / "cache"))
    prompts = PromptSet("tiny", ("w5 w6 w7", "w8", "w9 w10 w11 w12"), digest(["w5 w6 w7", "w8", "w9 w10 w11 w12"]), 0)
    ref = Reference.load(str(folder), "float32", "cpu", False, 1)
    pruned, _ = load_backbone(str(folder), "float32", False, "cpu")
    prune(pruned, {2})
    replies = original_replies(model, tok, prompts, max_new_tokens=8, show_progress=False)
    assert original_replies(model, tok, prompts, max_new_tokens=8, show_progress=False).replies == replies.replies
    data = reply_sequences(replies, 1)
    kl_hand, agree_hand, n_hand = 0.0, 0, 0
    with torch.no_grad():
        for i in range(len(data)):
            ids, labels = data.input_ids[i:i + 1], data.labels[i]
            zp, zq = model(ids).logits[0].float(), pruned(ids).logits[0].float()
            for t in range(ids.shape[1] - 1):
                if labels[t + 1] != IGNORE:
                    lp, lq = zp[t].log_softmax(-1), zq[t].log_softmax(-1)
                    kl_hand += float((lp.exp() * (lp - lq)).sum())
                    agree_hand += int(zp[t].argmax() == zq[t].argmax())
                    n_hand += 1
    from reskip.evaluate.chat_fidelity import chat_rows
    from reskip.evaluate.methods import Method
    from reskip.evaluate.scorers import ModelScorer

    m = Method("pruned", None, Spec("export", "pruned", run=str(tmp_path)))
    m.scorer = ModelScorer(pruned, [2], [3], 6)
    rows = chat_rows(ref.reference, tok, replies, [Method("backbone", None, Spec("backbone", "backbone")), m],
                     lambda method: write_all(pruned, tok, replies.texts(tok), Sampling(max_new_tokens=8), [1],
                                              show_progress=False), show=lambda *_: None)
    assert rows["pruned"]["reply_tokens"] == n_hand == sum(len(r.tokens) for r in replies.replies)
    assert rows["pruned"]["kl"]["mean"] == pytest.approx(kl_hand / n_hand, rel=1e-4)
    assert rows["pruned"]["top1"]["mean"] == pytest.approx(agree_hand / n_hand)
    b = rows["backbone"]
    assert b["kl"]["mean"] == 0 and b["top1"]["mean"] == 1 and b["identical"]["mean"] == 1
    assert b["new_loop"]["mean"] == 0 and math.isfinite(rows["pruned"]["prefix"]["mean"])


@pytest.mark.integration
def test_eval_reads_every_methods_chat_replies(tmp_path, monkeypatch):
    """`reskip eval --chat N`: every method's row, a skip policy's and a model of its own alike, with the backbone's
    own row exact."""
    from helpers import tiny_trained_run
    from reskip.cli import main

    monkeypatch.setenv("RESKIP_CACHE", str(tmp_path / "cache"))
    run = tiny_trained_run(tmp_path, calibrate=[], chat=True)
    assert main(["eval", str(run), "--methods", "backbone", "retrofit", "static:1", "pruned:1", "--chat", "5",
                 "--sequences", "2", "--benchmarks", "none", "--quiet", "--out", str(tmp_path / "ev")]) == 0
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    chat = results["chat"]
    assert chat["prompts"] == 5 and chat["dtype"] == "float32" and set(chat["methods"]) == {
        "backbone", "retrofit", "static:1", "pruned:1"}
    b = chat["methods"]["backbone"]
    assert b["kl"]["mean"] == 0 and b["top1"]["mean"] == 1 and b["identical"]["mean"] == 1
    assert chat["methods"]["static:1"]["kl"]["mean"] > 0 and chat["methods"]["pruned:1"]["kl"]["mean"] > 0
    assert "Chat fidelity: 5 held-out chat prompts" in (tmp_path / "ev" / "results.md").read_text()
