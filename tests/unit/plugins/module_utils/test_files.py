# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils._files: the one atomic writer of the collection, on real files."""
import json
import os
import stat

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _files


def test_write_atomic_sets_mode_before_the_file_appears_and_replaces_whole(tmp_path):
    path = str(tmp_path / "unit.service")
    _files.write_atomic(path, b"old\n", 0o644)
    _files.write_atomic(path, b"new\n", 0o640, owner=(os.getuid(), os.getgid()))
    assert _files.read_bytes(path) == b"new\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert os.listdir(str(tmp_path)) == ["unit.service"]


def test_write_json_fails_on_what_json_cannot_hold_and_keeps_the_old_file(tmp_path):
    path = str(tmp_path / "sub" / "r.json")
    _files.write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        _files.write_json(path, {"a": object()})
    assert json.loads(_files.read_bytes(path)) == {"a": 1}
    assert os.listdir(str(tmp_path / "sub")) == ["r.json"]


def test_write_json_with_default_str_keeps_every_record(tmp_path):
    path = str(tmp_path / "r.json")
    _files.write_json(path, {"a": "x", "b": object()}, default=str)
    assert json.loads(_files.read_bytes(path))["b"].startswith("<object object")


def test_read_bytes_of_a_missing_file_or_a_directory_is_none(tmp_path):
    assert _files.read_bytes(str(tmp_path / "missing")) is None
    assert _files.read_bytes(str(tmp_path)) is None
