"""PROMPT's value → a typed ``Prompt``: raw text, or the turns of ``chat(...)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

from ..errors import Error, closest
from ..records import ROLES, Prompt
from ..syntax import ast as A
from .expr import check_calls, evaluate
from .options import PlanError, shown


def plan_prompt(node: Optional[A.Node], env, source: str, template: str = "",
                template_span=None) -> Optional[Prompt]:
    """The ``Prompt`` of PROMPT's expression ``node`` (None without one), its values read in
    ``env`` (the query's parameters); ``template``: the chat_template option."""
    if node is None:
        if template:
            raise PlanError("chat_template renders PROMPT chat(...), and the query has no PROMPT", template_span,
                            source)
        return None
    if isinstance(node, A.Call) and node.name == "chat":
        messages = _messages(node, env, source)
        return Prompt(messages=messages, template=_template(template, template_span, source) or None)
    check_calls(node, source, allow_aggregates=False, allow_rows=False)
    value = _value(node, env, source)
    if isinstance(value, (list, tuple)):
        raise PlanError("PROMPT is text, or a conversation written chat(...)", node.span, source,
                        hint="a list of {role, content} messages is written chat(:messages)")
    if not isinstance(value, str):
        raise PlanError(f"PROMPT must be text or chat(...), not {shown(value)}", node.span, source)
    if template:
        raise PlanError("chat_template renders a conversation; this PROMPT is raw text", template_span, source,
                        hint="write PROMPT chat('user', ...) to use a chat template")
    return Prompt(text=value)


def _value(node: A.Node, env, source: str) -> Any:
    try:
        return evaluate(node, env)
    except Error as e:
        if e.source is None and e.span is not None:
            e.source = source
        raise


def _messages(node: A.Call, env, source: str) -> Tuple[Tuple[str, str], ...]:
    for a in node.args:
        if isinstance(a, A.Star):
            raise PlanError("* is not an argument of chat()", a.span, source)
        check_calls(a, source, allow_aggregates=False, allow_rows=False)
    if not node.args:
        raise PlanError("chat() needs a conversation: chat('user', 'a question'), or chat(:messages)", node.span,
                        source)
    if len(node.args) == 1:
        value = _value(node.args[0], env, source)
        if not isinstance(value, (list, tuple)):
            raise PlanError(f"chat() of one argument takes a list of {{role, content}} messages, not {shown(value)}",
                            node.args[0].span, source, hint="or write the turns out: chat('user', 'a question')")
        turns = [_turn(m, i, node.args[0], source) for i, m in enumerate(value, 1)]
    else:
        if len(node.args) % 2:
            raise PlanError("chat() takes role and content pairs: chat('system', '...', 'user', '...')",
                            node.args[-1].span, source)
        turns = []
        for role_node, content_node in zip(node.args[::2], node.args[1::2]):
            role, content = _value(role_node, env, source), _value(content_node, env, source)
            turns.append((_role(role, role_node, source), _content(content, content_node, source)))
    if not turns:
        raise PlanError("chat() needs at least one message: the conversation is empty", node.span, source)
    return tuple(turns)


def _role(role: Any, node: A.Node, source: str, where: str = "") -> str:
    if not isinstance(role, str) or role.lower() not in ROLES:
        near = closest(str(role), ROLES) if isinstance(role, str) else None
        raise PlanError(f"unknown role {shown(role)}{where}; a role is one of {', '.join(ROLES)}", node.span, source,
                        hint=f"did you mean {near!r}?" if near else None)
    return role.lower()


def _content(content: Any, node: A.Node, source: str, where: str = "") -> str:
    if not isinstance(content, str):
        raise PlanError(f"a message's content is text, not {shown(content)}{where}", node.span, source)
    return content


def _turn(message: Any, number: int, node: A.Node, source: str) -> Tuple[str, str]:
    where = f" (message {number})"
    if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
        raise PlanError(f"message {number} is not a {{role, content}} object: {shown(message)[:80]}", node.span,
                        source, hint='each message is like {"role": "user", "content": "a question"}')
    return _role(message["role"], node, source, where), _content(message["content"], node, source, where)


def _template(value: str, span, source: str) -> str:
    """The chat_template option's Jinja text: the value itself, or the file it names."""
    if not value or "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlanError(f"chat_template: no file {value!r} (and the text is no Jinja template)", span, source,
                        hint=f"give a template's text, or a file's path (relative paths start at {Path.cwd()})"
                        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise PlanError(f"chat_template: cannot read {value!r}: {getattr(e, 'strerror', None) or e}", span,
                        source) from None


__all__ = ["plan_prompt"]
