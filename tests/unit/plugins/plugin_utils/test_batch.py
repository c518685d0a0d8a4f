# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Before a batch leaves the router: which leases are due for renewal, the slot asked for again, which of the
router's workers are the group's, rollout_min_healthy as a count. (The whole batch task, through the action:
tests/unit/plugins/action/test_sglang_rollout_action.py.)"""
import os
import time

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro
from ansible_collections.gpufleet.inference.plugins.plugin_utils import _batch


class Nodes(object):
    def __init__(self, answers=()):
        self.answers, self.calls = list(answers), []

    def __call__(self, host):
        nodes = self

        class Runner(object):
            @staticmethod
            def run(module, args):
                nodes.calls.append((host, module, args))
                return nodes.answers.pop(0) if len(nodes.answers) > 1 else (nodes.answers or [{}])[0]
        return Runner()


def run_of(tmp_path, **over):
    run = dict(run_dir=str(tmp_path), hosts=["a", "b", "c"], leases=True, lease_seconds=300, pending_lease_seconds=600,
               holder={"run_id": "r1"}, leases_taken_at=time.time() - 151)
    run.update(over)
    return run


HOSTVARS = dict((host, {"sglang_drift": {"prepared": {"lease": {"unit": "u", "directory": "/d"}}},
                        "rollout_lease": {"lease": {"generation": 2}}}) for host in "abc")


def test_leases_are_renewed_once_half_a_lease_passed_and_the_renewal_is_remembered(tmp_path):
    nodes = Nodes([{"failed": True, "msg": "taken over by sweep s1"}, {}])
    renewed = _batch.renew_waiting(nodes, run_of(tmp_path), ["a"], HOSTVARS, lambda value: value)
    assert renewed == [{"host": "b", "ok": False, "msg": "taken over by sweep s1"}, {"host": "c", "ok": True, "msg": None}]
    assert [args["holder"] for dummy, dummy2, args in nodes.calls] == [{"run_id": "r1", "generation": 2}] * 2
    assert os.path.exists(tmp_path / ".leases_renewed")
    assert _batch.renew_waiting(Nodes(), run_of(tmp_path), ["a"], HOSTVARS, lambda value: value) == []  # just now


@pytest.mark.parametrize("taken_ago, over, check_mode", [(100, {}, False), (151, {"leases": False}, False),
                                                         (151, {}, True)])
def test_no_renewal_before_half_a_lease_nor_for_a_run_without_leases_nor_in_check_mode(
        tmp_path, taken_ago, over, check_mode):
    nodes = Nodes()
    run = run_of(tmp_path, leases_taken_at=time.time() - taken_ago, **over)
    assert _batch.renew_waiting(nodes, run, ["a"], HOSTVARS, lambda v: v, check_mode) == []
    assert nodes.calls == []


def test_the_slot_is_asked_for_again_until_the_capacity_wait_is_over(monkeypatch):
    clock = {"now": 0.0}
    monkeypatch.setattr(_batch.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(_batch.time, "sleep", lambda s: clock.update(now=clock["now"] + s))
    run = dict(slot={"anchor": "a", "unit": "slot", "directory": "/d"}, pending_lease_seconds=600, holder={"run_id": "r1"},
               capacity_wait=12)
    nodes = Nodes([{"failed": True, "msg": "held by r9"}])
    assert _batch.take_slot(nodes, run)["failed"] and len(nodes.calls) == 4  # at 0, 5, 10 and 15 s
    nodes = Nodes([{"failed": True, "unreachable": True, "msg": "no route"}])
    assert _batch.take_slot(nodes, run)["unreachable"] and len(nodes.calls) == 1  # an unreachable anchor: at once


def test_the_groups_workers_are_found_by_any_address_of_their_host_and_nothing_else():
    hostvars = {"a": {"ansible_host": "10.0.0.1"}, "b": {"sglang_router_worker_url": "http://[fd00::2]:30000"},
                "c": {"ansible_host": "0.0.0.0"}}
    listed = [{"url": "http://10.0.0.1:30000/"}, {"url": "http://[fd00::2]:30000"}, {"url": "http://10.0.0.9:30000"}]
    assert _batch.group_workers(listed, ["a", "b", "c"], hostvars) == {
        "http://10.0.0.1:30000": "a", "http://[fd00::2]:30000": "b"}


@pytest.mark.parametrize("spec, size, expected", [(2, 4, 2), ("50%", 4, 2), ("75%", 5, 4), ("0%", 3, 0)])
def test_min_healthy_is_a_count_or_a_share_of_the_group_rounded_up(spec, size, expected):
    assert _batch.required_count(spec, size)[1] == expected


def test_a_bad_min_healthy_is_refused():
    with pytest.raises(ro.RolloutError):
        _batch.required_count("many", 4)
