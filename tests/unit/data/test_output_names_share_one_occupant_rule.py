"""One rule says what at an output name stops a dataset being written
(dlmspec.data.outputs.occupant): a folder always, a file or any link (to a folder, dangling) only
without --force. `dlmspec data prepare` (check_outputs) and `dlmspec task make --prepare-data`
(existing_outputs, which checks every dataset's files before any is written) both follow it."""

from __future__ import annotations

import os

import pytest

from dlmspec.data.errors import DataPrepareError
from dlmspec.data.outputs import DatasetOutput, check_outputs, occupant
from dlmspec.tasks.datasets import existing_outputs, task_datasets


def _things(tmp_path):
    """An output name of each kind: nothing, a file, a folder, a link to a folder, a dangling link."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    os.symlink(tmp_path / "folder", tmp_path / "folder-link")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    return {"nothing": None, "file": "file", "folder": "folder", "folder-link": "file", "dangling": "file"}


def test_each_kind_of_thing_at_an_output_name(tmp_path):
    for name, expected in _things(tmp_path).items():
        assert occupant(str(tmp_path / name)) == expected, name


@pytest.mark.parametrize("force", [False, True])
def test_data_prepare_and_task_make_refuse_the_same_names(tmp_path, force):
    kinds = _things(tmp_path)
    for name, kind in kinds.items():
        path = str(tmp_path / name)
        out = {"text": DatasetOutput("text", path + "-prefix", path, path + "-prefix.idx")}
        try:
            check_outputs(out, "PREFIX", [], force)
            prepare_refuses = False
        except DataPrepareError:
            prepare_refuses = True
        task = tmp_path / f"task-{name}"
        train = task_datasets(task)[0]
        if kind:  # the same thing at task make's first output name
            os.rename(path, train.prefix + ".bin")
        found = existing_outputs(task_datasets(task), force)
        assert prepare_refuses == bool(found) == (kind == "folder" or (kind == "file" and not force)), name
        if found:
            assert found[0][0] == train.prefix + ".bin"


def test_task_make_names_every_file_in_the_way_at_once(tmp_path):
    datasets = task_datasets(tmp_path / "task")
    paths = [datasets[0].files()[2], datasets[3].files()[-1]]  # a record and an SFT response index
    os.symlink(tmp_path / "gone", paths[0])
    os.mkdir(paths[1])
    assert [p for p, _, _ in existing_outputs(datasets)] == paths
    assert [p for p, _, _ in existing_outputs(datasets, force=True)] == [paths[1]]
