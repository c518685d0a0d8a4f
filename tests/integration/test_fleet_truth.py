"""The fleet is the source of truth (issue 29), on the lab with the real sglang-router.

Each test reproduces cases of the issue the way an operator meets them: another results directory,
another controller (a hostname and PID namespace of its own, as an AWX job's container has), a host
whose SSH is down, a port change, a --limit, a stopped server the router still lists, an operator's
own drain, a sweep holding a host. The AWX / Automation Controller cases run the real ansible-runner,
each job in its own private data dir, hostname and PID namespace: two jobs at once, a job killed
(SIGKILL: the kernel ends every process of its namespace, as `podman kill` does) and resumed by a new
job, a status job.

Every test checks the fleet itself - router membership, the unit, the process and its config line,
each host's lease and record (read through the container) - not only what the playbook printed.
"""
from __future__ import annotations

import json
import re
import subprocess
import time

from lab_support import BIN

from rollout_support import (SIM_ENV, Playbook, Records, assert_records_consistent, assert_runs, describe, failures,
                             fleet_record, fleet_state, host_state, in_router, kill_group, leases, play_batches, playbook_env,
                             remove_workers, router_workers, worker_url)
from rollout_support import fleet_of, lab, make_inventory, need_router  # noqa: F401 pylint: disable=unused-import
from test_rollout_safety import (NEW, OLD, OTHER, SLOW_LOAD, assert_last_good, assert_untouched, finished,
                                 rollout, wait_started)

PLAN_TASK = "Plan the run from what the fleet holds (leases, records, the router's workers)"
CAPACITY_TASK = "Check that the group keeps enough healthy workers while this batch is out"


# ------------------------------------------------------------------ cases 2, 6, 7: an interrupted run

def test_an_interrupted_run_resumes_from_another_directory_only_with_its_own_intent(
        fleet_of, lab, lab_hosts, need_router, tmp_path):
    """Case 2: a run killed during the canary's wait, re-run from ANOTHER results directory, resumes
    (router membership from the router, records from the hosts): the canary is put back before the
    next host leaves. Case 6: a re-run with other settings - with a --limit that leaves the canary out,
    or with the canary - is refused naming it, and nothing is drained. Case 7: a finished run id is
    never reopened."""
    hosts = lab_hosts[:3]
    canary, second, third = hosts
    inv, before = fleet_of(hosts)
    inv.set_vars(sglang_speculative_draft_window_size=NEW, sglang_environment=SIM_ENV | SLOW_LOAD)
    run = rollout(inv, tmp_path / "first", hosts)
    wait_started(run, canary["name"])
    kill_group(run)
    killed = fleet_state(lab, lab_hosts, need_router)
    assert killed[canary["name"]]["in_router"] is False, describe(killed[canary["name"]])
    record = fleet_record(lab, canary)
    run_id = record["run_id"]
    assert record["kind"] == "rollout" and record["step"] == "applying" and record["drained_by"] == run_id, record

    # Case 6: other settings, the canary left out by --limit: refused before anything is leased or drained.
    other = inv.set_vars(sglang_speculative_draft_window_size=OTHER)
    refused = finished(rollout(inv, tmp_path / "other", [second, third]))
    assert refused.rc != 0 and failures(refused.out)[0][0] == PLAN_TASK, refused
    text = " ".join(refused.out.split())
    assert f"an interrupted rollout left {canary['name']} (run {run_id}, step applying) mid-change" in text, refused
    # ... and with the canary: it left the canary with other settings
    refused = finished(rollout(inv, tmp_path / "other", hosts))
    assert refused.rc != 0 and "this run brings other settings" in " ".join(refused.out.split()), refused
    assert "rollout_takeover=true" in " ".join(refused.out.split()), refused
    now = fleet_state(lab, lab_hosts, need_router)
    for host in (second, third):
        assert_runs(now[host["name"]], OLD, in_router=True)  # nothing drained
        assert (fleet_record(lab, host).get("run_id") or run_id) == run_id  # no other run wrote on them
    assert other["sglang_speculative_draft_window_size"] == OTHER

    # Case 2: the same settings from another directory: the run resumes under its id, canary first.
    inv.set_vars(sglang_speculative_draft_window_size=NEW, sglang_environment=SIM_ENV | SLOW_LOAD)
    resumed = finished(rollout(inv, tmp_path / "elsewhere", hosts))
    assert resumed.rc == 0, resumed
    assert re.search(rf"resuming run {run_id}: it left {canary['name']} mid-change", " ".join(resumed.out.split()))
    records = Records(tmp_path / "elsewhere")
    assert records.run_ids() == [run_id]
    recs = assert_records_consistent(records, run_id)
    assert recs[canary["name"]]["status"] == "recovered", recs[canary["name"]]
    assert [recs[h["name"]]["status"] for h in (second, third)] == ["updated", "updated"], recs
    # the second host left the router only after the canary was back in it
    left_at = [s["at"] for s in recs[second["name"]]["steps"] if s["step"] == "draining"][0]
    assert recs[canary["name"]]["rejoined_at"] < left_at, (recs[canary["name"]], recs[second["name"]])
    after = fleet_state(lab, lab_hosts, need_router)
    for host in hosts:
        assert_runs(after[host["name"]], NEW, in_router=True)
        assert_last_good(after[host["name"]], after[host["name"]]["invocation"], NEW)
    assert not leases(lab, hosts), "a finished run left leases"

    # Case 7: the finished run's id is not reopened, and nothing is written in its name.
    reopened = finished(rollout(inv, tmp_path / "elsewhere", hosts, "-e", f"rollout_run_id={run_id}"))
    assert reopened.rc != 0 and "a finished or unknown run is never reopened" in " ".join(reopened.out.split())
    assert records.run(run_id)["status"] == "finished"
    assert fleet_state(lab, lab_hosts, need_router) == after
    assert_untouched(after[lab_hosts[3]["name"]])
    print(f"\ninterrupted run {run_id}: other settings refused twice; resumed from another directory in "
          f"{resumed.seconds:.1f} s; reopening refused")


# ------------------------------------------------------------------ case 3: drained before reachable

def test_a_host_unreachable_when_its_batch_comes_is_never_drained_and_says_so(
        fleet_of, lab, lab_hosts, need_router, tmp_path):
    """Case 3: the second batch's host loses SSH during the canary's wait (its server serving): it is
    not taken out of the router, nothing changes on it, its record and the copy say so, and its lease
    stays for a re-run to resume."""
    hosts = lab_hosts[:2]
    canary, second = hosts
    inv, before = fleet_of(hosts)
    inv.set_vars(sglang_speculative_draft_window_size=NEW, sglang_environment=SIM_ENV | SLOW_LOAD)
    run = rollout(inv, tmp_path / "results", hosts)
    try:
        wait_started(run, canary["name"])
        lab.cut_ssh(second["name"])
        finished(run)
        cut = fleet_state(lab, lab_hosts, need_router)
    finally:
        lab.restore_ssh(second["name"])
    assert run.rc != 0, run
    records = Records(tmp_path / "results")
    run_id = records.only_run()
    recs = assert_records_consistent(records, run_id, last_writer=False)
    assert recs[canary["name"]]["status"] == "updated", recs[canary["name"]]
    record = recs[second["name"]]
    assert record["status"] == "failed" and record["connection_lost"] is True, record
    assert record["in_router"] is True and "was not taken out of the router" in record["outcome"], record
    assert record["runs"] == "the previous unit (unchanged)", record
    state = cut[second["name"]]
    assert_runs(state, OLD, in_router=True)  # never drained, never changed
    assert state["invocation"] == before[second["name"]]["invocation"], describe(state)
    assert_runs(cut[canary["name"]], NEW, in_router=True)
    print(f"\n{second['name']} unreachable at its batch: {record['outcome']}")


# ------------------------------------------------------------------ case 4: a port change

def test_a_port_change_drains_the_worker_the_router_has_and_rejoins_the_new_one(
        fleet_of, lab, lab_hosts, need_router, tmp_path):
    """Case 4: sglang_port changes: the old worker URL leaves the router (drained), the new one joins;
    with rollout_min_healthy the guard counts the workers the router has."""
    hosts = lab_hosts[:2]
    inv, before = fleet_of(hosts)
    inv.set_vars(sglang_speculative_draft_window_size=OLD, sglang_port=30001)
    run = finished(rollout(inv, tmp_path / "results", hosts, "-e", "rollout_min_healthy=1"))
    assert run.rc == 0, run
    listed = in_router(need_router)
    for host in hosts:
        assert worker_url(host) not in listed, listed  # the old worker is gone
        assert f"http://{host['address']}:30001" in listed, listed
    records = Records(tmp_path / "results")
    recs = assert_records_consistent(records, records.only_run())
    for host in hosts:
        assert recs[host["name"]]["status"] == "updated" and recs[host["name"]]["router_url"] == worker_url(host)
        assert fleet_record(lab, host)["worker_url"] == f"http://{host['address']}:30001"


# ------------------------------------------------------------------ cases 5, 9: the capacity guard

def test_the_capacity_guard_counts_the_group_and_probes_each_worker_itself(
        fleet_of, lab, lab_hosts, need_router, tmp_path):
    """Case 9: one server stopped (`systemctl stop`) while the router still lists it healthy:
    rollout_min_healthy 3 of 4 is refused naming it. Case 5: two of the group's four down, --limit
    to the two healthy ones with 50% is refused (the group is counted, not the play); --limit one
    host with min_healthy 2 while three stay healthy goes on."""
    inv, before = fleet_of(lab_hosts)
    stopped = lab_hosts[3]
    lab.enter(stopped["name"], ["systemctl", "stop", "sglang.service"])
    assert worker_url(stopped) in {w["url"] for w in router_workers(need_router) if w.get("is_healthy")}, \
        "the router noticed at once: the case needs its cached health"
    inv.set_vars(sglang_speculative_draft_window_size=NEW)
    quick = ("-e", "rollout_capacity_wait=3")
    refused = finished(rollout(inv, tmp_path / "a", lab_hosts[:3], "-e", "rollout_min_healthy=3", *quick))
    assert refused.rc != 0, refused
    task, _host, message = failures(refused.out)[0]
    assert task == CAPACITY_TASK and f"{stopped['name']} {worker_url(stopped)}: /generate" in message, refused
    assert not any(play_batches(refused.out)[1:]), refused

    # Case 5: a second server down; --limit to the two healthy ones; 50% of the group is 2: refused
    lab.enter(lab_hosts[2]["name"], ["systemctl", "stop", "sglang.service"])
    refused = finished(rollout(inv, tmp_path / "b", lab_hosts[:2], "-e", "rollout_min_healthy=50%", *quick))
    assert refused.rc != 0 and failures(refused.out)[0][0] == CAPACITY_TASK, refused
    assert "of the group's 4 server(s)" in failures(refused.out)[0][2].replace("''", "'"), refused  # yaml's quoting
    lab.enter(lab_hosts[2]["name"], ["systemctl", "start", "sglang.service"])
    deadline = time.monotonic() + 60
    while not all(fleet_state(lab, [h], None)[h["name"]]["serving"] for h in lab_hosts[:3]):
        assert time.monotonic() < deadline
        time.sleep(1)
    # --limit one host, min 2: three stay healthy (the group's), so it goes on
    ok = finished(rollout(inv, tmp_path / "c", lab_hosts[:1], "-e", "rollout_min_healthy=2", *quick))
    assert ok.rc == 0, ok
    after = fleet_state(lab, lab_hosts, need_router)
    assert_runs(after[lab_hosts[0]["name"]], NEW, in_router=True)
    assert after[lab_hosts[1]["name"]]["invocation"] == before[lab_hosts[1]["name"]]["invocation"]


# ------------------------------------------------------------------ cases 8, 10, 11

def test_an_unreachable_host_holds_nothing_an_operators_drain_is_kept_and_free_strategy_is_harmless(
        fleet_of, lab, lab_hosts, need_router, tmp_path):
    """Case 10: a host unreachable in the prepare phase: nothing is leased or changed; a re-run with
    --limit without it updates the others, rc 0, and names no other host. Case 11: a host in sync that
    the operator took out of the router stays out (reported); the collection puts back only what it
    drained. Case 8: with strategy = free in ansible.cfg the run-once steps still run once."""
    hosts = lab_hosts[:3]
    first, second, down = hosts
    inv, before = fleet_of(hosts)
    inv.set_vars(sglang_speculative_draft_window_size=NEW)
    lab.cut_ssh(down["name"])
    try:
        run = finished(rollout(inv, tmp_path / "a", hosts))
        assert run.rc != 0 and "no host was leased or changed" in " ".join(run.out.split()), run
        assert not leases(lab, hosts), "a run that changed nothing kept leases"
        now = fleet_state(lab, lab_hosts, need_router)
        for host in hosts:
            assert now[host["name"]]["invocation"] == before[host["name"]]["invocation"], describe(now[host["name"]])

        # the operator takes `second` out of the router on purpose; it is in sync after this run
        free = dict(inv.env, ANSIBLE_STRATEGY="free")
        inv.env = free
        run = finished(rollout(inv, tmp_path / "b", [first]))
        assert run.rc == 0 and run.out.count(f"TASK [{PLAN_TASK}]") == 1, run
        remove_workers(need_router, [second])
        run = finished(rollout(inv, tmp_path / "c", [first, second]))
        assert run.rc == 0 and "Rollout stopped at" not in run.out, run
        # the host that is down is of the group, not of this run: named as unread, never blamed
        assert f"{down['name']} (of the group, not in this run) could not be read" in " ".join(run.out.split()), run
    finally:
        lab.restore_ssh(down["name"])
    records = Records(tmp_path / "c")
    recs = assert_records_consistent(records, records.only_run())
    assert recs[first["name"]]["status"] == "unchanged (verified)", recs
    # changed (it was not in sync) and verified - but not put into the router: the operator took it out
    assert recs[second["name"]]["status"] == "updated, left out of the router", recs[second["name"]]
    after = fleet_state(lab, lab_hosts, need_router)
    assert_runs(after[second["name"]], NEW, in_router=False)
    assert_runs(after[first["name"]], NEW, in_router=True)
    # a host in sync that the operator took out stays out, reported
    remove_workers(need_router, [first])
    run = finished(rollout(inv, tmp_path / "d", [first]))
    assert run.rc == 0 and "not taken out by this collection" in " ".join(run.out.split()), run
    assert worker_url(first) not in in_router(need_router)
    records = Records(tmp_path / "d")
    # a run that changes nothing holds and writes nothing on the hosts: the host's record stays run c's
    assert assert_records_consistent(records, records.only_run(), last_writer=False)[first["name"]]["status"] == \
        "unchanged (verified), out of the router"
    assert records.ledger(first["name"])["run_id"] == Records(tmp_path / "c").only_run()
    assert not leases(lab, hosts), "a run that changed nothing left leases"

    # A live lease of another controller (not provably gone: it binds until it expires) refuses a run that
    # changes nothing too; with rollout_break_lease the run breaks it - holding the host though it changes
    # nothing - and releases it at its finish. Nothing restarts.
    bastion = {"kind": "rollout", "run_id": "r-bastion", "session": "s-bastion", "controller": "bastion-9",
               "user": "bob", "job": None}
    taken = subprocess.run([str(BIN / "ansible"), "-i", str(inv.hosts_yml), first["name"], "-m",
                            "gpufleet.inference.sglang_lease", "-a", json.dumps(
                                {"unit": "sglang.service", "directory": "/var/lib/gpufleet-inference/fleet",
                                 "holder": bastion, "seconds": 600})],
                           env=playbook_env(inv.env), capture_output=True, text=True, timeout=120, check=False)
    assert taken.returncode == 0 and leases(lab, [first]), taken.stdout + taken.stderr
    refused = finished(rollout(inv, tmp_path / "e", [first]))
    assert refused.rc != 0 and failures(refused.out)[0][0] == PLAN_TASK, refused
    assert "bastion-9" in " ".join(refused.out.split()), refused
    broke = finished(rollout(inv, tmp_path / "f", [first], "-e", "rollout_break_lease=true"))
    assert broke.rc == 0, broke
    lease = fleet_state(lab, [first], None)[first["name"]]
    assert not leases(lab, [first]) and lease["invocation"] == after[first["name"]]["invocation"], describe(lease)
    held = host_state(lab, first)["lease"]
    assert held["released"] and held["previous"]["holder"]["controller"] == "bastion-9", held
    assert_untouched(after[lab_hosts[3]["name"]])


# ------------------------------------------------------------------ case 12: writers exclude each other

SWEEP_MATRIX = {"sglang_speculative_draft_window_size": [OTHER]}


def test_a_sweep_holds_its_host_against_a_rollout_and_last_known_good_follows_every_verified_change(
        fleet_of, lab, lab_hosts, need_router, tmp_path):
    """Case 12: while sweep.yml holds a host, a rollout over it is refused naming the sweep; the
    sweep's restore and the role's apply keep last-known-good current, so a failing rollout reverts to
    what ran last, not to an older rollout's unit."""
    host = lab_hosts[0]
    inv, before = fleet_of([host], sglang_environment=SIM_ENV | {"SGLANG_SIM_LOAD_SECONDS": "8"})
    sweep = Playbook(inv.hosts_yml, "playbooks/sweep.yml", extra_vars={
        "sweep_host": host["name"], "sweep_matrix": SWEEP_MATRIX, "sweep_results_dir": str(tmp_path / "sweep"),
        "sweep_bench": {"num_prompts": 4, "concurrency": 2, "max_new_tokens": 16}},
        env=inv.env, log=tmp_path / "sweep.log")
    try:
        deadline = time.monotonic() + 120
        while not any(lease["holder"]["kind"] == "sweep" for lease in leases(lab, [host]).values()):
            assert time.monotonic() < deadline and sweep.proc.poll() is None, sweep
            time.sleep(0.5)
        inv.set_vars(sglang_speculative_draft_window_size=NEW)
        refused = finished(rollout(inv, tmp_path / "rollout", [host]))
        assert refused.rc != 0 and failures(refused.out)[0][0] == PLAN_TASK, refused
        assert f"{host['name']} is leased by sweep" in " ".join(refused.out.split()), refused
    finally:
        sweep.wait(600)
    assert sweep.rc == 0, sweep
    assert not leases(lab, [host]), "the sweep left its lease"
    restored = fleet_state(lab, [host], need_router)[host["name"]]
    assert_runs(restored, OLD, in_router=True)  # restored to the inventory's settings
    assert_last_good(restored, restored["invocation"], OLD)  # ... and that is what last-known-good is now

    # the role's apply changes it: last-known-good follows
    inv.set_vars(sglang_speculative_draft_window_size=NEW)
    inv.deploy(limit=host["name"])
    applied = fleet_state(lab, [host], need_router)[host["name"]]
    assert_last_good(applied, applied["invocation"], NEW)
    # a failing rollout reverts to the role's unit (NEW), not to an older one
    # (its SGLang ignores the window: the new process is refused, the host reverted)
    inv.set_vars(sglang_speculative_draft_window_size=OTHER,
                 sglang_environment=SIM_ENV | {"SGLANG_SIM_FAULT": "ignore_window"})
    failed = finished(rollout(inv, tmp_path / "failing", [host]))
    assert failed.rc != 0, failed
    records = Records(tmp_path / "failing")
    record = assert_records_consistent(records, records.only_run())[host["name"]]
    assert record["status"] == "reverted", record
    after = fleet_state(lab, [host], need_router)[host["name"]]
    assert after["unit_window"] == NEW and after["logged_window"] == NEW, describe(after)
