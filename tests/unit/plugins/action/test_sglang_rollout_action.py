# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's controller side: inputs, the fleet lock, records (host files, ledger, summary that
agree), the capacity guard and the end of a run - on real files under tmp_path."""
import json
import os

import pytest

import fakes
from ansible_collections.gpufleet.inference.plugins.action.sglang_rollout_host import CRITICAL_PATH_MODULES
from ansible_collections.gpufleet.inference.plugins.action import sglang_rollout as action_mod
from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro

HOSTS = ["gpu-1", "gpu-2"]
DRIFT = {"invocation_id": "old1", "in_sync": False, "verdict": "drifted", "observed": {"draft_window_size": 1024},
         "differences": [{"what": "config line", "key": "draft_window_size", "expected": 2048, "observed": 1024}],
         "restart_pending": False}
VERIFIED = {"verdict": "pass", "verified": True, "invocation_id": "new1", "source": "journal",
            "observed": {"draft_window_size": 2048}, "config_line_mode": "required",
            "phases": {"generate": {"elapsed": 12.5}}, "msg": "ok"}


def act(args, check_mode=False, host="gpu-1"):
    action = fakes.make_action(action_mod, args, check_mode, action="gpufleet.inference.sglang_rollout")
    return action.run(task_vars={"inventory_hostname": host})


@pytest.fixture
def shown(monkeypatch):
    lines = []
    monkeypatch.setattr(action_mod.display, "display", lambda msg, *a, **k: lines.append(msg))
    monkeypatch.setattr(action_mod.display, "warning", lambda msg, *a, **k: lines.append("WARNING " + msg))
    return lines


def start(root, **over):
    args = dict(state="start", hosts=HOSTS, results_dir=str(root))
    args.update(over)
    return act(args, check_mode=over.pop("check_mode", False) if "check_mode" in over else False)


def record(run, step, host="gpu-1", **args):
    return act(dict(state="record", run=run, step=step, **args), host=host)


def test_start_takes_the_lock_names_the_run_and_checks_inputs(tmp_path, shown):
    run = start(tmp_path, batches="[1, '25%']", min_healthy="50%")
    assert not run.get("failed"), run
    assert run["batches"] == [1, "25%"] and run["min_healthy"] == "50%" and not run["resumed"]
    lock = json.loads((tmp_path / "lock.json").read_text())
    assert lock["run_id"] == run["run_id"] and lock["pid"] == os.getppid()
    assert lock["pid_start"] == ro.process_start(os.getppid())
    assert json.loads((tmp_path / run["run_id"] / "run.json").read_text())["status"] == "running"


@pytest.mark.parametrize("over,message", [
    ({"batches": [0]}, r"rollout_batches\[0\] must be 1 or more"),
    ({"batches": ["abc"]}, "rollout_batches"),
    ({"min_healthy": "x"}, "rollout_min_healthy"),
    ({"run_id": "../escape"}, "rollout_run_id"),
])
def test_bad_inputs_fail_before_any_lock(tmp_path, shown, over, message):
    result = start(tmp_path, **over)
    assert result["failed"] and __import__("re").search(message, result["msg"]), result
    assert not (tmp_path / "lock.json").exists()


def test_a_second_rollout_is_refused_naming_the_holder(tmp_path, shown):
    first = start(tmp_path)
    second = start(tmp_path)
    assert second["failed"] and "another rollout holds this fleet's lock: run %s" % first["run_id"] in second["msg"]
    assert json.loads((tmp_path / "lock.json").read_text())["run_id"] == first["run_id"]


def test_an_interrupted_run_is_resumed_with_its_records(tmp_path, shown):
    first = start(tmp_path)
    record(first, "draining", router=True)
    # the controller died: its PID no longer runs what started the lock
    lock = json.loads((tmp_path / "lock.json").read_text())
    lock["pid_start"] = -1
    (tmp_path / "lock.json").write_text(json.dumps(lock))
    again = start(tmp_path)
    assert again["run_id"] == first["run_id"] and again["resumed"]
    assert any("resuming run %s" % first["run_id"] in line for line in shown)
    ledger = json.loads((tmp_path / "fleet" / "gpu-1.json").read_text())
    assert ledger["in_router"] is False and ledger["step"] == "draining" and "fleet" not in again
    meta = json.loads((tmp_path / first["run_id"] / "run.json").read_text())
    assert meta["resumes"] and "interrupted" in meta["resumes"][0]["note"]


def test_break_lock_abandons_the_old_run(tmp_path, shown):
    first = start(tmp_path)
    lock = json.loads((tmp_path / "lock.json").read_text())
    lock["controller"] = "another-controller"
    (tmp_path / "lock.json").write_text(json.dumps(lock))
    refused = start(tmp_path)
    assert refused["failed"] and "rollout_break_lock=true" in refused["msg"]
    fresh = start(tmp_path, break_lock=True)
    assert fresh["run_id"] != first["run_id"] and not fresh["resumed"]
    assert json.loads((tmp_path / first["run_id"] / "run.json").read_text())["status"] == "abandoned"
    assert json.loads((tmp_path / fresh["run_id"] / "run.json").read_text())["broke_lock_of"]["run_id"] == \
        first["run_id"]


def test_check_mode_takes_no_lock_and_marks_its_run(tmp_path, shown):
    run = act(dict(state="start", hosts=HOSTS, results_dir=str(tmp_path)), check_mode=True)
    assert run["check_mode"] and run["run_id"].endswith("-check")
    assert not (tmp_path / "lock.json").exists()
    out = record(run, "prepared", drift=DRIFT)
    assert out["record"]["status"] == "would change" and out["record"]["differences"]
    assert not (tmp_path / "fleet").exists()  # a check run never touches the ledger
    final = act(dict(state="finish", run=run))
    assert not final.get("failed") and "check mode: nothing was changed" in shown[-1]
    assert json.loads((tmp_path / run["run_id"] / "run.json").read_text())["status"] == "check"


def test_records_ledger_and_summary_agree_at_every_step(tmp_path, shown):
    run = start(tmp_path)
    for host in HOSTS:
        record(run, "prepared", host=host, drift=DRIFT, router=True, endpoint={"url": "u", "worker_url": "w"})
    steps = [("draining", False, "in progress"), ("applying", False, "in progress"),
             ("verified", False, "verified, not rejoined"), ("rejoined", True, "updated")]
    for step, in_router, status in steps:
        out = record(run, step, drift=DRIFT, verified=VERIFIED, router=True, last_good={"exists": True})
        host_file = json.loads((tmp_path / run["run_id"] / "gpu-1.json").read_text())
        ledger = json.loads((tmp_path / "fleet" / "gpu-1.json").read_text())
        summary = json.loads((tmp_path / run["run_id"] / "summary.json").read_text())
        assert host_file["status"] == ledger["status"] == status == out["ansible_facts"]["rollout_host_state"]["status"]
        assert host_file["in_router"] is ledger["in_router"] is in_router
        assert [h for h in summary["hosts"] if h["host"] == "gpu-1"][0] == host_file
        assert sum(summary["counts"].values()) == 2
    assert host_file["new_invocation"] == "new1" and host_file["time_to_ready"] == 12.5 and host_file["restarted"]
    assert host_file["last_good_saved"] is True and host_file["endpoint"] == {"url": "u", "worker_url": "w"}
    assert [s["step"] for s in host_file["steps"]] == ["prepared", "draining", "applying", "verified", "rejoined"]


def test_recovered_and_unchanged_hosts_are_named(tmp_path, shown):
    run = start(tmp_path)
    # The ledger as an earlier run left it (a lost host, out of the router), read at step prepared.
    (tmp_path / "fleet").mkdir(exist_ok=True)
    (tmp_path / "fleet" / "gpu-1.json").write_text(json.dumps(
        {"host": "gpu-1", "run_id": "OLD", "step": "applying", "in_router": False, "at": "t"}))
    out = record(run, "prepared", drift=dict(DRIFT, in_sync=True), router=True)
    assert out["record"]["status"] == "pending" and "left out of the router by run OLD" in out["record"]["recovering"]
    done = record(run, "rejoined", drift=dict(DRIFT, invocation_id="new1"), verified=VERIFIED, router=True,
                  recovering=True)
    assert done["record"]["status"] == "recovered"
    in_sync = record(run, "prepared", host="gpu-2", drift=dict(DRIFT, in_sync=True), router=True)
    assert in_sync["record"]["status"] == "unchanged (verified)"


@pytest.mark.parametrize("reached,failure,revert,changed,status,phrases", [
    ("verified", {"msg": "router paused"}, None, True, "verified, not rejoined",
     ["was NOT reverted", "serves no router traffic"]),
    ("applying", {"verdict": "connection_lost", "msg": "connection to gpu-1 lost"}, None, True, "failed",
     ["connection to the host was lost at step applying", "OUT of the router"]),
    ("applying", {"msg": "mismatch"}, {"healthy": True, "invocation_id": "rev1", "observed": {"w": 1},
                                       "verdict": "pass"}, True, "reverted",
     ["reverted to the last-known-good unit: invocation rev1", "back in the router"]),
    ("applying", {"msg": "mismatch"}, {"healthy": False, "verdict": "died",
                                       "msg": "sglang serve: error: unrecognized arguments: --bogus-flag x"},
     True, "failed", ["revert to the last-known-good unit FAILED too (died): sglang serve: error: unrecognized",
                      "OUT of the router, serving nothing"]),
    ("applying", {"msg": "mismatch"}, None, True, "failed", ["NO last-known-good unit"]),
    ("draining", {"msg": "drain timed out"}, None, False, "failed", ["nothing on the host had changed"]),
])
def test_failure_records_say_what_runs_and_where(tmp_path, shown, reached, failure, revert, changed, status, phrases):
    run = start(tmp_path)
    args = dict(state_before={"step": reached}, task="Wait until the new SGLang process runs the intended settings",
                failure=failure, changed=changed, router=True,
                rejoined_after_revert=bool(revert and revert.get("healthy")))
    if revert is not None:
        args["revert"] = revert
    out = record(run, "failed", **args)["record"]
    assert out["status"] == status, out
    for phrase in phrases:
        assert phrase in out["message"], (phrase, out["message"])
    assert out["message"].startswith("Rollout stopped at gpu-1: Wait until the new SGLang process")
    assert out["reverted"] is bool(revert and revert.get("healthy"))
    ledger = json.loads((tmp_path / "fleet" / "gpu-1.json").read_text())
    assert ledger["status"] == status and ledger["in_router"] == out["in_router"]


def test_finish_releases_the_lock_and_fails_when_a_host_failed(tmp_path, shown):
    run = start(tmp_path)
    record(run, "prepared", drift=DRIFT)
    record(run, "prepared", host="gpu-2", drift=DRIFT)
    record(run, "failed", state_before={"step": "applying"}, task="t", failure={"msg": "boom"}, changed=True)
    result = act(dict(state="finish", run=run))
    assert result["failed"] and result["msg"].startswith("Rollout stopped at gpu-1: t: boom")
    assert "Not reached: gpu-2" in result["msg"]
    assert not (tmp_path / "lock.json").exists()
    assert json.loads((tmp_path / run["run_id"] / "run.json").read_text())["status"] == "failed"
    assert any(line.startswith("\nRollout %s:\nhost" % run["run_id"]) for line in shown)


def test_a_host_lost_mid_change_keeps_the_lock_and_the_same_command_resumes_the_run(tmp_path, shown):
    run = start(tmp_path)
    record(run, "prepared", drift=DRIFT)
    record(run, "draining", router=True)
    record(run, "failed", state_before={"step": "applying"}, task="wait", router=True, changed=True,
           failure={"verdict": "connection_lost", "msg": "connection to gpu-1 lost"})
    result = act(dict(state="finish", run=run))
    assert result["failed"] and "keeps the fleet's lock until it is resumed" in result["msg"], result
    meta = json.loads((tmp_path / run["run_id"] / "run.json").read_text())
    assert meta["status"] == "interrupted" and meta["lost"] == ["gpu-1"]
    assert json.loads((tmp_path / "lock.json").read_text())["run_id"] == run["run_id"]
    # another rollout is refused while the controller that holds it lives ...
    refused = start(tmp_path)
    assert refused["failed"] and run["run_id"] in refused["msg"]
    # ... and once it has exited, the same command resumes the run, not a new one
    lock = json.loads((tmp_path / "lock.json").read_text())
    lock["pid_start"] = -1
    (tmp_path / "lock.json").write_text(json.dumps(lock))
    again = start(tmp_path)
    assert again["run_id"] == run["run_id"] and again["resumed"], again
    ledger = json.loads((tmp_path / "fleet" / "gpu-1.json").read_text())
    assert ledger["in_router"] is False and ledger["failed_step"] == "applying"
    record(again, "prepared", drift=DRIFT)
    assert "left out of the router by run %s" % run["run_id"] in json.loads(
        (tmp_path / run["run_id"] / "gpu-1.json").read_text())["recovering"]
    record(again, "rejoined", drift=DRIFT, verified=VERIFIED, router=True, recovering=True)
    done = act(dict(state="finish", run=again))
    assert not done.get("failed"), done
    meta = json.loads((tmp_path / run["run_id"] / "run.json").read_text())
    assert meta["status"] == "finished" and "lost" not in meta and len(meta["resumes"]) == 1
    assert not (tmp_path / "lock.json").exists()


def test_finish_of_a_good_run(tmp_path, shown):
    run = start(tmp_path)
    record(run, "prepared", drift=dict(DRIFT, in_sync=True))
    record(run, "rejoined", drift=DRIFT, verified=VERIFIED)
    result = act(dict(state="finish", run=run))
    assert not result.get("failed") and "updated" in result["msg"]
    assert json.loads((tmp_path / run["run_id"] / "run.json").read_text())["status"] == "finished"
    assert not (tmp_path / "lock.json").exists()


@pytest.mark.parametrize("step, extra, go_on", [
    ("prepared", {"drift": dict(DRIFT, in_sync=True)}, True),  # in sync: unchanged (verified)
    ("prepared", {"drift": DRIFT}, False),  # pending: not reached
    ("draining", {"router": True}, False),  # in progress
    ("verified", {"drift": DRIFT, "verified": VERIFIED, "router": True}, False),  # verified, not rejoined
    ("rejoined", {"drift": DRIFT, "verified": VERIFIED, "router": True}, True),  # updated
    ("failed", {"state_before": {"step": "applying"}, "task": "t", "failure": {"msg": "boom"}, "changed": True}, False),
])
def test_a_record_says_whether_the_rollout_may_go_on_and_finish_agrees(tmp_path, shown, step, extra, go_on):
    """continue_rollout (read by the playbook to stop after a batch) and the run's verdict come from one list."""
    run = start(tmp_path)
    if step not in ("prepared",):
        record(run, "prepared", drift=DRIFT)
    out = record(run, step, **extra)["record"]
    assert out["continue_rollout"] is go_on, out
    assert json.loads((tmp_path / run["run_id"] / "gpu-1.json").read_text())["continue_rollout"] is go_on
    result = act(dict(state="finish", run=run))
    assert bool(result.get("failed")) is not go_on, result


def test_finish_fails_a_run_with_a_host_at_a_status_it_does_not_know(tmp_path, shown):
    """Neither done nor stopped (a record from another version, a hand edit): not reached, so the run failed."""
    run = start(tmp_path)
    record(run, "rejoined", drift=DRIFT, verified=VERIFIED)
    path = tmp_path / run["run_id"] / "gpu-1.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), status="half-way")))
    (tmp_path / run["run_id"] / "summary.json").unlink()
    result = act(dict(state="finish", run=run))
    assert result["failed"] and "not done: gpu-1" in result["msg"], result


def test_finish_keeps_a_lock_it_does_not_hold(tmp_path, shown):
    run = start(tmp_path)
    lock = json.loads((tmp_path / "lock.json").read_text())
    lock["run_id"] = "someone-else"
    (tmp_path / "lock.json").write_text(json.dumps(lock))
    act(dict(state="finish", run=run))
    assert (tmp_path / "lock.json").exists()


class FakeRouter(object):
    def __init__(self, answers):
        self.answers = list(answers)

    def __call__(self, *args, **kwargs):
        return self

    def list_workers(self):
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return [{"url": url, "healthy": healthy} for url, healthy in answer]


W = ["http://h1:30000", "http://h2:30000", "http://h3:30000", "http://h4:30000"]


def capacity(monkeypatch, answers, **args):
    monkeypatch.setattr(action_mod, "RouterClient", FakeRouter(answers))
    monkeypatch.setattr(action_mod.time, "sleep", lambda s: None)
    base = dict(state="capacity", router_url="http://r", workers=W, leaving=W[:1], min_healthy=2, capacity_wait=0,
                poll=0)
    base.update(args)
    return act(base)


def test_capacity_enough_healthy_left(monkeypatch, shown):
    out = capacity(monkeypatch, [[(w, True) for w in W]], min_healthy="75%")
    assert not out.get("failed") and out["remaining"] == 3 and out["required"] == 3


def test_capacity_guard_stops_naming_the_unhealthy(monkeypatch, shown):
    out = capacity(monkeypatch, [[(W[0], True), (W[1], True), (W[2], False)]], min_healthy=2)
    assert out["failed"] and "would leave 1 healthy worker(s)" in out["msg"]
    assert "Not healthy in the router: http://h3:30000, http://h4:30000" in out["msg"]
    assert "nothing was changed in this batch" in out["msg"]


def test_capacity_waits_for_capacity_to_come_back(monkeypatch, shown):
    clock = iter([0.0, 0.0, 1.0, 2.0, 3.0, 4.0])
    monkeypatch.setattr(action_mod.time, "monotonic", lambda: next(clock))
    out = capacity(monkeypatch, [[(W[0], True), (W[1], False)], [(W[0], True), (W[1], True), (W[2], True)]],
                   min_healthy=2, capacity_wait=30)
    assert not out.get("failed") and out["remaining"] == 2


def test_capacity_with_the_router_unreachable_fails_saying_so(monkeypatch, shown):
    from ansible_collections.gpufleet.inference.plugins.module_utils._router import RouterError
    out = capacity(monkeypatch, [RouterError("listing the router's workers at http://r/workers: connection refused")],
                   min_healthy=0)
    assert out["failed"] and "connection refused" in out["msg"]


def test_unknown_state_is_refused(tmp_path):
    from ansible.errors import AnsibleActionFail
    with pytest.raises(AnsibleActionFail, match="state must be one of"):
        act(dict(state="_record"))


def test_a_step_updates_the_summary_in_place_and_rebuilds_a_lost_one(tmp_path, shown):
    run = start(tmp_path)
    for host in HOSTS:
        record(run, "prepared", host=host, drift=DRIFT, router=True)
    path = tmp_path / run["run_id"] / "summary.json"
    record(run, "draining", host=HOSTS[0], drift=DRIFT, router=True)
    summary = json.loads(path.read_text())
    assert sorted(h["host"] for h in summary["hosts"]) == sorted(HOSTS)
    assert summary["counts"] == {"in progress": 1, "pending": 1}, summary["counts"]
    path.unlink()  # lost (or never written): the next step rebuilds it from every host file
    record(run, "applying", host=HOSTS[1], drift=DRIFT, router=True)
    rebuilt = json.loads(path.read_text())
    assert sorted(h["host"] for h in rebuilt["hosts"]) == sorted(HOSTS)
    assert rebuilt["counts"] == {"in progress": 2}, rebuilt["counts"]


def prepared(run, hostvars, alive=None, hosts=("gpu-1", "gpu-2", "gpu-3")):
    action = fakes.make_action(action_mod, dict(state="prepared", run=run, hosts=list(hosts), router=True,
                                                alive=list(hosts if alive is None else alive)),
                               action="gpufleet.inference.sglang_rollout")
    return action.run(task_vars={"inventory_hostname": hosts[0], "hostvars": hostvars})


@pytest.fixture
def built(monkeypatch):
    """The module payloads the prepare phase builds (ActionBase._configure_module, faked)."""
    class Calls(list):
        broken = ()

    calls = Calls()

    def configure(self, name, module_args, task_vars):
        calls.append((name, task_vars.get("ansible_python_interpreter")))
        if name in calls.broken:
            raise RuntimeError("cannot build %s" % name)
        return object(), "/path/%s.py" % name

    monkeypatch.setattr(action_mod.ActionModule, "_configure_module", configure)
    return calls


def test_prepared_builds_the_critical_path_modules_before_any_host_leaves(tmp_path, shown, built):
    run = start(tmp_path, hosts=["gpu-1", "gpu-2", "gpu-3"])
    out = prepared(run, {"gpu-1": {"sglang_drift": DRIFT}, "gpu-2": {"sglang_drift": DRIFT},
                         "gpu-3": {"sglang_drift": dict(DRIFT, in_sync=True)}})
    assert out["prebuilt"] == list(CRITICAL_PATH_MODULES) and [c[0] for c in built] == list(CRITICAL_PATH_MODULES)
    assert {c[1] for c in built} == {"/usr/bin/python3"}  # no interpreter discovery on the host for a build
    # One that cannot be built here is left to the apply phase (built when used); the others are built.
    del built[:]
    built.broken = ("gpufleet.inference.sglang_ready",)
    again = prepared(start(tmp_path / "again", hosts=["gpu-1", "gpu-2", "gpu-3"]),
                     {"gpu-1": {"sglang_drift": DRIFT}, "gpu-2": {"sglang_drift": DRIFT}, "gpu-3": {"sglang_drift": DRIFT}})
    assert not again.get("failed") and again["apply"] == ["gpu-1", "gpu-2", "gpu-3"], again
    assert again["prebuilt"] == [m for m in CRITICAL_PATH_MODULES if m != "gpufleet.inference.sglang_ready"]
    # Nothing to change, or a host failed: nothing is built.
    del built[:]
    none = prepared(start(tmp_path / "none", hosts=["gpu-1"]), {"gpu-1": {"sglang_drift": dict(DRIFT, in_sync=True)}},
                    hosts=("gpu-1",))
    assert none["apply"] == [] and none["prebuilt"] == [] and built == []
    lost = prepared(start(tmp_path / "lost", hosts=["gpu-1", "gpu-2"]), {"gpu-1": {"sglang_drift": DRIFT}},
                    alive=["gpu-1"], hosts=("gpu-1", "gpu-2"))
    assert lost["apply"] == [] and built == []


def test_prepared_records_every_host_in_one_task_and_sends_only_those_that_change(tmp_path, shown, built):
    run = start(tmp_path, hosts=["gpu-1", "gpu-2", "gpu-3"])
    hostvars = {"gpu-1": {"sglang_drift": dict(DRIFT, prepared={"endpoint": {"url": "u1"}})},
                "gpu-2": {"sglang_drift": dict(DRIFT, in_sync=True)},
                "gpu-3": {"sglang_drift": DRIFT}}
    out = prepared(run, hostvars)
    assert out["apply"] == ["gpu-1", "gpu-3"], out  # inventory order: the canary is gpu-1
    files = dict((h, json.loads((tmp_path / run["run_id"] / ("%s.json" % h)).read_text())) for h in hostvars)
    assert [files[h]["status"] for h in ("gpu-1", "gpu-2", "gpu-3")] == ["pending", "unchanged (verified)", "pending"]
    assert files["gpu-1"]["endpoint"] == {"url": "u1"}
    summary = json.loads((tmp_path / run["run_id"] / "summary.json").read_text())
    assert summary["counts"] == {"pending": 2, "unchanged (verified)": 1}


def test_prepared_sends_no_host_when_one_failed_or_was_lost(tmp_path, shown, built):
    run = start(tmp_path, hosts=["gpu-1", "gpu-2", "gpu-3"])
    failed = record(run, "failed", host="gpu-3", task="Check the SGLang settings", failure={"msg": "bad window"})
    hostvars = {"gpu-1": {"sglang_drift": DRIFT}, "gpu-2": {"sglang_drift": DRIFT},
                "gpu-3": {"rollout_host_state": failed["record"]}}
    out = prepared(run, hostvars)
    assert out["apply"] == [] and out["failed_hosts"] == ["gpu-3"] and "gpu-3" in out["msg"], out
    kept = json.loads((tmp_path / run["run_id"] / "gpu-3.json").read_text())
    assert kept["status"] == "failed" and kept["failed_task"] == "Check the SGLang settings"  # not overwritten

    lost_run = start(tmp_path / "other", hosts=["gpu-1", "gpu-2", "gpu-3"])
    out = prepared(lost_run, {"gpu-1": {"sglang_drift": DRIFT}, "gpu-2": {"sglang_drift": DRIFT}, "gpu-3": {}},
                   alive=["gpu-1", "gpu-2"])
    assert out["apply"] == [] and out["lost_hosts"] == ["gpu-3"], out
    lost = json.loads((tmp_path / "other" / lost_run["run_id"] / "gpu-3.json").read_text())
    assert lost["status"] == "failed" and lost["connection_lost"] is False, lost
    assert "without a result" in lost["error"] and "nothing on the host had changed" in lost["outcome"]


def test_prepared_reads_the_ledger_and_names_each_host_s_worker(tmp_path, shown, built):
    """A host in sync that an earlier run left out of the router (the fleet's ledger, read at this
    step, not handed from the start) still changes; every compared host's worker URL is returned for
    the capacity guard, also that of a host in sync."""
    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / "gpu-2.json").write_text(json.dumps(
        {"host": "gpu-2", "run_id": "OLD", "step": "draining", "in_router": False, "at": "t"}))
    run = start(tmp_path, hosts=["gpu-1", "gpu-2", "gpu-3"])
    assert "fleet" not in run  # the ledger is not carried in every host's arguments
    endpoint = dict((h, {"url": "http://%s:30000" % h, "worker_url": "http://%s:30000" % h}) for h in run["hosts"])
    hostvars = dict((h, {"sglang_drift": dict(DRIFT, in_sync=True, prepared={"endpoint": endpoint[h]})})
                    for h in run["hosts"])
    out = prepared(run, hostvars)
    assert out["apply"] == ["gpu-2"], out
    assert out["worker_urls"] == dict((h, endpoint[h]["worker_url"]) for h in run["hosts"])
    record = json.loads((tmp_path / run["run_id"] / "gpu-2.json").read_text())
    assert record["status"] == "pending" and "left out of the router by run OLD" in record["recovering"]
    ledger = json.loads((tmp_path / "fleet" / "gpu-2.json").read_text())
    assert ledger["run_id"] == run["run_id"] and ledger["step"] == "prepared"  # rewritten after it was read
