# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift check: installed files, what systemd would run, what runs, its evidence, /server_info."""
import grp
import json
import os
import pwd

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _drift as drift
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import JournalError
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import EffectiveUnit, SystemdError
from ansible_collections.gpufleet.inference.plugins.module_utils._evidence import Intent

from fakes import (COMMAND, CONFIG_2048, CONFIG_NONE, CONFIG_512, EXPECT_2048, GOOD, NEW, OLD, STARTING, STARTUP, WALL0, FakeHost,
                   timed, unit_state)

UNIT_TEXT = "[Unit]\nDescription=SGLang\n\n[Service]\nExecStart=/opt/sglang/venv/bin/python -m x\nUser=sglang\n"
SECRET_TEXT = 'api_key: "sup3r-s3cret-value"\n'
DROP_IN = "/etc/systemd/system/sglang.service.d/override.conf"
BEFORE_START = WALL0 - 3600  # files written an hour before the process started
ME, MY_GROUP = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name


def exec_start(argv):
    return "{ path=%s ; argv[]=%s ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; " \
           "status=0/0 }" % (argv[0], " ".join(argv))


def effective(argv=COMMAND, drop_ins="", reload="no", environment=""):
    return EffectiveUnit({"FragmentPath": "/etc/systemd/system/sglang.service", "DropInPaths": drop_ins,
                          "NeedDaemonReload": reload, "ExecStart": exec_start(argv), "Environment": environment})


def installed(tmp_path, name, content, mode=0o644, mtime=BEFORE_START):
    path = tmp_path / name
    path.write_text(content)
    os.chmod(str(path), mode)
    os.utime(str(path), (mtime, mtime))
    return str(path)


def host_of(journal_lines=STARTUP, state=None, **kwargs):
    kwargs.setdefault("cmdline", COMMAND)
    kwargs.setdefault("effective", effective())
    kwargs.setdefault("generate", [(0.0, GOOD)])
    host = FakeHost(states=[(0.0, state or unit_state(NEW))],
                    journal={NEW: timed(0.0, journal_lines, 0.1)} if journal_lines is not None else {}, **kwargs)
    host.now = 100.0  # a process up for a while: its startup is in the journal, found by a search
    return host


def check(host, expect=None, mode=None, command=COMMAND, environment=None, files=None, server_info=None, probe=True,
          last_good_dir=None):
    intent = Intent(EXPECT_2048 if expect is None else expect, mode, command, environment)
    return drift.DriftCheck(host, intent, files or [], server_info, probe, 5.0, last_good_dir).run()


def keys(result):
    return [(item["what"], item["key"]) for item in result["differences"]]


# --------------------------------------------------------------------------- in sync

def test_in_sync(tmp_path):
    unit = installed(tmp_path, "sglang.service", UNIT_TEXT)
    secret = installed(tmp_path, "sglang.yaml", SECRET_TEXT, mode=0o640)
    host = host_of()
    result = check(host, files=[{"path": unit, "content": UNIT_TEXT, "mode": "0644", "owner": ME, "group": MY_GROUP},
                                {"path": secret, "content": SECRET_TEXT, "mode": "0640", "secret": True}])
    assert result["verdict"] == drift.IN_SYNC and result["in_sync"], result["differences"]
    assert result["differences"] == [] and result["blocking"] == [] and result["unit_diff"] == []
    assert result["restart_pending"] is False and result["restart_reasons"] == []
    assert (result["invocation_id"], result["main_pid"], result["active_state"]) == (NEW, 4242, "active")
    assert result["source"] == "journal" and result["receipt"] is False
    assert result["observed"]["draft_window_size"] == 2048 and result["config_lines"] == [CONFIG_2048]
    assert result["config_line"] == CONFIG_2048
    assert result["serving"] is True and result["generate"]["text"] == GOOD.json()["text"]
    assert result["command"] == COMMAND and result["effective"]["exec_start"] == COMMAND
    assert result["last_good"] == {"exists": False}
    assert "sup3r-s3cret-value" not in json.dumps(result)
    assert host.written == []  # read-only: never a receipt


# --------------------------------------------------------------------------- files

def test_unit_file_differs_gives_a_unified_diff(tmp_path):
    unit = installed(tmp_path, "sglang.service", UNIT_TEXT.replace("User=sglang", "User=root"))
    result = check(host_of(), files=[{"path": unit, "content": UNIT_TEXT}])
    assert result["verdict"] == drift.DRIFTED and not result["in_sync"]
    assert result["unit_diff"][:2] == ["--- %s (installed)" % unit, "+++ %s (intended)" % unit]
    assert "-User=root" in result["unit_diff"] and "+User=sglang" in result["unit_diff"]
    assert result["differences"] == [{"what": "file", "key": unit, "expected": "as rendered by the role",
                                      "observed": "-User=root; +User=sglang"}]
    # the role will install and restart: nothing is pending on the host itself
    assert result["restart_pending"] is False


def test_secret_file_differs_never_shows_its_content(tmp_path):
    secret = installed(tmp_path, "sglang.yaml", 'api_key: "old-s3cret-value"\n', mode=0o600)
    result = check(host_of(), files=[{"path": secret, "content": SECRET_TEXT, "mode": "0600", "secret": True}])
    assert result["verdict"] == drift.DRIFTED
    assert result["differences"] == [{"what": "file", "key": secret, "expected": "as rendered by the role",
                                      "observed": "differs (content not shown)"}]
    assert result["unit_diff"] == []
    text = json.dumps(result)
    assert "s3cret" not in text and "api_key" not in text


def test_mode_owner_and_group_differences(tmp_path):
    unit = installed(tmp_path, "sglang.service", UNIT_TEXT, mode=0o600)
    result = check(host_of(), files=[{"path": unit, "content": UNIT_TEXT, "mode": "0644", "owner": "no-such-owner",
                                      "group": "no-such-group"}])
    assert result["differences"] == [
        {"what": "file mode", "key": unit, "expected": "0644", "observed": "0600"},
        {"what": "file owner", "key": unit, "expected": "no-such-owner", "observed": ME},
        {"what": "file group", "key": unit, "expected": "no-such-group", "observed": MY_GROUP}]
    assert result["verdict"] == drift.DRIFTED


def test_missing_file(tmp_path):
    result = check(host_of(), files=[{"path": str(tmp_path / "nope.service"), "content": UNIT_TEXT}])
    assert result["differences"] == [{"what": "file", "key": str(tmp_path / "nope.service"),
                                      "expected": "installed", "observed": "missing"}]


def test_a_file_changed_after_the_process_started_is_a_pending_restart(tmp_path):
    unit = installed(tmp_path, "sglang.service", UNIT_TEXT, mtime=WALL0 + 60)
    result = check(host_of(), files=[{"path": unit, "content": UNIT_TEXT}])
    assert result["verdict"] == drift.IN_SYNC  # nothing differs in what runs ...
    assert result["restart_pending"] is True  # ... but the process predates its files
    assert result["restart_reasons"] == ["a file of the unit changed after its process started"]
    not_restarting = check(host_of(), files=[{"path": unit, "content": UNIT_TEXT, "restart_on_change": False}])
    assert not_restarting["restart_pending"] is False


@pytest.mark.parametrize("after_start, pending", [(0.2, True), (0.02, False), (-0.3, False)])
def test_a_file_written_around_the_start_is_judged_to_the_start_times_precision(tmp_path, after_start, pending):
    """Written 0.2 s after the process started: a pending restart. Written 20 ms after (within what a
    start time can be known to) or before it (a restart right after the write): not."""
    unit = installed(tmp_path, "sglang.service", UNIT_TEXT, mtime=WALL0 + after_start)
    result = check(host_of(), files=[{"path": unit, "content": UNIT_TEXT}])
    assert result["restart_pending"] is pending, result["restart_reasons"]


# --------------------------------------------------------------------------- what systemd would run

def test_a_drop_in_overriding_exec_start_blocks_and_is_named(tmp_path):
    unit = installed(tmp_path, "sglang.service", UNIT_TEXT)
    overridden = [arg if arg != "2048" else "512" for arg in COMMAND]
    host = host_of(effective=effective(overridden, drop_ins=DROP_IN), cmdline=overridden)
    result = check(host, files=[{"path": unit, "content": UNIT_TEXT}])
    assert result["verdict"] == drift.DRIFTED
    assert result["blocking"] == ["effective unit ExecStart --speculative-dflash-draft-window-size set by "
                                  "drop-in(s) %s" % DROP_IN]
    assert result["differences"][0] == {"what": "effective unit",
                                        "key": "ExecStart --speculative-dflash-draft-window-size",
                                        "expected": "2048", "observed": "512", "drop_ins": [DROP_IN]}
    assert ("command line", "--speculative-dflash-draft-window-size") in keys(result)
    assert result["drop_in_paths"] == [DROP_IN]


def test_need_daemon_reload_is_a_restart_reason_not_a_block(tmp_path):
    unit = installed(tmp_path, "sglang.service", UNIT_TEXT)
    stale = [arg if arg != "2048" else "512" for arg in COMMAND]
    host = host_of(effective=effective(stale, drop_ins=DROP_IN, reload="yes"))
    result = check(host, files=[{"path": unit, "content": UNIT_TEXT}])
    assert result["blocking"] == []
    assert "systemd has not reloaded the changed unit file (NeedDaemonReload=yes)" in result["restart_reasons"]
    assert result["restart_pending"] is True and result["verdict"] == drift.DRIFTED


def test_effective_environment_differences(tmp_path):
    host = host_of(effective=effective(environment='A=2 "B=x y"'), environ={"A": "1"})
    result = check(host, environment={"A": "1"})
    assert ("effective unit", "Environment A") in keys(result) and ("effective unit", "Environment B") in keys(result)
    assert ("process environment", "A") not in keys(result)
    assert result["blocking"] == []  # no drop-in: the role's own unit said so


def test_an_unreadable_effective_unit_is_a_note():
    host = host_of()

    def broken():
        raise SystemdError("systemctl show failed (rc=1): bus")
    host.effective = broken
    result = check(host)
    assert result["verdict"] == drift.IN_SYNC
    assert "could not read the effective unit: systemctl show failed (rc=1): bus" in result["notes"]
    assert "effective" not in result and result["drop_in_paths"] == []


# --------------------------------------------------------------------------- what runs

def test_process_runs_another_command_while_the_files_are_as_intended_is_restart_pending(tmp_path):
    # the play installed the unit and died before its restart handler ran (the lost-handler case)
    unit = installed(tmp_path, "sglang.service", UNIT_TEXT)
    old_command = [arg if arg != "2048" else "512" for arg in COMMAND]
    result = check(host_of(cmdline=old_command), files=[{"path": unit, "content": UNIT_TEXT}])
    assert result["verdict"] == drift.DRIFTED and result["restart_pending"] is True
    assert result["differences"] == [{"what": "command line", "key": "--speculative-dflash-draft-window-size",
                                      "expected": "2048", "observed": "512"}]
    assert result["restart_reasons"] == ["the running process (main PID 4242) does not run the installed unit: "
                                         "command line --speculative-dflash-draft-window-size"]


def test_command_line_secrets_are_masked_in_the_result():
    running = COMMAND + ["--api-key", "pl41n-k3y"]
    result = check(host_of(cmdline=running, effective=effective(running)), command=running)
    assert "pl41n-k3y" not in json.dumps(result)
    assert result["command"][-1] == "********" and result["verdict"] == drift.IN_SYNC


def test_main_process_gone():
    result = check(host_of(cmdline=None))
    assert {"what": "command line", "key": "main process 4242", "expected": "readable", "observed": "gone"} \
        in result["differences"]
    assert result["command"] is None


def test_process_environment_differences_only_for_intended_keys():
    host = host_of(environ={"A": "2", "SECRET_TOKEN": "zzz"})
    result = check(host, environment={"A": "1"})
    assert [item for item in result["differences"] if item["what"] == "process environment"] == [
        {"what": "process environment", "key": "A", "expected": "1", "observed": "2"}]
    assert "zzz" not in json.dumps(result)


def test_nothing_intended_about_the_command_reads_nothing():
    host = host_of(cmdline=lambda now: pytest.fail("the command line was read"))
    result = check(host, command=None)
    assert result["verdict"] == drift.IN_SYNC and "command" not in result


# --------------------------------------------------------------------------- evidence

def test_config_line_mismatch_through_the_one_comparator():
    lines = STARTUP[:6] + [CONFIG_512] + STARTUP[7:]
    result = check(host_of(lines))
    assert result["verdict"] == drift.DRIFTED
    assert result["differences"] == [{"what": "config line", "key": "draft_window_size", "expected": 2048,
                                      "observed": 512}]
    assert result["observed"]["draft_window_size"] == 512 and result["source"] == "journal"


def test_every_config_line_counts():
    lines = STARTUP[:7] + [CONFIG_512] + STARTUP[7:]
    result = check(host_of(lines))
    assert keys(result) == [("config line", "draft_window_size")]
    assert result["config_lines"] == [CONFIG_2048, CONFIG_512] and result["config_line"] == CONFIG_512


def test_absent_expectation_with_a_draft_line():
    result = check(host_of(), expect={}, mode="absent")
    assert result["verdict"] == drift.DRIFTED
    assert result["differences"] == [{"what": "config line", "key": "draft_runner",
                                      "expected": "no draft-runner line (speculative decoding off)",
                                      "observed": CONFIG_2048}]


def test_absent_expectation_met_by_a_complete_journal():
    lines = [line for line in STARTUP if "draft runner" not in line]
    result = check(host_of(lines), expect={}, mode="absent")
    assert result["verdict"] == drift.IN_SYNC and result["source"] == "journal"


def test_required_line_not_logged_in_a_complete_journal():
    lines = [line for line in STARTUP if "draft runner" not in line]
    result = check(host_of(lines))
    assert result["differences"] == [{"what": "config line", "key": "draft runner", "expected": "logged",
                                      "observed": "not logged (its journal is complete)"}]


def test_journal_lost_its_start_without_a_receipt_is_unverified_naming_retention():
    later = ['INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK']
    result = check(host_of(later), server_info={"speculative_dflash_draft_window_size": 2048})
    assert result["verdict"] == drift.UNVERIFIED and not result["in_sync"]
    assert result["source"] is None and result["observed"] is None
    assert "no longer holds the start of invocation %s" % NEW in result["unverified_reason"]
    assert "journal retention" in result["unverified_reason"]
    assert FakeHost.receipt_dir in result["unverified_reason"]


def test_journal_lost_to_the_rate_limit_is_unverified_naming_the_notice():
    lines = [line for line in STARTUP if "draft runner" not in line]
    notices = [{"count": 77, "message": "Suppressed 77 messages from sglang.service", "invocation_id": NEW}]
    result = check(host_of(lines, notices=notices))
    assert result["verdict"] == drift.UNVERIFIED
    assert "journald's rate limit dropped 77 messages" in result["unverified_reason"]


def test_suppression_lookup_failing_is_a_note():
    host = host_of(['INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK'])

    def broken(invocation_id, since):
        raise JournalError("journalctl failed")
    host.suppressed = broken
    result = check(host)
    assert result["verdict"] == drift.UNVERIFIED
    assert "could not look for journald suppression notices: journalctl failed" in result["notes"]


def test_a_difference_wins_over_unverified():
    later = ['INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK']
    result = check(host_of(later, cmdline=COMMAND[:-1] + ["512"]))
    assert result["verdict"] == drift.DRIFTED and result["unverified_reason"]


def test_grep_unsupported_is_a_note_and_unverified():
    result = check(host_of(grep=False))
    assert result["verdict"] == drift.UNVERIFIED
    assert "journalctl here cannot --grep; the journal of invocation %s was not searched" % NEW in result["notes"]


def test_optional_without_a_line_is_in_sync_without_a_source():
    lines = [line for line in STARTUP if "draft runner" not in line]
    result = check(host_of(lines[1:]), expect={}, mode="optional")
    assert result["verdict"] == drift.IN_SYNC and result["source"] is None


VALUES_2048 = {"block_size": 16, "draft_window_size": 2048, "compact_cache": True}
RECEIPT = {"version": 1, "unit": "sglang.service", "invocation_id": NEW, "verified_at": WALL0,
           "config_lines": [{"line": CONFIG_2048, "values": VALUES_2048}]}


def test_receipt_of_this_invocation_is_the_evidence():
    host = host_of(['INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK'], receipt=RECEIPT)
    result = check(host)
    assert result["verdict"] == drift.IN_SYNC and result["source"] == "receipt" and result["receipt"] is True
    assert result["config_lines"] == [CONFIG_2048] and result["observed"]["draft_window_size"] == 2048
    # the journal is still searched: a receipt stands in only for the lines the journal no longer has
    assert "grep:%s" % NEW in host.calls


def test_a_config_line_logged_after_the_receipt_is_judged_too():
    # verified at 2048 (the receipt); later the draft worker re-initialised without a window; the start
    # of the invocation has been rotated away since
    receipt = dict(RECEIPT, config_lines=[dict(RECEIPT["config_lines"][0], cursor="%s:0" % NEW)],
                   journal_cursor="%s:1" % NEW, config_line_mode="required")
    host = host_of(["[2026-11-29 10:00:00] old line", 'INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK',
                    CONFIG_NONE], receipt=receipt)
    result = check(host)
    assert "grep:%s after %s:1" % (NEW, NEW) in host.calls  # read on from where the verification stopped
    assert result["verdict"] == drift.DRIFTED and result["source"] == "receipt+journal"
    assert {(d["key"], d["expected"], d["observed"]) for d in result["differences"]} == {
        ("draft_window_size", 2048, None), ("compact_cache", True, False)}
    assert result["config_lines"] == [CONFIG_2048, CONFIG_NONE]


def test_receipt_with_other_values_or_no_line():
    other = dict(RECEIPT, config_lines=[{"line": CONFIG_512, "values": dict(VALUES_2048, draft_window_size=512)}])
    result = check(host_of(None, receipt=other))
    assert result["differences"] == [{"what": "config line", "key": "draft_window_size", "expected": 2048,
                                      "observed": 512}]
    # a receipt of a check that no draft-runner line was logged (mode absent)
    off_receipt = dict(RECEIPT, config_lines=[], config_line_mode="absent")
    empty = check(host_of(None, receipt=off_receipt))
    assert empty["differences"] == [{"what": "config line", "key": "draft runner", "expected": "logged",
                                     "observed": "none (its receipt records a verification that it logged none, "
                                                 "and its journal has none since)"}]
    assert empty["source"] == "receipt"
    off = check(host_of(None, receipt=off_receipt), expect={}, mode="absent")
    assert off["verdict"] == drift.IN_SYNC and off["source"] == "receipt"


def test_a_readiness_only_receipt_proves_nothing_about_the_config_line():
    # written by a check that compared nothing (mode optional, no line): not evidence that none was logged
    readiness = dict(RECEIPT, config_lines=[], config_line_mode="optional")
    result = check(host_of(['INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK'], receipt=readiness))
    assert result["verdict"] == drift.UNVERIFIED and result["receipt"] is False
    assert not result["differences"]


# --------------------------------------------------------------------------- serving and /server_info

def test_server_info_difference_is_drift_and_agreement_is_not_evidence():
    info = {"speculative_dflash_draft_window_size": 512, "tp_size": 8, "api_key": "srv-s3cret", "version": "0.5.11"}
    result = check(host_of(server_info=info), server_info={"speculative_dflash_draft_window_size": 2048, "tp_size": 8,
                                                           "speculative_eagle_topk": 4})
    assert result["differences"] == [{"what": "server_info", "key": "speculative_dflash_draft_window_size",
                                      "expected": 2048, "observed": 512}]  # a key it does not report is skipped
    assert result["server_info"]["version"] == "0.5.11"
    assert "srv-s3cret" not in json.dumps(result)


def test_server_info_not_answering_is_no_difference():
    result = check(host_of(), server_info={"tp_size": 8})
    assert result["verdict"] == drift.IN_SYNC and result["server_info"] is None


def test_not_serving_is_drift_and_probe_false_sends_nothing():
    host = host_of(generate=[(0.0, STARTING)])
    result = check(host)
    assert result["serving"] is False and result["generate"]["error"].startswith("HTTP 503")
    assert ("process", "/generate") in keys(result)
    quiet = host_of(generate=[(0.0, STARTING)])
    result = check(quiet, probe=False)
    assert "generate" not in quiet.calls and "serving" not in result and result["verdict"] == drift.IN_SYNC


# --------------------------------------------------------------------------- not running / installed

@pytest.mark.parametrize("state,text", [
    (unit_state(NEW, "failed", "failed", pid=0, result="exit-code", code="1", status="1"),
     "failed/failed (code=exited, status=1/FAILURE, Result exit-code)"),
    (unit_state(NEW, "activating", "start"), "activating/start (Result success)"),
    (unit_state(NEW, "activating", "auto-restart", result="signal", code="2", status="9"),
     "activating/auto-restart (code=killed, status=9/KILL, Result signal)"),
    (unit_state("", "inactive", "dead", pid=0), "inactive/dead (Result success)"),
])
def test_not_running(tmp_path, state, text):
    unit = installed(tmp_path, "sglang.service", UNIT_TEXT.replace("sglang", "x"))
    host = host_of(state=state)
    result = check(host, files=[{"path": unit, "content": UNIT_TEXT}])
    assert result["verdict"] == drift.NOT_RUNNING and not result["in_sync"]
    assert {"what": "process", "key": "active_state", "expected": "active", "observed": text} in result["differences"]
    assert ("file", unit) in keys(result)  # the file differences are still reported
    assert result["restart_pending"] is True and result["restart_reasons"][-1].startswith("the unit is ")
    assert "generate" not in host.calls


def test_not_installed():
    host = host_of(state=unit_state("", "inactive", "dead", load="not-found"))
    result = check(host)
    assert result["verdict"] == drift.NOT_INSTALLED and result["restart_pending"] is False
    assert result["differences"][-1] == {"what": "unit", "key": "sglang.service", "expected": "installed and active",
                                         "observed": "not installed"}
    assert "effective" not in host.calls


def test_unreadable_unit_state_is_drift_naming_the_error():
    host = host_of()

    def broken():
        raise SystemdError("Failed to connect to bus")
    host.state = broken
    result = check(host)
    assert result["verdict"] == drift.DRIFTED
    assert result["differences"] == [{"what": "unit", "key": "sglang.service", "expected": "readable",
                                      "observed": "Failed to connect to bus"}]


# --------------------------------------------------------------------------- last good

def test_last_good_summary(tmp_path):
    assert drift.last_good_summary(None, "sglang.service") == {"exists": False}
    assert drift.last_good_summary(str(tmp_path), "sglang.service") == {"exists": False}
    (tmp_path / "sglang.service").mkdir()
    (tmp_path / "sglang.service" / "record.json").write_text("{broken")
    assert drift.last_good_summary(str(tmp_path), "sglang.service") == {"exists": False}
    (tmp_path / "sglang.service" / "record.json").write_text(json.dumps(
        {"invocation_id": OLD, "saved_at": 1764410000.5, "adopted": True, "files": []}))
    assert drift.last_good_summary(str(tmp_path), "sglang.service") == {
        "exists": True, "invocation_id": OLD, "saved_at": 1764410000.5, "adopted": True}
    result = check(host_of(), last_good_dir=str(tmp_path))
    assert result["last_good"]["exists"] and result["last_good"]["invocation_id"] == OLD


def test_server_info_differences_only_for_reported_keys():
    assert drift.server_info_differences({"a": "2048", "b": 1}, {"a": 2048}) == []
    assert drift.server_info_differences({"a": None}, {"a": 0}) == [
        {"what": "server_info", "key": "a", "expected": None, "observed": 0}]
    assert drift.server_info_differences({"a": 1}, None) == []


def test_generate_is_sent_before_the_journal_is_searched():
    # journald writes a pending "Suppressed N messages" notice only when the unit logs again: the
    # probe's access-log line must come before the look for evidence, or a flood reads as "cannot tell yet".
    host = host_of()
    check(host)
    calls = [call for call in host.calls if call == "generate" or call.startswith("grep:")]
    assert calls[0] == "generate", host.calls
