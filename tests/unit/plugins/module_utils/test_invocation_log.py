# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading one invocation's journal: followed from a cursor, searched when it was running already, read to
its end after a death, and what could not be read said as a note (fakes.FakeHost on a fake clock)."""
import json

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._invocation_log import InvocationLog
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import JournalError

from fakes import CONFIG_2048, NEW, OLD, STARTUP, FakeHost, entry, timed, unit_state

KILLED = [entry("sglang.service: Main process exited, code=killed, status=9/KILL", systemd=True,
                EXIT_CODE="killed", EXIT_STATUS="9"),
          entry("sglang.service: Failed with result 'signal'.", systemd=True)]


def reader(host, state=None):
    notes = []
    return InvocationLog(host, state, tail_lines=5, note=notes.append), notes


def test_a_new_invocation_is_read_from_its_first_line_with_secrets_masked():
    host = FakeHost(states=[(0.0, unit_state(NEW))], journal={NEW: timed(0.0, STARTUP, 0.1)})
    log, notes = reader(host)
    host.now = 1.0
    entries = log.read(NEW, 0.25)
    assert len(entries) == len(STARTUP) and host.followers[0].from_start
    assert log.log.config_lines[0]["line"] == CONFIG_2048 and log.log.after_config_seen
    assert log.cursor == log.own_cursor == "%s:%s" % (NEW, len(STARTUP) - 1)
    assert len(log.tail) == 5 and all("sekret" not in line for line in log.tail)
    assert notes == []


def test_systemds_notes_are_read_but_are_not_lines_of_the_process():
    host = FakeHost(states=[], journal={NEW: timed(0.0, STARTUP[:2], 0.1) + [(0.5, KILLED[0])]})
    log, notes = reader(host)
    entries = log.read(NEW, 1.0)
    assert [item.from_systemd for item in entries] == [False, False, True]
    assert log.own_cursor == "%s:1" % NEW and log.cursor == "%s:2" % NEW  # a receipt reads on from its own lines
    assert len(log.tail) == 2 and "sekret" not in log.tail[0] and log.tail[1] == STARTUP[1]
    assert log.log.exit == "code=killed, status=9/KILL"


def test_a_broken_follower_starts_again_from_its_cursor():
    host = FakeHost(states=[], journal={NEW: timed(0.0, STARTUP, 0.1)})
    log, notes = reader(host)
    host.now = 0.35
    log.read(NEW, 0.0)
    host.follow_errors = 1
    with pytest.raises(JournalError):  # the loop says so in its phase and reads again at its next look
        log.read(NEW, 0.1)
    assert log.follower is None
    host.now = 2.0
    log.read(NEW, 0.1)
    assert host.followers[-1].cursor and len(log.log.config_lines) == 1
    assert log.log.lines_seen == len(STARTUP)  # nothing read twice, nothing lost


def test_a_slice_of_a_running_verified_invocation_reads_on_from_now_without_a_cursor():
    host = FakeHost(states=[], journal={NEW: timed(0.0, STARTUP, 0.1)})
    host.now = 5.0
    log, notes = reader(host, {"receipt": {"invocation_id": NEW, "config_lines": []}})
    assert log.read(NEW, 0.1, verify_only=True) == []  # startup known from its receipt: not read again
    fresh, notes = reader(host)
    assert len(fresh.read(NEW, 0.1, verify_only=True)) == len(STARTUP)  # unknown: read from its start


def test_looking_back_reads_where_the_journal_ends_before_the_search():
    host = FakeHost(states=[], journal={NEW: timed(0.0, STARTUP, 0.1)})
    host.now = 10.0
    log, notes = reader(host)
    log.look_back(NEW)
    assert host.calls == ["last_cursor:%s" % NEW, "grep:%s" % NEW, "follow:%s" % NEW]
    assert log.cursor == log.own_cursor == "%s:%s" % (NEW, len(STARTUP) - 1)
    assert log.log.config_lines and log.log.start_seen and log.follower.cursor == log.cursor


def test_looking_back_at_a_process_still_starting_follows_on_from_what_it_found():
    host = FakeHost(states=[], journal={NEW: timed(0.0, STARTUP[:3], 0.1)})
    host.now = 1.0
    log, notes = reader(host)
    log.look_back(NEW)
    assert log.cursor == "%s:0" % NEW  # its last landmark (server_args=), not the newest line
    host.journal[NEW] += timed(2.0, STARTUP[3:], 0.1)
    host.now = 3.0
    log.read(NEW, 0.1)
    assert log.log.config_lines and log.log.after_config_seen


def test_looking_back_without_grep_says_so():
    host = FakeHost(states=[], journal={NEW: timed(0.0, STARTUP, 0.1)}, grep=False)
    host.now = 10.0
    log, notes = reader(host)
    log.look_back(NEW)
    assert notes == ["journalctl here cannot --grep; the journal of invocation %s was not searched" % NEW]


def test_reading_to_the_end_stops_at_systemds_exit_notes():
    host = FakeHost(states=[], journal={NEW: timed(0.0, STARTUP[:7], 0.1) + [(1.0, KILLED[0]), (1.1, KILLED[1])]})
    log, notes = reader(host)
    log.read(NEW, 0.25)
    log.read_to_the_end(NEW, verify_only=False, tick=0.25)
    assert log.log.exit == "code=killed, status=9/KILL, Result signal"
    assert host.now < 2.0  # not the whole flush: systemd's last word came


def test_reading_to_the_end_waits_a_little_for_lines_that_lag():
    host = FakeHost(states=[], journal={NEW: timed(0.0, STARTUP[:2], 0.1) + [(1.5, entry("RuntimeError: boom"))]})
    log, notes = reader(host)
    log.read(NEW, 0.25)
    log.read_to_the_end(NEW, verify_only=False, tick=0.25)
    assert log.tail[-1] == "RuntimeError: boom" and 2.0 <= host.now <= 2.5


def test_an_invocation_never_followed_is_searched_and_its_tail_read():
    host = FakeHost(states=[], journal={NEW: timed(0.0, STARTUP[:7] + ["Received sigquit from a child"], 0.01)})
    host.now = 5.0
    log, notes = reader(host)
    log.read_to_the_end(NEW, verify_only=False, tick=0.25)
    assert log.log.config_lines and log.tail[-1] == "Received sigquit from a child"
    assert not host.followers  # searched, not followed


def test_what_cannot_be_read_is_a_note():
    host = FakeHost(states=[])
    log, notes = reader(host)

    def broken(*args):
        raise JournalError("journalctl failed (rc=1): scripted")
    host.grep = host.tail = host.restarts_since = host.suppressed = broken
    log.read_to_the_end(NEW, verify_only=True, tick=0.25)
    assert log.restarts_since(OLD) == [] and log.suppression_notices(NEW, None) == []
    assert notes == ["could not search the journal of invocation %s: journalctl failed (rc=1): scripted" % NEW,
                     "could not read the journal of invocation %s: journalctl failed (rc=1): scripted" % NEW,
                     "could not read systemd's restarts of sglang.service: journalctl failed (rc=1): scripted",
                     "could not look for journald suppression notices: journalctl failed (rc=1): scripted"]


def test_the_tail_of_another_invocation_replaces_it_even_when_empty():
    host = FakeHost(states=[], journal={NEW: timed(0.0, STARTUP[:2], 0.1)})
    host.now = 1.0
    log, notes = reader(host)
    log.read(NEW, 0.1)
    log.read_tail(OLD, replace=True)
    assert list(log.tail) == []
    log.read_tail(NEW)
    assert list(log.tail)[-1] == STARTUP[1]


def test_its_state_travels_as_json_and_reset_forgets_it():
    host = FakeHost(states=[], journal={NEW: timed(0.0, STARTUP, 0.1)})
    host.now = 1.0
    log, notes = reader(host)
    log.read(NEW, 0.1)
    again, notes = reader(host, json.loads(json.dumps(log.to_state())))
    assert again.to_state() == log.to_state()
    log.reset()
    assert log.to_state() == {"log": log.log.to_state(), "cursor": None, "own_cursor": None, "tail": [],
                              "receipt": None} and log.follower is None and not log.log.config_lines
