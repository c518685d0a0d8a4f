# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sglang_drift module: arguments, read-only result, secret files never shown."""
import json
import os

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import EffectiveUnit
from ansible_collections.gpufleet.inference.plugins.modules import sglang_drift

from fakes import COMMAND, EXPECT_2048, NEW, STARTUP, WALL0, FakeHost, ModuleExit, module_with_args, timed, unit_state

UNIT_TEXT = "[Service]\nExecStart=/opt/sglang/venv/bin/python -m sglang.launch_server\n"
SECRET = 'api_key: "drift-s3cret"\n'
KEY = "client-s3cret"


def running_host(**kwargs):
    kwargs.setdefault("cmdline", COMMAND)
    host = FakeHost(states=[(0.0, unit_state(NEW))], journal={NEW: timed(0.0, STARTUP, 0.1)}, **kwargs)
    host.now = 100.0
    return host


def write(tmp_path, name, content, mode=0o644):
    path = tmp_path / name
    path.write_text(content)
    os.chmod(str(path), mode)
    os.utime(str(path), (WALL0 - 60, WALL0 - 60))
    return str(path)


def drift(monkeypatch, host, check_mode=False, **args):
    args.setdefault("expect", EXPECT_2048)
    args.setdefault("command", COMMAND)
    module = module_with_args(monkeypatch, sglang_drift.ARGUMENT_SPEC, args, check_mode=check_mode)
    with pytest.raises(ModuleExit) as caught:
        sglang_drift.run(module, host)
    return caught.value.result, caught.value.failed, module


def test_in_sync_is_not_changed(monkeypatch, tmp_path):
    unit = write(tmp_path, "sglang.service", UNIT_TEXT)
    secret = write(tmp_path, "sglang.yaml", SECRET, 0o640)
    host = running_host()
    result, failed, module = drift(monkeypatch, host, files=[{"path": unit, "content": UNIT_TEXT, "mode": "0644"}],
                                   secret_files=[{"path": secret, "content": SECRET, "mode": "0640"}],
                                   last_good_dir=str(tmp_path / "last-good"))
    assert not failed and result["changed"] is False
    assert result["verdict"] == "in_sync" and result["in_sync"] is True and result["differences"] == []
    assert result["source"] == "journal" and result["last_good"] == {"exists": False}
    assert host.written == []
    assert sorted(os.listdir(str(tmp_path))) == ["sglang.service", "sglang.yaml"]  # nothing written


def test_drift_is_a_result_not_a_failure(monkeypatch, tmp_path):
    unit = write(tmp_path, "sglang.service", UNIT_TEXT.replace("sglang.launch_server", "other"))
    result, failed, module = drift(monkeypatch, running_host(), files=[{"path": unit, "content": UNIT_TEXT}])
    assert not failed and result["changed"] is False
    assert result["verdict"] == "drifted" and result["in_sync"] is False
    assert any(line.startswith("+ExecStart") for line in result["unit_diff"])


def test_secret_file_content_never_appears(monkeypatch, tmp_path):
    secret = write(tmp_path, "sglang.yaml", 'api_key: "old-drift-s3cret"\n', 0o600)
    result, failed, module = drift(monkeypatch, running_host(), api_key=KEY,
                                   secret_files=[{"path": secret, "content": SECRET, "mode": "0600"}])
    assert result["verdict"] == "drifted"
    assert result["differences"] == [{"what": "file", "key": secret, "expected": "as rendered by the role",
                                      "observed": "differs (content not shown)"}]
    text = json.dumps(result)
    assert "drift-s3cret" not in text and KEY not in text
    # Ansible masks them in anything else too (no_log of the suboption and of api_key)
    assert SECRET in module.no_log_values and KEY in module.no_log_values


def test_a_non_secret_file_is_diffed(monkeypatch, tmp_path):
    unit = write(tmp_path, "sglang.service", "A=1\n")
    result, failed, module = drift(monkeypatch, running_host(), files=[{"path": unit, "content": "A=2\n"}])
    assert result["differences"][0]["observed"] == "-A=1; +A=2"


def test_check_mode_is_the_same_look(monkeypatch, tmp_path):
    unit = write(tmp_path, "sglang.service", UNIT_TEXT)
    result, failed, module = drift(monkeypatch, running_host(), check_mode=True,
                                   files=[{"path": unit, "content": UNIT_TEXT}])
    assert result["verdict"] == "in_sync" and result["changed"] is False


def test_intent_parameters_reach_the_check(monkeypatch):
    host = running_host(effective=EffectiveUnit({"Environment": "A=2"}), environ={"A": "2"},
                        server_info={"speculative_dflash_draft_window_size": 512})
    result, failed, module = drift(monkeypatch, host, environment={"A": "1"}, config_line="required",
                                   server_info={"speculative_dflash_draft_window_size": 2048}, probe=False)
    keys = [(item["what"], item["key"]) for item in result["differences"]]
    assert keys == [("effective unit", "Environment A"), ("process environment", "A"),
                    ("server_info", "speculative_dflash_draft_window_size")]
    assert "generate" not in host.calls and "serving" not in result


def test_defaults(monkeypatch):
    module = module_with_args(monkeypatch, sglang_drift.ARGUMENT_SPEC, {})
    params = module.params
    assert params["files"] == [] and params["secret_files"] == [] and params["probe"] is True
    assert params["last_good_dir"] == "/var/lib/gpufleet-inference/last-good" and params["request_timeout"] == 30


@pytest.mark.parametrize("args,message", [
    ({"files": [{"path": "/x"}]}, "missing required arguments: content found in files"),
    ({"secret_files": [{"content": SECRET}]}, "missing required arguments: path found in secret_files"),
    ({"files": [{"path": "/x", "content": "", "colour": "red"}]}, "Unsupported parameters"),
    ({"config_line": "maybe"}, "value of config_line must be one of"),
])
def test_argument_validation(monkeypatch, args, message):
    with pytest.raises(ModuleExit) as caught:
        module_with_args(monkeypatch, sglang_drift.ARGUMENT_SPEC, dict(args, api_key=KEY))
    assert caught.value.failed and message in caught.value.result["msg"]
    text = json.dumps(caught.value.result)
    assert KEY not in text and "drift-s3cret" not in text


def test_an_unquoted_yaml_mode_is_understood(monkeypatch, tmp_path):
    unit = write(tmp_path, "sglang.service", UNIT_TEXT, 0o644)
    result, failed, module = drift(monkeypatch, running_host(), files=[{"path": unit, "content": UNIT_TEXT,
                                                                        "mode": 0o644}])
    assert result["differences"] == []


def test_missing_accounts_names_only_the_user_and_group_that_do_not_exist(monkeypatch):
    result, failed, _module = drift(monkeypatch, running_host(),
                                    accounts={"user": "no-such-user-gpf", "group": "root"})
    assert not failed and result["missing_accounts"] == ["user no-such-user-gpf"]
    result, failed, _module = drift(monkeypatch, running_host(),
                                    accounts={"user": "root", "group": "no-such-group-gpf"})
    assert result["missing_accounts"] == ["group no-such-group-gpf"]
    result, failed, _module = drift(monkeypatch, running_host(), accounts={"user": "root", "group": "0"})
    assert result["missing_accounts"] == []
    result, failed, _module = drift(monkeypatch, running_host())
    assert result["missing_accounts"] == []
