# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's controller side: inputs, the run's plan from what the fleet holds (hosts' leases and
records, the router), all-or-none leases, the capacity guard over the group, the end, the status view -
with the copy of the records on real files under tmp_path."""
import json
import re

import pytest

import fakes
from ansible_collections.gpufleet.inference.plugins.action import sglang_rollout as action_mod
from ansible_collections.gpufleet.inference.plugins.plugin_utils import _batch as batch_mod
from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro
from ansible_collections.gpufleet.inference.plugins.module_utils._hostpath import CRITICAL_PATH_MODULES
from ansible_collections.gpufleet.inference.plugins.module_utils._router import RouterError

HOSTS = ["gpu-1", "gpu-2"]
URL = {"gpu-1": "http://10.0.0.1:30000", "gpu-2": "http://10.0.0.2:30000", "gpu-3": "http://10.0.0.3:30000",
       "gpu-4": "http://10.0.0.4:30000"}
DRIFT = {"invocation_id": "old1", "in_sync": False, "verdict": "drifted", "observed": {"draft_window_size": 1024},
         "differences": [{"what": "config line", "key": "draft_window_size", "expected": 2048, "observed": 1024}],
         "restart_pending": False, "lease": None, "record": None}
VERIFIED = {"verdict": "pass", "verified": True, "invocation_id": "new1", "source": "journal",
            "observed": {"draft_window_size": 2048}, "config_line_mode": "required",
            "phases": {"generate": {"elapsed": 12.5}}, "msg": "ok"}


def act(args, check_mode=False, host="gpu-1", **task_vars):
    action = fakes.make_action(action_mod, args, check_mode, action="gpufleet.inference.sglang_rollout")
    return action.run(task_vars=dict(task_vars, inventory_hostname=host))


@pytest.fixture
def shown(monkeypatch):
    lines = []
    monkeypatch.setattr(action_mod.display, "display", lambda msg, *a, **k: lines.append(msg))
    monkeypatch.setattr(action_mod.display, "warning", lambda msg, *a, **k: lines.append("WARNING " + msg))
    return lines


@pytest.fixture
def built(monkeypatch):
    calls = []
    monkeypatch.setattr(action_mod.ActionModule, "_configure_module", lambda self, name, args, task_vars: (
        calls.append(name)))
    return calls


class FakeRouter(object):
    """RouterClient: answers list_workers in order (a list of URLs, or an exception)."""

    def __init__(self, answers):
        self.answers = list(answers)

    def __call__(self, *args, **kwargs):
        return self

    def list_workers(self):
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return [{"url": url, "healthy": True} for url in answer]


def start(root, **over):
    args = dict(state="start", hosts=HOSTS, results_dir=str(root))
    check_mode = over.pop("check_mode", False)
    args.update(over)
    return act(args, check_mode=check_mode, awx_job_id=over.pop("job", None))


class HostVars(dict):
    """As ansible-core 2.19's HostVars: asked for a host it does not know, it gives an undefined marker that
    fails outside a template (ReferenceError) - never None."""

    def get(self, key, default=None):
        if key not in self:
            raise ReferenceError("A required TemplateContext context is not active. (hostvars[%r])" % (key,))
        return dict.get(self, key, default)


def hostvars(drifts, failed=()):
    found = HostVars()
    for host, drift in drifts.items():
        prepared = {"digest": "d-" + host, "endpoint": {"url": "http://127.0.0.1:30000", "worker_url": URL[host]}}
        found[host] = {"sglang_drift": dict(DRIFT, prepared=prepared, **drift), "ansible_host": URL[host][7:15]}
        if host in failed:
            found[host]["rollout_host_state"] = {"step": "failed", "args": {"task": "Compare", "failure": {
                "msg": "sglang_tp_size must be a positive integer"}}}
    return found


def prepared(monkeypatch, run, drifts, workers=(), alive=None, failed=(), router=True):
    monkeypatch.setattr(action_mod, "RouterClient", FakeRouter([list(workers)]))
    args = dict(state="prepared", run=run, hosts=list(drifts), alive=alive if alive is not None else list(drifts))
    if router:
        args["router_url"] = "http://router:30080"
    return act(args, hostvars=hostvars(drifts, failed))


# ------------------------------------------------------------------ start

def test_start_checks_the_inputs_names_the_run_and_who_runs_it_and_writes_nothing(tmp_path, shown):
    run = start(tmp_path, batches="[1, '25%']", min_healthy="50%", group=["gpu-3", "gpu-1"], job=42)
    assert not run.get("failed"), run
    assert run["batches"] == [1, "25%"] and run["min_healthy"] == "50%" and run["group"] == ["gpu-1", "gpu-2", "gpu-3"]
    holder = run["holder"]
    assert holder["kind"] == "rollout" and holder["run_id"] == run["run_id"] and len(holder["session"]) == 32
    assert holder["job"] == "42" and holder["controller"] and holder["user"]
    assert list(tmp_path.iterdir()) == []  # nothing is written before the fleet was asked
    # a host of a later batch is leased for a lease plus the longest a batch may take
    run = start(tmp_path, lease_seconds="120", capacity_wait=60, batch_timeouts={
        "drain": 100, "ready": "600", "settle": 10, "rejoin": 20, "rejoin_retries": 2})
    assert run["lease_seconds"] == 120 and run["pending_lease_seconds"] == 120 + 60 + 100 + 600 + 10 + 20 * 3
    assert "batch_timeouts.ready must be a whole number" in start(tmp_path, batch_timeouts={"ready": "10m"})["msg"]


@pytest.mark.parametrize("over,message", [
    ({"batches": [0]}, r"rollout_batches\[0\] must be 1 or more"),
    ({"batches": ["abc"]}, "rollout_batches"),
    ({"min_healthy": "x"}, "rollout_min_healthy"),
    ({"run_id": "../escape"}, "rollout_run_id"),
    ({"lease_seconds": 3}, "sglang_lease_seconds must be a whole number of seconds, 10 or more"),
])
def test_bad_inputs_fail_first(tmp_path, shown, over, message):
    result = start(tmp_path, **over)
    assert result["failed"] and re.search(message, result["msg"]), result


def test_a_check_run_is_named_as_one_and_sends_no_host_on(tmp_path, shown, monkeypatch, built):
    run = start(tmp_path, check_mode=True)
    assert run["run_id"].endswith("-check")
    out = prepared(monkeypatch, run, {"gpu-1": {}}, workers=[URL["gpu-1"]])
    assert out["apply"] == [] and out["records"]["gpu-1"]["status"] == "would change" and built == []


# ------------------------------------------------------------------ prepared: the plan

def test_the_plan_sends_what_differs_writes_the_copy_and_names_the_worker_to_drain(
        tmp_path, shown, monkeypatch, built):
    run = start(tmp_path)
    out = prepared(monkeypatch, run, {"gpu-1": {}, "gpu-2": {"in_sync": True}}, workers=[URL["gpu-1"], URL["gpu-2"]])
    assert not out.get("failed"), out
    assert out["apply"] == ["gpu-1"] and out["plan"]["gpu-1"]["drain_url"] == URL["gpu-1"]
    assert out["run"]["digests"] == {"gpu-1": "d-gpu-1", "gpu-2": "d-gpu-2"}
    copy = json.loads((tmp_path / run["run_id"] / "gpu-2.json").read_text())
    assert copy["status"] == "unchanged (verified)" and copy["in_router"] is True
    record = out["records"]["gpu-1"]  # what the lease task writes on the host
    assert record["kind"] == "rollout" and record["run_id"] == run["run_id"] and record["step"] == "prepared"
    assert record["intent_digest"] == "d-gpu-1"
    assert json.loads((tmp_path / run["run_id"] / "run.json").read_text())["status"] == "running"
    assert out["prebuilt"] == list(CRITICAL_PATH_MODULES) and built == list(CRITICAL_PATH_MODULES)


def test_a_run_that_changes_nothing_holds_nothing_and_one_that_changes_a_host_leases_them_all(
        tmp_path, shown, monkeypatch, built):
    run = start(tmp_path)
    in_sync = {"gpu-1": {"in_sync": True}, "gpu-2": {"in_sync": True}}
    out = prepared(monkeypatch, run, in_sync, workers=[URL["gpu-1"], URL["gpu-2"]])
    assert out["apply"] == [] and out["run"]["leases"] is False and built == []
    # told to break a lease, it takes them (and so breaks it) even with nothing to change
    out = prepared(monkeypatch, dict(start(tmp_path), break_lease=True), in_sync, workers=[URL["gpu-1"], URL["gpu-2"]])
    assert out["run"]["leases"] is True
    out = prepared(monkeypatch, start(tmp_path), {"gpu-1": {}, "gpu-2": {"in_sync": True}},
                   workers=[URL["gpu-1"], URL["gpu-2"]])
    assert out["apply"] == ["gpu-1"] and out["run"]["leases"] is True
    check = prepared(monkeypatch, start(tmp_path, check_mode=True), {"gpu-1": {}}, workers=[URL["gpu-1"]])
    assert check["run"]["leases"] is False


def test_a_port_change_drains_the_worker_the_router_has(tmp_path, shown, monkeypatch, built):
    run = start(tmp_path)
    old = "http://10.0.0.1:30001"
    out = prepared(monkeypatch, run, {"gpu-1": {"record": {"kind": "rollout", "run_id": "r0", "step": "rejoined",
                                                           "worker_url": old}}}, workers=[old])
    assert out["plan"]["gpu-1"]["drain_url"] == old


def test_a_host_leased_by_a_live_run_refuses_the_plan_and_nothing_is_written(tmp_path, shown, monkeypatch, built):
    run = start(tmp_path)
    lease = {"live": True, "session": "other", "text": "rollout r-9 on bastion-2 by bob, expires in 200s"}
    out = prepared(monkeypatch, run, {"gpu-1": {}, "gpu-2": {"lease": lease}}, workers=[URL["gpu-1"]])
    assert out["failed"] and "gpu-2 is leased by rollout r-9 on bastion-2 by bob" in out["msg"]
    assert not (tmp_path / run["run_id"]).exists() and built == []


def test_an_interrupted_run_of_the_same_intent_is_resumed_from_another_controller(
        tmp_path, shown, monkeypatch, built):
    run = start(tmp_path)
    left = {"kind": "rollout", "run_id": "r-old", "step": "applying", "intent_digest": "d-gpu-1",
            "drained_by": "r-old"}
    out = prepared(monkeypatch, run, {"gpu-1": {"in_sync": True, "record": left}, "gpu-2": {"in_sync": True}},
                   workers=[URL["gpu-2"]])
    assert out["run"]["run_id"] == "r-old" and out["run"]["resumed"] and out["holder"]["run_id"] == "r-old"
    assert out["apply"] == ["gpu-1"] and out["plan"]["gpu-1"]["action"] == "recover"
    assert any("resuming run r-old" in line for line in shown)
    meta = json.loads((tmp_path / "r-old" / "run.json").read_text())
    assert meta["resumes"] and "resuming run r-old" in meta["resumes"][0]["notes"][0]


def test_a_resumed_runs_copy_keeps_what_the_run_did_before_and_an_outside_host_mid_change_refuses(
        tmp_path, shown, monkeypatch, built):
    run = start(tmp_path)
    left = {"kind": "rollout", "run_id": "r-old", "step": "applying", "intent_digest": "d-gpu-1", "drained_by": "r-old"}
    done = {"kind": "rollout", "run_id": "r-old", "step": "rejoined", "status": "updated", "intent_digest": "d-gpu-2",
            "old_invocation": "a" * 32, "new_invocation": "b" * 32}
    out = prepared(monkeypatch, run, {"gpu-1": {"in_sync": True, "record": left},
                                      "gpu-2": {"in_sync": True, "record": done}}, workers=[URL["gpu-2"]])
    copy = json.loads((tmp_path / "r-old" / "gpu-2.json").read_text())
    assert out["apply"] == ["gpu-1"] and copy["status"] == "updated" and copy["new_invocation"] == "b" * 32
    # the canary it left drained is outside this run (--limit): refused before anything is leased
    monkeypatch.setattr(action_mod, "RouterClient", FakeRouter([[URL["gpu-2"]]]))
    out = act(dict(state="prepared", run=start(tmp_path), hosts=["gpu-2"], alive=["gpu-2"],
                   router_url="http://router:30080",
                   outside=[{"item": "gpu-1", "record": left, "changed": False}]),
              hostvars=hostvars({"gpu-2": {}}))
    assert out["failed"] and "left gpu-1 (run r-old, step applying) mid-change" in out["msg"], out


def test_the_plan_reads_the_hosts_the_run_leaves_out_itself_and_one_mid_change_refuses(
        tmp_path, shown, monkeypatch, built):
    left = {"kind": "rollout", "run_id": "r-old", "step": "draining", "intent_digest": "d-gpu-1", "drained_by": "r-old"}
    nodes = FakeNodes({"gpu-1": [{"record": left, "lease": None}], "gpu-3": [{"failed": True, "unreachable": True,
                                                                              "msg": "ssh: connect refused"}]})
    monkeypatch.setattr(action_mod, "NodeRunners", lambda action, task_vars, **kw: nodes)
    monkeypatch.setattr(action_mod, "RouterClient", FakeRouter([[URL["gpu-2"]]]))
    run = start(tmp_path, hosts=["gpu-2"], group=["gpu-1", "gpu-2", "gpu-3"])
    found = hostvars({"gpu-2": {}})
    found["gpu-1"] = {"sglang_unit_name": "sglang-a.service"}
    out = act(dict(state="prepared", run=run, hosts=["gpu-2"], alive=["gpu-2"], router_url="http://router:30080"),
              hostvars=found, sglang_unit_name="sglang.service", sglang_fleet_dir="/var/lib/f")
    assert [(host, args) for host, dummy, args in nodes.calls] == [
        ("gpu-1", {"state": "query", "unit": "sglang-a.service", "directory": "/var/lib/f"}),
        ("gpu-3", {"state": "query", "unit": "sglang.service", "directory": "/var/lib/f"})] and nodes.closed
    assert out["failed"] and "left gpu-1 (run r-old, step draining) mid-change" in out["msg"], out
    # nothing left out: nothing is asked
    nodes.calls[:] = []
    out = act(dict(state="prepared", run=start(tmp_path), hosts=HOSTS, alive=HOSTS, router_url="http://router:30080"),
              hostvars=hostvars({"gpu-1": {}, "gpu-2": {}}))
    assert nodes.calls == [] and not out.get("failed"), out


def test_a_host_that_failed_or_was_lost_in_the_prepare_phase_stops_everything(tmp_path, shown, monkeypatch, built):
    run = start(tmp_path)
    out = prepared(monkeypatch, run, {"gpu-1": {}, "gpu-2": {}}, workers=[], alive=["gpu-1"], failed=["gpu-1"])
    assert out["failed"] and out["apply"] == [] and "gpu-1, gpu-2" in out["msg"], out
    summary = json.loads((tmp_path / run["run_id"] / "summary.json").read_text())
    assert set(record["status"] for record in summary["hosts"]) == {"failed"}
    assert summary["run"]["status"] == "failed" and built == []


def test_an_unreadable_router_stops_the_plan(tmp_path, shown, monkeypatch):
    run = start(tmp_path)
    monkeypatch.setattr(action_mod, "RouterClient", FakeRouter([RouterError("connection refused")]))
    out = act(dict(state="prepared", run=run, hosts=["gpu-1"], alive=["gpu-1"], router_url="http://r"),
              hostvars=hostvars({"gpu-1": {}}))
    assert out["failed"] and "router membership comes from the router" in out["msg"]


# ------------------------------------------------------------------ leased: all or none

def test_every_host_leased_or_the_ones_taken_are_released(tmp_path):
    lease = {"lease": {"generation": 3}}
    ok = act(dict(state="leased", hosts=HOSTS), hostvars={"gpu-1": {"rollout_lease": lease},
                                                          "gpu-2": {"rollout_lease": lease}})
    assert not ok.get("failed") and ok["generations"] == {"gpu-1": 3, "gpu-2": 3}
    refused = {"failed": True, "msg": "the host is leased by sweep sw-1 on bastion-3 by carol"}
    out = act(dict(state="leased", hosts=HOSTS), hostvars={"gpu-1": {"rollout_lease": lease},
                                                           "gpu-2": {"rollout_lease": refused}})
    assert out["failed"] and out["release"] == ["gpu-1"] and "gpu-2: the host is leased by sweep sw-1" in out["msg"]
    # two runs started together meet at the first host: the one refused there takes no other host, and its
    # copy goes (it changed and held nothing)
    copy = tmp_path / "r-new"
    copy.mkdir()
    skipped = {"rollout_lease": {"skipped": True}}
    out = act(dict(state="leased", hosts=HOSTS, gate=refused, run={"run_id": "r-new", "run_dir": str(copy)}),
              hostvars={"gpu-1": skipped, "gpu-2": skipped})
    assert out["failed"] and out["release"] == [] and "first host could not be leased" in out["msg"]
    assert "sweep sw-1 on bastion-3" in out["msg"] and not copy.exists()


# ------------------------------------------------------------------ capacity: the group, probed now

def group_vars(hosts):
    return dict((host, {"ansible_host": URL[host][7:15], "sglang_api_key": "k-" + host}) for host in hosts)


def capacity(monkeypatch, listed, probes, **args):
    monkeypatch.setattr(batch_mod, "RouterClient", FakeRouter(listed))
    monkeypatch.setattr(batch_mod.time, "sleep", lambda s: None)
    seen = []

    def probe(url, api_key, timeout):
        seen.append((url, api_key))
        answer = probes(url) if callable(probes) else probes.get(url, True)
        return (answer, "answers /generate") if answer is True else (False, answer)
    monkeypatch.setattr(batch_mod, "probe", probe)
    base = dict(state="capacity", router_url="http://r", group=sorted(URL), leaving=[URL["gpu-1"]], min_healthy=2,
                capacity_wait=0, poll=0)
    base.update(args)
    return act(base, hostvars=group_vars(sorted(URL))), seen


def test_the_guard_counts_the_whole_group_and_probes_each_worker_itself(monkeypatch, shown):
    out, seen = capacity(monkeypatch, [list(URL.values())], {}, min_healthy="75%")
    assert not out.get("failed") and out["remaining"] == 3 and out["required"] == 3 and out["group"] == 4
    assert sorted(seen) == sorted((URL[h], "k-" + h) for h in URL)  # each worker with its own host's key


def test_a_stopped_server_the_router_still_lists_is_not_counted(monkeypatch, shown):
    out, seen = capacity(monkeypatch, [list(URL.values())], {URL["gpu-3"]: "/generate: connection refused"},
                         min_healthy=3)
    assert out["failed"] and "would leave 2 healthy worker(s) of the group's 4 server(s)" in out["msg"]
    assert "gpu-3 %s: /generate: connection refused" % URL["gpu-3"] in out["msg"]
    assert "nothing was changed in this batch" in out["msg"]


def test_hosts_outside_the_limit_count_and_hosts_out_of_the_router_are_named(monkeypatch, shown):
    out, seen = capacity(monkeypatch, [[URL["gpu-1"], URL["gpu-2"]]], {}, min_healthy="50%")
    assert out["failed"] and "Not in the router: gpu-3, gpu-4" in out["msg"], out["msg"]


def test_the_guard_waits_for_capacity_to_come_back(monkeypatch, shown):
    clock = iter([0.0, 0.0, 1.0, 2.0, 3.0, 4.0])
    monkeypatch.setattr(batch_mod.time, "monotonic", lambda: next(clock))
    answers = iter([False, True, True])
    out, seen = capacity(monkeypatch, [[URL["gpu-1"], URL["gpu-2"]], list(URL.values())],
                         lambda url: True if url != URL["gpu-2"] else next(answers), min_healthy=2, capacity_wait=30)
    assert not out.get("failed") and out["remaining"] >= 2


def test_a_batch_slot_another_run_holds_refuses_the_batch_naming_it(monkeypatch, shown):
    held = {"failed": True, "msg": "the host is leased by rollout r-9 on bastion-2 by bob, expires in 200s"}
    out, seen = capacity(monkeypatch, [list(URL.values())], {}, slot=held)
    assert out["failed"] and "the group's batch slot" in out["msg"] and "rollout r-9 on bastion-2" in out["msg"]
    assert seen == []  # nothing probed, nothing changed


# ------------------------------------------------------------------ batch: renewals, the slot, the guard in one task

class FakeNodes(object):
    """NodeRunners: each other host's lease module answers from `answers` (host -> list, last one repeated)."""

    def __init__(self, answers):
        self.answers, self.calls, self.closed = answers, [], False

    def __call__(self, host):
        nodes = self

        class Runner(object):
            @staticmethod
            def run(module, args):
                nodes.calls.append((host, module, args))
                queue = nodes.answers.get(host) or [{"lease": {"generation": 7}}]
                return queue.pop(0) if len(queue) > 1 else queue[0]
        return Runner()

    def close(self):
        self.closed = True


def batch(monkeypatch, tmp_path, answers=None, probes=None, taken_ago=200.0, anchor="gpu-4", **over):
    nodes = FakeNodes(answers or {})
    monkeypatch.setattr(action_mod, "NodeRunners", lambda action, task_vars, **kw: nodes)
    clock = {"now": 1000.0}
    monkeypatch.setattr(batch_mod.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(batch_mod.time, "sleep", lambda s: clock.update(now=clock["now"] + s))
    monkeypatch.setattr(batch_mod, "probe", lambda url, key, timeout: (
        (True, "answers /generate") if (probes or {}).get(url, True) is True else (False, probes[url])))
    monkeypatch.setattr(batch_mod, "RouterClient", FakeRouter([list(URL.values())]))
    hosts = sorted(URL)
    run = dict(run_id="r-1", run_dir=str(tmp_path), hosts=hosts, servers=hosts, holder={"kind": "rollout", "run_id": "r-1"},
               lease_seconds=300, pending_lease_seconds=900, leases=True, min_healthy=2, capacity_wait=30,
               leases_taken_at=batch_mod.time.time() - taken_ago, takeover_runs=[],
               slot={"anchor": anchor, "unit": "sglang-batch-slot", "directory": "/var/lib/f"}, analysis={})
    run.update(over)
    found = HostVars((host, {"ansible_host": URL[host][7:15], "rollout_lease": {"lease": {"generation": 3}},
                             "sglang_drift": {"prepared": {"lease": {"unit": "sglang.service", "directory": "/var/lib/f"}}}})
                     for host in hosts)
    args = dict(state="batch", run=run, batch=["gpu-1"], router_url="http://r", leaving=[URL["gpu-1"]])
    return act(args, hostvars=found), nodes


def test_a_batch_renews_the_waiting_hosts_leases_when_half_a_lease_passed_then_takes_the_slot_and_checks(
        monkeypatch, tmp_path, shown):
    out, nodes = batch(monkeypatch, tmp_path)
    renewals = [call for call in nodes.calls if call[2]["unit"] == "sglang.service"]
    assert [host for host, dummy, dummy2 in renewals] == ["gpu-2", "gpu-3", "gpu-4"]  # not the batch's own
    assert all(args["holder"] == {"kind": "rollout", "run_id": "r-1", "generation": 3} and args["seconds"] == 900
               for dummy, dummy2, args in renewals)
    assert [r["ok"] for r in out["renewed"]] == [True] * 3
    slot = [call for call in nodes.calls if call[2]["unit"] == "sglang-batch-slot"]
    assert [host for host, dummy, dummy2 in slot] == ["gpu-4"] and out["slot"]["lease"]["generation"] == 7
    assert not out.get("failed") and out["remaining"] == 3 and nodes.closed
    # the next batch, at once: nothing is due
    again, nodes = batch(monkeypatch, tmp_path)
    assert again["renewed"] == [] and not [c for c in nodes.calls if c[2]["unit"] == "sglang.service"]


def test_a_batch_soon_after_the_leases_were_taken_renews_none_and_a_run_without_a_slot_takes_none(
        monkeypatch, tmp_path, shown):
    out, nodes = batch(monkeypatch, tmp_path, taken_ago=10.0, anchor=None)
    assert out["renewed"] == [] and nodes.calls == [] and "slot" not in out and not out.get("failed")


def test_a_batch_waits_for_the_slot_another_run_holds_and_refuses_past_the_capacity_wait_keeping_what_it_got(
        monkeypatch, tmp_path, shown):
    held = {"failed": True, "msg": "the host is leased by rollout r-9 on bastion-2 by bob"}
    out, nodes = batch(monkeypatch, tmp_path, answers={"gpu-4": [held, held, {"lease": {"generation": 4}}]},
                       taken_ago=0)
    assert not out.get("failed") and out["slot"]["lease"]["generation"] == 4 and len(nodes.calls) == 3
    out, nodes = batch(monkeypatch, tmp_path, answers={"gpu-4": [held]}, taken_ago=0)
    assert out["failed"] and "the group's batch slot" in out["msg"] and "rollout r-9 on bastion-2" in out["msg"]
    assert out["slot"]["failed"] and len(nodes.calls) == 1 + 30 // 5  # asked every 5 s for the capacity wait


def test_a_batch_the_guard_refuses_still_returns_the_slot_it_took_so_it_is_released(monkeypatch, tmp_path, shown):
    out, nodes = batch(monkeypatch, tmp_path, probes={URL["gpu-2"]: "refused", URL["gpu-3"]: "refused"}, taken_ago=0,
                       capacity_wait=0)
    assert out["failed"] and "would leave 1 healthy worker(s)" in out["msg"]
    assert out["slot"]["lease"]["generation"] == 7 and not out["slot"].get("failed")


def test_a_batch_without_a_router_only_renews(monkeypatch, tmp_path, shown):
    nodes = FakeNodes({})
    monkeypatch.setattr(action_mod, "NodeRunners", lambda action, task_vars, **kw: nodes)
    run = dict(run_id="r-1", run_dir=str(tmp_path), hosts=["gpu-1"], leases=True, lease_seconds=300,
               leases_taken_at=0, slot={"anchor": "gpu-1"})
    out = act(dict(state="batch", run=run, batch=["gpu-1"], router_url=""), hostvars=HostVars())
    assert not out.get("failed") and "no router" in out["msg"] and nodes.calls == [] and out["renewed"] == []


# ------------------------------------------------------------------ finish

def run_with(tmp_path, steps):
    run = start(tmp_path)
    run["digests"] = {}
    for host, items in steps.items():
        for step, args in items:
            ro.record_step(run, host, step, dict(args, router=True))
    return run


def test_finish_of_a_good_run_releases_every_lease_and_keeps_a_summary_for_awx(tmp_path, shown):
    run = run_with(tmp_path, {"gpu-1": [("prepared", {"drift": DRIFT}), ("rejoined", {
        "drift": DRIFT, "verified": VERIFIED})], "gpu-2": [("prepared", {"drift": dict(DRIFT, in_sync=True)})]})
    out = act(dict(state="finish", run=run))
    assert not out.get("failed") and "failed_msg" not in out and out["release"] == ["gpu-1", "gpu-2"]
    assert out["summary"] == {"run_id": run["run_id"], "status": "finished",
                              "counts": {"updated": 1, "unchanged (verified)": 1},
                              "hosts": {"gpu-1": "updated", "gpu-2": "unchanged (verified)"}}
    assert "| gpu-1 | updated |" in (tmp_path / run["run_id"] / "summary.md").read_text()


def test_finish_of_a_run_that_held_no_lease_releases_none(tmp_path, shown):
    run = run_with(tmp_path, {"gpu-1": [("prepared", {"drift": dict(DRIFT, in_sync=True)})],
                              "gpu-2": [("prepared", {"drift": dict(DRIFT, in_sync=True)})]})
    out = act(dict(state="finish", run=dict(run, leases=False)))
    assert not out.get("failed") and out["release"] == [] and out["status"] == "finished"
    assert act(dict(state="finish", run=dict(run, leases=True)))["release"] == ["gpu-1", "gpu-2"]


def test_a_host_caught_mid_change_keeps_its_lease_and_the_run_is_interrupted(tmp_path, shown):
    run = run_with(tmp_path, {
        "gpu-1": [("prepared", {"drift": DRIFT}), ("draining", {}),
                  ("failed", {"state_before": {"step": "applying"}, "task": "wait", "changed": True,
                              "failure": {"verdict": "connection_lost", "msg": "connection to gpu-1 lost"}})],
        "gpu-2": [("prepared", {"drift": DRIFT})]})
    out = act(dict(state="finish", run=run))
    assert out["kept_leased"] == ["gpu-1"] and out["release"] == ["gpu-2"]  # never touched: released
    assert out["status"] == "interrupted" and "Kept leased (caught mid-change" in out["failed_msg"]


def test_finish_fails_when_a_host_failed_and_names_what_was_not_reached(tmp_path, shown):
    run = run_with(tmp_path, {"gpu-1": [("prepared", {"drift": DRIFT}), ("failed", {
        "state_before": {"step": "applying"}, "task": "t", "failure": {"msg": "boom"}, "changed": True})],
        "gpu-2": [("prepared", {"drift": DRIFT})]})
    out = act(dict(state="finish", run=run))
    assert out["failed_msg"].startswith("Rollout stopped at gpu-1: t: boom") and "Not reached: gpu-2" in out[
        "failed_msg"]
    assert json.loads((tmp_path / run["run_id"] / "run.json").read_text())["status"] == "failed"
    assert any(line.startswith("\nRollout %s:\nhost" % run["run_id"]) for line in shown)


# ------------------------------------------------------------------ status and the rest

def test_status_shows_each_hosts_lease_run_step_and_router_membership(monkeypatch, shown):
    monkeypatch.setattr(action_mod, "RouterClient", FakeRouter([[URL["gpu-2"]]]))
    states = {"gpu-1": {"sglang_status": {"lease": {"live": True, "text": "rollout r-1 on b by a, expires in 90s"},
                                          "record": {"run_id": "r-1", "kind": "rollout", "step": "applying",
                                                     "status": "in progress", "intent_digest": "d1"}},
                        "ansible_host": "10.0.0.1"},
              "gpu-2": {"sglang_status": {"lease": None, "record": None}, "ansible_host": "10.0.0.2"}}
    out = act(dict(state="status", hosts=HOSTS, router_url="http://r"), hostvars=states)
    rows = dict((row["host"], row) for row in out["hosts"])
    assert rows["gpu-1"]["leased"] and rows["gpu-1"]["step"] == "applying" and rows["gpu-1"]["in_router"] is False
    assert rows["gpu-2"]["in_router"] is True and rows["gpu-2"]["run_id"] is None
    assert "rollout r-1 on b by a" in shown[-1] and shown[-1].splitlines()[2].startswith("gpu-1  r-1  applying")


def test_a_prepare_failure_is_kept_as_a_fact_until_the_plan(shown):
    out = act(dict(state="record", task="Compare", failure={"msg": "boom"}, router=True))
    assert out["ansible_facts"]["rollout_host_state"]["step"] == "failed"


def test_unknown_state_is_refused():
    from ansible.errors import AnsibleActionFail
    with pytest.raises(AnsibleActionFail, match="state must be one of"):
        act(dict(state="_record"))


# ------------------------------------------------------------------ the canary analysis's plan

def test_the_analysis_settings_are_checked_first(tmp_path, shown):
    run = start(tmp_path, analysis={"rounds": "4", "thresholds": {"max_throughput_drop": "3%"}})
    assert run["analysis"]["enabled"] is True and run["analysis"]["rounds"] == 4
    for bad, message in (({"on_inconclusive": "ignore"}, "rollout_analysis_on_inconclusive must be stop or continue"),
                         ({"rounds": 1}, "rollout_analysis_rounds"),
                         ({"thresholds": {"max_nonsense": 1}}, "rollout_analysis"),
                         ({"enabled": "maybe"}, "rollout_analysis must be true or false")):
        result = start(tmp_path, analysis=bad)
        assert result["failed"] and message in result["msg"], (bad, result)


def test_the_canary_is_compared_with_the_first_host_of_a_later_batch_still_on_the_previous_settings(
        tmp_path, shown, monkeypatch, built):
    run = start(tmp_path, hosts=["gpu-1", "gpu-2", "gpu-3"], batches=[1])
    drifts = dict((host, {"active_state": "active"}) for host in ("gpu-1", "gpu-2", "gpu-3"))
    out = prepared(monkeypatch, run, drifts, workers=list(URL.values()))
    analysis = out["run"]["analysis"]
    assert analysis["canary"] == "gpu-1" and analysis["baseline"] == "gpu-2" and analysis["baseline_url"] == URL["gpu-2"]
    assert any("gpu-1 will be compared with gpu-2" in line for line in shown)
    # one batch for every host: nothing left on the previous settings - said, and skipped
    run = start(tmp_path, hosts=["gpu-1", "gpu-2"], batches=["100%"])
    out = prepared(monkeypatch, run, {"gpu-1": {}, "gpu-2": {}}, workers=list(URL.values()))
    assert out["run"]["analysis"]["enabled"] is False
    assert "no host of a later batch still serves the previous settings" in out["run"]["analysis"]["note"]
    # a baseline that is no such host is refused before anything
    run = start(tmp_path, hosts=["gpu-1", "gpu-2"], batches=[1], analysis={"baseline": "gpu-1"})
    out = prepared(monkeypatch, run, {"gpu-1": {}, "gpu-2": {}}, workers=list(URL.values()))
    assert out["failed"] and "rollout_analysis_baseline gpu-1 is not a host of a later batch" in out["msg"]


def test_an_isolated_analysis_counts_the_baseline_out_with_the_canarys_batch(monkeypatch, shown):
    analysis = {"isolate": True, "canary": "gpu-1", "baseline_url": URL["gpu-2"]}
    out, seen = capacity(monkeypatch, [list(URL.values())], {}, min_healthy=3, batch=["gpu-1"], analysis=analysis)
    assert out["failed"] and "leave 2 healthy worker" in out["msg"], out  # 4 workers, canary and baseline out
    out, seen = capacity(monkeypatch, [list(URL.values())], {}, min_healthy=3, batch=["gpu-2"], analysis=analysis)
    assert not out.get("failed"), out


# ------------------------------------------------------------------ serving groups

def group_hostvars():
    """gpu-1 (head) and gpu-2 (follower) of serving group g; gpu-3 and gpu-4 single-node."""
    common = {"sglang_model_path": "/m", "sglang_tp_size": 2, "sglang_port": 30000,
              "sglang_serving_groups": ["g"]}
    found = {}
    for n, host in enumerate(["gpu-1", "gpu-2", "gpu-3", "gpu-4"], 1):
        found[host] = dict(common, ansible_host="10.0.0.%d" % n, sglang_host="10.0.0.%d" % n,
                           group_names=["gpu", "g"] if n <= 2 else ["gpu"])
        if n <= 2:
            found[host]["sglang_node_rank"] = n - 1
    return found


class RawHostvars(dict):
    def raw_get(self, host):
        return self[host]


def start_grouped(root, hosts, group=None):
    args = dict(state="start", hosts=hosts, group=group or ["gpu-1", "gpu-2", "gpu-3", "gpu-4"],
                results_dir=str(root))
    return act(args, hostvars=RawHostvars(group_hostvars()),
               groups={"all": ["gpu-1", "gpu-2", "gpu-3", "gpu-4"], "gpu": ["gpu-1", "gpu-2", "gpu-3", "gpu-4"],
                       "g": ["gpu-1", "gpu-2"]})


def test_a_run_counts_a_serving_group_as_one_server_its_head(tmp_path, shown):
    run = start_grouped(tmp_path, ["gpu-1", "gpu-2", "gpu-3", "gpu-4"])
    assert not run.get("failed"), run
    assert run["servers"] == ["gpu-1", "gpu-3", "gpu-4"] and run["group"] == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]


def test_a_limit_that_splits_a_serving_group_fails_before_anything_naming_the_group(tmp_path, shown):
    run = start_grouped(tmp_path, ["gpu-2", "gpu-3"])
    assert run["failed"] and list(tmp_path.iterdir()) == []
    assert run["msg"].startswith("serving group g is only partly in this run (--limit): gpu-2 (rank 1) in, gpu-1 "
                                 "(rank 0) not;")
    assert run["msg"].endswith("Nothing was compared or changed.")
    run = start_grouped(tmp_path, ["gpu-1"], group=["gpu-1", "gpu-3"])
    assert run["failed"] and "serving group g is only partly in rollout_hosts" in run["msg"]


def test_a_rank_typo_fails_the_run_before_anything_naming_host_and_variable(tmp_path, shown, monkeypatch):
    broken = group_hostvars()
    broken["gpu-2"]["sglang_node_rank"] = 2
    run = act(dict(state="start", hosts=["gpu-1", "gpu-2"], group=["gpu-1", "gpu-2"], results_dir=str(tmp_path)),
              hostvars=RawHostvars(broken), groups={"g": ["gpu-1", "gpu-2"]})
    assert run["failed"] and "host gpu-2: sglang_node_rank 2 is out of range for serving group g" in run["msg"]


def test_the_plan_sends_a_groups_head_alone_and_records_its_follower_out_of_any_router(
        tmp_path, shown, monkeypatch, built):
    run = start(tmp_path)
    group = {"name": "g", "head": "gpu-1", "followers": ["gpu-2"], "ranks": {"gpu-1": 0, "gpu-2": 1}}
    drifts = {"gpu-1": {"in_sync": True}, "gpu-2": {}, "gpu-3": {"in_sync": True}}
    found = hostvars(drifts)
    for host, rank in (("gpu-1", 0), ("gpu-2", 1)):
        found[host]["sglang_drift"]["prepared"]["group"] = dict(group, rank=rank)
    monkeypatch.setattr(action_mod, "RouterClient", FakeRouter([[URL["gpu-1"], URL["gpu-3"]]]))
    out = act(dict(state="prepared", run=run, hosts=list(drifts), alive=list(drifts), router_url="http://r:1"),
              hostvars=found)
    assert not out.get("failed"), out
    assert out["apply"] == ["gpu-1"]  # the group's head carries its follower; gpu-3 is in sync
    assert out["plan"]["gpu-1"]["reason"] == "serving group g restarts as one (gpu-2: settings differ)"
    follower = json.loads((tmp_path / run["run_id"] / "gpu-2.json").read_text())
    assert follower["status"] == "pending" and follower["in_router"] is None
    assert out["plan"]["gpu-2"]["action"] == "apply" and out["plan"]["gpu-2"]["drain_url"] is None
