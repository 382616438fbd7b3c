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
contains ``<|im_end|>`` is tokenized as text, by :func:`dlmspec.data.sft_tokens.text_tokenize`).

Nothing here imports torch or megatron; ``transformers`` only for the ``tokenizer`` template.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

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


class TemplateTooCostly(ChatTemplateError):
    """A tokenizer's ``chat_template`` ran past a row's time, output or memory bound
    (:class:`RenderBounds`): a template that loops without end or grows strings without bound."""


#: Conversations longer than this many messages are split from one rendering when the template
#: allows it (:meth:`TokenizerTemplate._segments_in_one_pass`); shorter ones prefix by prefix.
FAST_MIN_MESSAGES = 16
#: Seconds a tokenizer's chat template may take to render one row (all its renderings), plus
#: :data:`SECONDS_PER_MESSAGE` per message of the row.
ROW_SECONDS = 20.0
SECONDS_PER_MESSAGE = 0.01
#: Characters a rendering (or a string the template builds) may have: this many plus
#: :data:`OUTPUT_PER_CHAR` per character of the row's contents.
OUTPUT_CHARS = 1 << 20
OUTPUT_PER_CHAR = 8
#: Bytes of memory (address space) a row's rendering may add to the process (Linux: ``RLIMIT_AS``).
RENDER_MEMORY = 1 << 30


class _Deadline(BaseException):
    """Raised by the SIGALRM handler inside a rendering (a BaseException: templates and jinja
    never catch it); turned into :class:`TemplateTooCostly`."""


@dataclass
class RenderBounds:
    """The bounds of one row's rendering: ``deadline`` (``time.monotonic()``), ``max_chars``."""

    deadline: float
    max_chars: int
    seconds: float

    def check(self, chars: int = 0) -> None:
        if chars > self.max_chars:
            raise TemplateTooCostly(f"wrote a string of more than {self.max_chars:,} characters")
        if time.monotonic() > self.deadline:
            raise TemplateTooCostly(f"ran longer than {self.seconds:.0f} s")


_BOUNDS: contextvars.ContextVar[Optional[RenderBounds]] = contextvars.ContextVar("dlmspec_render_bounds", default=None)


#: Loop attributes that take the next item before the current one is rendered.
_PEEKING = frozenset(["last", "length", "revindex", "revindex0", "nextitem"])


class _Tracker:
    """Where a rendering's output stood when the template took each message (:class:`_Tracked`)."""

    def __init__(self) -> None:
        self.written = 0
        self.taken: dict[int, int] = {}
        self.order: list[int] = []
        self.passes = 0
        self.unusual = False

    def take(self, index: int) -> None:
        if index not in self.taken:
            self.taken[index] = self.written
            self.order.append(index)


_TRACKER: contextvars.ContextVar[Optional[_Tracker]] = contextvars.ContextVar("dlmspec_render_tracker", default=None)


class _Tracked(list):
    """The ``messages`` a template sees in :meth:`TokenizerTemplate._render_tracked`: a list whose
    iteration tells the tracker when message ``offset + i`` is taken (a slice with step 1 is
    tracked too; anything else marks the rendering unusual)."""

    def __init__(self, items: Any, tracker: _Tracker, offset: int = 0) -> None:
        super().__init__(items)
        self._tracker = tracker
        self._offset = offset

    def __iter__(self) -> Iterator[Any]:
        tracker, offset = self._tracker, self._offset
        tracker.passes += 1
        for i, item in enumerate(list.__iter__(self)):
            tracker.take(offset + i)
            yield item

    def __reversed__(self) -> Iterator[Any]:
        self._tracker.unusual = True
        return list.__reversed__(self)

    def __getitem__(self, key: Any) -> Any:
        got = list.__getitem__(self, key)
        if isinstance(key, slice):
            start, _, step = key.indices(len(self))
            if step == 1:
                return _Tracked(got, self._tracker, self._offset + start)
            self._tracker.unusual = True
        return got


def _check_size(value: Any) -> Any:
    bounds = _BOUNDS.get()
    if bounds is not None and isinstance(value, (str, list, tuple)):
        bounds.check(len(value))
    return value


def _bounded_environment(text: str) -> Any:
    """The compiled ``text`` in ``transformers``' chat-template environment (jinja2's
    ``ImmutableSandboxedEnvironment``, ``trim_blocks``, ``lstrip_blocks``, its ``tojson``,
    ``raise_exception``, ``strftime_now``, ``dict`` and ``namespace``), so renderings equal
    ``apply_chat_template``'s, with the row's :class:`RenderBounds` checked where strings grow:
    ``+``, ``*`` and ``**`` (checked before they run), ``~`` and every piece of output."""
    import jinja2
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedCodeGenerator(CodeGenerator):
        def visit_Concat(self, node: Any, frame: Any) -> None:  # ``a ~ b``: checked after joining
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        code_generator_class = BoundedCodeGenerator
        intercepted_binops = frozenset(["+", "*", "**"])

        def bounded_concat(self, values: Any) -> str:
            bounds = _BOUNDS.get()
            if bounds is not None:
                bounds.check(sum(len(v) if isinstance(v, str) else 0 for v in values))
            return _check_size("".join(map(str, values)))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            bounds = _BOUNDS.get()
            if bounds is not None:
                bounds.check()
                if operator == "*":
                    for seq, n in ((left, right), (right, left)):
                        if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                            bounds.check(len(seq) * max(n, 0))
                elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, type(left)):
                    bounds.check(len(left) + len(right))
                elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
                        and right > 4096:
                    raise TemplateTooCostly(f"computed {left} ** {right}")
            return super().call_binop(context, operator, left, right)

        def getattr(self, obj: Any, attribute: str) -> Any:
            tracker = _TRACKER.get()
            if tracker is not None and attribute in _PEEKING and type(obj).__name__ == "LoopContext":
                tracker.unusual = True  # loop.last & co. take the next message early
            return super().getattr(obj, attribute)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            bounds = _BOUNDS.get()
            if bounds is not None:
                bounds.check()
            return _check_size(super().call(__context, __obj, *args, **kwargs))

    base = None
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        base = _compile_jinja_template("").environment  # its environment only: the text is compiled below
    except Exception:  # noqa: BLE001  (an older transformers: jinja's own sandbox, loop controls)
        base = None
    if base is not None:
        env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[type(e) for e in base.extensions.values()])
        env.filters.update(base.filters)
        env.globals.update(base.globals)
    else:
        env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    return env.from_string(text)


@contextlib.contextmanager
def bounded_rendering(bounds: RenderBounds, memory: int = RENDER_MEMORY) -> Iterator[None]:
    """Render inside ``bounds``: a SIGALRM at the deadline (main thread only; elsewhere the
    checks in the template's operations and output stop it), and on Linux an address-space
    limit (``RLIMIT_AS``) of the current size plus ``memory`` bytes, so a template that builds a
    huge string gets a ``MemoryError`` instead of the machine's memory. Both are restored after.

    Raises:
        TemplateTooCostly: the deadline passed, or memory ran out, inside the block.
    """
    token = _BOUNDS.set(bounds)
    alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    previous_handler = None
    limits = None
    if alarm:
        def on_alarm(signum: int, frame: Any) -> None:
            raise _Deadline()

        previous_handler = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, max(0.001, bounds.deadline - time.monotonic()))
    limits = _limit_memory(memory)
    try:
        yield
    except _Deadline:
        raise TemplateTooCostly(f"ran longer than {bounds.seconds:.0f} s") from None
    except MemoryError:
        raise TemplateTooCostly(f"needed more than {memory >> 20:,} MiB of memory") from None
    except RecursionError:
        raise TemplateTooCostly("recursed too deep") from None
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_handler)
        if limits is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, limits)
        _BOUNDS.reset(token)


def _limit_memory(extra: int) -> Optional[tuple[int, int]]:
    """Lower the soft ``RLIMIT_AS`` to the current address-space size plus ``extra`` bytes;
    returns the limits to restore (None: not Linux, or the limit is lower already)."""
    try:
        import resource

        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[0])
        size = pages * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = size + extra
        if hard != resource.RLIM_INFINITY and want > hard:
            return None
        if soft != resource.RLIM_INFINITY and soft <= want:
            return None
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))
        return soft, hard
    except (ImportError, OSError, ValueError, AttributeError):
        return None


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
        try:  # jinja folds constant expressions (filters too) while compiling: bounded as a rendering
            with bounded_rendering(RenderBounds(time.monotonic() + ROW_SECONDS, OUTPUT_CHARS, ROW_SECONDS)):
                self._template = _bounded_environment(text)
        except TemplateTooCostly as exc:
            raise TemplateTooCostly(
                f"--chat-template tokenizer: the chat_template of {name} {exc} while being compiled; fix the "
                "template, or pick a built-in one, e.g. --chat-template chatml"
            ) from None
        except Exception as exc:  # noqa: BLE001  (jinja2.TemplateSyntaxError and what constant folding raises)
            raise ChatTemplateError(
                f"--chat-template tokenizer: the chat_template of {name} cannot be compiled ({str(exc)[:200]}); "
                "fix the template, or pick a built-in one, e.g. --chat-template chatml"
            ) from None
        #: What ``apply_chat_template`` passes the template besides the messages.
        self._variables = _plain(dict(getattr(hf_tokenizer, "special_tokens_map", None) or {}))
        specials = set(getattr(hf_tokenizer, "all_special_tokens", []) or [])
        specials.update(hf_tokenizer.get_added_vocab())
        #: Special/added token strings of the tokenizer, longest first (split out of template text).
        self.special_tokens: tuple[str, ...] = tuple(sorted((s for s in specials if s), key=lambda s: (-len(s), s)))

    def _render(self, messages: Sequence[dict[str, str]], generation: bool) -> str:
        """``apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)``,
        streamed, every piece checked against the row's bounds."""
        if not messages:  # transformers refuses an empty conversation
            return ""
        bounds = _BOUNDS.get()
        pieces: list[str] = []
        total = 0
        for piece in self._template.generate(messages=[dict(m) for m in messages], tools=None, documents=None,
                                             add_generation_prompt=generation, **self._variables):
            total += len(piece)
            if bounds is not None:
                bounds.check(total)
            pieces.append(piece)
        return "".join(pieces)

    def _render_tracked(self, messages: Sequence[dict[str, str]]) -> tuple[str, _Tracker]:
        """The rendering of the whole conversation (no generation prompt) and where the output
        stood each time the template took a message."""
        bounds = _BOUNDS.get()
        tracker = _Tracker()
        token = _TRACKER.set(tracker)
        pieces: list[str] = []
        try:
            for piece in self._template.generate(messages=_Tracked([dict(m) for m in messages], tracker), tools=None,
                                                 documents=None, add_generation_prompt=False, **self._variables):
                tracker.written += len(piece)
                if bounds is not None:
                    bounds.check(tracker.written)
                pieces.append(piece)
        finally:
            _TRACKER.reset(token)
        return "".join(pieces), tracker

    def bounds(self, messages: Sequence[dict[str, str]]) -> RenderBounds:
        """A row's :class:`RenderBounds`: :data:`ROW_SECONDS` plus :data:`SECONDS_PER_MESSAGE` a
        message; :data:`OUTPUT_CHARS` plus :data:`OUTPUT_PER_CHAR` per character of content."""
        seconds = ROW_SECONDS + SECONDS_PER_MESSAGE * len(messages)
        chars = sum(len(m.get("content") or "") for m in messages)
        return RenderBounds(time.monotonic() + seconds, OUTPUT_CHARS + OUTPUT_PER_CHAR * chars, seconds)

    def render(self, messages: Sequence[dict[str, str]]) -> list[Segment]:
        """``messages`` as :class:`Segment` s (their texts joined equal the tokenizer's
        ``apply_chat_template(messages, tokenize=False)``).

        Raises:
            ChatTemplateError: a rendering is not a prefix of the next one, or an assistant turn's
                content is not found where the template puts it.
            jinja2 errors: the template raised (``raise_exception``) for these messages.
        """
        try:
            with bounded_rendering(self.bounds(messages)):
                if len(messages) > FAST_MIN_MESSAGES:
                    found = self._segments_in_one_pass(messages)
                    if found is not None:
                        return found
                return self._segments(messages)
        except TemplateTooCostly as exc:
            raise TemplateTooCostly(
                f"--chat-template tokenizer: the chat_template of {self.name} {exc} rendering one "
                f"conversation of {len(messages):,} messages (a template that loops without end or "
                "grows strings without bound); fix the template, or pick a built-in one, e.g. "
                "--chat-template chatml"
            ) from None

    def _segments_in_one_pass(self, messages: Sequence[dict[str, str]]) -> Optional[list[Segment]]:
        """:meth:`_segments`' result from one rendering of the whole conversation instead of one
        per prefix (linear instead of quadratic in the number of messages), or None when that
        cannot be trusted for this template and conversation.

        The rendering is cut where the template took each message (a template that loops over the
        messages once, in order: the text before message ``k`` is taken is ``render(messages[:k])``).
        Trusted only when every message was taken once, in order, in one pass, without
        ``loop.last`` or other look-ahead, reversal or stepped slices; and checked: at messages 1,
        2, the middle, the last and the first and last assistant turns, the cut equals the prefix
        rendered on its own, and the generation prompt ``render(messages[:k], True)`` adds is the
        same at the first and last assistant turn and starts every assistant turn's text.
        """
        full, tracker = self._render_tracked(messages)
        n = len(messages)
        if tracker.unusual or tracker.passes != 1 or tracker.order != sorted(tracker.order) \
                or set(tracker.order) - set(range(n)) or not set(range(1, n)) <= set(tracker.order):
            return None
        cuts = [0] + [tracker.taken[k] for k in range(1, n)] + [len(full)]  # cuts[k]: end of messages[:k]
        if any(a > b for a, b in zip(cuts, cuts[1:])):
            return None
        replies = [i for i, m in enumerate(messages) if m["role"] == RESPONSE_ROLE]
        for k in sorted({1, 2, n // 2, n - 1, *replies[:1], *replies[-1:]} - {0}):
            if k < n and self._render(messages[:k], False) != full[:cuts[k]]:
                return None
        prompts = set()
        for k in {*replies[:1], *replies[-1:]}:
            header = self._render(messages[:k], True)
            if not header.startswith(full[:cuts[k]]):
                return None
            prompts.add(header[cuts[k]:])
        if len(prompts) > 1:
            return None
        prompt = prompts.pop() if prompts else ""
        if any(not full.startswith(prompt, cuts[k]) or cuts[k] + len(prompt) > cuts[k + 1] for k in replies):
            return None
        return self._split(messages, lambda k: full[:cuts[k]], lambda k: full[:cuts[k]] + prompt)

    def _segments(self, messages: Sequence[dict[str, str]]) -> list[Segment]:
        return self._split(messages, lambda k: self._render(messages[:k], False),
                           lambda k: self._render(messages[:k], True))

    def _split(self, messages: Sequence[dict[str, str]], rendered: Callable[[int], str],
               header_of: Callable[[int], str]) -> list[Segment]:
        """The segments, from ``rendered(k)`` (``render(messages[:k])``) and ``header_of(k)``
        (``render(messages[:k], add_generation_prompt=True)``)."""
        out: list[Segment] = []
        previous = ""
        for index, message in enumerate(messages):
            if message["role"] != RESPONSE_ROLE:
                current = rendered(index + 1)
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
            header = header_of(index)
            self._check_prefix(previous, header, index)
            current = rendered(index + 1)
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


def _plain(value: Any) -> Any:
    """``value`` rebuilt of plain JSON types, as ``transformers`` gives a template its variables
    (``_plain_template_data``; other objects become ``"<TypeName>"``)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value) if type(value) in (list, tuple) else [_plain(v) for v in value]
    return f"<{type(value).__name__}>"


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
    pattern = _specials_pattern(tuple(specials))
    if pattern is None:
        return [(text, False)] if text else []
    pieces: list[tuple[str, bool]] = []
    start = 0
    for hit in pattern.finditer(text):
        if hit.start() > start:
            pieces.append((text[start:hit.start()], False))
        pieces.append((hit.group(), True))
        start = hit.end()
    if start < len(text):
        pieces.append((text[start:], False))
    return pieces


@functools.lru_cache(maxsize=64)
def _specials_pattern(specials: tuple[str, ...]) -> Optional["re.Pattern[str]"]:
    """A regular expression matching any of ``specials`` (the longest first, so that at each
    position the longest one that starts there matches, as regular-expression alternatives are
    tried in order); None for no (non-empty) special."""
    ordered = sorted(set(s for s in specials if s), key=len, reverse=True)
    return re.compile("|".join(re.escape(s) for s in ordered)) if ordered else None


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
