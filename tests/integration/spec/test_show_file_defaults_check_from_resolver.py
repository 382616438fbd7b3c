"""Loading back a file dlmspec wrote (``spec.lock.toml``, ``dlmspec show``): the written defaults are
left out only through the content-hash check the resolver hands the loader
(:func:`dlmspec.spec.show.use_locked_form`); the spec layer itself never imports the resolver."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _lock_file(tmp_path: Path) -> Path:
    from dlmspec.render.compile import render_lock
    from dlmspec.resolve import resolve
    from dlmspec.spec.load import load

    path = tmp_path / "spec.lock.toml"
    path.write_text(render_lock(resolve(load(ROOT / "specs" / "demo-dlm.toml").spec)), encoding="utf-8")
    return path


def test_lock_file_loads_with_written_defaults_unset_through_the_resolver_check(tmp_path: Path) -> None:
    from dlmspec.render.compile import content_hash
    from dlmspec.resolve import locked_form, resolve
    from dlmspec.spec import show
    from dlmspec.spec.load import load

    lock = _lock_file(tmp_path)
    original = load(ROOT / "specs" / "demo-dlm.toml").spec
    again = load(lock).spec
    assert show._LOCKED_FORM is not None and show._LOCKED_FORM[0] is locked_form
    assert content_hash(resolve(again)) == content_hash(resolve(original))
    # the defaults the lock wrote are unset again, as in the spec it was written from
    import tomllib

    written = set(tomllib.loads(lock.read_text(encoding="utf-8"))["train"])
    assert again.train.model_fields_set <= original.train.model_fields_set < written


def test_written_defaults_are_kept_when_the_check_says_the_run_changes(tmp_path: Path) -> None:
    import tomllib

    from dlmspec.spec.show import _without_written_defaults

    data = tomllib.loads(_lock_file(tmp_path).read_text(encoding="utf-8"))
    calls = []

    def every_change_differs(d: dict) -> str:
        calls.append(d)
        return str(id(d))

    kept = _without_written_defaults(data, (every_change_differs, ("train.train_iters",)))
    assert calls and kept is data
    assert _without_written_defaults(data, (lambda d: "same", ())) != data  # an agreeing check trims


def test_spec_layer_loads_a_lock_file_without_importing_the_resolver(tmp_path: Path) -> None:
    lock = _lock_file(tmp_path)
    code = ("import sys; from dlmspec.spec.load import load; spec = load(sys.argv[1]).spec; "
            "print('dlmspec.resolve' in sys.modules, 'train_iters' in spec.train.model_fields_set)")
    out = subprocess.run([sys.executable, "-c", code, str(lock)], capture_output=True, text=True, check=True)
    # without the resolver's check the file loads as written: every key it wrote set
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr
