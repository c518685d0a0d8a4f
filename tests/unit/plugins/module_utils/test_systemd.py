# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""systemctl show: unit state, how its process ended, and what systemd would run (drop-ins included)."""
import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _systemd as sd

SHOW = """Id=sglang.service
LoadState=loaded
InvocationID=0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d
ActiveState=active
SubState=running
MainPID=4242
NRestarts=2
ControlGroup=/system.slice/sglang.service
ExecMainStartTimestamp=Sun 2026-11-29 10:00:00 UTC
ExecMainStartTimestampMonotonic=123456789
Result=success
UnitFileState=enabled
ExecMainCode=0
ExecMainStatus=0
"""
EXEC = ("{ path=/opt/sglang/venv/bin/python ; argv[]=/opt/sglang/venv/bin/python -m sglang.launch_server "
        "--speculative-dflash-draft-window-size 2048 --speculative-num-draft-tokens=16 ; ignore_errors=no ; "
        "start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }")
EFFECTIVE = """FragmentPath=/etc/systemd/system/sglang.service
DropInPaths=/etc/systemd/system/sglang.service.d/10-a.conf /run/systemd/system/sglang.service.d/override.conf
NeedDaemonReload=yes
ExecStart=%s
Environment=A=1 "B=two words" C=x=y "D=say \\"hi\\"" A=2
EnvironmentFiles=/etc/sglang/a.env (ignore_errors=no)
EnvironmentFiles=/etc/sglang/b.env (ignore_errors=yes)
""" % EXEC


# --------------------------------------------------------------------------- parse_show

def test_parse_show_first_equals_splits_and_repeated_keys_are_kept():
    props = sd.parse_show("A=1\nB=x=y\nEnvironmentFiles=/a (ignore_errors=no)\nEnvironmentFiles=/b (ignore_errors=no)\n"
                          "no equals sign here\nEmpty=\n")
    assert props == {"A": "1", "B": "x=y", "EnvironmentFiles": "/a (ignore_errors=no)\n/b (ignore_errors=no)",
                     "Empty": ""}
    assert sd.parse_show("") == {} and sd.parse_show(None) == {}


def test_show_argv_names_every_property():
    argv = sd.show_argv("sglang.service", ("A", "B"), "/usr/bin/systemctl")
    assert argv == ["/usr/bin/systemctl", "show", "sglang.service", "--no-pager", "-p", "A,B"]


# --------------------------------------------------------------------------- UnitState

def test_state_through_systemctl(run_table):
    run_table.add(sd.show_argv("sglang.service", sd.STATE_PROPERTIES), out=SHOW)
    state = sd.Systemd(run_table, "sglang.service").state()
    assert state.exists and state.running and not state.crashed
    assert (state.invocation_id, state.main_pid, state.n_restarts) == ("0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d", 4242, 2)
    assert state.control_group == "/system.slice/sglang.service"
    assert state.start_monotonic_usec == 123456789 and state.unit_file_state == "enabled"
    assert state.exit is None  # ExecMainCode=0: the main process has not ended
    assert run_table.calls == [sd.show_argv("sglang.service", sd.STATE_PROPERTIES)]
    assert state.as_dict() == {"invocation_id": "0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d", "active_state": "active",
                               "sub_state": "running", "main_pid": 4242, "n_restarts": 2,
                               "control_group": "/system.slice/sglang.service", "result": "success", "exit": None}


@pytest.mark.parametrize("active,sub,running,crashed", [
    ("active", "running", True, False),
    ("reloading", "reload", True, False),
    ("activating", "start", True, False),
    ("failed", "failed", False, True),
    ("inactive", "dead", False, True),
    ("activating", "auto-restart", False, True),
    ("activating", "auto-restart-queued", False, True),
    ("deactivating", "stop-sigterm", False, False),
])
def test_crashed_and_running(active, sub, running, crashed):
    state = sd.UnitState({"LoadState": "loaded", "ActiveState": active, "SubState": sub})
    assert (state.running, state.crashed) == (running, crashed)


def test_missing_fields_have_safe_defaults():
    state = sd.UnitState({"LoadState": "not-found", "MainPID": "", "NRestarts": "[not set]"})
    assert not state.exists
    assert (state.main_pid, state.n_restarts, state.invocation_id, state.control_group) == (0, 0, "", "")
    assert state.as_dict()["invocation_id"] is None and state.as_dict()["control_group"] is None
    assert not sd.UnitState({}).exists  # no LoadState at all: not a unit systemd knows


def test_how_it_ended_and_describe():
    killed = sd.UnitState({"LoadState": "loaded", "ActiveState": "failed", "SubState": "failed", "Result": "signal",
                           "ExecMainCode": "2", "ExecMainStatus": "9", "InvocationID": "abc", "MainPID": "0"})
    assert killed.exit == "code=killed, status=9/KILL"
    assert killed.how_it_ended() == "code=killed, status=9/KILL, Result signal"
    assert killed.describe() == "failed/failed (InvocationID abc, MainPID 0, NRestarts 0, Result signal)"
    running = sd.UnitState({"LoadState": "loaded"})
    assert running.how_it_ended() == "Result ?"  # nothing known: still says so
    assert running.describe() == "?/? (InvocationID none, MainPID 0, NRestarts 0, Result ?)"


@pytest.mark.parametrize("code,status,text", [
    ("1", "0", "code=exited, status=0/SUCCESS"),
    ("1", "1", "code=exited, status=1/FAILURE"),
    ("1", "2", "code=exited, status=2/INVALIDARGUMENT"),
    ("1", "7", "code=exited, status=7/NOTRUNNING"),
    ("1", "137", "code=exited, status=137"),  # no name for it: number only
    ("2", "9", "code=killed, status=9/KILL"),
    ("2", "15", "code=killed, status=15/TERM"),
    ("3", "11", "code=dumped, status=11/SEGV"),
    ("3", "6", "code=dumped, status=6/ABRT"),
    ("2", "999", "code=killed, status=999"),  # not a signal number
    ("0", "0", None),
    ("", "", None),
    (None, None, None),
])
def test_describe_exit(code, status, text):
    assert sd.describe_exit(code, status) == text


def test_systemctl_failure_raises_with_its_error(run_table):
    run_table.add(sd.show_argv("x.service", sd.STATE_PROPERTIES), rc=1, err="Failed to connect to bus\n")
    with pytest.raises(sd.SystemdError, match=r"systemctl show x.service .* failed \(rc=1\): Failed to connect to bus"):
        sd.Systemd(run_table, "x.service").state()
    run_table.add(sd.show_argv("y.service", sd.STATE_PROPERTIES), rc=3, out="only stdout")
    with pytest.raises(sd.SystemdError, match="only stdout"):
        sd.Systemd(run_table, "y.service").state()


# --------------------------------------------------------------------------- EffectiveUnit

def test_effective_unit_with_drop_ins_environment_and_files(run_table):
    run_table.add(sd.show_argv("sglang.service", sd.EFFECTIVE_PROPERTIES, "/bin/systemctl"), out=EFFECTIVE)
    effective = sd.Systemd(run_table, "sglang.service", "/bin/systemctl").effective()
    assert effective.fragment_path == "/etc/systemd/system/sglang.service"
    assert effective.drop_in_paths == ["/etc/systemd/system/sglang.service.d/10-a.conf",
                                       "/run/systemd/system/sglang.service.d/override.conf"]
    assert effective.need_daemon_reload is True
    assert effective.exec_start[0][:3] == ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server"]
    # later assignments win, '=' in values is kept, quoted words stay whole, escapes are undone
    assert effective.environment == {"A": "2", "B": "two words", "C": "x=y", "D": 'say "hi"'}
    assert effective.environment_files == ["/etc/sglang/a.env", "/etc/sglang/b.env"]
    as_dict = effective.as_dict()
    assert as_dict["exec_start"] == effective.exec_start[0]
    assert as_dict["environment_files"] == ["/etc/sglang/a.env", "/etc/sglang/b.env"]


def test_effective_unit_of_an_empty_answer():
    effective = sd.EffectiveUnit({})
    assert effective.fragment_path is None and effective.drop_in_paths == []
    assert effective.need_daemon_reload is False and effective.exec_start == []
    assert effective.environment == {} and effective.environment_files == []
    assert effective.as_dict()["exec_start"] == []


def test_exec_start_and_flag_value(run_table):
    run_table.add(sd.show_argv("sglang.service", sd.EFFECTIVE_PROPERTIES), out="ExecStart=" + EXEC + "\n")
    argvs = sd.Systemd(run_table, "sglang.service").exec_start()
    assert len(argvs) == 1
    assert sd.flag_value(argvs[0], "--speculative-dflash-draft-window-size") == (True, "2048")
    assert sd.flag_value(argvs[0], "--speculative-num-draft-tokens") == (True, "16")
    assert sd.flag_value(argvs[0], "--speculative-draft-window-size") == (False, None)
    assert sd.flag_value(["--flag"], "--flag") == (True, None)  # last argument, no value
    assert sd.parse_exec_start("") == [] and sd.parse_exec_start(None) == []


def test_several_exec_start_blocks():
    two = EXEC + " " + EXEC.replace("2048", "512")
    argvs = sd.parse_exec_start(two)
    assert [sd.flag_value(argv, "--speculative-dflash-draft-window-size")[1] for argv in argvs] == ["2048", "512"]


@pytest.mark.parametrize("value,env", [
    ('A=1 "B=two words"', {"A": "1", "B": "two words"}),
    ('"PATH=/a b:/c" X=', {"PATH": "/a b:/c", "X": ""}),
    ('A="x y"z', {"A": "x yz"}),  # quotes may start inside a word
    ('T=a\\tb N=a\\nb', {"T": "a\tb", "N": "a\nb"}),
    ('NOEQUALS A=1', {"A": "1"}),
    ("", {}),
    (None, {}),
])
def test_parse_environment(value, env):
    assert sd.parse_environment(value) == env


def test_parse_environment_files_keeps_only_paths():
    assert sd.parse_environment_files("/etc/a.env (ignore_errors=no)\n/etc/b.env (ignore_errors=yes)") == \
        ["/etc/a.env", "/etc/b.env"]
    assert sd.parse_environment_files('"/etc/with space.env" (ignore_errors=no)') == ["/etc/with space.env"]
    assert sd.parse_environment_files("") == []


def test_effective_unit_as_dict_never_carries_a_command_line_secret():
    secret = EXEC.replace("--speculative-num-draft-tokens=16", "--api-key s3cr3t --admin-api-key=s3cr3t")
    effective = sd.EffectiveUnit({"ExecStart": secret})
    assert "s3cr3t" in effective.exec_start[0]  # the parsed argv is what runs (compared masked elsewhere)
    shown = effective.as_dict()["exec_start"]
    assert "s3cr3t" not in " ".join(shown)
    assert shown[-3:] == ["--api-key", "********", "--admin-api-key=********"]


def test_journald_storage_takes_the_last_setting_of_the_journal_section():
    text = ("# /etc/systemd/journald.conf\n[Journal]\n#Storage=auto\nStorage=persistent\n\n"
            "# /etc/systemd/journald.conf.d/50-x.conf\n[Journal]\nStorage=none\n")
    assert sd.journald_storage(text) == "none"
    assert sd.journald_storage("[Journal]\nRateLimitBurst=5\n") == "auto"
    assert sd.journald_storage("[Other]\nStorage=none\n") == "auto"
    assert sd.journald_storage("[Journal]\nStorage=Volatile\n") == "volatile"
    assert sd.journald_storage("") is None and sd.journald_storage(None) is None


# --------------------------------------------------------------------------- unit file quoting

@pytest.mark.parametrize("raw, quoted", [
    ("plain", '"plain"'),
    ("with space", '"with space"'),
    ("50%", '"50%%"'),
    ("%h-%i", '"%%h-%%i"'),
    ("$HOME", '"$$HOME"'),
    ("${X}", '"$${X}"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"'),
    ("trailing\\", '"trailing\\\\"'),
    ("it's", "\"it's\""),
    (";", '";"'),
    ("", '""'),
    (8, '"8"'),
    ("ünï", '"ünï"'),
])
def test_systemd_quote(raw, quoted):
    assert sd.systemd_quote(raw) == quoted


@pytest.mark.parametrize("raw", ["a\nb", "a\rb", "a\x00b", "a\x1bb", "a\x7fb", "tab\there"])
def test_systemd_quote_rejects_control_characters(raw):
    with pytest.raises(sd.QuotingError, match="newline or control character"):
        sd.systemd_quote(raw)


def test_systemd_quote_env_keeps_dollar():
    assert sd.systemd_quote_env("A", '5$ 10% "x"\\') == '"A=5$ 10%% \\"x\\"\\\\"'
