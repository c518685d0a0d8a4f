# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sglang_info module: read-only facts of the current invocation."""
import json

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._journal import JournalError
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import EffectiveUnit, SystemdError
from ansible_collections.gpufleet.inference.plugins.modules import sglang_info

from fakes import (COMMAND, CONFIG_2048, CONFIG_512, NEW, OLD, STARTUP, FakeHost, ModuleExit, module_with_args,
                   record_warnings, timed, unit_state)

KEY = "info-s3cret"
INFO = {"version": "0.5.11", "status": "Up", "tp_size": 8, "speculative_dflash_draft_window_size": 2048,
        "internal_states": [{"avg_spec_accept_length": 3.1}], "api_key": KEY, "mem_fraction_static": 0.8}


def exec_start(argv):
    return "{ path=%s ; argv[]=%s ; ignore_errors=no ; pid=0 ; code=(null) ; status=0/0 }" % (argv[0], " ".join(argv))


def host_of(lines=STARTUP, state=None, **kwargs):
    kwargs.setdefault("effective", EffectiveUnit({"ExecStart": exec_start(COMMAND)}))
    host = FakeHost(states=[(0.0, state or unit_state(NEW))], journal={NEW: timed(0.0, lines, 0.1)}, **kwargs)
    host.now = 100.0
    return host


def info(monkeypatch, host, check_mode=False, **args):
    module = module_with_args(monkeypatch, sglang_info.ARGUMENT_SPEC, args, check_mode=check_mode)
    with pytest.raises(ModuleExit) as caught:
        sglang_info.run(module, host)
    return caught.value.result, caught.value.failed


def test_current_invocation_from_its_journal(monkeypatch):
    host = host_of(lines=[STARTUP[0], CONFIG_2048.replace("TP0", "TP3").replace("2048", "7")] + STARTUP[1:],
                   server_info=INFO)
    result, failed = info(monkeypatch, host, api_key=KEY)
    assert not failed and result["changed"] is False
    assert result["exists"] and result["invocation_id"] == NEW and result["main_pid"] == 4242
    assert (result["active_state"], result["sub_state"], result["n_restarts"]) == ("active", "running", 0)
    assert result["control_group"] == "/system.slice/sglang.service"
    assert result["exec_start"] == COMMAND
    assert result["config"]["draft_window_size"] == 2048 and result["config_line"] == CONFIG_2048
    assert result["config_source"] == "journal"
    assert result["server_info"] == {"version": "0.5.11", "status": "Up", "tp_size": 8,
                                     "speculative_dflash_draft_window_size": 2048,
                                     "internal_states": [{"avg_spec_accept_length": 3.1}]}
    assert "server_info_error" not in result
    assert KEY not in json.dumps(result)
    assert host.calls.count("grep:%s" % NEW) == 1 and host.written == []


def test_the_last_of_several_config_lines_is_reported(monkeypatch):
    lines = STARTUP[:7] + [CONFIG_512] + STARTUP[7:]
    result, failed = info(monkeypatch, host_of(lines=lines), probe_server=False)
    assert result["config"]["draft_window_size"] == 512 and result["config_line"] == CONFIG_512


def test_the_receipt_of_this_invocation_when_the_journal_lost_the_start(monkeypatch):
    receipt = {"version": 1, "unit": "sglang.service", "invocation_id": NEW, "config_lines": [
        {"line": CONFIG_2048 + " api_key='%s'" % KEY, "values": {"draft_window_size": 2048}}]}
    host = host_of(lines=['INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK'], receipt=receipt)
    result, failed = info(monkeypatch, host, probe_server=False)
    assert result["config_source"] == "receipt" and result["config"] == {"draft_window_size": 2048}
    assert KEY not in result["config_line"] and result["config_line"].startswith(CONFIG_2048)
    assert "grep:%s" % NEW in host.calls  # a receipt never hides a later line: the journal is searched too


def test_a_receipt_of_another_invocation_is_not_used(monkeypatch):
    receipt = {"version": 1, "unit": "sglang.service", "invocation_id": OLD, "config_lines": [
        {"line": CONFIG_512, "values": {"draft_window_size": 512}}]}
    host = host_of(lines=['INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK'], receipt=receipt)
    result, failed = info(monkeypatch, host, probe_server=False)
    assert result["config"] is None and result["config_source"] is None and result["config_line"] is None


def test_missing_unit_is_not_a_failure(monkeypatch):
    host = host_of(state=unit_state("", "inactive", "dead", pid=0, load="not-found"))
    result, failed = info(monkeypatch, host)
    assert not failed and result["exists"] is False and result["invocation_id"] is None
    assert result["config"] is None and result["exec_start"] == [] and result["server_info"] is None
    assert host.calls == ["state"]  # nothing else asked about a unit that does not exist


def test_a_unit_that_never_ran_has_no_journal_to_search(monkeypatch):
    host = host_of(state=unit_state("", "inactive", "dead", pid=0))
    result, failed = info(monkeypatch, host, probe_server=False)
    assert result["exists"] and result["invocation_id"] is None and result["config"] is None
    assert not any(call.startswith("grep") for call in host.calls)


def test_unreachable_server_is_null_with_the_reason(monkeypatch):
    result, failed = info(monkeypatch, host_of())
    assert result["server_info"] is None and result["server_info_error"] == "connection refused"


def test_probe_server_false_asks_nothing(monkeypatch):
    host = host_of(server_info=INFO)
    host.server_info = lambda timeout: pytest.fail("/server_info was asked")
    result, failed = info(monkeypatch, host, probe_server=False)
    assert result["server_info"] is None and "server_info_error" not in result


def test_systemd_error_fails_naming_the_unit(monkeypatch):
    host = host_of()

    def broken():
        raise SystemdError("Failed to connect to bus")
    host.state = broken
    result, failed = info(monkeypatch, host)
    assert failed and result["msg"] == "could not read the state of sglang.service: Failed to connect to bus"


def test_unreadable_exec_start_and_journal_are_warnings(monkeypatch):
    warnings = record_warnings(monkeypatch)
    host = host_of(grep=False)

    def broken():
        raise SystemdError("timeout")
    host.effective = broken
    result, failed = info(monkeypatch, host, probe_server=False)
    assert not failed and result["exec_start"] == [] and result["config"] is None
    assert warnings == ["could not read ExecStart of sglang.service: timeout",
                        "journalctl here cannot --grep; the journal of invocation %s was not searched" % NEW]


def test_a_journal_error_is_a_warning(monkeypatch):
    warnings = record_warnings(monkeypatch)
    host = host_of()

    def broken(invocation_id, after_cursor=None):
        raise JournalError("Permission denied")
    host.grep = broken
    result, failed = info(monkeypatch, host, probe_server=False)
    assert not failed and result["config"] is None
    assert warnings == ["could not search the journal of invocation %s: Permission denied" % NEW]


def test_check_mode_reads_the_same(monkeypatch):
    result, failed = info(monkeypatch, host_of(), check_mode=True, probe_server=False)
    assert not failed and result["config_source"] == "journal" and result["changed"] is False


def test_defaults(monkeypatch):
    params = module_with_args(monkeypatch, sglang_info.ARGUMENT_SPEC, {}).params
    assert (params["unit"], params["url"], params["probe_server"], params["timeout"]) == (
        "sglang.service", "http://127.0.0.1:30000", True, 10)


def test_exec_start_never_carries_a_command_line_secret(monkeypatch):
    host = host_of(effective=EffectiveUnit({"ExecStart": exec_start(COMMAND + ["--api-key", "dropin-s3cret"])}))
    result, failed = info(monkeypatch, host, probe_server=False)
    assert "dropin-s3cret" not in json.dumps(result)
