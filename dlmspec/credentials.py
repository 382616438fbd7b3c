"""Secrets in a spec: how they are recognised, and the copy of a spec or an issue without them.

A secret written in a spec would be copied into every generated file (``launch.sbatch``,
``spec.lock.toml``, ...) and shown by ``dlmspec show``; secrets are passed through the
environment instead (exported in the shell the job is launched from, which the job inherits).
Three things count as a secret:

* an environment variable name that holds one (:func:`is_secret_name`): ``HF_TOKEN``,
  ``WANDB_API_KEY``, ``DB_PASS``, ``GH_PAT``, ``NPM_AUTH``, ``SESSION``, ``SSH_PRIVATE_KEY``,
  ``NETRC``, ... but not ``TOKENIZERS_PARALLELISM``, ``MAX_TOKENS`` or ``PWD``;
* a token-shaped value (:data:`TOKEN_SHAPES`): the published formats of Hugging Face, GitHub,
  GitLab, OpenAI, Anthropic, Slack, AWS, Google, Stripe, npm and PyPI tokens, JWTs, PEM private
  keys and ``Bearer`` headers, each matched as a whole token (not glued to letters, digits, ``_``
  or ``-``) with its minimum length and character class, so ``/data/hf_cache`` and
  ``/home/sk-lab`` are paths; Slack and Discord webhook URLs (the path is the secret); and an
  AWS secret access key under any name, by its shape (exactly 40 base64 characters with both
  cases, digits and a ``/`` or ``+``, random-looking: not a path, not a 40-digit git hash);
* a credential inside a URL: ``scheme://user:password@host`` (``s3://KEY:SECRET@bucket`` too,
  and ``scheme:/user:password@`` where joining the URL to a path collapsed ``//``), a key as the
  URL's user (``https://KEY@o1.ingest.sentry.io/1``, a Sentry DSN: 32+ hex digits or a random
  run of 20+), and query or fragment parameters such as ``?token=``, ``&sig=``,
  ``#access_token=`` or ``X-Amz-Signature=``; a value that names an environment variable
  (``$HF_TOKEN``, ``${HF_TOKEN}``) is not one.

:func:`find_secret` describes what a string holds (never the secret itself),
:func:`spec_secrets` walks every string of a spec, :func:`redact` copies data with each
secret replaced by :data:`HIDDEN`. Used by the ``slurm-secret`` rule
(:mod:`dlmspec.check.slurm`), the ``secret-in-spec`` rule (:mod:`dlmspec.check.strings`),
:class:`dlmspec.errors.SpecIssue` (no issue holds a secret), ``dlmspec show`` and
:func:`dlmspec.render.compile.render` (no generated file holds a token). Imports only the standard library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterator

#: What is printed in place of a secret.
HIDDEN = "<hidden>"

#: Dotted spec keys of the tables whose keys are environment variable names.
ENV_TABLES = frozenset({"cluster.slurm.env"})

#: Why a secret is refused (every refusal says it).
NEVER_WRITTEN = "secrets are never written into generated files"

#: How to pass a secret instead (the fix every refusal gives).
ENVIRONMENT_FIX = ("remove it from the spec and pass it through the environment: export it in the shell "
                   "you start the job from (e.g. `export HF_TOKEN=<token>` before `./launch.sh` or "
                   "`sbatch launch.sbatch`); the job inherits it")

# --------------------------------------------------------------------------------------------
# Names

#: A name's words: split at anything but letters and digits, and at camelCase humps.
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")

#: Words that make a name secret wherever they stand (``DB_PASS``, ``GH_PAT``, ``NPM_AUTH``).
_SECRET_WORDS = frozenset({
    "PASS", "PAT", "AUTH", "OAUTH", "AUTHORIZATION", "BEARER", "SESSION", "SESSIONID", "CREDS", "JWT",
    "SIG", "SIGNATURE",
})

#: Parts of a word that make a name secret (``PGPASSWORD``, ``CLIENT_SECRET``, ``SSH_PRIVATE_KEY``).
_SECRET_PARTS = ("SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "PRIVATE", "NETRC", "APIKEY",
                 "COOKIE", "BEARER")

#: Words before a last ``TOKEN`` that make it a vocabulary token or a count, not a secret
#: (``MASK_TOKEN``, ``MAX_TOKEN``, ``PER_TOKEN``).
_VOCABULARY_WORDS = frozenset({"MASK", "PAD", "EOS", "BOS", "EOD", "UNK", "SEP", "CLS", "SPECIAL", "MAX", "MIN",
                               "NUM", "PER"})


def _words(name: str) -> list[str]:
    return [w.upper() for w in _WORD_SPLIT.split(name) if w]


def is_secret_name(name: str) -> bool:
    """Whether the environment variable ``name`` holds a secret (any case; ``_``, ``-``, ``.``
    and camelCase separate words).

    Secret: a word of :data:`_SECRET_WORDS` (``DB_PASS``, ``GH_PAT``, ``NPM_AUTH``, ``BEARER``,
    ``SESSION``), a word containing one of :data:`_SECRET_PARTS` (``PGPASSWORD``,
    ``CLIENT_SECRET``, ``MY_PRIVATE_KEY``, ``NETRC``, ``SESSION_COOKIE``, ``APIKEY``), a last
    word ending in ``TOKEN`` (``HF_TOKEN``, ``AWS_SESSION_TOKEN``, ``NGROK_AUTHTOKEN``; numbers
    after it do not count) unless a vocabulary or count word comes before it (``MASK_TOKEN``,
    ``MAX_TOKEN``), ``KEY``/``KEYS`` as the last word or before ``ID`` (``WANDB_API_KEY``,
    ``AWS_ACCESS_KEY_ID``), and ``PWD`` beside other words (``DB_PWD``; the shell's ``PWD``
    alone is the working directory). Not secret: ``TOKENIZERS_PARALLELISM``, ``MAX_TOKENS``,
    ``MASK_TOKEN_ID``, ``CALCULATE_PER_TOKEN_LOSS``, ``PATH``, ``PASSTHROUGH``, ``AUTHOR``.
    """
    words = _words(name)
    while len(words) > 1 and words[-1].isdigit():
        words.pop()
    for i, word in enumerate(words):
        after = words[i + 1] if i + 1 < len(words) else None
        if word in _SECRET_WORDS or any(part in word for part in _SECRET_PARTS):
            return True
        if word.endswith("TOKEN") and after is None:
            if not (word == "TOKEN" and i > 0 and words[i - 1] in _VOCABULARY_WORDS):
                return True
        if word in ("KEY", "KEYS") and after in (None, "ID"):
            return True
        if word == "PWD" and len(words) > 1:
            return True
    return False


# --------------------------------------------------------------------------------------------
# Values

#: Before and after a whole token: not a letter, digit, ``_`` or ``-``.
_START = r"(?<![A-Za-z0-9_\-])"
_END = r"(?![A-Za-z0-9_\-])"


def _mixed_case(token: str) -> bool:
    """Random base62/base64 text of 20+ characters has upper- and lower-case letters; a word or
    a path written by a person seldom does without separators."""
    return any(c.isupper() for c in token) and any(c.islower() for c in token)


def _random_run(token: str) -> bool:
    """Mixed case and a run of 20+ letters and digits: ``sk-`` keys, not ``sk-lab-2024-runs``."""
    return _mixed_case(token) and max((len(r) for r in re.findall(r"[A-Za-z0-9]+", token)), default=0) >= 20


def _hex_key(token: str) -> bool:
    """32 or more hexadecimal digits with both letters and digits: a Sentry key, an API key."""
    return len(token) >= 32 and re.fullmatch(r"[0-9a-fA-F]+", token) is not None and \
        any(c.isdigit() for c in token) and any(c.isalpha() for c in token)


def _aws_secret(token: str) -> bool:
    """An AWS secret access key's shape: exactly 40 base64 characters holding upper- and
    lower-case letters, digits and a ``/`` or ``+``, not a path (no leading, trailing or double
    ``/``) and random (at least 10 case changes between neighbouring letters; a path of
    capitalised words has a few, a random key about 17)."""
    if len(token) != 40 or not ("/" in token or "+" in token) or not any(c.isdigit() for c in token):
        return False
    if not _mixed_case(token) or token.startswith("/") or token.endswith("/") or "//" in token:
        return False
    letters = [c for c in token if c.isalpha()]
    changes = sum(1 for a, b in zip(letters, letters[1:]) if a.isupper() != b.isupper())
    return changes >= 10


def _always(token: str) -> bool:
    """A format specific enough by itself (fixed prefix, length and alphabet)."""
    return True


@dataclass(frozen=True)
class TokenShape:
    """A published token format.

    Attributes:
        what: what it is and which variable its tools read it from, for messages.
        source: the regular expression; its ``body`` group is the token's random part.
        check: what ``body`` must satisfy besides the pattern (:func:`_mixed_case`, ...).
        markers: literal texts one of which every match contains: the pattern is compiled
            and run only on a string that holds one (most strings hold none, and compiling
            every pattern at import would add about 3 ms to each ``dlmspec validate``).
    """

    what: str
    source: str
    check: Callable[[str], bool]
    markers: tuple[str, ...]

    @property
    def pattern(self) -> re.Pattern[str]:
        return _compiled(self.source)

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        """Where the random part of each match in ``text`` lies."""
        if any(marker in text for marker in self.markers):
            for match in self.pattern.finditer(text):
                if self.check(match.group("body")):
                    yield match.span("body")


@lru_cache(maxsize=None)
def _compiled(source: str) -> re.Pattern[str]:
    return re.compile(source)


#: The published token formats. The lengths are the formats' minimums (GitHub classic tokens:
#: 36 base62 characters; Hugging Face: 34 letters; AWS key ids: exactly 16 after the prefix).
TOKEN_SHAPES: tuple[TokenShape, ...] = (
    TokenShape("a Hugging Face token (hf_...; Hugging Face tools read it from HF_TOKEN)",
               _START + r"hf_(?P<body>[A-Za-z0-9]{30,})" + _END, _mixed_case, ("hf_",)),
    TokenShape("a GitHub token (ghp_/gho_/ghu_/ghs_/ghr_...; git and gh read it from GH_TOKEN or GITHUB_TOKEN)",
               _START + r"gh[pousr]_(?P<body>[A-Za-z0-9]{36,})" + _END, _mixed_case,
               ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    TokenShape("a GitHub fine-grained token (github_pat_...; git and gh read it from GH_TOKEN or GITHUB_TOKEN)",
               _START + r"github_pat_(?P<body>[A-Za-z0-9_]{50,})" + _END, _mixed_case, ("github_pat_",)),
    TokenShape("a GitLab token (glpat-...)", _START + r"glpat-(?P<body>[A-Za-z0-9_\-]{20,})" + _END, _mixed_case,
               ("glpat-",)),
    TokenShape("an API key (sk-...; e.g. OPENAI_API_KEY or ANTHROPIC_API_KEY)",
               _START + r"sk-(?P<body>[A-Za-z0-9_\-]{20,})" + _END, _random_run, ("sk-",)),
    TokenShape("a Stripe key (sk_live_/rk_test_...)",
               _START + r"[sr]k_(?:live|test)_(?P<body>[A-Za-z0-9]{20,})" + _END, _mixed_case,
               ("k_live_", "k_test_")),
    TokenShape("a Slack token (xoxb-/xoxp-/xapp-...)",
               _START + r"(?:xox[abposr]|xapp)-[0-9]+-(?P<body>[A-Za-z0-9\-]{8,})" + _END, _always, ("xox", "xapp-")),
    TokenShape("an AWS access key id (AKIA.../ASIA...; AWS tools read it from AWS_ACCESS_KEY_ID)",
               _START + r"(?:AKIA|ASIA)(?P<body>[A-Z0-9]{16})" + _END, _always, ("AKIA", "ASIA")),
    TokenShape("a Google API key (AIza...)", _START + r"AIza(?P<body>[A-Za-z0-9_\-]{35})" + _END, _always, ("AIza",)),
    TokenShape("an npm token (npm_...; npm reads it from NPM_TOKEN)",
               _START + r"npm_(?P<body>[A-Za-z0-9]{36,})" + _END, _mixed_case, ("npm_",)),
    TokenShape("a PyPI token (pypi-...; twine reads it from TWINE_PASSWORD)",
               _START + r"pypi-(?P<body>[A-Za-z0-9_\-]{50,})" + _END, _mixed_case, ("pypi-",)),
    TokenShape("a JSON web token (eyJ...)",
               r"(?<![A-Za-z0-9_\-.])(?P<body>eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*)"
               r"(?![A-Za-z0-9_\-.])", _always, ("eyJ",)),
    TokenShape("a private key (-----BEGIN ... PRIVATE KEY-----)",
               r"(?P<body>-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----)?)",
               _always, ("PRIVATE KEY-----",)),
    TokenShape("a Slack webhook URL (hooks.slack.com/services/...; the path is the secret)",
               r"(?i:hooks\.slack\.com)/(?:services|workflows|triggers)/(?P<body>[A-Za-z0-9_/\-]{16,})",
               _always, ("hooks.slack.com", "HOOKS.SLACK.COM")),
    TokenShape("a Discord webhook URL (discord.com/api/webhooks/...)",
               r"(?i:discord(?:app)?\.com)/api/webhooks/(?P<body>[A-Za-z0-9_/\-]{16,})", _always,
               ("discord.com/api/webhooks", "discordapp.com/api/webhooks")),
    TokenShape("a key inside a URL's user part (https://KEY@host, as a Sentry DSN writes it; "
               "sentry_sdk reads the DSN from SENTRY_DSN)",
               r"(?i:[a-z][a-z0-9+.\-]*):/{1,2}(?P<body>[A-Za-z0-9_\-]{20,})@", lambda t: _hex_key(t) or _random_run(t),
               (":/",)),
    TokenShape("an AWS secret access key (40 base64 characters; AWS tools read it from AWS_SECRET_ACCESS_KEY)",
               r"(?<![A-Za-z0-9+/=_\-.])(?P<body>[A-Za-z0-9+/]{40})(?![A-Za-z0-9+/=_\-.])", lambda t: _aws_secret(t),
               ("/", "+")),
    TokenShape("a bearer token (Bearer ...)",
               r"(?<![A-Za-z0-9_])(?i:bearer)\s+(?P<body>[A-Za-z0-9._~+/\-]{16,}=*)", _random_run,
               ("Bearer", "bearer", "BEARER")),
)

#: Every marker of :data:`TOKEN_SHAPES`, looked for once per text (:func:`_secrets`).
_MARKERS = frozenset(marker for shape in TOKEN_SHAPES for marker in shape.markers)

#: ``scheme://user:password@``: the password may hold ``/`` (AWS secret keys do), but a
#: ``host:PORT/`` is not one (``https://host:8443/repo@v1``). One slash counts too: a URL
#: joined to a path as a file name (``extends``) loses one (``/specs/https:/user:pw@host``).
_URL_PASSWORD = (r"(?i)(?<![A-Za-z0-9+.\-])(?P<scheme>[a-z][a-z0-9+.\-]*):/{1,2}[^\s/@:?#]*:(?!\d*(?:[/?#]|$))"
                 r"(?P<password>[^\s@]+)@")

#: ``name=value`` in a query string, a URL fragment or an option (``?token=...``, ``&sig=...``,
#: ``#access_token=...``, ``--hf-token=...``).
_ASSIGNMENT = r"(?:^|[?&;,#\s])-{0,2}(?P<name>[A-Za-z][A-Za-z0-9_.\-]*)=(?P<value>[^\s&;,#\"']+)"


def _placeholder(value: str) -> bool:
    """An environment variable reference or a stand-in, not a secret: ``$X``, ``${X}``,
    ``%(x)s``, ``<hidden>``."""
    return value.startswith(("$", "%", "<", "{"))


def _url_what(scheme: str) -> str:
    scheme = scheme.lower()
    if scheme in ("s3", "s3a", "s3n", "gs", "gcs"):
        return ("an access key and secret inside a URL (KEY:SECRET@); S3 clients read them from "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    if scheme in ("docker", "oras", "library", "shub"):
        return ("a registry user name and password inside a URL (user:password@); enroot reads them from "
                "~/.config/enroot/.credentials, apptainer from APPTAINER_DOCKER_USERNAME/APPTAINER_DOCKER_PASSWORD")
    return ("a user name and password inside a URL (user:password@host); put them in ~/.netrc or a token "
            "variable such as HF_TOKEN")


def _secrets(text: str, assignments: bool) -> Iterator[tuple[str, tuple[int, int]]]:
    """(what, span of the secret) for each secret in ``text``, tokens first."""
    present = {marker for marker in _MARKERS if marker in text}  # one pass over the markers per text
    for shape in TOKEN_SHAPES:
        if present.intersection(shape.markers):
            for span in shape.spans(text):
                yield shape.what, span
    if ":/" in text:
        for match in _compiled(_URL_PASSWORD).finditer(text):
            if not _placeholder(match.group("password")):
                yield _url_what(match.group("scheme")), match.span("password")
    if assignments and "=" in text:
        for match in _compiled(_ASSIGNMENT).finditer(text):
            if is_secret_name(match.group("name")) and not _placeholder(match.group("value")):
                yield f"a secret assigned to '{match.group('name')}' (a query parameter or an option)", \
                    match.span("value")


def find_secret(value: str, *, assignments: bool = True) -> str | None:
    """What secret ``value`` holds, in words (``"a GitHub token (ghp_...; ...)"``), or None.

    Looks for the token shapes of :data:`TOKEN_SHAPES` (whole tokens only), a password inside a
    URL (``scheme://user:password@``) and, with ``assignments`` (for spec strings; generated
    code is full of ``name=value``), a secret-named assignment in a query string or an option
    (``?token=...``, ``&X-Amz-Signature=...``, ``--api-key=...``; the name judged by
    :func:`is_secret_name`). Values that name an environment variable (``$HF_TOKEN``) are not
    secrets. The description never contains the secret. Costs about 0.2 ms per KiB of text.
    """
    if not isinstance(value, str) or len(value) < 8:
        return None
    return next((what for what, _ in _secrets(value, assignments)), None)


def redact_text(text: str) -> str:
    """``text`` (a message, a hint) with each token (:data:`TOKEN_SHAPES`) and each password
    inside a URL replaced by :data:`HIDDEN`; the words around it are kept. Secret-named
    assignments are left alone here: messages and hints show ``--set section.key=value``."""
    if not isinstance(text, str) or len(text) < 8:
        return text
    spans = [span for _, span in _secrets(text, assignments=False)]
    if not spans:
        return text
    out, last = [], 0
    for start, end in sorted(spans):
        if start < last:  # overlaps the previous one
            if end > last:
                last = end
            continue
        out += [text[last:start], HIDDEN]
        last = end
    return "".join(out) + text[last:]


# --------------------------------------------------------------------------------------------
# Specs and data


def _is_env_entry(path: str) -> str | None:
    """The variable name when dotted ``path`` is an entry of an environment table."""
    table, _, name = path.rpartition(".")
    return name if table in ENV_TABLES else None


def walk_strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string under ``node`` as ``(dotted key, string)``: spec tables (pydantic models and
    :class:`dlmspec.spec.fast.SpecTable`, read by iterating their fields), dicts (keys joined
    with ``.``) and lists (indices: ``data.train.0.prefix``), in order. Dict keys are not
    yielded. Iterative, so a deeply nested free-form table (``[lock]``) cannot exhaust the
    stack."""
    stack: list[tuple[str, Any]] = [(path, node)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            yield path, node
            continue
        if isinstance(node, dict):
            children = [(str(k), v) for k, v in node.items()]
        elif isinstance(node, (list, tuple)):
            children = [(str(i), v) for i, v in enumerate(node)]
        elif hasattr(node, "model_fields_set"):  # a spec table
            children = list(node)
        else:
            continue
        stack.extend((f"{path}.{k}" if path else k, v) for k, v in reversed(children))


def spec_secrets(spec: Any) -> Iterator[tuple[str, str]]:
    """``(dotted key, what)`` for each string of ``spec`` that holds a secret (:func:`find_secret`;
    a token used as a key of a free-form table counts too) and each entry of an environment
    table (:data:`ENV_TABLES`) whose name is a secret (:func:`is_secret_name`), in the order of
    the spec's fields. ``what`` never contains the secret (the key may: an issue hides it)."""
    for key, value in walk_strings(spec):
        name = _is_env_entry(key)
        if name is not None and is_secret_name(name):
            yield key, f"the value of a secret-named variable ({name})"
            continue
        what = find_secret(value) or find_secret(key, assignments=False)
        if what is not None:
            yield key, what


def redact(value: Any, path: str = "") -> Any:
    """A copy of JSON-like ``value`` (dicts, lists, strings, numbers) at dotted ``path`` with
    every secret string replaced by :data:`HIDDEN`, and so every value of an environment-table
    entry whose name is a secret (a token used as a dict key becomes ``<hidden>`` inside the
    key). Other values are returned as they are (the same object when nothing changed)."""
    if isinstance(value, str):
        name = _is_env_entry(path)
        if (name is not None and is_secret_name(name)) or find_secret(value) is not None:
            return HIDDEN
        return value
    if isinstance(value, dict):
        pairs = [(k, redact(v, f"{path}.{k}" if path else str(k))) for k, v in value.items()]
        if all(new is value[k] for k, new in pairs) and not any(redact_text(str(k)) != str(k) for k in value):
            return value
        return {redact_text(k) if isinstance(k, str) else k: new for k, new in pairs}
    if isinstance(value, (list, tuple)):
        items = [redact(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(value)]
        if all(a is b for a, b in zip(items, value)):
            return value
        return tuple(items) if isinstance(value, tuple) else items
    name = _is_env_entry(path)
    if name is not None and is_secret_name(name) and value is not None:
        return HIDDEN
    return value
