# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One invocation's journal: bounded queries (tail, grep), journald's suppression notices, and the
follower that reads `journalctl --follow` from a pipe."""
import io
import json
import os
import select as select_module

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _journal as jr
from fakes import JOURNAL_INV

INV = JOURNAL_INV  # the invocation make_entries writes
BASE = ["journalctl", "_SYSTEMD_INVOCATION_ID=" + INV, "-o", "json", "--all", "--no-pager", "-q"]
PATTERN = r"Initialized (DFLASH draft runner|DDTree worker)\."


# --------------------------------------------------------------------------- entries

def test_binary_null_and_odd_messages():
    assert jr.decode_message(list(b"caf\xc3\xa9 \x1b[0m")) == u"caf\xe9 \x1b[0m"
    assert jr.decode_message(list(b"\xff")) == u"\ufffd"
    assert jr.decode_message([300]) == ""  # not a byte value
    assert jr.decode_message(None) == "" and jr.decode_message(42) == "42"


def test_parse_json_lines_skips_garbage():
    text = '{"MESSAGE": "a"}\nnot json\n{"MESSAGE": \n\n  {"MESSAGE": "b"}  \n'
    assert [fields["MESSAGE"] for fields in jr.parse_json_lines(text)] == ["a", "b"]
    assert jr.parse_json_lines(None) == []


@pytest.mark.parametrize("fields,from_systemd", [
    ({"MESSAGE": "x", "_SYSTEMD_INVOCATION_ID": INV}, False),                     # the process's own line
    ({"MESSAGE": "Started x", "INVOCATION_ID": INV, "_PID": "1"}, True),          # systemd about it
    ({"MESSAGE": "x", "_SYSTEMD_INVOCATION_ID": INV, "INVOCATION_ID": INV}, False),
    ({"MESSAGE": "x"}, False),
    # INVOCATION_ID= is a field any client may set (logger --journald, sd_journal_send): only PID 1's counts
    ({"MESSAGE": "Started x", "INVOCATION_ID": INV, "_PID": "4711", "_UID": "1000"}, False),
    ({"MESSAGE": "Started x", "INVOCATION_ID": INV, "_PID": "1", "_UID": "1000"}, False),
    ({"MESSAGE": "x", "INVOCATION_ID": INV, "_PID": "4711", "_SYSTEMD_INVOCATION_ID": "other"}, False),
])
def test_entry_tells_systemds_messages_apart(fields, from_systemd):
    assert jr.Entry(fields).from_systemd is from_systemd


@pytest.mark.parametrize("fields,belongs", [
    ({"_SYSTEMD_INVOCATION_ID": INV, "_PID": "4242"}, True),               # journald: from the unit's cgroup
    ({"INVOCATION_ID": INV, "_PID": "1", "_UID": "0"}, True),               # systemd's message about it
    # a hostile local user: their own process (own scope's invocation) naming ours in the client field
    ({"INVOCATION_ID": INV, "_PID": "4711", "_UID": "1000", "_SYSTEMD_INVOCATION_ID": "5c09e1"}, False),
    ({"INVOCATION_ID": INV, "_PID": "4711", "_UID": "1000"}, False),
    ({"_SYSTEMD_INVOCATION_ID": "other", "_PID": "4242"}, False),
    ({"INVOCATION_ID": "other", "_PID": "1", "_UID": "0"}, False),
])
def test_an_entry_belongs_to_an_invocation_only_by_fields_journald_sets(fields, belongs):
    assert jr.Entry(dict(fields, MESSAGE="m")).belongs_to(INV) is belongs


def test_queries_drop_entries_a_client_attributed_to_the_invocation(run_table, jentries):
    forged = "[2026-11-29 10:04:49 TP0] Initialized DFLASH draft runner. block_size=16, draft_window_size=2048"
    run_table.add(BASE + ["--grep", PATTERN], out=jentries(
        ("own", "c1"),
        (forged, "c2", {"_SYSTEMD_INVOCATION_ID": "5c09e1", "INVOCATION_ID": INV, "_PID": "4711", "_UID": "1000"})))
    assert [e.message for e in jr.InvocationJournal(run_table, INV).grep_entries(PATTERN)] == ["own"]


def test_grep_after_a_cursor_reads_only_what_came_later(run_table, jentries):
    run_table.add(BASE + ["--grep", PATTERN, "--after-cursor=c5"], out=jentries(("later", "c6")))
    assert [e.cursor for e in jr.InvocationJournal(run_table, INV).grep_entries(PATTERN, after_cursor="c5")] == ["c6"]


def test_entry_fields():
    entry = jr.Entry({"MESSAGE": "m", "__CURSOR": "c1", "__REALTIME_TIMESTAMP": "1764410400000000", "_PID": "42"})
    assert (entry.message, entry.cursor, entry.realtime_usec, entry.pid) == ("m", "c1", 1764410400000000, "42")
    assert jr.Entry({"__REALTIME_TIMESTAMP": "soon"}).realtime_usec is None
    assert jr.Entry({}).message == "" and jr.Entry({}).cursor is None


# --------------------------------------------------------------------------- InvocationJournal

def test_tail_is_bounded_and_scoped_to_the_invocation(run_table, jentries):
    run_table.add(BASE + ["-n", "20"], out=jentries(("x", "c9"), ("y", "c10")))
    journal = jr.InvocationJournal(run_table, INV)
    assert journal.tail(20) == ["x", "y"]
    assert run_table.calls == [BASE + ["-n", "20"]]
    # never the unit's history
    assert not any("-u" in call for call in run_table.calls)


def test_last_cursor_is_the_newest_entrys_or_none_before_any(run_table, jentries):
    run_table.add(BASE + ["-n", "1"], out=jentries(("y", "c10")))
    assert jr.InvocationJournal(run_table, INV).last_cursor() == "c10"
    run_table.add(BASE + ["-n", "1"], out="")
    assert jr.InvocationJournal(run_table, INV).last_cursor() is None


def test_tail_with_another_journalctl(run_table, jentries):
    run_table.add(["/usr/bin/journalctl"] + BASE[1:] + ["-n", "5"], out=jentries(("x", "c1")))
    assert jr.InvocationJournal(run_table, INV, journalctl="/usr/bin/journalctl").tail(5) == ["x"]


def test_tail_error_raises_with_journalctls_words(run_table):
    run_table.add(BASE + ["-n", "20"], rc=1, err="Failed to open journal: Permission denied\n")
    with pytest.raises(jr.JournalError, match=r"failed \(rc=1\): Failed to open journal: Permission denied"):
        jr.InvocationJournal(run_table, INV).tail(20)


def test_grep_has_no_line_limit_and_keeps_cursors(run_table, jentries):
    line = "[t TP0] Initialized DFLASH draft runner. block_size=16"
    run_table.add(BASE + ["--grep", PATTERN], out=jentries((line, "c7"), ("second", "c8", {"_PID": "9"})))
    journal = jr.InvocationJournal(run_table, INV)
    entries = journal.grep_entries(PATTERN)
    assert [(e.message, e.cursor, e.pid) for e in entries] == [(line, "c7", "4242"), ("second", "c8", "9")]
    assert journal.grep(PATTERN) == [line, "second"]
    assert all("-n" not in call for call in run_table.calls)


@pytest.mark.parametrize("err", ["Compiled without pattern matching support",
                                 "journalctl: unrecognized option '--grep'",
                                 "Option --grep is not supported"])
def test_grep_unsupported_is_none(run_table, err):
    run_table.add(BASE + ["--grep", "y"], rc=1, err=err)
    journal = jr.InvocationJournal(run_table, INV)
    assert journal.grep_entries("y") is None and journal.grep("y") is None


def test_grep_without_a_match_is_empty(run_table):
    run_table.add(BASE + ["--grep", "x"], rc=1)  # journalctl --grep exits 1 when nothing matched
    assert jr.InvocationJournal(run_table, INV).grep("x") == []


def test_grep_other_errors_raise(run_table):
    journal = jr.InvocationJournal(run_table, INV)
    run_table.add(BASE + ["--grep", "z"], rc=1, err="Failed to open journal: Permission denied")
    with pytest.raises(jr.JournalError, match="Permission denied"):
        journal.grep("z")
    run_table.add(BASE + ["--grep", "w"], rc=1, out="half an answer")  # output but a failure: no silent []
    with pytest.raises(jr.JournalError):
        journal.grep("w")


# --------------------------------------------------------------------------- suppression notices

SINCE = "Sun 2026-11-29 10:00:00 UTC"
SUPPRESSED = ["journalctl", "MESSAGE_ID=" + jr.JOURNAL_DROPPED_MESSAGE_ID, "-o", "json", "--all", "--no-pager", "-q"]


def test_suppressed_notices_match_invocation_unit_or_message(run_table, jentries):
    driver = {"_TRANSPORT": "driver"}  # journald's own entries
    run_table.add(SUPPRESSED + ["--since", SINCE], out=jentries(
        ("Suppressed 1200 messages from sglang.service", "c1",
         dict(driver, N_DROPPED="1200", OBJECT_SYSTEMD_UNIT="sglang.service", OBJECT_SYSTEMD_INVOCATION_ID="=" + INV,
              _SYSTEMD_UNIT="systemd-journald.service")),
        ("Suppressed 5 messages from sglang.service", "c2",
         dict(driver, N_DROPPED="5", OBJECT_SYSTEMD_UNIT="sglang.service", OBJECT_SYSTEMD_INVOCATION_ID="older")),
        ("Suppressed 7 messages from other.service", "c3", dict(driver, OBJECT_SYSTEMD_UNIT="other.service")),
        ("Suppressed 9 messages from /system.slice/sglang.service", "c4", driver),
        ("Suppressed 11 messages from /system.slice/xsglang.service", "c4b", driver),
        ("Suppressed 3 messages from sglang.service", "c5", dict(driver, OBJECT_SYSTEMD_UNIT="sglang.service")),
        ("Suppressed many messages from sglang.service", "c6", dict(driver, OBJECT_SYSTEMD_UNIT="sglang.service")),
        # a client imitating the notice (MESSAGE_ID is client-settable; _TRANSPORT is not)
        ("Suppressed 99 messages from sglang.service", "c7",
         {"_TRANSPORT": "journal", "_UID": "1000", "OBJECT_SYSTEMD_UNIT": "sglang.service",
          "OBJECT_SYSTEMD_INVOCATION_ID": INV}),
    ))
    notices = jr.suppressed_notices(run_table, "sglang.service", INV, SINCE)
    assert [n["count"] for n in notices] == [1200, 9, 3, None]
    assert notices[0] == {"count": 1200, "message": "Suppressed 1200 messages from sglang.service",
                          "invocation_id": INV}  # the stray '=' is gone
    assert notices[1]["invocation_id"] is None


def test_suppressed_notices_without_since_and_errors(run_table):
    run_table.add(SUPPRESSED, out="")
    assert jr.suppressed_notices(run_table, "sglang.service", INV, None) == []
    assert run_table.calls[-1] == SUPPRESSED  # no --since
    run_table.add(SUPPRESSED + ["--since", SINCE], rc=1, err="bad time")
    with pytest.raises(jr.JournalError, match="bad time"):
        jr.suppressed_notices(run_table, "sglang.service", INV, SINCE)


def test_dropped_message_id_is_systemds():
    # SD_MESSAGE_JOURNAL_DROPPED in systemd's sd-messages.h; seen on the lab's journald (systemd 252).
    assert jr.JOURNAL_DROPPED_MESSAGE_ID == "a596d6fe7bfa4994828e72309e95d61e"


# --------------------------------------------------------------------------- JournalFollower

class PipeProcess(object):
    """What spawn returns: stdout is the read end of an os.pipe() the test writes JSON lines into."""

    def __init__(self, argv, stderr=b""):
        self.argv = argv
        read_fd, self.write_fd = os.pipe()
        self.stdout = os.fdopen(read_fd, "rb", buffering=0)
        self.stderr = io.BytesIO(stderr)
        self.rc = None
        self.killed = False
        self.waited = False

    def write(self, data):
        os.write(self.write_fd, data)

    def entry(self, message, cursor, **fields):
        data = {"MESSAGE": message, "__CURSOR": cursor, "_SYSTEMD_INVOCATION_ID": INV}
        data.update(fields)
        self.write(json.dumps(data).encode() + b"\n")

    def end(self, rc):
        """journalctl exits: its pipe reaches EOF."""
        self.rc = rc
        self.close_writer()

    def close_writer(self):
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None

    def poll(self):
        return self.rc

    def kill(self):
        self.killed = True

    def wait(self):
        self.waited = True
        return self.rc

    def cleanup(self):
        self.close_writer()
        self.stdout.close()


class Spawner(object):
    def __init__(self, stderr=b""):
        self.procs = []
        self.stderr = stderr

    def __call__(self, argv):
        proc = PipeProcess(argv, self.stderr)
        self.procs.append(proc)
        return proc

    @property
    def proc(self):
        return self.procs[-1]


class NoWaitSelect(object):
    """select() that never blocks (a real select with timeout 0); records the timeouts asked for."""

    def __init__(self):
        self.timeouts = []

    def __call__(self, rlist, wlist, xlist, timeout):
        self.timeouts.append(timeout)
        return select_module.select(rlist, wlist, xlist, 0)


@pytest.fixture
def spawner():
    spawn = Spawner()
    yield spawn
    for proc in spawn.procs:
        proc.cleanup()


def follower(spawn, **kwargs):
    selector = NoWaitSelect()
    return jr.JournalFollower(spawn, INV, select=selector, **kwargs), selector


def test_argv_from_start_from_a_cursor_and_from_now():
    def argv(**kwargs):
        return jr.JournalFollower(None, INV, **kwargs).argv()
    tail = ["_SYSTEMD_INVOCATION_ID=" + INV, "+", "INVOCATION_ID=" + INV]
    head = ["journalctl", "--follow", "-o", "json", "--all", "--no-pager", "-q"]
    assert argv() == head + ["--no-tail"] + tail
    assert argv(cursor="s=1;i=2") == head + ["--after-cursor=s=1;i=2"] + tail
    assert argv(cursor="s=1", from_start=False) == head + ["--after-cursor=s=1"] + tail
    assert argv(from_start=False) == head + ["-n", "0"] + tail
    assert argv(journalctl="/bin/journalctl")[0] == "/bin/journalctl"


def test_reads_whole_lines_only_and_keeps_a_partial_line_for_later(spawner):
    follow, selector = follower(spawner)
    assert follow.read(0.5) == []  # starts journalctl; nothing written yet
    assert spawner.proc.argv == follow.argv() and selector.timeouts == [0.5]
    line = json.dumps({"MESSAGE": "Load weight begin", "__CURSOR": "c1", "_SYSTEMD_INVOCATION_ID": INV}).encode()
    spawner.proc.write(line[:20])
    assert follow.read(0.1) == [] and follow.cursor is None
    spawner.proc.write(line[20:] + b"\n" + line[:5])
    entries = follow.read(0.1)
    assert [e.message for e in entries] == ["Load weight begin"]
    assert follow.cursor == "c1"
    assert len(spawner.procs) == 1  # one journalctl for the whole follow


def test_many_entries_in_one_read_advance_the_cursor_to_the_last(spawner):
    follow, selector = follower(spawner)
    follow.read(0)
    for index in range(5):
        spawner.proc.entry("line %d" % index, "c%d" % index)
    spawner.proc.write(b"not json\n{broken\n\n")
    entries = follow.read(0.25)
    assert [e.message for e in entries] == ["line %d" % index for index in range(5)]
    assert follow.cursor == "c4" and follow.entries_read == 5
    assert follow.read(0.25) == [] and follow.cursor == "c4"  # a quiet read keeps the cursor


def test_systemds_entries_are_returned_but_not_in_last_lines(spawner):
    follow, selector = follower(spawner, keep=3)
    follow.read(0)
    spawner.proc.entry("a", "c1")
    spawner.proc.write(json.dumps({"MESSAGE": "sglang.service: Main process exited, code=killed, status=9/KILL",
                                   "INVOCATION_ID": INV, "_PID": "1", "__CURSOR": "c2"}).encode() + b"\n")
    for name in ("b", "c", "d"):
        spawner.proc.entry(name, "c-" + name)
    entries = follow.read(0.1)
    assert [e.from_systemd for e in entries] == [False, True, False, False, False]
    assert list(follow.last_lines) == ["b", "c", "d"]  # bounded by keep, systemd's line left out


def test_the_follower_drops_what_a_client_wrote_in_the_invocations_name_and_counts_it(spawner):
    follow, selector = follower(spawner)
    follow.read(0)
    spawner.proc.entry("a", "c1")
    spawner.proc.write(json.dumps({"MESSAGE": "[2026-11-29 10:04:49 TP0] Initialized DFLASH draft runner. x=1",
                                   "INVOCATION_ID": INV, "_PID": "4711", "_UID": "1000",
                                   "_SYSTEMD_INVOCATION_ID": "5c09e1", "__CURSOR": "c2"}).encode() + b"\n")
    spawner.proc.entry("b", "c3")
    assert [e.message for e in follow.read(0.1)] == ["a", "b"]
    assert follow.foreign == 1 and follow.cursor == "c3"


def test_eof_of_an_exited_journalctl_raises_and_the_next_read_restarts_after_the_cursor():
    spawn = Spawner(stderr=b"Failed to iterate through journal: Bad message\n")
    try:
        follow, selector = follower(spawn)
        follow.read(0)
        spawn.proc.entry("a", "c1")
        assert [e.message for e in follow.read(0)] == ["a"]
        spawn.proc.end(1)
        with pytest.raises(jr.JournalError, match=r"journalctl --follow ended \(rc=1\): Failed to iterate"):
            follow.read(0.1)
        assert follow.proc is None
        # the caller reads again: a new journalctl continues after the last entry it returned
        assert follow.read(0) == []
        assert len(spawn.procs) == 2 and "--after-cursor=c1" in spawn.proc.argv
    finally:
        for proc in spawn.procs:
            proc.cleanup()


def test_eof_says_so_when_journalctl_printed_nothing(spawner):
    follow, selector = follower(spawner)
    follow.read(0)
    spawner.proc.end(0)  # even a clean exit ends a --follow that should never end
    with pytest.raises(jr.JournalError, match=r"\(rc=0\): no error output"):
        follow.read(0)


def test_an_exited_journalctl_with_its_pipe_still_open_raises():
    spawn = Spawner()
    try:
        follow, selector = follower(spawn)
        follow.read(0)
        spawn.proc.rc = 1  # gone, but a grandchild still holds the pipe
        with pytest.raises(jr.JournalError, match=r"rc=1"):
            follow.read(0)
    finally:
        for proc in spawn.procs:
            proc.cleanup()


def test_eof_while_journalctl_still_runs_is_not_an_error(spawner):
    follow, selector = follower(spawner)
    follow.read(0)
    spawner.proc.entry("a", "c1")
    spawner.proc.close_writer()  # EOF, but poll() still says running
    assert [e.message for e in follow.read(0)] == ["a"]


def test_spawn_failure_is_a_journal_error():
    def spawn(argv):
        raise OSError(2, "No such file or directory")
    follow = jr.JournalFollower(spawn, INV, select=NoWaitSelect())
    with pytest.raises(jr.JournalError, match="could not start journalctl: .*No such file"):
        follow.read(1)


def test_negative_timeout_becomes_zero(spawner):
    follow, selector = follower(spawner)
    follow.read(-3)
    assert selector.timeouts == [0.0]


def test_close_kills_and_reaps_once(spawner):
    follow, selector = follower(spawner)
    follow.close()  # never started: nothing to do
    assert spawner.procs == []
    follow.read(0)
    proc = spawner.proc
    follow.close()
    assert proc.killed and proc.waited and follow.proc is None
    proc.killed = False
    follow.close()
    assert not proc.killed


def test_close_of_an_already_dead_process_does_not_raise(spawner):
    follow, selector = follower(spawner)
    follow.read(0)

    def kill():
        raise OSError(3, "No such process")
    spawner.proc.kill = kill
    follow.close()
    assert follow.proc is None


# --------------------------------------------------------------------------- systemd's restarts

RESTARTS_BASE = ["journalctl", "-o", "json", "--all", "--no-pager", "-q"]
SCHEDULED = "MESSAGE_ID=" + jr.RESTART_SCHEDULED_MESSAGE_ID


def test_restarts_since_an_invocation_are_pid1s_scheduled_restarts_after_its_end(run_table, jentries):
    old = "aaaa0000"
    run_table.add(RESTARTS_BASE + ["-n", "1", "_PID=1", "INVOCATION_ID=" + old],
                  out=jentries(("Stopped sglang.service.", "c10", {"_PID": "1", "_UID": "0", "INVOCATION_ID": old,
                                                                   "_SYSTEMD_INVOCATION_ID": None})))
    # make_entries stamps the n-th entry 1764410400.000000 + n us: the end of `old` is at ...000000
    pid1 = {"_PID": "1", "_UID": "0", "_SYSTEMD_INVOCATION_ID": None}
    scheduled = jentries(
        ("the end itself, again (--since is inclusive)", "c10", dict(pid1, INVOCATION_ID=old)),
        ("sglang.service: Scheduled restart job, restart counter is at 1.", "c12",
         dict(pid1, INVOCATION_ID="bbbb1111", N_RESTARTS="1")),
        ("sglang.service: Scheduled restart job, restart counter is at 9.", "c13",  # not PID 1's
         {"_PID": "4711", "_UID": "1000", "INVOCATION_ID": "cccc2222", "N_RESTARTS": "9"}))
    run_table.add(RESTARTS_BASE + ["--since=@1764410400.000000", "_PID=1", SCHEDULED, "UNIT=sglang.service"],
                  out=scheduled)
    assert jr.restarts_since(run_table, "sglang.service", old) == [
        {"invocation_id": "bbbb1111", "n_restarts": 1,
         "message": "sglang.service: Scheduled restart job, restart counter is at 1."}]


def test_restarts_since_an_invocation_whose_end_is_gone_cannot_be_told(run_table):
    run_table.add(RESTARTS_BASE + ["-n", "1", "_PID=1", "INVOCATION_ID=gone"], out="")
    assert jr.restarts_since(run_table, "sglang.service", "gone") is None
    run_table.add(RESTARTS_BASE + ["-n", "1", "_PID=1", "INVOCATION_ID=x"], rc=1, err="Permission denied")
    with pytest.raises(jr.JournalError, match="Permission denied"):
        jr.restarts_since(run_table, "sglang.service", "x")
