"""Spec strings reach the generated files as data only (no code from spec strings).

Every string field of the schema (found by walking the pydantic models of ``dlmspec.spec.models``) gets
a harmless marker in a *benign* spec and a hostile value in a *hostile* spec; both are compiled.
Where validation refuses a hostile value, the refusal must be a clean :class:`SpecError` naming
the key (``dlmspec`` exits 2 with it), that field goes back to its marker and the rest is
compiled again. The two outputs must then be the same program with the hostile value exactly
where the marker was:

* train.py: the same AST, string constants compared by value (so the value is a constant, and
  nothing else was added), the same comments on the same lines;
* spec.lock.toml and plan.json: the same data (tomllib, json);
* launch.sh and launch.sbatch: ``bash -n`` passes, the same lines, and the lines that differ
  read the same words when decoded as bash (and sbatch, for ``#SBATCH`` lines) read them, by
  the strict decoders below: nothing generated is executed, sourced or imported.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import tokenize
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from dlmspec.check import RULES, find, issues_for
from dlmspec.render.compile import compile_spec
from dlmspec.errors import SpecError
from dlmspec.spec.load import load
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec
from dlmspec.spec.names import NAME_KEYS, bad_tokens
from spec_kit import write_toml

#: Values that would run code, break a line or change an argument if any generated file took
#: them as code: docstring and quote break-outs, shell substitutions, line breaks of every kind
#: (bash ends lines at \n only; Python at \n and \r; str.splitlines also at U+2028, U+0085, ...),
#: NUL, template syntax, option-like values.
HOSTILE = [
    'x"""\nimport os; os.system("touch PWNED")\n"""',
    'x"""; import os; os.system("touch PWNED"); """',
    "x'''; import os; os.system('touch PWNED'); '''",
    "'; rm -rf ~; '",
    '"; rm -rf ~; "',
    "$(touch PWNED)",
    "`touch PWNED`",
    "${IFS}$HOME!!",
    "line\nbreak",
    "trailing-newline\n",
    "carriage\rreturn",
    "nul\x00byte",
    "sep\u2028line\u2029para\x85nel\x0bvt\x0cff\x1cfs",
    "# hash",
    "{{ 7 * 7 }}{% if 1 %}x{% endif %}{# c #}",
    "--",
    "-x",
    "back\\slash\\",
    "tab\tx",
    "esc\x1b[31mred\x7f",
    "ünï©ødé 漢字 \u00a0",
]
IDS = [f"h{i:02d}" for i in range(len(HOSTILE))]


# ------------------------------------------------------------------------------------------
# The string fields of the schema


def _slots(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every place a free string goes in a spec: ``a.b`` (a str field), ``a.b[]`` (an item of a
    list of str), ``a.b{}`` / ``a.b{=}`` (a key / a value of a dict with str keys), with
    ``[].`` for tables inside lists. Literal (enumerated) strings are not free."""
    out = []

    def visit(key: str, annotation: Any) -> None:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            visit(key, typing.get_args(annotation)[0])
        elif origin in (typing.Union, types.UnionType):
            for arg in typing.get_args(annotation):
                visit(key, arg)
        elif origin is Literal or annotation in (type(None), int, float, bool):
            return
        elif annotation is str:
            out.append(key)
        elif origin is list:
            (item,) = typing.get_args(annotation)
            if isinstance(item, type) and issubclass(item, BaseModel):
                out.extend(_slots(item, key + "[]."))
            else:
                visit(key + "[]", item)
        elif origin is dict:
            k, v = typing.get_args(annotation)
            if k is str:
                out.append(key + "{}")
            if v is str or v is Any:
                out.append(key + "{=}")
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.extend(_slots(annotation, key + "."))

    for name, field in model.model_fields.items():
        visit(prefix + name, field.annotation)
    return sorted(set(out))


SLOTS = _slots(Spec)

#: Slots whose valid values are not free text: every hostile value is refused (and the benign
#: spec holds this valid value instead of a marker; None: the key is left out).
CONSTRAINED: dict[str, Any] = {
    "model.preset": None,  # a preset id
    "cluster.gpu": "h100",  # a GPU catalog id
    "cluster.slurm.time": "04:00:00",  # a SLURM time
    "cluster.slurm.mem": "480G",  # a SLURM memory size
    "stage.kind": "rl",  # a registered stage (dlmspec.stages): the RL stage writes its prompts and rewards in train.py
    "generate.preset": None,  # a [generate] preset id (dlmspec.generate presets)
    "parallel.pipeline_model_parallel_layout": None,  # megatron-core's layout grammar (rule pipeline-layout-grammar)
}

#: Slots that take a fixed form around the free text.
FORM = {"checkpoint.init_from": "mcore:{}", "stage.rl.rewards[].function": "{}.py:reward"}

#: Slots that must take every hostile value without NUL (so the test reaches train.py, the shell
#: scripts and the lock file with each one).
MUST_ACCEPT = {"name", "description", "data.train[].prefix", "data.split", "checkpoint.save",
               "logging.run_dir", "cluster.slurm.env{=}", "data.tokenizer.model", "stage.rl.prompts",
               "stage.rl.rewards[].function", "eval.generation.prompts"}

#: Slots compile never writes: a spec's [lock] table is dropped (compile writes its own).
NOT_WRITTEN = {"lock{}", "lock{=}"}

# logging.tensorboard_dir is a slot too, but the runtime takes <logging.run_dir>/tensorboard only
# (compile refuses any other), so build() derives it from run_dir, hostile when run_dir is.

MARKERS = {slot: f"Q{i:02d}Z" for i, slot in enumerate(SLOTS)}


def test_the_slots_cover_the_schema() -> None:
    """A new string key in the schema lands here (and in the placement below) by itself."""
    assert {"name", "data.train[].prefix", "cluster.slurm.env{}", "cluster.slurm.env{=}",
            "cluster.slurm.container_mounts[]", "checkpoint.init_from", "lock{}", "stage.rl.prompts",
            "stage.rl.rewards[].function", "eval.generation.prompts"} <= set(SLOTS)
    assert set(CONSTRAINED) | set(FORM) | MUST_ACCEPT <= set(SLOTS)
    assert len(SLOTS) >= 35


def _model() -> dict[str, Any]:
    return {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
            "vocab_size": 1000, "max_position_embeddings": 128}


def _place(data: dict[str, Any], slot: str, value: Any) -> None:
    """Put ``value`` at ``slot`` in the spec ``data`` (None: leave the key out)."""
    if slot.endswith("{}") or slot.endswith("{=}"):
        path, which = slot.rsplit("{", 1)
        node = _node(data, path.split(".")[:-1])
        table = node.setdefault(path.split(".")[-1], {"": ""})
        (key, val), = table.items()
        table.clear()
        table.update({value: val} if which == "}" else {key: value})
        return
    if "[]" in slot:
        path, _, rest = slot.partition("[]")
        parts = path.split(".")
        node = _node(data, parts[:-1])
        items = node.setdefault(parts[-1], [{}] if rest else [""])
        if rest:
            items[0][rest.lstrip(".")] = value
        else:
            items[0] = value
        return
    parts = slot.split(".")
    node = _node(data, parts[:-1])
    if value is None:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value


def _node(data: dict[str, Any], parts: list[str]) -> dict[str, Any]:
    for part in parts:
        data = data.setdefault(part, {})
    return data


def _value(slot: str, text: str | None) -> Any:
    """What goes at ``slot``: ``text`` in the slot's form; None = the benign value."""
    if text is None:
        text = MARKERS[slot]
        if slot in CONSTRAINED:
            return CONSTRAINED[slot]
    return FORM.get(slot, "{}").format(text) if slot in FORM else text


def build(hostile: dict[str, str], runtime: str = "pyxis") -> dict[str, Any]:
    """A compilable spec with a marker in every slot except those in ``hostile`` (slot -> value).

    The stage is RL (its prompts file and reward function paths are written in train.py): 8
    prompts x 8 completions = the global batch of 64, rollouts sampled (temperature > 0). The
    tokenizer is GPT-2's BPE: [eval.generation] needs a text tokenizer (rule
    eval-generation-layout), and its vocab_file / merge_file are string slots it reads; the model's
    50305 rows (GPT-2's 50257 ids and padding) leave a padded slot for [MASK] (rule mask-token-range)."""
    data: dict[str, Any] = {
        "model": {**_model(), "vocab_size": 50305},
        "stage": {"kind": "rl", "rl": {"grpo_group_size": 8, "grpo_prompts_per_step": 8}},
        "generate": {"temperature": 0.9, "gen_length": 32, "steps": 32, "block_length": 32},  # rows fit seq_length
        "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 64, "train_iters": 10,
                  "eval_interval": 5},
        "data": {"tokenizer": {"type": "GPT2BPETokenizer"}},
        "cluster": {"gpus_per_node": 8, "nodes": 1, "slurm": {"container_runtime": runtime}},
    }
    for slot in SLOTS:
        _place(data, slot, _value(slot, hostile.get(slot)))
    # The runtime writes TensorBoard events to <run_dir>/tensorboard only: the value follows run_dir.
    data["logging"]["tensorboard_dir"] = data["logging"]["run_dir"] + "/tensorboard"
    return data


def _replacements(hostile: dict[str, str]) -> list[tuple[str, str]]:
    """(marker text, hostile text) per hostile slot, in the slot's form."""
    return [(_value(s, None), _value(s, h)) for s, h in hostile.items() if s not in CONSTRAINED]


def _markers_in(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(marker, hostile) with the bare markers of ``pairs`` (init_from's form stripped)."""
    out = []
    for m, h in pairs:
        bare = re.search(r"Q\d\dZ", m).group()
        out.append((bare, h[m.index(bare):len(h) - (len(m) - m.index(bare) - len(bare))]))
    return out


def _sub(text: str, pairs: list[tuple[str, str]], *, quoted: bool = True) -> str:
    if quoted:
        for m, h in pairs:
            text = text.replace(repr(m), repr(h))
    for m, h in pairs:
        text = text.replace(m, h)
    return text


def _sub_data(value: Any, pairs: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        return _sub(value, pairs, quoted=False)
    if isinstance(value, list):
        return [_sub_data(v, pairs) for v in value]
    if isinstance(value, dict):
        return {_sub_data(k, pairs): _sub_data(v, pairs) for k, v in value.items()}
    return value


# ------------------------------------------------------------------------------------------
# Decoding without running: Python comments, bash words, #SBATCH values


def _comments(text: str) -> list[tuple[int, str]]:
    return [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type == tokenize.COMMENT]


def _comment_pattern(benign: str, pairs: list[tuple[str, str]]) -> tuple[re.Pattern[str], list[str | None]]:
    """A pattern matching ``benign`` with anything on one line where a marker was; per group,
    the hostile value when the marker was shown as a Python literal (repr), else None."""
    pieces, expect = [], []
    rest = benign
    tokens = [(repr(m), h) for m, h in pairs] + [(m, None) for m, _ in pairs]
    while rest:
        hits = [(rest.find(t), t, h) for t, h in tokens if rest.find(t) >= 0]
        if not hits:
            pieces.append(re.escape(rest))
            break
        at, token, value = min(hits, key=lambda x: (x[0], -len(x[1])))
        pieces.append(re.escape(rest[:at]) + "(.*?)")
        expect.append(value)
        rest = rest[at + len(token):]
    return re.compile("".join(pieces)), expect


def assert_same_comment(benign: str, hostile: str, pairs: list[tuple[str, str]]) -> None:
    pattern, expect = _comment_pattern(benign, pairs)
    match = pattern.fullmatch(hostile)
    assert match, (benign, hostile)
    for group, value in zip(match.groups(), expect):
        assert not re.search(r"[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]", group)
        if value is not None:
            assert ast.literal_eval(group) == value


_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]")
_ANSI_C = {"\\": b"\\", "'": b"'", '"': b'"', "n": b"\n", "t": b"\t", "r": b"\r", "a": b"\a",
           "b": b"\b", "e": b"\x1b", "f": b"\f", "v": b"\v", "?": b"?"}


def bash_tokens(line: str) -> list[tuple[str, Any]]:
    """The words, operators and comment of one line as bash reads it, for the quoting forms
    the templates use: '...', $'...' (ANSI-C: decoded), "..." (kept raw), unquoted safe
    characters and $NAME / ${...} expansions (kept raw). Anything else (an unquoted ``;``
    inside a word, a backtick, a glob, a brace) raises: this decoder only accepts what it can
    read exactly."""
    tokens: list[tuple[str, Any]] = []
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c in " \t":
            i += 1
        elif c == "#":
            tokens.append(("comment", line[i:]))
            break
        elif c in ";&|()<>":
            tokens.append(("op", c))
            i += 1
        elif c == "\\" and i == n - 1:
            tokens.append(("op", "continue"))
            i += 1
        else:
            parts: list[tuple[str, Any]] = []
            while i < n and line[i] not in " \t;&|()<>":
                c = line[i]
                if c == "'":
                    j = line.index("'", i + 1)
                    parts.append(("lit", line[i + 1:j].encode()))
                    i = j + 1
                elif line.startswith("$'", i):
                    out, i = bytearray(), i + 2
                    while line[i] != "'":
                        if line[i] == "\\":
                            e = line[i + 1]
                            if e == "x":
                                m = re.match(r"[0-9a-fA-F]{1,2}", line[i + 2:])
                                out.append(int(m.group(), 16))
                                i += 2 + len(m.group())
                                continue
                            out += _ANSI_C[e]
                            i += 2
                        else:
                            out += line[i].encode()
                            i += 1
                    parts.append(("lit", bytes(out)))
                    i += 1
                elif c == '"':
                    m = re.compile(r'"((?:[^"\\`]|\\.)*)"').match(line, i)
                    assert m, line[i:]
                    raw = m.group(1)
                    if re.search(r"(?<!\\)\$", raw):  # an expansion: kept as written
                        parts.append(("dq", raw))
                    else:
                        parts.append(("lit", re.sub(r'\\([$`"\\])', r"\1", raw).encode()))
                    i = m.end()
                elif c == "$":
                    m = re.compile(r"\$(?:[A-Za-z_]\w*|\{[^}]*\}|[@#?$!0-9*-])").match(line, i)
                    if not m:
                        raise ValueError(f"unquoted $ bash would expand: {line[i:]!r}")
                    parts.append(("exp", m.group()))
                    i = m.end()
                elif c == "\\":
                    parts.append(("lit", line[i + 1].encode()))
                    i += 2
                elif _SAFE.match(c):
                    parts.append(("lit", c.encode()))
                    i += 1
                else:
                    raise ValueError(f"{c!r} is not literal in an unquoted bash word: {line!r}")
            merged: list[tuple[str, Any]] = []
            for kind, text in parts:
                if kind == "lit" and merged and merged[-1][0] == "lit":
                    merged[-1] = ("lit", merged[-1][1] + text)
                else:
                    merged.append((kind, text))
            tokens.append(("word", [(k, t.decode() if k == "lit" else t) for k, t in merged]))
    return tokens


def sbatch_directive(line: str) -> tuple[str, str | None]:
    """``(option, value)`` of an ``#SBATCH --option[=value]`` line as sbatch reads it: a value of
    plain characters, or one double-quoted with backslash escapes, then the end of the line."""
    m = re.fullmatch(r"#SBATCH (--[a-z-]+)(?:=(.*))?", line)
    assert m, line
    option, raw = m.groups()
    if raw is None:
        return option, None
    if re.fullmatch(r"[A-Za-z0-9_.,:@%+=/\-\[\]]+", raw):
        return option, raw
    m = re.fullmatch(r'"((?:[^"\\]|\\.)*)"', raw)
    assert m, f"not one sbatch argument: {line!r}"
    return option, re.sub(r"\\(.)", r"\1", m.group(1))


def assert_same_shell(benign: str, hostile: str, pairs: list[tuple[str, str]]) -> None:
    """``hostile`` is ``benign`` with the hostile values in the markers' places, as data."""
    b_lines, h_lines = benign.split("\n"), hostile.split("\n")
    assert len(b_lines) == len(h_lines), "a value added or removed a line"
    for b, h in zip(b_lines, h_lines):
        if b == h:
            continue
        if b.startswith("#SBATCH"):
            (bo, bv), (ho, hv) = sbatch_directive(b), sbatch_directive(h)
            assert bo == ho and (None if bv is None else _sub(bv, pairs, quoted=False)) == hv, (b, h)
            continue
        bt, ht = bash_tokens(b), bash_tokens(h)
        assert [k for k, _ in bt] == [k for k, _ in ht], (b, h)
        for (kind, bv), (_, hv) in zip(bt, ht):
            if kind == "comment":
                assert_same_comment(bv, hv, pairs)
            elif kind == "word":
                want = [(k, _sub(t, pairs, quoted=False) if k == "lit" else t) for k, t in bv]
                assert want == hv, (b, h)
                if hv[0][0] == "lit" and hv[0][1].startswith("-"):  # no value turned into an option
                    assert bv[0][0] == "lit" and bv[0][1].startswith("-"), (b, h)
            else:
                assert bv == hv, (b, h)


# ------------------------------------------------------------------------------------------
# Compiling


@pytest.fixture(scope="module")
def benign_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The benign spec compiled (once for the module)."""
    base = tmp_path_factory.mktemp("benign")
    write_toml(base / "spec.toml", build({}))
    compile_spec(base / "spec.toml", base / "out")
    return base / "out"


def _normal(text: str, content_hash: str, spec: Path) -> str:
    """``text`` without what differs between two compiles of the same program: the content
    hash and the spec file's path (train.py and launch.sh name it in their headers)."""
    return text.replace(content_hash, "sha256:HASH").replace(spec.as_posix(), "SPEC")


def compile_hostile(tmp_path: Path, value: str) -> tuple[Path, dict[str, str], set[str]]:
    """Compile the spec with ``value`` in every slot validation accepts it in. Returns (its
    directory, the accepted slots -> value, the refused slots); every refusal is checked to be a
    clean SpecError naming the slot's key, which validate reports too."""
    spec = tmp_path / "spec.toml"
    hostile = {slot: value for slot in SLOTS}
    refused: set[str] = set()
    for _ in range(8):
        write_toml(spec, build(hostile))
        try:
            result = compile_spec(spec, tmp_path / "hostile")
            break
        except SpecError as exc:
            errors = [i for i in exc.issues if i.severity == "error"]
            assert errors and not (tmp_path / "hostile").exists()
            blamed = {_blame(i.key, hostile) for i in errors}
            assert None not in blamed, [(i.key, i.message) for i in errors]
            # validate reports it too (compile's runtime gaps aside).
            try:
                # with "paths": a data.train glob that matches nothing is an error (data-glob-empty)
                shown = {i.key for i in find(("spec", "paths", "slurm", "memory", "runtime"), load(spec))
                         if i.severity == "error"}
            except SpecError as loaded:
                shown = {i.key for i in loaded.errors}
            assert {i.key for i in errors if RULES[i.rule].scope != "runtime"} <= shown
            for slot in blamed:
                del hostile[slot]
            refused |= blamed
    else:
        raise AssertionError("the hostile spec never compiled")
    assert result.files
    return tmp_path / "hostile", hostile, refused


def _blame(key: str, hostile: dict[str, str]) -> str | None:
    """The hostile slot an error at ``key`` is about (None: none of them)."""
    for slot in hostile:
        path = re.sub(r"(\[\]|\{=?\}).*", "", slot)
        if slot.endswith("{}") and key.startswith(path + "."):
            return slot
        if slot.endswith("{=}") and key.startswith(path + ".") and path + "{}" not in hostile:
            return slot
        if key == path or (slot not in CONSTRAINED and key.startswith(path + ".") and not slot.endswith("}")):
            return slot
    return None


def assert_same_program(benign_dir: Path, hostile_dir: Path, accepted: dict[str, str], tmp_path: Path) -> None:
    pairs = _markers_in(_replacements(accepted))
    read = {}
    for d in (benign_dir, hostile_dir):
        content_hash = tomllib.loads((d / "spec.lock.toml").read_text(encoding="utf-8"))["lock"]["content_hash"]
        read[d] = {p.name: _normal(p.read_text(encoding="utf-8"), content_hash, d.parent / "spec.toml")
                   for p in d.iterdir()}
    b, h = read[benign_dir], read[hostile_dir]
    assert set(b) == set(h) == {"train.py", "launch.sh", "launch.sbatch", "spec.lock.toml", "plan.json"}

    # train.py: the same AST with the values as string constants, the same comments.
    b_tree, h_tree = ast.parse(b["train.py"]), ast.parse(h["train.py"])
    for node in ast.walk(b_tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = _sub(node.value, pairs)
    assert ast.dump(b_tree) == ast.dump(h_tree)
    strings = {n.value for n in ast.walk(h_tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for slot in ("name", "data.train[].prefix", "checkpoint.save", "logging.run_dir", "data.split",
                 "stage.rl.prompts", "eval.generation.prompts"):
        if slot in accepted:
            assert accepted[slot] in strings, slot
    if "name" in accepted:
        assert repr(accepted["name"]) in ast.get_docstring(h_tree, clean=False)
    b_comments, h_comments = _comments(b["train.py"]), _comments(h["train.py"])
    assert [line for line, _ in b_comments] == [line for line, _ in h_comments]
    for (_, bc), (_, hc) in zip(b_comments, h_comments):
        if bc != hc:
            assert_same_comment(bc, hc, pairs)

    # The lock file and the plan: the same data.
    b_lock, h_lock = tomllib.loads(b["spec.lock.toml"]), tomllib.loads(h["spec.lock.toml"])
    assert _sub_data(b_lock, pairs) == h_lock
    assert _sub_data(json.loads(b["plan.json"]), pairs) == json.loads(h["plan.json"])

    # The scripts: bash parses them, and reads the same words.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    for name in ("launch.sh", "launch.sbatch"):
        run = subprocess.run(["bash", "-n", str(hostile_dir / name)], capture_output=True, text=True,
                             cwd=tmp_path, env=env)
        assert run.returncode == 0, run.stderr
        assert_same_shell(b[name], h[name], pairs)
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_hostile_values_in_every_string_field_arrive_as_data(tmp_path: Path, benign_dir: Path, value: str) -> None:
    hostile, accepted, refused = compile_hostile(tmp_path, value)
    assert set(accepted) | refused == set(SLOTS)
    assert set(CONSTRAINED) <= refused
    if "\x00" not in value:
        # a brace other than {name}, {{ or }} in a run path is the loader's name-placeholder error
        must = MUST_ACCEPT - (set(NAME_KEYS) if bad_tokens(value) else set())
        if set("*?[") & set(value):  # a glob of shards (dlmspec.resolve.resolve_blend): refused when it matches none
            must -= {"data.train[].prefix"}
        assert must <= set(accepted), must - set(accepted)
    else:  # NUL fits no path, name or environment variable: refused everywhere it is written
        assert set(accepted) <= NOT_WRITTEN | {"logging.tensorboard_dir"}, accepted
    assert_same_program(benign_dir, hostile, accepted, tmp_path)


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_hostile_container_values_with_apptainer(tmp_path: Path, value: str) -> None:
    """apptainer takes the image and mounts as words of its command line (pyxis as option values)."""
    spec = build({}, "apptainer")
    resolved = resolve(Spec.model_validate(spec))
    from dlmspec.render.sbatch import render_sbatch

    benign = render_sbatch(resolved)
    slots = ["cluster.slurm.container_image", "cluster.slurm.container_mounts[]"]
    hostile = build(dict.fromkeys(slots, value), "apptainer")
    resolved = resolve(Spec.model_validate(hostile))
    issues = issues_for("sbatch", resolved.spec, resolved)
    if issues:
        assert {i.key for i in issues} <= {"cluster.slurm.container_image", "cluster.slurm.container_mounts"}
        with pytest.raises(SpecError):
            render_sbatch(resolved)
        return
    assert_same_shell(benign, render_sbatch(resolved), _markers_in(_replacements(dict.fromkeys(slots, value))))


def test_a_docstring_break_out_in_the_name_runs_nothing(tmp_path: Path) -> None:
    """The attack of a run name that closes train.py's docstring."""
    name = 'x"""; import os; os.system("touch PWNED"); """'
    spec = build({"name": name})
    write_toml(tmp_path / "spec.toml", spec)
    compile_spec(tmp_path / "spec.toml", tmp_path / "out")
    tree = ast.parse((tmp_path / "out" / "train.py").read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "system"]
    assert not calls
    assert ast.get_docstring(tree, clean=False).startswith(f"Training launch for run {name!r}:")
    assert name in {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}


# ------------------------------------------------------------------------------------------
# The escaping functions themselves (dlmspec.escape), read back by the decoders above


_BREAKS = re.compile(r"[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_each_escape_reads_back_as_the_value(value: str) -> None:
    from dlmspec.escape import comment, py_docstring, py_literal, sbatch_value, shell_word

    assert ast.literal_eval(py_literal(value)) == value and not _BREAKS.search(py_literal(value))
    text = py_docstring(value)
    assert '"' not in text.replace('\\"', "") and not _BREAKS.search(text)
    assert ast.literal_eval(f'"""{text}"""') == value
    assert comment(value).isprintable() and len(comment(value).splitlines()) <= 1
    if any(not ch.isprintable() for ch in value):
        with pytest.raises(ValueError):
            sbatch_value(value)
    else:
        assert sbatch_directive(f"#SBATCH --job-name={sbatch_value(value)}") == ("--job-name", value)
    if "\x00" in value:
        with pytest.raises(ValueError):
            shell_word(value)
    else:
        assert bash_tokens(f"export V={shell_word(value)}") == [("word", [("lit", "export")]),
                                                                  ("word", [("lit", "V=" + value)])]


def test_validate_refuses_nul_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dlmspec validate` (its fast path, without pydantic) reports what compile refuses."""
    from dlmspec.cli import main as cli_main

    spec = build({})
    spec["data"]["train"][0]["prefix"] = "data/a\x00b"
    path = tmp_path / "spec.toml"
    write_toml(path, spec)
    assert cli_main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "data.train" in err and "NUL" in err and "string-characters" in err and "Traceback" not in err


def test_a_python_spec_with_a_lone_surrogate_is_refused(tmp_path: Path) -> None:
    spec = build({})
    spec["description"] = "half \ud800 a pair"
    path = tmp_path / "spec.py"
    path.write_text(f"spec = {spec!r}\n", encoding="utf-8")
    with pytest.raises(SpecError) as info:
        compile_spec(path, tmp_path / "out")
    assert [(i.key, i.rule) for i in info.value.errors] == [("description", "string-characters")]
    assert not (tmp_path / "out").exists()
