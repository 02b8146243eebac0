"""A ``Prompt`` → the token ids a model reads before the reply: raw text after the start token, or a
conversation rendered by the model's chat template and tokenized as the tokenizer has it."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Tuple

from ..errors import ModelError
from ..records import Prompt
from .vocab import Vocabulary

GEMMA3_TEMPLATE_HINT = "examples/templates/gemma3.jinja in relmql's repository holds Gemma 3's published template"


@dataclass(frozen=True)
class Rendered:
    """A prompt as a model reads it. ``ids``: every token before the reply (the start token or
    the template's own first); ``special``: which of them are special tokens (chat markers, the
    start token), read as themselves and never spelled; ``tail``: the tokens after the last special
    one, whose text the reply's first characters may join in the tokenizer's chunks (the reply is
    tokenized as the tokenizer encodes the prompt's text followed by it); ``end_of_turn``: the
    token that ends the assistant's turn under a chat template (``eos`` there means it);
    ``continues``: the conversation's last turn is the assistant's, which the reply goes on."""

    ids: Tuple[int, ...]
    special: Tuple[bool, ...]
    tail: Tuple[int, ...]
    text: str
    end_of_turn: Optional[int] = None
    continues: bool = False

    def shown(self, vocab: Vocabulary, width: int = 400) -> str:
        """The prompt as text with its special tokens marked ⟨like this⟩, clipped to ``width``."""
        tok = vocab.tokenizer
        parts, run = [], []
        for i, s in zip(self.ids, self.special):
            if s:
                if run:
                    parts.append(vocab.decode(run))
                    run = []
                name = tok.convert_ids_to_tokens(int(i)) if tok is not None else str(i)
                parts.append(f"⟨{name}⟩")
            else:
                run.append(i)
        if run:
            parts.append(vocab.decode(run))
        text = "".join(parts).replace("\n", "\\n")
        return text if len(text) <= width else text[:width - 3] + "..."


@functools.lru_cache(maxsize=64)
def render(prompt: Prompt, vocab: Vocabulary, name: str) -> Rendered:
    """The tokens of ``prompt`` for the model ``name`` over ``vocab`` (cached)."""
    if not prompt.is_chat:
        body = tuple(vocab.encode(prompt.text)) if prompt.text else ()
        ids = (vocab.bos_id,) + body
        return Rendered(ids, (True,) + (False,) * len(body), body, prompt.text)
    tok = vocab.tokenizer
    template = prompt.template or getattr(tok, "chat_template", None)
    if not template:
        raise ModelError(f"the model {name!r} has no chat template, so chat() cannot be rendered for it",
                         hint="give one with USING chat_template '...' (a Jinja text or a file's path)"
                              + ("; " + GEMMA3_TEMPLATE_HINT if "gemma" in name.lower() else "")
                              + ", or write the prompt as raw text: PROMPT '...'")
    messages = [{"role": r, "content": c} for r, c in prompt.messages]
    continues = prompt.messages[-1][0] == "assistant"
    text = _apply(tok, messages, template, name, continues)
    ids = tuple(vocab.encode(text))
    if not ids:
        raise ModelError(f"the chat template of {name!r} renders this conversation as nothing")
    special = tuple(vocab.tokens[i] is None for i in ids)
    last = max((k for k, s in enumerate(special) if s), default=-1)
    return Rendered(ids, special, ids[last + 1:], text, _end_of_turn(tok, vocab, template, name), continues)


def _apply(tok, messages, template: str, name: str, continues: bool) -> str:
    try:
        return tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                       add_generation_prompt=not continues, continue_final_message=continues)
    except Exception as e:  # a template's own raise_exception(), a syntax error, an undefined name
        message = str(e).strip() or type(e).__name__
        raise ModelError(f"the chat template of {name!r} cannot render this conversation: {message}",
                         hint="check the roles' order (many templates want user and assistant turns to "
                              "alternate, the first after an optional system turn)") from None


def _end_of_turn(tok, vocab: Vocabulary, template: str, name: str) -> Optional[int]:
    """The special token the template puts after an assistant's message (None where it puts none)."""
    marker = "Zq7 relmql"
    try:
        text = tok.apply_chat_template([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": marker}],
                                       chat_template=template, tokenize=False)
    except Exception:
        return tok.eos_token_id
    at = text.rfind(marker)
    if at < 0:
        return tok.eos_token_id
    after = vocab.encode(text[at + len(marker):])
    return next((i for i in after if vocab.tokens[i] is None), tok.eos_token_id)


__all__ = ["Rendered", "render"]
