# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A run's plan from what the fleet holds: leases, records, the router - on any controller."""
import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _fleet

HOSTS = ["gpu-1", "gpu-2", "gpu-3"]
URL = "http://10.0.0.%d:30000"
REQUEST = {"run_id": "r-new", "requested": None, "session": "s-new", "takeover": False, "break_lease": False}


def fact(n, in_sync=False, lease=None, record=None, listed=True, digest="d-new", router=True):
    return {"lease": lease, "record": record, "in_sync": in_sync, "digest": digest,
            "listed": (URL % n) if listed else None, "router": router}


def facts(**changes):
    base = dict((host, fact(n + 1)) for n, host in enumerate(HOSTS))
    base.update(changes)
    return base


def live(run="r-old", session="s-old"):
    return {"live": True, "session": session, "text": "rollout %s on bastion-2 by bob, expires in 200s" % run}


def left(run="r-old", step="applying", digest="d-new", **more):
    return dict({"kind": "rollout", "run_id": run, "step": step, "status": "in progress", "intent_digest": digest,
                 "drained_by": run}, **more)


def test_a_new_run_changes_what_differs_and_keeps_what_is_in_sync():
    planned = _fleet.plan(HOSTS, facts(**{"gpu-2": fact(2, in_sync=True)}), REQUEST)
    assert planned["run_id"] == "r-new" and not planned["resumed"]
    assert [planned["hosts"][host]["action"] for host in HOSTS] == ["apply", "keep", "apply"]
    assert planned["hosts"]["gpu-1"]["drain_url"] == URL % 1


def test_a_host_leased_by_a_live_run_refuses_the_run_naming_it():
    with pytest.raises(_fleet.PlanError) as refused:
        _fleet.plan(HOSTS, facts(**{"gpu-3": fact(3, lease=live())}), REQUEST)
    assert "gpu-3 is leased by rollout r-old on bastion-2 by bob" in str(refused.value)
    assert "Nothing was changed" in str(refused.value)
    # this session's own lease (a re-run of a task) and an expired one do not refuse
    mine = dict(live(), session="s-new")
    expired = dict(live(), live=False)
    assert _fleet.plan(HOSTS, facts(**{"gpu-2": fact(2, lease=mine), "gpu-3": fact(3, lease=expired)}), REQUEST)
    broken = _fleet.plan(HOSTS, facts(**{"gpu-3": fact(3, lease=live())}), dict(REQUEST, break_lease=True))
    assert "breaking the live lease" in broken["notes"][0]


def test_an_interrupted_run_with_the_same_intent_is_resumed_under_its_run_id():
    # r-old drained gpu-1 and died; its lease expired; the same settings come again from another controller
    planned = _fleet.plan(HOSTS, facts(**{"gpu-1": fact(1, in_sync=True, listed=False, record=left())}), REQUEST)
    assert planned["run_id"] == "r-old" and planned["resumed"] and "resuming run r-old" in planned["notes"][0]
    entry = planned["hosts"]["gpu-1"]
    assert entry["action"] == "recover" and entry["drained_by"] == "r-old" and entry["drain_url"] is None


def test_a_re_run_with_other_settings_says_what_differs_and_changes_nothing():
    stale = left(digest="d-old")
    with pytest.raises(_fleet.PlanError) as refused:
        _fleet.plan(HOSTS, facts(**{"gpu-1": fact(1, record=stale)}), REQUEST)
    text = str(refused.value)
    assert "gpu-1 (left at step applying by run r-old with settings d-old; this run's settings are d-new)" in text
    assert "rollout_takeover=true" in text
    # explicit: a new run brings that host to the new settings
    planned = _fleet.plan(HOSTS, facts(**{"gpu-1": fact(1, record=stale)}), dict(REQUEST, takeover=True))
    assert planned["run_id"] == "r-new" and not planned["resumed"] and "replacing the interrupted r-old" in planned["notes"][0]


def test_a_finished_or_unknown_run_id_is_never_reopened():
    with pytest.raises(_fleet.PlanError, match="never reopened"):
        _fleet.plan(HOSTS, facts(), dict(REQUEST, requested="r-done"))
    planned = _fleet.plan(HOSTS, facts(**{"gpu-2": fact(2, record=left())}), dict(REQUEST, requested="r-old"))
    assert planned["run_id"] == "r-old"


def test_only_the_collections_own_drain_is_put_back():
    done = {"kind": "rollout", "run_id": "r-old", "step": "rejoined", "status": "updated", "drained_by": None}
    planned = _fleet.plan(HOSTS, facts(**{
        "gpu-1": fact(1, in_sync=True, listed=False, record=done),  # an operator took it out afterwards
        "gpu-2": fact(2, in_sync=True, listed=False, record=dict(done, step="failed", status="failed",
                                                                 drained_by="r-old")),  # the collection left it out
    }), REQUEST)
    assert planned["hosts"]["gpu-1"]["action"] == "left_out" and "not taken out by this collection" in \
        planned["hosts"]["gpu-1"]["reason"]
    assert planned["hosts"]["gpu-2"]["action"] == "recover" and planned["hosts"]["gpu-2"]["drained_by"] == "r-old"


def test_without_a_router_membership_is_not_judged():
    planned = _fleet.plan(HOSTS, dict((host, fact(n + 1, in_sync=True, listed=False, router=False))
                                      for n, host in enumerate(HOSTS)), REQUEST)
    assert set(entry["action"] for entry in planned["hosts"].values()) == {"keep"}


@pytest.mark.parametrize("workers, wanted, previous, addresses, found", [
    ([{"url": URL % 1}], URL % 1, None, (), URL % 1),
    # a port change: the router still has the old URL, which the collection put in last
    ([{"url": "http://10.0.0.1:30001"}], URL % 1, "http://10.0.0.1:30001", (), "http://10.0.0.1:30001"),
    # not recorded, but the only worker at the host's address
    ([{"url": "http://10.0.0.1:30001/"}, {"url": URL % 2}], URL % 1, None, ("10.0.0.1",), "http://10.0.0.1:30001"),
    ([{"url": "http://10.0.0.1:1"}, {"url": "http://10.0.0.1:2"}], URL % 1, None, ("10.0.0.1",), None),  # ambiguous
    ([], URL % 1, None, ("10.0.0.1",), None),
    ([{"url": "http://[fd00::1]:30000"}], None, None, ("[fd00::1]",), "http://[fd00::1]:30000"),
])
def test_the_worker_to_drain_is_the_one_the_router_has(workers, wanted, previous, addresses, found):
    assert _fleet.router_url_of(workers, wanted, previous, addresses) == found


def test_the_capacity_guard_counts_the_group_and_names_what_is_unhealthy():
    group = {URL % 1: "gpu-1", URL % 2: "gpu-2", URL % 3: "gpu-3", URL % 4: "gpu-4"}
    healthy = {URL % 1: (True, "answers"), URL % 2: (True, "answers"), URL % 3: (False, "/generate: refused")}
    ok, remaining, unhealthy = _fleet.capacity(group, healthy, [URL % 1], required=2)
    assert not ok and remaining == [URL % 2]
    assert unhealthy == ["gpu-3 %s: /generate: refused" % (URL % 3), "gpu-4 %s: not probed" % (URL % 4)]
    assert _fleet.capacity(group, healthy, [URL % 1], required=1)[0]


def test_the_intent_digest_follows_the_settings_and_never_the_key():
    prepared = {"intent": {"expect": {"draft_window_size": 2048}}, "unit_text": "[Unit]\n", "journald_text": "j",
                "config_file": {"path": "/etc/sglang/sglang.yaml"}}
    digest = _fleet.intent_digest(prepared)
    assert digest == _fleet.intent_digest(dict(prepared)) and len(digest) == 16
    assert digest != _fleet.intent_digest(dict(prepared, intent={"expect": {"draft_window_size": 4096}}))


def test_a_host_left_mid_change_outside_the_run_refuses_it_naming_the_host():
    # --limit leaves out the canary an interrupted run left drained: nothing else may be drained first
    outside = {"gpu-0": {"record": left(step="draining")}, "gpu-9": {"record": {"kind": "rollout", "step": "rejoined"}}}
    with pytest.raises(_fleet.PlanError) as refused:
        _fleet.plan(HOSTS, facts(), dict(REQUEST, outside=outside))
    assert "left gpu-0 (run r-old, step draining) mid-change" in str(refused.value)
    assert "gpu-9" not in str(refused.value) and "Nothing was changed" in str(refused.value)
    # a host outside the run that cannot be read is named, and does not hold the run
    planned = _fleet.plan(HOSTS, facts(), dict(REQUEST, outside={"gpu-0": {"unreachable": "Connection refused"}}))
    assert planned["run_id"] == "r-new" and "gpu-0 (of the group, not in this run) could not be read" in \
        planned["notes"][0]


def test_a_resumed_run_keeps_what_it_did_before_it_was_interrupted():
    done = {"kind": "rollout", "run_id": "r-old", "step": "rejoined", "status": "updated",
            "old_invocation": "a", "new_invocation": "b", "intent_digest": "d-new"}
    planned = _fleet.plan(HOSTS, facts(**{"gpu-1": fact(1, in_sync=True, record=done),
                                          "gpu-2": fact(2, in_sync=True, listed=False, record=left())}), REQUEST)
    assert planned["resumed"] and planned["hosts"]["gpu-1"]["action"] == "keep"
    assert planned["hosts"]["gpu-1"]["earlier"] == {"status": "updated", "old_invocation": "a", "new_invocation": "b"}
    # a new run carries nothing of an earlier run
    fresh = _fleet.plan(HOSTS, facts(**{"gpu-1": fact(1, in_sync=True, record=done)}), REQUEST)
    assert not fresh["resumed"] and "earlier" not in fresh["hosts"]["gpu-1"]


def test_a_dead_runs_leases_of_hosts_it_had_not_reached_do_not_refuse_the_run_that_resumes_it():
    # r-old drained gpu-1 (its lease expired: the controller is gone); gpu-2 and gpu-3 it had leased for later
    # batches, for longer - still live
    expired = dict(live(), live=False, holder={"run_id": "r-old"})
    pending = dict(live(), holder={"run_id": "r-old"})
    planned = _fleet.plan(HOSTS, facts(**{"gpu-1": fact(1, in_sync=True, listed=False, record=left(), lease=expired),
                                          "gpu-2": fact(2, lease=pending), "gpu-3": fact(3, lease=pending)}), REQUEST)
    assert planned["resumed"] and planned["takeover_runs"] == ["r-old"]
    # while the canary's lease is live (its controller renews it) the run is alive: refused
    with pytest.raises(_fleet.PlanError, match="gpu-1 is leased by"):
        _fleet.plan(HOSTS, facts(**{"gpu-1": fact(1, in_sync=True, listed=False, record=left(),
                                                  lease=dict(live(), holder={"run_id": "r-old"})),
                                    "gpu-2": fact(2, lease=pending)}), REQUEST)
    # a live run that left nothing mid-change still refuses
    with pytest.raises(_fleet.PlanError, match="gpu-2 is leased by"):
        _fleet.plan(HOSTS, facts(**{"gpu-2": fact(2, lease=pending)}), REQUEST)


def test_the_batch_slot_is_on_the_groups_first_host_that_answered_and_named_by_the_group():
    slot = _fleet.batch_slot(["gpu-3", "gpu-1", "gpu-2"], reachable=["gpu-2", "gpu-3"])
    assert slot["anchor"] == "gpu-2" and slot["unit"].startswith("gpufleet-batch-")
    assert slot == _fleet.batch_slot(["gpu-2", "gpu-1", "gpu-3"], ["gpu-3", "gpu-2"])  # any order, any controller
    assert _fleet.batch_slot(["gpu-1", "gpu-2"], ["gpu-1"])["unit"] != slot["unit"]
    assert _fleet.batch_slot(["gpu-1"], [])["anchor"] is None


def test_a_run_that_holds_every_host_of_its_group_takes_no_batch_slot():
    group = ["gpu-1", "gpu-2", "gpu-3"]
    assert _fleet.batch_slot(group, group, run_hosts=["gpu-3", "gpu-2", "gpu-1"])["anchor"] is None
    assert _fleet.batch_slot(group, group, run_hosts=["gpu-1", "gpu-2"])["anchor"] == "gpu-1"  # --limit: shared


def test_a_holder_provably_gone_binds_nothing_and_its_run_is_taken_over():
    # a Ctrl-C'd run on this controller: its leases are live, but its process ended
    gone = dict(live(), gone=True, holder={"run_id": "r-old"})
    planned = _fleet.plan(HOSTS, facts(**{"gpu-1": fact(1, in_sync=True, listed=False, record=left(), lease=gone),
                                          "gpu-2": fact(2, lease=gone)}), REQUEST)
    assert planned["resumed"] and planned["takeover_runs"] == ["r-old"]
    assert any("its ansible-playbook on this controller ended" in note for note in planned["notes"])


def test_a_serving_host_an_operator_took_out_is_changed_and_left_out_a_new_one_joins():
    serving = dict(fact(1, listed=False), serving=True)
    fresh = dict(fact(2, listed=False), serving=False)
    ours = dict(fact(3, listed=False, in_sync=True, record=left(step="failed")), serving=True)
    planned = _fleet.plan(HOSTS, facts(**{"gpu-1": serving, "gpu-2": fresh, "gpu-3": ours}), REQUEST)["hosts"]
    assert planned["gpu-1"]["action"] == "apply" and planned["gpu-1"]["stay_out"] is True
    assert "an operator's choice" in planned["gpu-1"]["reason"]
    assert "stay_out" not in planned["gpu-2"]                      # never served: it joins
    assert planned["gpu-3"]["action"] == "recover" and "stay_out" not in planned["gpu-3"]  # ours: put back


def test_a_host_left_mid_change_that_still_differs_is_changed_and_recorded_as_recovering():
    planned = _fleet.plan(HOSTS, facts(**{"gpu-1": fact(1, listed=False, record=left())}), REQUEST)
    entry = planned["hosts"]["gpu-1"]
    assert entry["action"] == "apply" and "by run r-old (step applying)" in entry["recovering"]
    assert "stay_out" not in entry  # ours: put back


def dead_lease(run="r-old", digest="d-new", **more):
    return dict({"live": False, "released": False, "session": "s-old", "intent_digest": digest,
                 "holder": {"kind": "rollout", "run_id": run}, "text": "rollout %s, expired" % run}, **more)


def test_a_run_that_died_before_its_finish_is_resumed_even_when_no_host_is_mid_change():
    # its controller died after the canary was done (an orphaned worker finished it): its leases were never
    # released; the same settings resume it, the canary counted as done
    done = {"kind": "rollout", "run_id": "r-old", "step": "rejoined", "status": "updated", "intent_digest": "d-new"}
    planned = _fleet.plan(HOSTS, facts(**{"gpu-1": fact(1, in_sync=True, record=done, lease=dead_lease()),
                                          "gpu-2": fact(2, lease=dead_lease()), "gpu-3": fact(3, lease=dead_lease())}),
                          REQUEST)
    assert planned["run_id"] == "r-old" and planned["resumed"] and planned["takeover_runs"] == ["r-old"]
    assert "it ended before its finish" in planned["notes"][0]
    assert planned["hosts"]["gpu-1"]["earlier"]["status"] == "updated"
    assert [planned["hosts"][h]["action"] for h in HOSTS] == ["keep", "apply", "apply"]


def test_other_settings_replace_a_dead_run_that_changed_nothing_yet_and_a_released_lease_is_history():
    planned = _fleet.plan(HOSTS, facts(**{"gpu-2": fact(2, lease=dead_lease(digest="d-old"))}), REQUEST)
    assert planned["run_id"] == "r-new" and not planned["resumed"] and planned["takeover_runs"] == ["r-old"]
    assert "replacing the interrupted r-old: gpu-2 (left leased by run r-old" in planned["notes"][0]
    finished = _fleet.plan(HOSTS, facts(**{"gpu-2": fact(2, lease=dead_lease(released=True))}), REQUEST)
    assert finished["run_id"] == "r-new" and finished["takeover_runs"] == [] and finished["notes"] == []
    with pytest.raises(_fleet.PlanError, match="never reopened"):
        _fleet.plan(HOSTS, facts(**{"gpu-2": fact(2, lease=dead_lease(released=True))}),
                    dict(REQUEST, requested="r-old"))


GROUPS = {"g": {"head": "gpu-1", "followers": ["gpu-2"]}}


def test_a_serving_group_whose_follower_differs_is_changed_as_one_and_names_why():
    planned = _fleet.plan(HOSTS, facts(**{"gpu-1": fact(1, in_sync=True), "gpu-2": fact(2, listed=False, router=False),
                                          "gpu-3": fact(3, in_sync=True)}), REQUEST)["hosts"]
    _fleet.group_plan(planned, GROUPS)
    assert [planned[host]["action"] for host in HOSTS] == ["apply", "apply", "keep"]
    assert planned["gpu-1"]["reason"] == "serving group g restarts as one (gpu-2: settings differ)"
    assert (planned["gpu-1"]["group"], planned["gpu-2"]["head"]) == ("g", "gpu-1") and "group" not in planned["gpu-3"]
    assert not planned["gpu-1"].get("stay_out")


def test_a_serving_group_in_sync_is_kept_and_one_left_mid_change_is_recovered():
    in_sync = facts(**{"gpu-1": fact(1, in_sync=True), "gpu-2": fact(2, in_sync=True, listed=False, router=False)})
    planned = _fleet.plan(HOSTS, in_sync, REQUEST)["hosts"]
    assert [_fleet.group_plan(planned, GROUPS)[host]["action"] for host in HOSTS[:2]] == ["keep", "keep"]
    in_sync["gpu-2"] = fact(2, in_sync=True, listed=False, router=False, record=left(run="r-new"))
    planned = _fleet.plan(HOSTS, in_sync, dict(REQUEST, session="s-new"))["hosts"]
    assert [_fleet.group_plan(planned, GROUPS)[host]["action"] for host in HOSTS[:2]] == ["recover", "recover"]


def test_a_groups_head_an_operator_took_out_is_changed_with_its_group_and_left_out():
    planned = _fleet.plan(HOSTS, facts(**{"gpu-1": fact(1, in_sync=True, listed=False),
                                          "gpu-2": fact(2, listed=False, router=False)}), REQUEST)["hosts"]
    assert planned["gpu-1"]["action"] == "left_out"
    _fleet.group_plan(planned, GROUPS)
    assert planned["gpu-1"]["action"] == "apply" and planned["gpu-1"]["stay_out"] is True
