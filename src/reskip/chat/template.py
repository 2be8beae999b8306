"""A chat model's template read as data: where a user's turn starts, the token that ends a turn, and a prompt as the
model is asked it. One place for what differs between families' templates (SmolLM2 and Qwen2.5 add a default system
prompt; Gemma's turns end in `<end_of_turn>`)."""

from __future__ import annotations

from ..errors import ReskipError

_MARK = "\u2063RESKIP\u2063"  # a marker no template writes itself (an invisible separator around a word)


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def require_chat_template(tokenizer, what: str) -> None:
    if not has_chat_template(tokenizer):
        raise ReskipError(f"{what} needs a chat model: this tokenizer has no chat template (use text data instead)")


def user_turn_prefix(tokenizer) -> str:
    """The template's text up to where a user's first message starts (its default system prompt included): what a
    Magpie-style sampler gives the model so that it writes a user's request itself."""
    require_chat_template(tokenizer, "sampling user turns")
    full = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    return full[: full.index(_MARK)]


def end_of_turn_ids(tokenizer) -> list[int]:
    """The token ids that end a turn: the first token the template writes after a message's content, and the
    tokenizer's end-of-sequence token."""
    require_chat_template(tokenizer, "reading the end of a turn")
    full = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    closing = full[full.index(_MARK) + len(_MARK):]
    ids = tokenizer(closing, add_special_tokens=False).input_ids[:1] if closing.strip() else []
    eos = tokenizer.eos_token_id
    return sorted({*ids, *([eos] if eos is not None else [])})


def prompt_text(tokenizer, user: str) -> str:
    """One user message as the model is asked it: through the chat template with the assistant's header after it."""
    require_chat_template(tokenizer, "asking a chat prompt")
    return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                         add_generation_prompt=True)


def normalized(text: str) -> str:
    """A prompt's text as duplicates are found: lower case, letters and digits only, single spaces."""
    return " ".join("".join(c if c.isalnum() else " " for c in text.lower()).split())
