# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""verify.yml's report: one line per host, the report files, and a verdict that never lies."""
import json

import pytest

import fakes
from ansible_collections.gpufleet.inference.plugins.action import sglang_drift_report as action_mod

IN_SYNC = {"host": "gpu-1", "verdict": "in_sync", "in_sync": True, "invocation_id": "i1", "differences": [],
           "changed": False, "invocation": {"module_args": {}}}
DRIFTED = {"host": "gpu-2", "verdict": "drifted", "in_sync": False, "invocation_id": "i2",
           "blocking": ["effective unit ExecStart --w set by drop-in(s) /etc/systemd/system/sglang.service.d/o.conf"],
           "differences": [{"what": "config line", "key": "draft_window_size", "expected": 2048, "observed": 512}]}
UNVERIFIED = {"host": "gpu-3", "verdict": "unverified", "in_sync": False, "invocation_id": "i3", "differences": [],
              "unverified_reason": "the journal no longer holds the start of invocation i3"}


@pytest.fixture
def shown(monkeypatch):
    lines = []
    monkeypatch.setattr(action_mod.display, "display", lambda msg, *a, **k: lines.append(msg))
    return lines


def report(tmp_path, drifts, **args):
    hostvars = dict((name, {"sglang_drift": drift} if drift else {}) for name, drift in drifts.items())
    action = fakes.make_action(action_mod, dict(results_dir=str(tmp_path), **args))
    return action.run(task_vars={"hostvars": hostvars, "ansible_play_hosts_all": list(drifts)})


def test_all_in_sync(tmp_path, shown):
    result = report(tmp_path, {"gpu-1": IN_SYNC})
    assert not result.get("failed") and result["changed"] is False
    assert shown == ["gpu-1: in sync (invocation i1)"]
    summary = json.loads((tmp_path / result["run_dir"].rsplit("/", 1)[1] / "summary.json").read_text())
    assert summary["in_sync"] == ["gpu-1"] and summary["drifted"] == []
    assert "invocation" not in summary["hosts"][0] and "changed" not in summary["hosts"][0]


def test_drift_unverified_and_unchecked_fail_with_their_reasons(tmp_path, shown):
    result = report(tmp_path, {"gpu-1": IN_SYNC, "gpu-2": DRIFTED, "gpu-3": UNVERIFIED, "gpu-4": None})
    assert result["failed"] and result["drifted"] == ["gpu-2", "gpu-3", "gpu-4"]
    assert "gpu-2: DRIFTED (invocation i2); config line draft_window_size: expected 2048, observed 512; blocking: " \
           "effective unit ExecStart --w set by drop-in(s) /etc/systemd/system/sglang.service.d/o.conf" in shown
    assert "gpu-3: UNVERIFIED (invocation i3); the journal no longer holds the start of invocation i3" in shown
    assert any(line.startswith("gpu-4: NOT CHECKED") for line in shown)
    assert result["msg"].startswith("Drift on gpu-2, gpu-3, gpu-4")
    run_dir = tmp_path / result["run_dir"].rsplit("/", 1)[1]
    expected = ["gpu-1.json", "gpu-2.json", "gpu-3.json", "gpu-4.json", "summary.json"]
    assert sorted(p.name for p in run_dir.iterdir()) == expected


def test_accept_unverified(tmp_path, shown):
    result = report(tmp_path, {"gpu-1": IN_SYNC, "gpu-3": UNVERIFIED}, accept_unverified=True)
    assert not result.get("failed") and result["in_sync"] == ["gpu-1", "gpu-3"]


# ------------------------------------------------------------------ a serving group: one line with its nodes

GROUP = {"name": "k26_2node", "head": "gpu-c01", "followers": ["gpu-c02"], "ranks": {"gpu-c01": 0, "gpu-c02": 1}}
HEAD_ARGV = ["python", "-m", "sglang.launch_server", "--model-path", "/m", "--host", "10.0.0.1",
             "--speculative-draft-window-size", "2048", "--nnodes", "2", "--node-rank", "0"]
NODE_ARGV = ["python", "-m", "sglang.launch_server", "--model-path", "/m", "--host", "10.0.0.2",
             "--speculative-draft-window-size", "2048", "--nnodes", "2", "--node-rank", "1"]


def node(host, argv, rank, **over):
    return dict(IN_SYNC, host=host, invocation_id="i-" + host, command=argv,
                prepared={"group": dict(GROUP, rank=rank)}, **over)


def test_a_serving_group_in_sync_is_one_line_with_its_nodes(tmp_path, shown):
    result = report(tmp_path, {"gpu-1": IN_SYNC, "gpu-c01": node("gpu-c01", HEAD_ARGV, 0),
                               "gpu-c02": node("gpu-c02", NODE_ARGV, 1)})
    assert not result.get("failed"), result
    assert shown == ["gpu-1: in sync (invocation i1)",
                     "serving group k26_2node (gpu-c01 rank 0, gpu-c02 rank 1): in sync | gpu-c01: in sync (invocation "
                     "i-gpu-c01) | gpu-c02: in sync (invocation i-gpu-c02)"]
    assert result["groups"] == [{"name": "k26_2node", "nodes": ["gpu-c01", "gpu-c02"], "in_sync": True,
                                 "differences": []}]


def test_a_follower_running_other_arguments_than_its_head_drifts_the_whole_group(tmp_path, shown):
    other = [word if word != "2048" else "1024" for word in NODE_ARGV]
    result = report(tmp_path, {"gpu-c01": node("gpu-c01", HEAD_ARGV, 0), "gpu-c02": node("gpu-c02", other, 1)})
    assert result["failed"] and result["drifted"] == ["gpu-c01", "gpu-c02"]
    assert shown == ["serving group k26_2node (gpu-c01 rank 0, gpu-c02 rank 1): DRIFTED | gpu-c01: in sync (invocation "
                     "i-gpu-c01) | gpu-c02: in sync (invocation i-gpu-c02) | gpu-c02 (rank 1) runs other arguments than "
                     "its head gpu-c01: --speculative-draft-window-size: head 2048, node 1024"]
    assert "gpu-c02 (rank 1) runs other arguments than its head gpu-c01" in result["msg"]


def test_a_node_left_out_of_the_run_leaves_its_group_unjudged(tmp_path, shown):
    result = report(tmp_path, {"gpu-c01": node("gpu-c01", HEAD_ARGV, 0)})
    assert not result.get("failed")  # the head itself is in sync
    assert shown[0].endswith("NOT JUDGED (a node was not checked) | gpu-c01: in sync (invocation i-gpu-c01) | gpu-c02: "
                             "NOT CHECKED (not in this run)")
