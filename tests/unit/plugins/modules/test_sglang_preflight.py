# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sglang_preflight module: version, the launch check, --config left out, messages and secrets.
(The scripts and their parsers are tested in tests/unit/plugins/module_utils/test_preflight.py.)"""
import json

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.inference.plugins.module_utils import _preflight
from ansible_collections.gpufleet.inference.plugins.module_utils._host import COMMAND_ENV
from ansible_collections.gpufleet.inference.plugins.modules import sglang_preflight

from fakes import ModuleExit, RunTable, patch_module_exits, patch_run_command

PYTHON = "/opt/sglang/venv/bin/python"
ARGS = ["--model-path", "/m", "--tp-size", "8", "--speculative-algorithm", "DFLASH"]


def report(data, stages=()):
    lines = ["%s_STAGE %s" % (_preflight.MARKER, stage) for stage in stages]
    return "\n".join(lines + ["noise", "%s %s" % (_preflight.MARKER, json.dumps(data))]) + "\n"


VERSION_OK = (0, report({"version": "0.5.23", "source": "metadata", "error": None}), "")
CHECK_OK = (0, report({"ok": True, "stage": "resolve", "error": None, "exception": None,
                       "checked": ["argparse (prepare_server_args)", "ServerArgs.resolve_once()"],
                       "unchecked": ["GPU memory"]}, ("import", "parse", "resolve")), "")


def preflight(monkeypatch, table, check_mode=False, **args):
    patch_module_exits(monkeypatch)
    patch_run_command(monkeypatch, table)
    with patch_module_args(dict(args, _ansible_check_mode=check_mode)):
        with pytest.raises(ModuleExit) as caught:
            sglang_preflight.main()
    return caught.value.result, caught.value.failed


def table(version=VERSION_OK, check=None, python=PYTHON):
    runs = RunTable({tuple(_preflight.version_command(python)): version})
    if check is not None:
        runs.add(_preflight.check_command(python, ARGS), *check)
    return runs


def test_version_only(monkeypatch):
    runs = table()
    result, failed = preflight(monkeypatch, runs, environment={"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": 8})
    assert not failed and result == {"changed": False, "version": "0.5.23", "version_source": "metadata"}
    assert runs.calls == [_preflight.version_command(PYTHON)]
    env = runs.kwargs[0]["environ_update"]
    assert env == dict(COMMAND_ENV, NCCL_DEBUG="WARN", OMP_NUM_THREADS="8")  # as text, like the unit's


def test_version_from_an_import(monkeypatch):
    version = (0, report({"version": "0.5.11", "source": "import", "error": "no package metadata"}), "")
    result, failed = preflight(monkeypatch, table(version=version, python="/venv/bin/python"),
                               python="/venv/bin/python")
    assert result["version"] == "0.5.11" and result["version_source"] == "import"


@pytest.mark.parametrize("answer,cause", [
    ((1, report({"version": None, "source": None, "error": "ModuleNotFoundError: No module named 'sglang'"}), ""),
     "ModuleNotFoundError: No module named 'sglang'"),
    ((127, "", "/opt/sglang/venv/bin/python: No such file or directory"),
     "/opt/sglang/venv/bin/python: No such file or directory (exit 127)"),
    ((-9, "", ""), "no answer (killed by signal 9)"),
    ((0, report({"version": None, "source": None, "error": None}), ""), "no version found"),
])
def test_no_version_fails_naming_the_interpreter(monkeypatch, answer, cause):
    result, failed = preflight(monkeypatch, table(version=answer), args=ARGS)
    assert failed and result["version"] is None and result["changed"] is False
    assert result["msg"] == ("cannot tell which SGLang %s (sglang_python) has: %s. Point sglang_python at the "
                             "interpreter that has sglang installed, or set sglang_version." % (PYTHON, cause))


def test_args_are_checked_without_the_config_file(monkeypatch):
    runs = table(check=CHECK_OK)
    result, failed = preflight(monkeypatch, runs, args=ARGS + ["--config", "/etc/sglang/sglang.yaml"])
    assert not failed, result["msg"] if failed else ""
    assert result["checked"] == ["argparse (prepare_server_args)", "ServerArgs.resolve_once()"]
    assert result["unchecked"] == ["GPU memory"] and result["version"] == "0.5.23"
    assert runs.calls[1] == _preflight.check_command(PYTHON, ARGS)
    assert "/etc/sglang/sglang.yaml" not in runs.calls[1] and "--config" not in runs.calls[1]


@pytest.mark.parametrize("args,kept", [
    (["--config", "/a.yaml", "--port", "1"], ["--port", "1"]),
    (["--port", "1", "--config"], ["--port", "1"]),
    (["--port", "1"], ["--port", "1"]),
    ([], []),
])
def test_without_config(args, kept):
    assert _preflight.without_config(args) == kept


def test_rejected_args_fail_naming_the_stage_and_the_cause(monkeypatch):
    check = (1, report({"ok": False, "stage": "parse", "exception": "SystemExit", "checked": [], "unchecked": ["x"],
                        "error": "launch_server: error: argument --tp-size: invalid int value: 'eight'"},
                       ("import", "parse")), "")
    result, failed = preflight(monkeypatch, table(check=check), args=ARGS)
    assert failed and result["changed"] is False
    assert result["msg"] == ("SGLang 0.5.23 (%s) rejects the intended arguments (parse): launch_server: error: "
                             "argument --tp-size: invalid int value: 'eight'. Nothing was changed." % PYTHON)
    assert result["unchecked"] == ["x"] and result["checked"] == []


def test_a_check_that_died_names_how_far_it_got(monkeypatch):
    check = (-9, "%s_STAGE import\n%s_STAGE parse\n" % (_preflight.MARKER, _preflight.MARKER), "")
    result, failed = preflight(monkeypatch, table(check=check), args=ARGS)
    assert failed and "rejects the intended arguments (parse): no answer (killed by signal 9)" in result["msg"]


def test_a_secret_in_the_checks_error_is_masked(monkeypatch):
    check = (1, report({"ok": False, "stage": "resolve", "exception": "ValueError", "checked": [], "unchecked": [],
                        "error": "ValueError: bad ServerArgs(api_key='pf-s3cret')"}), "")
    result, failed = preflight(monkeypatch, table(check=check), args=ARGS)
    assert failed and "pf-s3cret" not in json.dumps(result)
    assert "api_key=%s" % _preflight.REDACTED in result["msg"]


def test_check_mode_runs_the_same_read_only_checks(monkeypatch):
    runs = table(check=CHECK_OK)
    result, failed = preflight(monkeypatch, runs, check_mode=True, args=ARGS)
    assert not failed and result["changed"] is False and len(runs.calls) == 2


def test_argument_validation(monkeypatch):
    runs = RunTable()
    result, failed = preflight(monkeypatch, runs, bogus=True)
    assert failed and "Unsupported parameters" in result["msg"] and runs.calls == []
    result, failed = preflight(monkeypatch, runs, environment=["A=1"])
    assert failed and "environment" in result["msg"] and runs.calls == []
