# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
import json

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _journal as jr

INV = "0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d"
BASE = ["journalctl", "_SYSTEMD_INVOCATION_ID=" + INV, "-o", "json", "--all", "--no-pager", "-q"]


def test_first_read_is_bounded_and_later_reads_continue_after_the_cursor(run_table, jentries):
    run_table.add(BASE + ["-n", "3"], out=jentries(("a", "c1"), ("b", "c2")))
    run_table.add(BASE + ["--after-cursor=c2", "-n", "3"], out=jentries(("c", "c3")))
    run_table.add(BASE + ["--after-cursor=c3", "-n", "3"], out="")
    journal = jr.InvocationJournal(run_table, INV, batch=3)
    assert [e.message for e in journal.read_new()] == ["a", "b"]
    assert journal.cursor == "c2" and not journal.gaps
    assert [e.message for e in journal.read_new()] == ["c"]
    assert journal.read_new() == []
    assert journal.cursor == "c3"
    assert list(journal.last_lines) == ["a", "b", "c"]
    # never the unit's history: every query is scoped to the invocation
    assert all(call[1] == "_SYSTEMD_INVOCATION_ID=" + INV for call in run_table.calls)
    assert not any("-u" in call for call in run_table.calls)


def test_full_first_read_marks_a_gap(run_table, jentries):
    run_table.add(BASE + ["-n", "2"], out=jentries(("a", "c1"), ("b", "c2")))
    journal = jr.InvocationJournal(run_table, INV, batch=2)
    journal.start()
    assert journal.gaps


def test_read_new_loops_over_full_batches_but_is_bounded(run_table, jentries):
    run_table.add(BASE + ["-n", "2"], out=jentries(("a", "c1")))
    run_table.add(BASE + ["--after-cursor=c1", "-n", "2"], out=jentries(("b", "c2"), ("c", "c3")))
    run_table.add(BASE + ["--after-cursor=c3", "-n", "2"], out=jentries(("d", "c4"), ("e", "c5")))
    journal = jr.InvocationJournal(run_table, INV, batch=2, max_batches=2)
    journal.start()
    assert [e.message for e in journal.read_new()] == ["b", "c", "d", "e"]
    assert journal.cursor == "c5"
    assert len(run_table.calls) == 3


def test_empty_read_keeps_the_cursor(run_table, jentries):
    run_table.add(BASE + ["-n", "5"], out="")
    journal = jr.InvocationJournal(run_table, INV, batch=5)
    assert journal.read_new() == []
    assert journal.cursor is None


def test_binary_message_and_null_message(run_table, jentries):
    out = json.dumps({"MESSAGE": list(b"caf\xc3\xa9 \x1b[0m"), "__CURSOR": "c1"}) + "\n" + \
        json.dumps({"MESSAGE": None, "__CURSOR": "c2"}) + "\nnot json\n"
    run_table.add(BASE + ["-n", "5"], out=out)
    journal = jr.InvocationJournal(run_table, INV, batch=5)
    assert [e.message for e in journal.start()] == [u"caf\xe9 \x1b[0m", ""]


def test_error_raises(run_table, jentries):
    run_table.add(BASE + ["-n", "5"], rc=1, err="Failed to open journal")
    journal = jr.InvocationJournal(run_table, INV, batch=5)
    with pytest.raises(jr.JournalError, match="Failed to open journal"):
        journal.start()


def test_tail_is_bounded_and_independent_of_cursor(run_table, jentries):
    run_table.add(BASE + ["-n", "20"], out=jentries(("x", "c9"), ("y", "c10")))
    journal = jr.InvocationJournal(run_table, INV)
    assert journal.tail(20) == ["x", "y"]
    assert journal.cursor is None


def test_tail_falls_back_to_lines_seen(run_table, jentries):
    run_table.add(BASE + ["-n", "20"], rc=1, err="boom")
    journal = jr.InvocationJournal(run_table, INV)
    journal.last_lines.extend(["p", "q"])
    assert journal.tail(20) == ["p", "q"]


def test_grep_has_no_line_limit(run_table, jentries):
    pattern = r"Initialized (DFLASH draft runner|DDTree worker)\."
    run_table.add(BASE + ["--grep", pattern], out=jentries(("[t TP0] Initialized DFLASH draft runner. block_size=16", "c")))
    journal = jr.InvocationJournal(run_table, INV)
    assert journal.grep(pattern) == ["[t TP0] Initialized DFLASH draft runner. block_size=16"]
    assert "-n" not in run_table.calls[0]


def test_grep_no_match_and_unsupported(run_table, jentries):
    journal = jr.InvocationJournal(run_table, INV)
    run_table.add(BASE + ["--grep", "x"], rc=1)
    assert journal.grep("x") == []
    run_table.add(BASE + ["--grep", "y"], rc=1, err="Compiled without pattern matching support")
    assert journal.grep("y") is None
    run_table.add(BASE + ["--grep", "z"], rc=1, err="Failed to open journal: Permission denied")
    with pytest.raises(jr.JournalError):
        journal.grep("z")


SUPPRESSED = ["journalctl", "MESSAGE_ID=" + jr.JOURNAL_DROPPED_MESSAGE_ID, "-o", "json", "--all", "--no-pager", "-q",
              "--since", "Sun 2026-11-29 10:00:00 UTC"]


def test_suppressed_notices_match_invocation_unit_or_message(run_table, jentries):
    run_table.add(SUPPRESSED, out=jentries(
        ("Suppressed 1200 messages from sglang.service", "c1",
         {"N_DROPPED": "1200", "OBJECT_SYSTEMD_UNIT": "sglang.service", "OBJECT_SYSTEMD_INVOCATION_ID": "=" + INV,
          "_SYSTEMD_UNIT": "systemd-journald.service"}),
        ("Suppressed 5 messages from sglang.service", "c2",
         {"N_DROPPED": "5", "OBJECT_SYSTEMD_UNIT": "sglang.service", "OBJECT_SYSTEMD_INVOCATION_ID": "older"}),
        ("Suppressed 7 messages from other.service", "c3", {"OBJECT_SYSTEMD_UNIT": "other.service"}),
        ("Suppressed 9 messages from /system.slice/sglang.service", "c4"),
        ("Suppressed 3 messages from sglang.service", "c5", {"OBJECT_SYSTEMD_UNIT": "sglang.service"}),
    ))
    notices = jr.suppressed_notices(run_table, "sglang.service", INV, "Sun 2026-11-29 10:00:00 UTC")
    assert [n["count"] for n in notices] == [1200, 9, 3]
    assert notices[0]["invocation_id"] == INV


def test_dropped_message_id_is_systemds():
    # SD_MESSAGE_JOURNAL_DROPPED in systemd's sd-messages.h; seen on the lab's journald (systemd 252).
    assert jr.JOURNAL_DROPPED_MESSAGE_ID == "a596d6fe7bfa4994828e72309e95d61e"
