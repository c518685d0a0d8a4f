# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the wait sees of the host: when systemd is read, what each look reads and keeps for the result, and
the snapshot the judge reads (fakes.FakeHost on a fake clock)."""
from ansible_collections.gpufleet.inference.plugins.module_utils import _evidence as ev
from ansible_collections.gpufleet.inference.plugins.module_utils import _judge as jd
from ansible_collections.gpufleet.inference.plugins.module_utils._host_view import (
    POKE_SECONDS,
    HostView,
    read_launch,
    read_unit_flags,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._invocation_log import InvocationLog
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import EffectiveUnit, SystemdError
from ansible_collections.gpufleet.inference.plugins.module_utils._wait import Followed, WaitState

from fakes import (COMMAND, CONFIG_2048, EXPECT_2048, GOOD, NEW, OLD, STARTING, STARTUP, FakeHost, entry, timed,
                   unit_state)


def view_of(host, after=OLD, invocation_id=None, command=COMMAND, environment=None, **policy):
    state = WaitState(Followed(after=after, invocation_id=invocation_id, main_pid=4242 if invocation_id else None),
                      InvocationLog(host))
    view = HostView(host, "sglang.service", ev.Intent(EXPECT_2048, None, command, environment),
                    jd.Policy(**dict({"timeout": 120}, **policy)), state)
    view.started = host.now
    return view


def test_systemd_is_read_first_and_then_when_due():
    host = FakeHost(states=[(0.0, unit_state(NEW))], journal={NEW: timed(0.0, STARTUP, 0.1)},
                    alive=[(0.0, True), (3.0, False)])
    view = view_of(host, invocation_id=NEW)
    view.watch()
    assert host.calls[:2] == ["state", "follow:%s" % NEW] and not view.unit_stale
    view.watch()
    assert host.calls.count("state") == 1  # within state_interval, main process alive
    host.now = 2.0
    view.watch()
    assert host.calls.count("state") == 2  # state_interval passed
    host.now = 3.1
    view.watch()
    assert host.calls.count("state") == 3  # its main process is gone: at once


def test_a_note_of_systemd_in_the_journal_makes_its_view_due():
    host = FakeHost(states=[(0.0, unit_state(NEW))],
                    journal={NEW: [(0.5, entry("sglang.service: Main process exited", systemd=True,
                                               EXIT_CODE="exited", EXIT_STATUS="1"))]})
    view = view_of(host, invocation_id=NEW)
    view.watch()
    host.now = 0.6
    view.watch()
    assert view.unit_stale and view.snapshot().unit_stale
    view.watch()
    assert host.calls.count("state") == 2 and not view.unit_stale


def test_nothing_followed_yet_reads_systemd_at_every_look_and_no_journal():
    host = FakeHost(states=[(0.0, unit_state(OLD))])
    view = view_of(host)
    view.watch()
    view.watch()
    assert host.calls == ["state", "state"] and not host.followers


def test_a_read_that_fails_is_named_until_it_succeeds_again():
    host = FakeHost(states=[(0.0, unit_state(NEW))], journal={NEW: timed(0.0, STARTUP, 0.1)})
    view = view_of(host, invocation_id=NEW)
    working = host.state

    def broken():
        raise SystemdError("systemctl show failed (rc=1)")
    host.state = broken
    host.follow_errors = 1
    view.watch()
    assert view.read_error == "systemctl show failed (rc=1); journalctl --follow ended (rc=1): scripted"
    assert view.unit_state is None and view.snapshot().last_error == view.read_error
    view.watch()
    assert view.read_error == "systemctl show failed (rc=1)"  # the journal reads again
    host.state = working
    view.watch()
    assert view.read_error is None and view.unit_state.invocation_id == NEW


def test_the_main_pid_follows_systemd_only_for_the_followed_invocation():
    host = FakeHost(states=[(0.0, unit_state(NEW, pid=77)), (1.0, unit_state(OLD, pid=88))])
    view = view_of(host, invocation_id=NEW)
    view.watch()
    assert view.state.tracker.main_pid == 77
    host.now = 1.5
    view.watch()
    assert view.state.tracker.main_pid == 77  # another invocation's process is not this one's


def test_following_a_new_invocation_marks_it_and_counts_restarts_before_the_first_look():
    restarts = [(0.0, {"invocation_id": "x", "n_restarts": 1, "message": "Scheduled restart job"})]
    host = FakeHost(states=[(0.0, unit_state(NEW, restarts=1))], restarts=restarts)
    view = view_of(host)
    view.watch()
    assert view.look(jd.FOLLOW, {}) == [restarts[0][1]]
    tracker = view.state.tracker
    assert (tracker.invocation_id, tracker.baseline_restarts, tracker.deaths) == (NEW, 1, 1)
    assert view.state.phases["new_invocation"]["invocation_id"] == NEW
    assert view.events[-1]["text"] == "new invocation %s, main PID 4242" % NEW and view.phase_changed


def test_following_the_running_invocation_looks_back_at_it():
    host = FakeHost(states=[(0.0, unit_state(NEW))], journal={NEW: timed(0.0, STARTUP, 0.1)})
    host.now = 10.0
    view = view_of(host, after=None)
    view.watch()
    assert view.look(jd.FOLLOW, {}) == []
    assert "restarts_since" not in " ".join(host.calls) and "grep:%s" % NEW in host.calls
    assert view.state.phases["config_line"]["logged_at"] == "2026-11-29 10:04:49"
    assert view.events[-1]["text"] == "running invocation %s, main PID 4242" % NEW


def test_an_invocation_that_ended_is_followed_without_reading_anything():
    host = FakeHost(states=[(0.0, unit_state(NEW, "failed", "failed"))])
    view = view_of(host)
    view.watch()
    assert view.look(jd.FOLLOW, {}) == [] and view.state.tracker.invocation_id == NEW
    assert host.calls == ["state"] and "new_invocation" not in view.state.phases


def test_the_first_open_port_and_the_first_good_answer_are_kept_once():
    host = FakeHost(states=[(0.0, unit_state(NEW))], generate=[(0.0, STARTING), (1.0, GOOD)])
    view = view_of(host, invocation_id=NEW)
    assert view.look(jd.PORT, {}) is True and view.look(jd.PORT, {}) is True
    assert [event["phase"] for event in view.events] == ["port_open"]
    assert view.look(jd.GENERATE, {}).status == 503 and view.state.found.generate is None
    host.now = 1.0
    view.look(jd.GENERATE, {})
    assert view.state.found.generate == {"status": 200, "text": " Paris. The capital",
                                         "meta_info": {"completion_tokens": 8, "spec_accept_length": 3.2}}
    assert view.state.phases["generate"]["elapsed"] == 1.0
    assert view.events[-1]["text"] == "/generate answered (8 tokens, accept length 3.2)"


def test_the_listener_and_journalds_notices_are_kept_for_the_result():
    notices = [{"count": 7, "message": "Suppressed 7 messages from sglang.service"},
               {"count": None, "message": "Suppressed some"}]
    host = FakeHost(states=[(0.0, unit_state(NEW))], notices=notices)
    view = view_of(host, invocation_id=NEW)
    view.watch()
    assert view.look(jd.LISTENER, {})["verdict"] == "inside" and view.state.found.listener["verdict"] == "inside"
    assert view.look(jd.NOTICES, {}) == notices
    assert view.suppression == {"messages_dropped": 7, "notices": [notice["message"] for notice in notices]}


def test_a_poke_is_sent_at_most_every_few_seconds():
    host = FakeHost(states=[(0.0, unit_state(NEW))])
    view = view_of(host, invocation_id=NEW)
    for step in range(9):
        host.now = step * 0.5
        view.look(jd.POKE, {})
    assert host.calls.count("generate") == 1 + int(4.0 // POKE_SECONDS)


def test_what_runs_is_read_once_its_command_line_can_be_read():
    host = FakeHost(states=[(0.0, unit_state(NEW))], cmdline=None)
    view = view_of(host, invocation_id=NEW)
    assert view.look(jd.LAUNCH, {}) is None and view.state.found.launched is None
    host.cmdline_value = ["/usr/bin/python3.11"] + COMMAND[1:]
    launch = view.look(jd.LAUNCH, {})
    assert launch.differences == () and view.state.found.launched["command_checked"]
    assert view.state.notes and "execs it" in view.state.notes[0]


def test_read_launch_reads_the_environment_only_when_one_is_intended():
    host = FakeHost(states=[], cmdline=COMMAND, environ={"A": "1"}, effective=EffectiveUnit({"Environment": "A=1"}))
    assert read_launch(host, ev.Intent({}, "optional", COMMAND), "u", 1).launched["environment_checked"] is False
    assert "effective" not in host.calls
    found = read_launch(host, ev.Intent({}, "optional", None, {"A": "1"}), "u", 1)
    assert found.differences == () and found.launched["environment_checked"] and "effective" in host.calls


def test_unit_flags_come_from_the_intended_command_else_the_units_execstart():
    host = FakeHost(states=[], effective=EffectiveUnit({
        "ExecStart": "{ path=/py ; argv[]=/py -m sglang.launch_server --speculative-draft-window-size 64 ; }"}))
    intended = read_unit_flags(host, ev.Intent(EXPECT_2048, None, COMMAND))
    assert intended.argv == tuple(COMMAND) and "effective" not in host.calls
    assert "--speculative-dflash-draft-window-size" in intended.flags["draft_window_size"]
    running = read_unit_flags(host, ev.Intent(EXPECT_2048))
    assert running.argv[-2:] == ("--speculative-draft-window-size", "64")

    def broken():
        raise SystemdError("no systemctl")
    host.effective = broken
    assert read_unit_flags(host, ev.Intent(EXPECT_2048)).argv == ()


def test_the_snapshot_is_what_the_record_and_the_last_looks_show():
    host = FakeHost(states=[(0.0, unit_state(NEW))], journal={NEW: timed(0.0, STARTUP, 0.1)})
    view = view_of(host, invocation_id=NEW)
    host.now = 2.0
    view.watch()
    view.look(jd.GENERATE, {})
    snap = view.snapshot({jd.PORT: True})
    assert (snap.after, snap.invocation_id, snap.unit_state.invocation_id) == (OLD, NEW, NEW)
    assert [line["line"] for line in snap.journal_lines] == [CONFIG_2048]
    assert snap.start_seen and snap.after_config_seen and snap.startup == "warmed up (fired up and ready to roll)"
    assert snap.generate["status"] == 200 and snap.generate_elapsed == snap.elapsed == 2.25  # after a tick read
    assert dict(snap.looks) == {jd.PORT: True} and snap.receipt_path == host.receipt_path
