"""Chat templates for ``dlmspec data prepare --sft``: a conversation rendered as text segments that
know whether they are prompt or response, and the jinja text of each template.

Templates (``--chat-template``, the spec's ``[stage.sft] chat_template``):

* ``chatml``: ``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`` per message (OpenAI ChatML, as Qwen and
  many instruct models use it, without a default system prompt);
* ``llama3``: ``<|begin_of_text|>`` then ``<|start_header_id|>ROLE<|end_header_id|>\\n\\n``
  ``CONTENT<|eot_id|>`` per message, the content stripped (Meta Llama 3's template without its
  tool and date parts; ``<|begin_of_text|>`` is written literally, not the tokenizer's BOS);
* ``plain``: ``System:``/``User:``/``Assistant:`` headers, each followed by a newline and the
  content, messages joined by a blank line; no special tokens, so no end-of-turn token either
  (a model stops at the EOD after the last turn: use chatml or llama3 for multi-turn chat);
* ``tokenizer``: the Hugging Face tokenizer's own ``chat_template``, rendered by
  ``transformers``' ``apply_chat_template`` (:class:`TokenizerTemplate`).

:data:`JINJA` holds each built-in template as jinja text that ``apply_chat_template(messages,
chat_template=JINJA[name], tokenize=False)`` renders to exactly :func:`render`'s text (tests
check it with the GPT-2 tokenizer); its SHA-256 is what the dataset record keeps.

Supervision (the response flag): every assistant turn's content and its end-of-turn token
(``<|im_end|>``, ``<|eot_id|>``) are response; role headers, system and user turns and the
template text between turns are prompt. Each run of text with one flag is tokenized on its own,
so no token straddles the prompt/response boundary and the prompt's tokens are those of the
generation prompt (``add_generation_prompt=True``) that inference feeds the model. The special
tokens are split out of the template's text (never out of a message's content: a content that
contains ``<|im_end|>`` is tokenized as text, by :func:`dlmspec.data.sft.text_tokenize`).

Nothing here imports torch or megatron; ``transformers`` only for the ``tokenizer`` template.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

#: ``--chat-template`` choices.
TEMPLATES: tuple[str, ...] = ("chatml", "llama3", "plain", "tokenizer")
#: The roles a message may have.
ROLES: tuple[str, ...] = ("system", "user", "assistant")
#: The role whose turns are supervised.
RESPONSE_ROLE = "assistant"

CHATML_JINJA = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_JINJA = (
    "{% for message in messages %}"
    "{% if loop.first %}{{ '<|begin_of_text|>' }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{% if messages | length == 0 %}{{ '<|begin_of_text|>' }}{% endif %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
PLAIN_JINJA = (
    "{% for message in messages %}"
    "{% if not loop.first %}{{ '\\n\\n' }}{% endif %}"
    "{{ message['role'] | capitalize + ':\\n' + message['content'] }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{% if messages | length > 0 %}{{ '\\n\\n' }}{% endif %}{{ 'Assistant:\\n' }}"
    "{% endif %}"
)

#: The jinja text of each built-in template (what ``transformers`` renders to :func:`render`'s text).
JINJA: dict[str, str] = {"chatml": CHATML_JINJA, "llama3": LLAMA3_JINJA, "plain": PLAIN_JINJA}

#: The special-token strings each built-in template writes (split out of its text, one id each).
SPECIAL_TOKENS: dict[str, tuple[str, ...]] = {
    "chatml": ("<|im_start|>", "<|im_end|>"),
    "llama3": ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    "plain": (),
}


class ChatTemplateError(ValueError):
    """A template cannot be used (unknown name, a tokenizer without ``chat_template``, a template
    whose renderings are not prefixes of each other); the message says why and what works."""


@dataclass(frozen=True)
class Segment:
    """A piece of a rendered conversation.

    Attributes:
        text: The characters.
        response: Whether its tokens are supervised (assistant content and end-of-turn token).
        template: True for the template's own text (special tokens are split out of it), False
            for a message's content (tokenized as text only).
    """

    text: str
    response: bool
    template: bool


def template_sha256(text: str) -> str:
    """Hex SHA-256 of a template's jinja text (UTF-8), as the dataset record keeps it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def render(
    template: str, messages: Sequence[dict[str, str]], add_generation_prompt: bool = False
) -> list[Segment]:
    """Render ``messages`` (dicts with ``role`` in :data:`ROLES` and a string ``content``) with a
    built-in template (``chatml``, ``llama3``, ``plain``) as :class:`Segment` s; their texts joined
    equal ``apply_chat_template(messages, chat_template=JINJA[template], tokenize=False,
    add_generation_prompt=add_generation_prompt)``.

    Raises:
        ChatTemplateError: ``template`` is not a built-in one.
    """
    if template not in JINJA:
        raise ChatTemplateError(
            f"unknown chat template {template!r}; built-in ones are {', '.join(JINJA)}"
        )
    out: list[Segment] = []

    def prompt(text: str) -> None:
        out.append(Segment(text, False, True))

    for index, message in enumerate(messages):
        role, content = message["role"], message["content"]
        reply = role == RESPONSE_ROLE
        if template == "chatml":
            prompt(f"<|im_start|>{role}\n")
            out.append(Segment(content, reply, False))
            out.append(Segment("<|im_end|>", reply, True))
            prompt("\n")
        elif template == "llama3":
            prompt(("<|begin_of_text|>" if index == 0 else "") + f"<|start_header_id|>{role}<|end_header_id|>\n\n")
            out.append(Segment(content.strip(), reply, False))
            out.append(Segment("<|eot_id|>", reply, True))
        else:  # plain
            prompt(("\n\n" if index else "") + role.capitalize() + ":\n")
            out.append(Segment(content, reply, False))
    if add_generation_prompt:
        if template == "chatml":
            prompt("<|im_start|>assistant\n")
        elif template == "llama3":
            prompt(("" if messages else "<|begin_of_text|>") + "<|start_header_id|>assistant<|end_header_id|>\n\n")
        else:
            prompt(("\n\n" if messages else "") + "Assistant:\n")
    return [s for s in out if s.text]


def text_of(segments: Sequence[Segment]) -> str:
    """The rendered text: the segments' texts joined."""
    return "".join(s.text for s in segments)


class TokenizerTemplate:
    """A Hugging Face tokenizer's own ``chat_template`` (``--chat-template tokenizer``), split into
    :class:`Segment` s by rendering growing prefixes of the conversation with ``transformers``.

    For message ``i`` the text it adds is ``render(messages[:i+1])`` minus ``render(messages[:i])``;
    for an assistant message, the header is what ``add_generation_prompt=True`` adds, the content is
    found in the rest, and the special token right after it (allowing whitespace between) is its
    end-of-turn token; all three are checked, and a template for which a rendering is not a prefix
    of the next (one that rewrites earlier turns) is refused. Every message's content, found in
    the text its message added, is content (special-token strings in it stay text).

    Args:
        hf_tokenizer: a ``transformers`` tokenizer with a ``chat_template``.
        name: how to name it in messages (the ``--tokenizer-model`` value).

    Raises:
        ChatTemplateError: the tokenizer has no ``chat_template``.
    """

    def __init__(self, hf_tokenizer: Any, name: str) -> None:
        text = getattr(hf_tokenizer, "chat_template", None)
        if isinstance(text, dict):  # several named templates: the default one
            text = text.get("default")
        if not isinstance(text, str) or not text.strip():
            raise ChatTemplateError(
                f"--chat-template tokenizer: the tokenizer {name} has no chat_template "
                "(tokenizer_config.json or chat_template.jinja); pick a built-in one, e.g. "
                "--chat-template chatml"
            )
        self.hf = hf_tokenizer
        self.name = name
        self.jinja = text
        specials = set(getattr(hf_tokenizer, "all_special_tokens", []) or [])
        specials.update(hf_tokenizer.get_added_vocab())
        #: Special/added token strings of the tokenizer, longest first (split out of template text).
        self.special_tokens: tuple[str, ...] = tuple(sorted((s for s in specials if s), key=lambda s: (-len(s), s)))

    def _render(self, messages: Sequence[dict[str, str]], generation: bool) -> str:
        if not messages:  # transformers refuses an empty conversation
            return ""
        return self.hf.apply_chat_template(
            list(messages), chat_template=self.jinja, tokenize=False, add_generation_prompt=generation
        )

    def render(self, messages: Sequence[dict[str, str]]) -> list[Segment]:
        """``messages`` as :class:`Segment` s (their texts joined equal the tokenizer's
        ``apply_chat_template(messages, tokenize=False)``).

        Raises:
            ChatTemplateError: a rendering is not a prefix of the next one, or an assistant turn's
                content is not found where the template puts it.
            jinja2 errors: the template raised (``raise_exception``) for these messages.
        """
        out: list[Segment] = []
        previous = ""
        for index, message in enumerate(messages):
            if message["role"] != RESPONSE_ROLE:
                current = self._render(messages[: index + 1], False)
                self._check_prefix(previous, current, index)
                added = current[len(previous):]
                at, content = _find_content(added, message["content"])
                if at < 0 or not content:  # not written as given: all of it is template text
                    out.append(Segment(added, False, True))
                else:  # the content is text: special-token strings in it stay text
                    out.append(Segment(added[:at], False, True))
                    out.append(Segment(content, False, False))
                    out.append(Segment(added[at + len(content):], False, True))
                previous = current
                continue
            header = self._render(messages[:index], True)
            self._check_prefix(previous, header, index)
            current = self._render(messages[: index + 1], False)
            self._check_prefix(header, current, index)
            body = current[len(header):]
            at, content = _find_content(body, message["content"])
            if at < 0 or not content:
                raise ChatTemplateError(
                    f"--chat-template tokenizer: the template of {self.name} does not write assistant "
                    f"turn {index}'s content as given (it rewrites it), so its response tokens cannot "
                    "be told apart; pick a built-in one, e.g. --chat-template chatml"
                )
            end = at + len(content)
            rest = body[end:]
            stripped = rest.lstrip()
            eot = next((s for s in self.special_tokens if stripped.startswith(s)), "")
            supervised_tail = rest[: len(rest) - len(stripped) + len(eot)] if eot else ""
            out.append(Segment(header[len(previous):] + body[:at], False, True))
            out.append(Segment(body[at:end], True, False))
            if supervised_tail:
                out.append(Segment(supervised_tail, True, True))
            if rest[len(supervised_tail):]:
                out.append(Segment(rest[len(supervised_tail):], False, True))
            previous = current
        return [s for s in out if s.text]

    def _check_prefix(self, before: str, after: str, index: int) -> None:
        if not after.startswith(before):
            raise ChatTemplateError(
                f"--chat-template tokenizer: the template of {self.name} renders message {index} by "
                "changing the text of earlier messages (a rendering is not a prefix of the next), so "
                "turns cannot be split into prompt and response; pick a built-in one, e.g. "
                "--chat-template chatml"
            )


def _find_content(text: str, content: str) -> tuple[int, str]:
    """Where a message's ``content`` is in ``text`` (the part its message added), as written or
    else stripped (templates that strip it, as Llama 3's ``| trim``): ``(index, the content as
    found)``, index -1 when it is not there."""
    at = text.find(content)
    if at < 0:
        content = content.strip()
        at = text.find(content) if content else -1
    return at, content


def split_specials(text: str, specials: Sequence[str]) -> list[tuple[str, bool]]:
    """``text`` cut into ``(piece, is_special)`` at every occurrence of a string of ``specials``
    (longest match first at each position)."""
    ordered = sorted(set(s for s in specials if s), key=len, reverse=True)
    pieces: list[tuple[str, bool]] = []
    start = i = 0
    while i < len(text):
        hit = next((s for s in ordered if text.startswith(s, i)), None) if ordered else None
        if hit is None:
            i += 1
            continue
        if i > start:
            pieces.append((text[start:i], False))
        pieces.append((hit, True))
        i += len(hit)
        start = i
    if start < len(text):
        pieces.append((text[start:], False))
    return pieces


def tokenize_segments(
    segments: Sequence[Segment],
    tokenize: Callable[[str], list[int]],
    special_ids: dict[str, int],
) -> tuple[list[int], list[int]]:
    """Token ids and response flags (1/0, one per id) of rendered ``segments``.

    Special-token strings (the keys of ``special_ids``) are split out of template text and become
    their id; the text between them is joined with neighbouring text of the same flag (content
    included) and tokenized with ``tokenize`` run by run.

    Returns:
        ``(ids, flags)``, two lists of the same length.
    """
    ids: list[int] = []
    flags: list[int] = []
    pending: list[str] = []
    pending_flag = 0

    def flush() -> None:
        if pending:
            got = list(tokenize("".join(pending)))
            ids.extend(got)
            flags.extend([pending_flag] * len(got))
            pending.clear()

    for segment in segments:
        flag = int(segment.response)
        pieces = split_specials(segment.text, list(special_ids)) if segment.template else [(segment.text, False)]
        for piece, special in pieces:
            if special or flag != pending_flag:
                flush()
                pending_flag = flag
            if special:
                ids.append(special_ids[piece])
                flags.append(flag)
            else:
                pending.append(piece)
    flush()
    return ids, flags
