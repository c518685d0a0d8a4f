# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What counts as evidence: every config line against the intent, when a missing line may be judged,
and receipts of a verified invocation."""
import json
import os
import stat

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _config_line as cfg
from ansible_collections.gpufleet.inference.plugins.module_utils import _evidence as ev

from fakes import CONFIG_2048, CONFIG_512, CONFIG_NONE, EXPECT_2048, NEW, OLD

LINE_2048, LINE_512, LINE_NONE = (cfg.parse_config_line(line) for line in (CONFIG_2048, CONFIG_512, CONFIG_NONE))


@pytest.mark.parametrize("mode,expect,effective", [
    (None, {"a": 1}, ev.REQUIRED),
    (None, {}, ev.OPTIONAL),
    (None, None, ev.OPTIONAL),
    ("", {"a": 1}, ev.REQUIRED),
    (ev.ABSENT, {"a": 1}, ev.ABSENT),  # an explicit mode wins
    (ev.OPTIONAL, {"a": 1}, ev.OPTIONAL),
    (ev.REQUIRED, {}, ev.REQUIRED),
])
def test_config_line_mode(mode, expect, effective):
    assert ev.config_line_mode(mode, expect) == effective


# --------------------------------------------------------------------------- mismatches

@pytest.mark.parametrize("mode", [ev.REQUIRED, ev.OPTIONAL])
def test_agreeing_lines_have_no_mismatch(mode):
    assert ev.mismatches(EXPECT_2048, mode, [LINE_2048, LINE_2048]) == []
    assert ev.mismatches(EXPECT_2048, mode, []) == []  # no line: judged elsewhere (completeness)


@pytest.mark.parametrize("mode", [ev.REQUIRED, ev.OPTIONAL])
def test_every_line_is_compared_and_names_its_occurrence(mode):
    found = ev.mismatches(EXPECT_2048, mode, [LINE_2048, LINE_512, LINE_NONE])
    assert [(item["occurrence"], item["key"], item["observed"]) for item in found] == [
        (2, "draft_window_size", 512), (3, "compact_cache", False), (3, "draft_window_size", None)]
    assert found[0]["expected"] == 2048 and found[0]["line"] == CONFIG_512


def test_a_missing_key_is_a_mismatch():
    found = ev.mismatches({"tree_budget": 64}, ev.REQUIRED, [LINE_2048])
    assert found == [{"key": "tree_budget", "expected": 64, "observed": cfg.ABSENT, "occurrence": 1,
                      "line": CONFIG_2048}]


def test_absent_mode_any_draft_runner_line_is_a_mismatch():
    assert ev.mismatches({}, ev.ABSENT, []) == []
    found = ev.mismatches({"draft_window_size": 2048}, ev.ABSENT, [LINE_2048, LINE_512])
    assert [(item["key"], item["occurrence"], item["observed"]) for item in found] == [
        ("draft_runner", 1, CONFIG_2048), ("draft_runner", 2, CONFIG_512)]
    assert found[0]["expected"] == "no draft-runner line (speculative decoding off)"


def test_receipt_lines_compare_like_journal_lines():
    receipt_line = {"line": CONFIG_NONE, "values": LINE_NONE["values"]}
    assert [item["key"] for item in ev.mismatches(EXPECT_2048, ev.REQUIRED, [receipt_line])] == \
        ["compact_cache", "draft_window_size"]


# --------------------------------------------------------------------------- completeness

@pytest.mark.parametrize("start_seen,after_config_seen,notices,result", [
    (True, True, [], ev.CONCLUSIVE),
    (True, True, [{"count": 1}], ev.LOST),       # a notice wins over everything
    (False, False, [{"count": 1}], ev.LOST),
    (False, True, [], ev.NO_START),
    (False, False, [], ev.NO_START),
    (True, False, [], ev.INCOMPLETE),
    (True, False, None, ev.INCOMPLETE),
])
def test_journal_completeness_truth_table(start_seen, after_config_seen, notices, result):
    assert ev.journal_completeness(start_seen, after_config_seen, notices) == result


# --------------------------------------------------------------------------- receipts

def receipt(**overrides):
    lines = [dict(LINE_2048, cursor="s=1;i=2", realtime_usec=5)]
    data = ev.make_receipt("sglang.service", NEW, 4242, {"draft_window_size": "2048", "compact_cache": "true"},
                           ev.REQUIRED, lines, ["/py", "--api-key", "********"], 1764410400.5)
    data.update(overrides)
    return data


def test_make_receipt_keeps_what_the_verification_saw():
    data = receipt()
    assert data == {
        "version": ev.RECEIPT_VERSION, "unit": "sglang.service", "invocation_id": NEW, "main_pid": 4242,
        "verified_at": 1764410400.5, "expect": {"draft_window_size": 2048, "compact_cache": True},
        "config_line_mode": "required",
        "config_lines": [{"line": CONFIG_2048, "values": LINE_2048["values"], "cursor": "s=1;i=2",
                          "realtime_usec": 5}],
        "journal_cursor": "s=1;i=2",  # none given: its last config line's
        "command": ["/py", "--api-key", "********"]}
    json.dumps(data)  # plain JSON
    assert ev.receipt_cursor(data) == "s=1;i=2"


def test_a_later_check_reads_the_journal_on_from_where_the_verification_stopped():
    read_on = ev.make_receipt("u", NEW, 1, {}, ev.ABSENT, [], None, 1.0, journal_cursor="s=1;i=9")
    assert ev.receipt_cursor(read_on) == "s=1;i=9"
    # a receipt of an earlier release, without journal_cursor: its last line's cursor, else the start
    assert ev.receipt_cursor({"config_lines": [{"cursor": "s=1;i=3"}]}) == "s=1;i=3"
    assert ev.receipt_cursor({"config_lines": []}) is None


@pytest.mark.parametrize("mode,expect,lines,compared", [
    (ev.ABSENT, {}, [], True),                              # "off" was checked
    (ev.REQUIRED, {"draft_window_size": 2048}, [LINE_2048], True),
    (ev.REQUIRED, {}, [LINE_2048], True),                   # a line was required and logged
    (ev.OPTIONAL, {"draft_window_size": 2048}, [LINE_2048], True),
    (ev.OPTIONAL, {}, [], False),                           # readiness only
    (ev.OPTIONAL, {}, [LINE_2048], False),                  # lines, but nothing expected of them
    (ev.OPTIONAL, {"draft_window_size": 2048}, [], False),
])
def test_a_receipt_records_only_what_was_compared(mode, expect, lines, compared):
    assert ev.compared_anything(mode, expect, lines) is compared


@pytest.mark.parametrize("mode,lines,usable", [
    ("required", [{"values": {}}], True), ("absent", [], True), ("optional", [{"values": {}}], True),
    ("optional", [], False), (None, [], False),
])
def test_a_receipt_without_a_comparison_proves_nothing(mode, lines, usable):
    data = {"unit": "u", "invocation_id": NEW, "config_line_mode": mode, "config_lines": lines}
    assert (ev.receipt_of(data, "u", NEW) is data) is usable


def test_write_is_atomic_mode_0644_and_read_back(tmp_path):
    path = ev.receipt_path(str(tmp_path / "receipts" / "deep"), "sglang.service")
    assert path == str(tmp_path / "receipts" / "deep" / "sglang.service.json")
    old_umask = os.umask(0o077)  # a strict umask must not make it unreadable
    try:
        ev.write_receipt(path, receipt())
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert ev.read_receipt(path) == receipt()
    assert os.listdir(os.path.dirname(path)) == ["sglang.service.json"]  # no temp file left
    ev.write_receipt(path, receipt(invocation_id=OLD))  # replaced whole
    assert ev.read_receipt(path)["invocation_id"] == OLD


def test_a_failed_write_leaves_the_old_receipt_and_no_temp_file(tmp_path):
    path = str(tmp_path / "sglang.service.json")
    ev.write_receipt(path, receipt())
    with pytest.raises(TypeError):
        ev.write_receipt(path, receipt(main_pid=object()))  # not JSON
    assert ev.read_receipt(path) == receipt()
    assert os.listdir(str(tmp_path)) == ["sglang.service.json"]


@pytest.mark.parametrize("content", [None, "", "not json", "[1, 2]", '{"version": 2, "unit": "sglang.service"}',
                                     '{"unit": "sglang.service"}'])
def test_read_receipt_of_nothing_or_garbage_is_none(tmp_path, content):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    assert ev.read_receipt(str(path)) is None


@pytest.mark.parametrize("unit,invocation,accepted", [
    ("sglang.service", NEW, True),
    ("sglang.service", OLD, False),        # another invocation of the same unit
    ("other.service", NEW, False),         # another unit
    ("sglang.service", "", False),
    ("sglang.service", None, False),
])
def test_receipt_of_never_accepts_another_invocation_or_unit(unit, invocation, accepted):
    data = receipt()
    assert (ev.receipt_of(data, unit, invocation) is data) is accepted
    if not accepted:
        assert ev.receipt_of(data, unit, invocation) is None


def test_receipt_of_nothing():
    assert ev.receipt_of(None, "sglang.service", NEW) is None
    assert ev.receipt_of({}, "sglang.service", NEW) is None
    assert ev.receipt_of(receipt(invocation_id=None), "sglang.service", None) is None


def test_a_receipt_someone_else_could_have_written_is_not_read(tmp_path):
    path = ev.receipt_path(str(tmp_path), "sglang.service")
    ev.write_receipt(path, receipt())
    assert ev.read_receipt(path) == receipt()
    os.chmod(path, 0o666)  # writable by anyone: no longer evidence
    assert ev.read_receipt(path) is None
    os.chmod(path, 0o644)
    assert ev.trusted_file(path)
    if os.geteuid() == 0:  # CI and the lab run as root
        os.chown(path, 4711, -1)  # owned by another user than root or the one checking
        assert not ev.trusted_file(path) and ev.read_receipt(path) is None
    assert not ev.trusted_file(str(tmp_path / "missing.json"))


def test_an_intent_coerces_what_ansible_passes():
    intent = ev.Intent({"draft_window_size": "2048", "compact_cache": "true"}, None, ("/py", "-m", "x"),
                       {"A": 1, "B": None, "C": True, "D": False})
    assert intent.expect == {"draft_window_size": 2048, "compact_cache": True} and intent.mode == ev.REQUIRED
    assert intent.command == ["/py", "-m", "x"]
    assert intent.environment == {"A": "1", "B": "", "C": "1", "D": "0"}  # as systemd sets them
    nothing = ev.Intent()
    assert (nothing.expect, nothing.mode, nothing.command, nothing.environment) == ({}, ev.OPTIONAL, None, None)


def test_judged_lines_are_the_receipts_then_the_journals_later_ones():
    kept = dict(LINE_2048, cursor="c:6")
    later = dict(LINE_NONE, cursor="c:30")
    receipt = {"config_lines": [kept]}
    assert ev.judged_lines(receipt, [dict(LINE_2048, cursor="c:6"), later]) == [kept, later]  # read twice: once
    assert ev.judged_lines(None, [later]) == [later]
    assert ev.judged_lines({"config_lines": []}, []) == []


@pytest.mark.parametrize("receipt,journal_lines,source", [
    (None, [LINE_2048], "journal"),
    (None, [], "journal"),
    ({"config_lines": [LINE_2048]}, [], "receipt"),
    ({"config_lines": [LINE_2048]}, [LINE_NONE], "receipt+journal"),
])
def test_evidence_source_names_the_receipt_whenever_it_counts(receipt, journal_lines, source):
    assert ev.evidence_source(receipt, journal_lines) == source
