# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sglang_ready module: arguments, check mode, verdicts as results, receipts and secrets."""
import json

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import EffectiveUnit
from ansible_collections.gpufleet.inference.plugins.modules import sglang_ready

from fakes import (COMMAND, CONFIG_2048, EXPECT_2048, NEW, OLD, STARTUP, FakeHost, ModuleExit, entry,
                   module_with_args, record_warnings, restarted_host, timed, unit_state)

KEY = "sekret-api-key-42"


def ready(monkeypatch, host, check_mode=False, **args):
    args.setdefault("after_invocation", OLD)
    args.setdefault("expect", EXPECT_2048)
    args.setdefault("command", COMMAND)
    args.setdefault("min_ready_seconds", 0)
    args.setdefault("slice_seconds", 0)
    args.setdefault("timeout", 120)
    module = module_with_args(monkeypatch, sglang_ready.ARGUMENT_SPEC, args, check_mode=check_mode)
    with pytest.raises(ModuleExit) as caught:
        sglang_ready.run(module, host)
    return caught.value.result, caught.value.failed, module


def test_pass_writes_a_receipt_and_is_changed(monkeypatch):
    host = restarted_host()
    result, failed, module = ready(monkeypatch, host)
    assert not failed, result["msg"]
    assert result["verdict"] == "pass" and result["verified"] is True and result["changed"] is True
    assert result["receipt"] == host.receipt_path and host.written[-1]["invocation_id"] == NEW
    assert result["invocation_id"] == NEW and result["source"] == "journal"
    assert result["expected"] == {"draft_window_size": 2048, "compact_cache": True, "block_size": 16}
    assert result["config_line"] == CONFIG_2048 and result["config_line_mode"] == "required"
    assert set(result["phases"]) == {"new_invocation", "config_line", "port_open", "generate"}
    assert "state" not in result
    json.dumps(result)  # a plain result


def test_no_receipt_means_not_changed(monkeypatch):
    host = restarted_host()
    result, failed, module = ready(monkeypatch, host, write_receipt=False)
    assert result["verdict"] == "pass" and result["changed"] is False and result["receipt"] is None
    assert host.written == []


def test_a_receipt_that_cannot_be_written_is_a_note_not_a_change(monkeypatch):
    host = restarted_host()

    def broken(receipt):
        raise OSError(30, "Read-only file system")
    host.write_receipt = broken
    result, failed, module = ready(monkeypatch, host)
    assert not failed and result["changed"] is False and result["receipt"] is None
    assert any("could not write the verification receipt" in note and "Read-only" in note for note in result["notes"])


# --------------------------------------------------------------------------- check mode

def test_check_mode_with_after_invocation_returns_at_once(monkeypatch):
    host = restarted_host()
    result, failed, module = ready(monkeypatch, host, check_mode=True)
    assert not failed
    assert result["verdict"] == "check_mode" and result["skipped"] is True and result["changed"] is False
    assert result["verified"] is False and "nothing was restarted" in result["msg"]
    assert host.calls == [] and host.now == 0.0  # the host was not even looked at


def test_check_mode_verifies_the_running_invocation_but_writes_no_receipt(monkeypatch):
    host = FakeHost(states=[(0.0, unit_state(NEW))], journal={NEW: timed(0.0, STARTUP, 0.1)}, cmdline=COMMAND)
    host.now = 10.0
    result, failed, module = ready(monkeypatch, host, check_mode=True, after_invocation=None)
    assert not failed, result["msg"]
    assert result["verdict"] == "pass" and result["changed"] is False and result["receipt"] is None
    assert host.written == []
    # the same run outside check mode does write one
    host2 = FakeHost(states=[(0.0, unit_state(NEW))], journal={NEW: timed(0.0, STARTUP, 0.1)}, cmdline=COMMAND)
    host2.now = 10.0
    result, failed, module = ready(monkeypatch, host2, after_invocation=None)
    assert result["changed"] is True and len(host2.written) == 1


# --------------------------------------------------------------------------- failures

def test_mismatch_fails_with_the_verdict_and_the_flag(monkeypatch):
    host = restarted_host(lines=STARTUP[:6] + [CONFIG_2048.replace("2048", "512")] + STARTUP[7:])
    result, failed, module = ready(monkeypatch, host)
    assert failed and result["failed"] is True and result["verdict"] == "mismatch"
    assert "draft_window_size: expected 2048 (--speculative-dflash-draft-window-size 2048 in sglang.service), " \
           "observed 512" in result["msg"]
    assert result["changed"] is False and host.written == []


def test_unverified_fails_and_accept_unverified_warns(monkeypatch):
    lines = [line for line in STARTUP if "draft runner" not in line]
    notices = [{"count": 10, "message": "Suppressed 10 messages from sglang.service", "invocation_id": NEW}]
    result, failed, module = ready(monkeypatch, restarted_host(lines=lines, notices=notices))
    assert failed and result["verdict"] == "unverified" and result["verified"] is False
    warnings = record_warnings(monkeypatch)
    host = restarted_host(lines=lines, notices=notices)
    result, failed, module = ready(monkeypatch, host, accept_unverified=True)
    assert not failed and result["verdict"] == "pass" and result["verified"] is False
    assert result["changed"] is False and host.written == []  # never a receipt without evidence
    assert warnings == [result["msg"]] and "UNVERIFIED" in warnings[0]


def test_a_died_invocation_fails_with_its_tail_masked(monkeypatch):
    lines = ["[2026-11-29 10:00:00] server_args=ServerArgs(model_path='/m', api_key='%s')" % KEY,
             "RuntimeError: CUDA error"]
    states = [(0.0, unit_state(OLD)), (1.0, unit_state(NEW, "activating", "start")),
              (3.0, unit_state(NEW, "failed", "failed", pid=0, result="exit-code", code="1", status="1"))]
    host = FakeHost(states=states, journal={NEW: timed(2.0, lines, 0.2)}, port=[], cmdline=COMMAND)
    result, failed, module = ready(monkeypatch, host, api_key=KEY)
    assert failed and result["verdict"] == "died"
    assert "code=exited, status=1/FAILURE" in result["msg"] and "Cause: RuntimeError: CUDA error" in result["msg"]
    assert result["journal_tail"][-1] == "RuntimeError: CUDA error"
    assert KEY not in json.dumps(result)
    assert KEY in module.no_log_values  # and Ansible masks it in anything else the module says


# --------------------------------------------------------------------------- slices

def test_a_slice_returns_waiting_with_its_state(monkeypatch):
    host = restarted_host(port_at=30.0)
    result, failed, module = ready(monkeypatch, host, slice_seconds=2, api_key=KEY)
    assert not failed and result["verdict"] == "waiting" and result["changed"] is False
    state = json.loads(json.dumps(result["state"]))
    assert state["tracker"]["after"] == OLD and KEY not in json.dumps(state)
    # the next slice goes on from it
    result, failed, module = ready(monkeypatch, host, slice_seconds=0, resume=state)
    assert result["verdict"] == "pass" and result["invocation_id"] == NEW


# --------------------------------------------------------------------------- arguments

@pytest.mark.parametrize("args,message", [
    ({"timeout": 0}, "timeout must be greater than 0, got 0.0"),
    ({"timeout": -5}, "timeout must be greater than 0, got -5.0"),
    ({"poll_interval": 0}, "poll_interval must be greater than 0, got 0.0"),
    ({"request_timeout": 0}, "request_timeout must be greater than 0, got 0.0"),
    ({"min_ready_seconds": -1}, "min_ready_seconds must be 0 or more, got -1.0"),
    ({"journal_grace": -0.5}, "journal_grace must be 0 or more, got -0.5"),
    ({"slice_seconds": -1}, "slice_seconds must be 0 or more, got -1.0"),
    ({"crash_loop_restarts": -1}, "crash_loop_restarts must be 0 or more, got -1"),
])
def test_invalid_numbers_fail_before_anything_is_read(monkeypatch, args, message):
    host = restarted_host()
    result, failed, module = ready(monkeypatch, host, api_key=KEY, **args)
    assert failed and result["msg"] == message
    assert host.calls == []


def test_invalid_numbers_fail_in_check_mode_too(monkeypatch):
    result, failed, module = ready(monkeypatch, restarted_host(), check_mode=True, timeout=0)
    assert failed and result["msg"] == "timeout must be greater than 0, got 0.0"


@pytest.mark.parametrize("args,message", [
    ({"config_line": "sometimes"}, "value of config_line must be one of: required, absent, optional, got: sometimes"),
    ({"expect": "draft_window_size"}, "expect"),
    ({"bogus": 1}, "Unsupported parameters"),
])
def test_ansible_argument_validation(monkeypatch, args, message):
    with pytest.raises(ModuleExit) as caught:
        module_with_args(monkeypatch, sglang_ready.ARGUMENT_SPEC, dict(args, api_key=KEY))
    assert caught.value.failed and message in caught.value.result["msg"]
    assert KEY not in json.dumps(caught.value.result)


def test_defaults(monkeypatch):
    module = module_with_args(monkeypatch, sglang_ready.ARGUMENT_SPEC, {})
    params = module.params
    assert (params["unit"], params["url"], params["timeout"], params["min_ready_seconds"]) == (
        "sglang.service", "http://127.0.0.1:30000", 900, 10)
    assert params["slice_seconds"] == 30 and params["write_receipt"] is True and params["accept_unverified"] is False
    assert params["receipt_dir"] == "/var/lib/gpufleet-inference/receipts"
    waiter = sglang_ready.build_waiter(module, FakeHost(states=[(0.0, unit_state(NEW))]))
    assert waiter.state.tracker.after is None and waiter.intent.mode == "optional"  # verifies the running one
    assert waiter.intent.follower is False  # a server, proven over HTTP
    assert waiter.policy.write_receipt is True and waiter.policy.journal_grace == 35


def test_build_waiter_maps_every_parameter(monkeypatch):
    module = module_with_args(monkeypatch, sglang_ready.ARGUMENT_SPEC, {
        "after_invocation": OLD, "expect": {"draft_window_size": "2048"}, "config_line": "optional",
        "command": COMMAND, "environment": {"A": 1}, "timeout": 30, "min_ready_seconds": 2, "poll_interval": 0.5,
        "request_timeout": 7, "crash_loop_restarts": 2, "journal_grace": 9, "accept_unverified": True,
        "write_receipt": True, "follower": True}, check_mode=True)
    waiter = sglang_ready.build_waiter(module, FakeHost(states=[(0.0, unit_state(NEW))]))
    assert waiter.state.tracker.after == OLD and waiter.policy.crash_loop_restarts == 2
    assert waiter.intent.expect == {"draft_window_size": 2048} and waiter.intent.mode == "optional"
    assert waiter.intent.command == COMMAND and waiter.intent.environment == {"A": "1"}
    assert waiter.intent.follower is True
    policy = waiter.policy
    assert (policy.timeout, policy.min_ready_seconds, policy.tick, policy.request_timeout, policy.journal_grace) == (
        30, 2, 0.5, 7, 9)
    assert policy.accept_unverified is True
    assert policy.write_receipt is False  # check mode never writes


def test_main_builds_the_module(monkeypatch):
    from ansible.module_utils.testing import patch_module_args
    from fakes import patch_module_exits
    patch_module_exits(monkeypatch)
    with patch_module_args({"timeout": 0, "api_key": KEY}):
        with pytest.raises(ModuleExit) as caught:
            sglang_ready.main()
    assert caught.value.failed and caught.value.result["msg"] == "timeout must be greater than 0, got 0.0"
    assert KEY not in repr(caught.value.result)


def test_systemds_messages_do_not_reach_the_result_as_lines(monkeypatch):
    journal = {NEW: timed(2.0, STARTUP[:-2], 0.2) + [(3.9, entry("Started sglang.service.", systemd=True))]
               + timed(4.0, STARTUP[-2:], 0.1)}
    result, failed, module = ready(monkeypatch, restarted_host(journal=journal))
    assert result["verdict"] == "pass"
    assert "Started sglang.service." not in json.dumps(result)


def test_environment_numbers_from_yaml_compare_as_text(monkeypatch):
    def host():
        return restarted_host(environ={"OMP_NUM_THREADS": "8"},
                              effective=EffectiveUnit({"Environment": "OMP_NUM_THREADS=8"}))
    as_text = ready(monkeypatch, host(), environment={"OMP_NUM_THREADS": "8"})[0]
    assert as_text["verdict"] == "pass"  # the same as text passes
    result, failed, module = ready(monkeypatch, host(), environment={"OMP_NUM_THREADS": 8})
    assert result["verdict"] == "pass", result["msg"]
