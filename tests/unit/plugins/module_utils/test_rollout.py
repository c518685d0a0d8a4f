# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_rollout: the rollout's inputs, run ids, the fleet lock's decisions, records and the table."""
import datetime
import os
import re

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro


@pytest.mark.parametrize("given,expected", [
    ([1, "25%"], [1, "25%"]),
    (2, [2]),
    ("[2]", [2]),             # -e rollout_batches=[2]
    ("[1, '25%']", [1, "25%"]),
    ("1,50%", [1, "50%"]),
    ("3", [3]),
    ([1.0, " 10 % "], [1, "10%"]),
])
def test_batches_accept_every_honest_spelling(given, expected):
    assert ro.parse_batches(given) == expected


@pytest.mark.parametrize("given,message", [
    ([], "non-empty list"),
    ({"a": 1}, "non-empty list"),
    ([0], r"rollout_batches\[0\] must be 1 or more"),
    ([-1], r"rollout_batches\[0\] must be 1 or more"),
    (["150%"], r"rollout_batches\[0\] percentage must be above 0..100"),
    (["0%"], r"percentage must be above 0..100"),
    (["abc"], "must be a number or a percentage"),
    ([True], "must be a number or a percentage"),
    ("[1, ", "is not a list like"),
])
def test_bad_batches_fail_naming_the_variable(given, message):
    with pytest.raises(ro.RolloutError, match=message):
        ro.parse_batches(given)


@pytest.mark.parametrize("value,expected", [(0, 0), ("2", 2), ("25%", "25%"), ("0%", "0%")])
def test_min_healthy_counts(value, expected):
    assert ro.parse_count(value, "rollout_min_healthy") == expected


def test_batch_sizes_follow_ansible_serial():
    assert ro.batch_sizes([1, "25%"], 8) == [1, 2, 2, 2, 1]
    assert ro.batch_sizes([1, "25%"], 3) == [1, 1, 1]   # 25 % of 3 rounds down, to at least 1
    assert ro.batch_sizes([2], 5) == [2, 2, 1]
    assert ro.batch_sizes([1, "100%"], 4) == [1, 3]


def test_run_ids_are_unique_within_a_second():
    moment = datetime.datetime(2026, 12, 1, 10, 0, 0, tzinfo=datetime.timezone.utc)
    ids = {ro.new_run_id(moment) for dummy in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"20261201T100000Z-[0-9a-f]{6}", run_id) for run_id in ids)
    assert ro.check_run_id("20261201T100000Z-abcdef")
    for bad in ("../x", "", "a b", "-x"):
        with pytest.raises(ro.RolloutError):
            ro.check_run_id(bad)


def test_iso_has_milliseconds_and_parses_back():
    text = ro.iso()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", text)
    assert ro.parse_iso(text) is not None and ro.parse_iso("2026-12-01T10:00:00Z") is not None
    assert ro.parse_iso("yesterday") is None


def test_write_json_is_atomic_and_readable(tmp_path):
    path = tmp_path / "a" / "b.json"
    ro.write_json(str(path), {"x": 1})
    assert ro.read_json(str(path)) == {"x": 1}
    assert [p.name for p in path.parent.iterdir()] == ["b.json"]  # no temporary left
    assert ro.read_json(str(tmp_path / "missing.json"), "default") == "default"
    (tmp_path / "bad.json").write_text("{not json")
    assert ro.read_json(str(tmp_path / "bad.json")) is None


# --------------------------------------------------------------------------- records

def test_summary_counts_agree_with_the_records():
    records = [{"host": "b", "status": "updated"}, {"host": "a", "status": "failed"},
               {"host": "c", "status": "updated"}]
    summary = ro.summarize({"run_id": "R"}, records)
    assert summary["counts"] == {"updated": 2, "failed": 1}
    assert [r["host"] for r in summary["hosts"]] == ["a", "b", "c"]


def test_table_one_line_per_host():
    text = ro.table([
        {"host": "gpu-2", "status": "updated", "old_invocation": "aaaaaaaa1111", "new_invocation": "bbbbbbbb2222",
         "time_to_ready": 312.46, "observed": {"block_size": 16, "draft_window_size": 2048, "compact_cache": True}},
        {"host": "gpu-1", "status": "unchanged (verified)", "old_invocation": "cccccccc3333",
         "config_line_mode": "absent"},
    ])
    lines = text.splitlines()
    assert lines[0].split() == ["host", "status", "invocation", "(old", "->", "new)", "ready", "config", "seen"]
    assert lines[1].startswith("gpu-1") and lines[1].rstrip().endswith("off")
    assert "aaaaaaaa -> bbbbbbbb" in lines[2] and "312.5s" in lines[2]
    assert "draft_window_size=2048, block_size=16, compact_cache=True" in lines[2]


def test_a_serving_groups_node_is_recorded_with_its_group_and_shown_as_its_node():
    record = ro.build_record("gpu-c02", "prepared", {"drift": {"invocation_id": "i"}, "plan": {
        "action": "apply", "group": "k26_2node", "head": "gpu-c01"}}, {"run_id": "r"})
    assert record["group"] == {"name": "k26_2node", "head": "gpu-c01"} and record["status"] == "pending"
    head = dict(record, host="gpu-c01", observed={"draft_window_size": 2048})
    lines = ro.table([dict(record, status="updated"), head]).splitlines()
    assert lines[1].startswith("gpu-c01") and lines[1].endswith("draft_window_size=2048")
    assert lines[2].startswith("gpu-c02") and lines[2].endswith("node of k26_2node (head gpu-c01)")
    assert "group" not in ro.build_record("gpu-1", "prepared", {"plan": {"action": "keep"}}, {"run_id": "r"})


def test_an_unverified_process_is_never_recorded_as_verified_or_unchanged():
    """sglang_verify off: the verification is `not_verified` with no invocation; whether the host
    changed is what the step did (restarted), never a comparison with the OLD invocation."""
    run = {"run_id": "r1"}
    drift = {"invocation_id": "aaaa", "in_sync": False}
    unverified = {"verdict": "not_verified", "verified": False, "invocation_id": None, "restarted": True}
    at_verified = ro.build_record("gpu-1", "verified", {"drift": drift, "verified": unverified, "router": True}, run)
    assert at_verified["status"] == "not verified, not rejoined" and at_verified["in_router"] is False
    assert at_verified["status"] in ro.STOPPED_STATUSES
    done = ro.build_record("gpu-1", "rejoined", {"drift": drift, "verified": unverified, "router": True}, run)
    assert done["status"] == "updated (not verified)" and done["restarted"] is True and done["verified"] is False
    assert done["new_invocation"] is None and done["last_good_saved"] is False and "not verified" in done["last_good_note"]
    assert done["status"] in ro.CONTINUE_STATUSES
    same = ro.build_record("gpu-1", "rejoined", {"drift": drift, "verified": dict(unverified, restarted=False)}, run)
    assert same["status"] == "unchanged (not verified)" and same["restarted"] is False
    verified = {"verdict": "pass", "verified": True, "invocation_id": "bbbb", "observed": {}}
    assert ro.build_record("gpu-1", "rejoined", {"drift": drift, "verified": verified}, run)["status"] == "updated"
    kept = dict(verified, invocation_id="aaaa")
    assert ro.build_record("gpu-1", "rejoined", {"drift": drift, "verified": kept}, run)["status"] == \
        "unchanged (verified)"


def test_summary_text_is_the_summary_with_one_line_per_host():
    import json
    when = datetime.datetime(2026, 12, 2, 7, 0, 0)
    records = [{"host": "gpu-%d" % n, "status": "updated", "steps": [{"step": "prepared"}], "at": when,
                "note": "quotes \" and\nnewline"} for n in (2, 1, 10)]
    summary = ro.summarize({"run_id": "r1", "hosts": ["gpu-1", "gpu-2", "gpu-10"]}, records)
    text = ro.summary_text(summary)
    assert text.endswith("}\n")
    assert json.loads(text) == json.loads(json.dumps(summary, default=str))  # nothing lost; a date as its text
    host_lines = [line for line in text.splitlines() if line.startswith('    {"at"')]
    assert [json.loads(line.rstrip(","))["host"] for line in host_lines] == ["gpu-1", "gpu-10", "gpu-2"]
    assert '"run": {\n    "hosts": [' in text  # the run is indented


@pytest.mark.parametrize("summary", [
    {"run": {}, "counts": {}, "hosts": []},
    {"hosts": [{"host": "gpu-1"}]},
    {"run": {"run_id": "r"}, "hosts": "not a list"},
])
def test_summary_text_edge_cases_stay_json(summary):
    import json
    assert json.loads(ro.summary_text(summary)) == summary


def test_record_step_keeps_summary_readable_and_complete(tmp_path):
    import json
    run = {"run_id": "r1", "run_dir": str(tmp_path / "r1"), "hosts": ["gpu-1", "gpu-2"]}
    os.makedirs(run["run_dir"])
    with open(os.path.join(run["run_dir"], "run.json"), "w") as handle:
        json.dump({"run_id": "r1"}, handle)
    ro.record_step(run, "gpu-1", "prepared", {"drift": {"in_sync": True}})
    ro.record_step(run, "gpu-2", "prepared", {"drift": {"in_sync": False}})
    ro.record_step(run, "gpu-2", "draining", {})
    summary = json.loads((tmp_path / "r1" / "summary.json").read_text())
    assert [r["host"] for r in summary["hosts"]] == ["gpu-1", "gpu-2"]
    assert summary["hosts"][1]["step"] == "draining"
    assert sum(summary["counts"].values()) == 2


def test_seconds_are_whole_numbers_named_when_wrong():
    assert ro.parse_seconds("300", "x") == 300 and ro.parse_seconds(0, "x") == 0
    assert ro.parse_seconds(5.0, "x") == 5 and ro.parse_seconds("5.0", "x") == 5  # YAML's 5.0 is whole
    for bad in ("5m", -1, True, "1.5", 1.5, None, "nan", float("inf"), ""):
        with pytest.raises(ro.RolloutError, match="x must be a whole number of seconds"):
            ro.parse_seconds(bad, "x")
    with pytest.raises(ro.RolloutError, match="10 or more"):
        ro.parse_seconds(5, "x", minimum=10)
