"""One row of an SFT JSONL file as chat messages (:func:`row_messages`): the ``messages`` format or
the ``prompt``/``response`` format, with the keys renamed by ``--messages-key``, ``--prompt-key``
and ``--response-key``; a row that cannot be used raises :class:`BadRow` with its kind (one of
:data:`dlmspec.data.sft.BAD_KINDS`) and why.
"""

from __future__ import annotations

import re
from typing import Any

from dlmspec.data import chat

class BadRow(Exception):
    """A row that cannot be used: ``kind`` (one of :data:`BAD_KINDS`) and why, in words."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind
        self.why = why


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


#: A UTF-16 surrogate code point: JSON's ``"\ud800"`` escapes parse to one, and no UTF-8 text holds it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_text(value: str, where: str) -> None:
    """Raise :class:`BadRow` (``bad_text``) when ``value`` holds a lone surrogate (not Unicode
    text: no tokenizer can encode it)."""
    found = _SURROGATE.search(value)
    if found is not None:
        raise BadRow("bad_text", f"{where} holds the lone surrogate \\u{ord(found.group()):04x} at character "
                     f"{found.start()} (not Unicode text; write the character itself, or a pair of surrogates)")


def _present(record: dict) -> str:
    """The row's first eight keys, for a message (``"none"`` for an empty object)."""
    return ", ".join(repr(k) for k in list(record)[:8]) or "none"


def row_messages(record: Any, fmt: str, keys: dict[str, str]) -> list[dict[str, str]]:
    """The conversation of one parsed row, as ``[{"role", "content"}, ...]``.

    Args:
        record: the parsed JSON line.
        fmt: ``"messages"`` or ``"prompt_response"``.
        keys: ``{"messages": ..., "prompt": ..., "response": ...}``, the row's key names.

    Raises:
        BadRow: the row is not a usable conversation (kind and why).
    """
    if not isinstance(record, dict):
        raise BadRow("not_json", f"expected a JSON object, got a JSON {_json_type(record)}")
    if fmt == "prompt_response":
        prompt_key, response_key = keys["prompt"], keys["response"]
        for key in (prompt_key, response_key):
            if key not in record:
                raise BadRow("missing_key", f"no key {key!r} (the row has keys: {_present(record)})")
            if not isinstance(record[key], str):
                raise BadRow("wrong_type", f"key {key!r} must be a string, got a JSON {_json_type(record[key])}")
        for key in (prompt_key, response_key):
            _check_text(record[key], repr(key))
        if not record[response_key].strip():
            raise BadRow("empty_response", f"key {response_key!r} is empty")
        return [{"role": "user", "content": record[prompt_key]},
                {"role": "assistant", "content": record[response_key]}]
    key = keys["messages"]
    if key not in record:
        other = " (a file has one format: the first row's)" if keys["prompt"] in record else ""
        raise BadRow("missing_key", f"no key {key!r} (the row has keys: {_present(record)}){other}")
    messages = record[key]
    if not isinstance(messages, list):
        raise BadRow("wrong_type", f"key {key!r} must be a list of messages, got a JSON {_json_type(messages)}")
    out: list[dict[str, str]] = []
    for index, message in enumerate(messages):
        where = f"{key}[{index}]"
        if not isinstance(message, dict):
            raise BadRow("wrong_type", f"{where} must be an object with role and content, got a JSON {_json_type(message)}")
        role = message.get("role")
        if role is None or role == "":
            raise BadRow("missing_role", f"{where} has no 'role' (one of {', '.join(chat.ROLES)})")
        if not isinstance(role, str):
            raise BadRow("wrong_type", f"{where}.role must be a string, got a JSON {_json_type(role)}")
        if role not in chat.ROLES:
            raise BadRow("unknown_role", f"{where}.role {role!r} is not one of {', '.join(chat.ROLES)}")
        if "content" not in message:
            raise BadRow("missing_key", f"{where} has no 'content'")
        content = message["content"]
        if not isinstance(content, str):
            raise BadRow("wrong_type", f"{where}.content must be a string, got a JSON {_json_type(content)}")
        _check_text(content, f"{where}.content")
        if role == chat.RESPONSE_ROLE and not content.strip():
            raise BadRow("empty_response", f"{where} is an assistant turn with empty content")
        out.append({"role": role, "content": content})
    replies = [i for i, m in enumerate(out) if m["role"] == chat.RESPONSE_ROLE]
    if not replies:
        raise BadRow("no_response", "the conversation has no assistant turn (nothing to learn)")
    if replies[-1] != len(out) - 1:
        raise BadRow("no_response", f"{key}[{len(out) - 1}] ({out[-1]['role']}) comes after the last "
                     "assistant turn (it would be trained on nothing)")
    return out
