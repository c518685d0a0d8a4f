# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Module-level tests: exit_json/fail_json raise, run_command answers from an argv table."""
import json

import pytest
from unittest import mock

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.inference.plugins.module_utils import _systemd as sd
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import JOURNAL_DROPPED_MESSAGE_ID
from ansible_collections.gpufleet.inference.plugins.modules import sglang_info, sglang_ready

INV = "0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d"
OLD = "ffff0000ffff0000ffff0000ffff0000"
CONFIG = ("[2026-11-29 10:00:00 TP0] Initialized DFLASH draft runner. attention_backend=flashinfer, "
          "model=DFlashDraftModel, block_size=16, draft_window_size=2048, compact_cache=True")
SHOW = ("Id=sglang.service\nLoadState=loaded\nInvocationID=%s\nActiveState=active\nSubState=running\nMainPID=4242\n"
        "NRestarts=0\nControlGroup=/system.slice/sglang.service\nExecMainStartTimestamp=Sun 2026-11-29 10:00:00 UTC\n"
        "Result=success\nUnitFileState=enabled\n")
EXEC = ("ExecStart={ path=/opt/sglang/venv/bin/python ; argv[]=/opt/sglang/venv/bin/python -m sglang.launch_server "
        "--speculative-dflash-draft-window-size 2048 ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; "
        "code=(null) ; status=0/0 }\n")
JBASE = ["journalctl", "_SYSTEMD_INVOCATION_ID=" + INV, "-o", "json", "--all", "--no-pager", "-q"]
GREP = tuple(JBASE + ["--grep", r"Initialized (DFLASH draft runner|DDTree worker)\."])


class Exit(Exception):
    pass


class Fail(Exception):
    pass


def exit_json(self, **kwargs):
    raise Exit(kwargs)


def fail_json(self, **kwargs):
    raise Fail(kwargs)


def entries(*messages):
    return "".join(json.dumps({"MESSAGE": m, "__CURSOR": "c%d" % i, "__REALTIME_TIMESTAMP": "1"}) + "\n"
                   for i, m in enumerate(messages))


class Table(object):
    def __init__(self, table):
        self.table = dict((tuple(k), v) for k, v in table.items())
        self.calls = []

    def __call__(self, argv, **kwargs):
        self.calls.append(list(argv))
        key = tuple(argv)
        assert key in self.table, "unexpected command %r" % (argv,)
        return self.table[key]


@pytest.fixture
def patched():
    with mock.patch.multiple(basic.AnsibleModule, exit_json=exit_json, fail_json=fail_json), \
            mock.patch.object(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: name):
        yield


def run_module(module, args, table, responses):
    """responses: path -> (status, body) or an exception, for open_url."""
    def opener(url, **kwargs):
        for path, outcome in responses.items():
            if url.endswith(path):
                if isinstance(outcome, Exception):
                    raise outcome
                status, body = outcome
                resp = mock.Mock()
                resp.status = status
                resp.read.return_value = json.dumps(body).encode()
                return resp
        raise ConnectionRefusedError(111, "Connection refused")
    with patch_module_args(args), mock.patch.object(basic.AnsibleModule, "run_command", table), \
            mock.patch("ansible_collections.gpufleet.inference.plugins.module_utils._probe.open_url", opener):
        with pytest.raises((Exit, Fail)) as info:
            module.main()
    return info.type, info.value.args[0]


STATE_ARGV = tuple(sd.show_argv("sglang.service", sd.STATE_PROPERTIES))
EXEC_ARGV = tuple(sd.show_argv("sglang.service", ("ExecStart",)))
GOOD = {"text": " Paris", "meta_info": {"completion_tokens": 8, "spec_accept_length": 3.1}}


def test_info_reports_current_invocation(patched):
    table = Table({STATE_ARGV: (0, SHOW % INV, ""), EXEC_ARGV: (0, EXEC, ""),
                   GREP: (0, entries(CONFIG.replace("TP0", "TP3"), CONFIG), "")})
    kind, result = run_module(sglang_info, {"api_key": "sekret"}, table, {"/server_info": (200, {
        "version": "0.5.11", "status": "Up", "tp_size": 8, "speculative_dflash_draft_window_size": 2048,
        "internal_states": [{"avg_spec_accept_length": 3.1}], "api_key": "sekret"})})
    assert kind is Exit and result["changed"] is False
    assert result["exists"] and result["invocation_id"] == INV and result["main_pid"] == 4242
    assert result["exec_start"][:3] == ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server"]
    assert result["config"]["draft_window_size"] == 2048 and result["config_line"] == CONFIG
    assert result["server_info"]["speculative_dflash_draft_window_size"] == 2048
    assert "api_key" not in result["server_info"]
    assert result["unit_file_state"] == "enabled"
    assert not any(call[0] == "journalctl" and "-u" in call for call in table.calls)


def test_info_missing_unit_is_not_a_failure(patched):
    table = Table({STATE_ARGV: (0, "Id=sglang.service\nLoadState=not-found\nActiveState=inactive\n", "")})
    kind, result = run_module(sglang_info, {}, table, {})
    assert kind is Exit and result["exists"] is False and result["config"] is None


def test_info_unreachable_server_is_null(patched):
    table = Table({STATE_ARGV: (0, SHOW % INV, ""), EXEC_ARGV: (0, EXEC, ""), GREP: (1, "", "")})
    kind, result = run_module(sglang_info, {}, table, {})
    assert kind is Exit and result["server_info"] is None and result["config"] is None
    assert result["server_info_error"] == "connection refused"


def ready_table(extra=None):
    table = {STATE_ARGV: (0, SHOW % INV, ""), EXEC_ARGV: (0, EXEC, ""),
             tuple(JBASE + ["-n", "2000"]): (0, entries("Load weight begin.", CONFIG), ""),
             tuple(JBASE + ["--after-cursor=c1", "-n", "2000"]): (0, "", "")}
    table.update(extra or {})
    return Table(table)


def test_ready_passes(patched):
    kind, result = run_module(sglang_ready, {
        "after_invocation": OLD, "expect": {"draft_window_size": "2048", "compact_cache": "True"},
        "verify_listener": False, "timeout": 5, "poll_interval": 0.01}, ready_table(), {"/generate": (200, GOOD)})
    assert kind is Exit, result["msg"]
    assert result["changed"] is False and result["verdict"] == "pass" and result["invocation_id"] == INV
    assert result["generate"]["meta_info"]["spec_accept_length"] == 3.1
    assert result["source"] == "journal" and result["expected"] == {"draft_window_size": 2048, "compact_cache": True}


def test_ready_mismatch_fails(patched):
    kind, result = run_module(sglang_ready, {
        "after_invocation": OLD, "expect": {"draft_window_size": 1024}, "verify_listener": False, "timeout": 5},
        ready_table(), {"/generate": (200, GOOD)})
    assert kind is Fail and result["verdict"] == "mismatch"
    assert "expected 1024 (--speculative-dflash-draft-window-size 2048 in sglang.service), observed 2048" in result["msg"]


def test_ready_suppressed_fallback_warns(patched):
    table = ready_table({
        tuple(JBASE + ["-n", "2000"]): (0, entries("Load weight begin."), ""),
        tuple(JBASE + ["--after-cursor=c0", "-n", "2000"]): (0, "", ""),
        GREP: (1, "", ""),
        ("journalctl", "MESSAGE_ID=" + JOURNAL_DROPPED_MESSAGE_ID, "-o", "json", "--all", "--no-pager", "-q",
         "--since", "Sun 2026-11-29 10:00:00 UTC"): (0, json.dumps({
             "MESSAGE": "Suppressed 999 messages from sglang.service", "N_DROPPED": "999",
             "OBJECT_SYSTEMD_UNIT": "sglang.service", "OBJECT_SYSTEMD_INVOCATION_ID": INV, "__CURSOR": "s"}) + "\n", ""),
    })
    kind, result = run_module(sglang_ready, {
        "after_invocation": OLD, "expect": {"draft_window_size": 2048}, "verify_listener": False, "timeout": 5},
        table, {"/generate": (200, GOOD), "/server_info": (200, {"speculative_dflash_draft_window_size": 2048})})
    assert kind is Exit, result["msg"]
    assert result["source"] == "server_info" and result["suppression"]["messages_dropped"] == 999
    assert any("Suppressed 999" in w for w in result.get("warnings", [])) or result["notes"]


def test_ready_check_mode_with_after_invocation_skips(patched):
    kind, result = run_module(sglang_ready, {"after_invocation": OLD, "_ansible_check_mode": True}, Table({}), {})
    assert kind is Exit and result["skipped"] and result["verdict"] == "check_mode" and result["changed"] is False


def test_ready_rejects_bad_timeout(patched):
    kind, result = run_module(sglang_ready, {"timeout": 0}, Table({}), {})
    assert kind is Fail and "timeout must be greater than 0" in result["msg"]


def test_ready_api_key_is_not_logged():
    with mock.patch.multiple(basic.AnsibleModule, exit_json=exit_json, fail_json=fail_json):
        with patch_module_args({"api_key": "sekret", "timeout": 0}):
            with pytest.raises(Fail) as info:
                sglang_ready.main()
    assert "sekret" not in repr(info.value.args[0])
