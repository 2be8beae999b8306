"""Data: splits, chat labels, packing, user formats, and the bundled default mix."""

import json

import pytest

from helpers import has_package
from reskip import ReskipError
from reskip.data.documents import SPLITS, Document, read_user_file, segments, split_of
from reskip.data.packing import IGNORE, chat_tokens, pack
from reskip.data.sources import load_splits


def test_split_assignment_is_deterministic_and_roughly_proportional():
    ids = [f"doc:{i}" for i in range(20000)]
    first = [split_of(i) for i in ids]
    assert first == [split_of(i) for i in ids]
    share = {s: first.count(s) / len(ids) for s in SPLITS}
    assert 0.89 < share["train"] < 0.93 and all(0.02 < share[s] < 0.04 for s in ("val", "calib", "test"))


def test_segments_cut_at_blank_lines_and_keep_all_text():
    text = "\n\n".join(f"paragraph {i} " * 30 for i in range(40))
    parts = segments(text, 1000)
    assert len(parts) > 5 and "\n\n".join(parts) == text
    assert all(len(p) <= 1000 + 400 for p in parts)


def test_chat_labels_cover_assistant_content_only(smollm2):
    _, tok = smollm2
    messages = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"},
                {"role": "user", "content": "Nothing"}, {"role": "assistant", "content": "Alright."}]
    ids, labels = chat_tokens(tok, messages)
    assert ids == tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False).input_ids
    trained = tok.decode([i for i, lab in zip(ids, labels) if lab != IGNORE])
    assert trained == "Hello! How can I help?<|im_end|>\nAlright.<|im_end|>\n"


def test_a_conversation_the_assistant_opens_is_context_until_it_answers(smollm2):
    """Its opening turn answers nothing (and the template cannot render the empty conversation before it): it is
    context; the assistant's answer to the user is trained."""
    _, tok = smollm2
    messages = [{"role": "assistant", "content": "Welcome back."}, {"role": "user", "content": "Thanks"},
                {"role": "assistant", "content": "Any time."}]
    ids, labels = chat_tokens(tok, messages)
    assert ids == tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False).input_ids
    assert tok.decode([i for i, lab in zip(ids, labels) if lab != IGNORE]) == "Any time.<|im_end|>\n"


def test_pack_is_deterministic_and_mixes_sources(smollm2):
    _, tok = smollm2
    docs = [Document(f"a{i}", "prose", "To be or not to be, that is the question. " * 20) for i in range(20)]
    docs += [Document(f"b{i}", "code", "def f(x):\n    return x + 1\n" * 30) for i in range(20)]
    a = pack(tok, docs, 64, 12, seed=3)
    b = pack(tok, docs, 64, 12, seed=3)
    assert a.input_ids.shape == (12, 64) and (a.input_ids == b.input_ids).all()
    assert a.sources.count("prose") == a.sources.count("code") == 6


def test_user_formats(tmp_path):
    (tmp_path / "t.txt").write_text("plain text\n\nmore text")
    (tmp_path / "x.jsonl").write_text(json.dumps({"text": "one"}) + "\n" + json.dumps(
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}) + "\n")
    docs = read_user_file(tmp_path / "t.txt") + read_user_file(tmp_path / "x.jsonl")
    assert [d.text is not None for d in docs] == [True, True, False]
    (tmp_path / "bad.jsonl").write_text('{"foo": 1}\n')
    with pytest.raises(ReskipError, match="neither"):
        read_user_file(tmp_path / "bad.jsonl")
    (tmp_path / "bad2.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(ReskipError, match="assistant"):
        read_user_file(tmp_path / "bad2.jsonl")
    with pytest.raises(ReskipError, match="does not exist"):
        load_splits([str(tmp_path / "missing.txt")])


@pytest.mark.real
def test_default_mix_is_diverse_disjoint_and_checksummed():
    if not has_package("chitchat_dataset"):
        pytest.fail("the default mix needs chitchat-dataset: run the README's set-up command")
    splits, record = load_splits(["default"])
    manifest = record["parts"][0]["manifest"]
    assert set(manifest["files"]) == set(SPLITS) and all(len(v) == 64 for v in manifest["files"].values())
    for s in SPLITS:
        assert set(record["splits"][s]["by_source"]) == {"dialogue", "prose", "code"}
    ids = [set(d.doc_id for d in splits[s]) for s in SPLITS]
    assert sum(len(x) for x in ids) == len(set().union(*ids))  # disjoint
    prose = {d.doc_id.split("#")[0] for s in SPLITS for d in splits[s] if d.source == "prose"}
    assert not any("_gut_f.txt" in p for p in prose)  # one edition per play
    assert "prose:hamlet_gut.txt" in prose and any("paradise_lost" in p for p in prose)
    every = " ".join(d.doc_id for s in SPLITS for d in splits[s]).lower()
    assert "mmlu" not in every and "bigbench" not in every
