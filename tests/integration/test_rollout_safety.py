"""Rollouts that never leave the fleet worse off (issue 9), on the lab with the real sglang-router.

One test per finding of the issue: two rollouts at once, SSH lost during the wait (and transient
breaks that must not revert), Ctrl-C during the canary's wait, the router paused or killed at
rejoin, a failed revert, --check, bad rollout_batches, the capacity guard; plus the lost restart
handler and a last host with invalid settings (issue 11). Each test checks, on every lab host,
router membership (GET <router>/workers), the unit file, the running process (its InvocationID,
command line and the config line of that invocation) - read through the container, not SSH - and
that the records (the copy: <run>/<host>.json, <run>/summary.json; each host's own record and lease) say the same.

Tests that change nothing share one deployment (class TestOnADeployedFleet); the others deploy
only the hosts they roll (the rest of the lab stays clean and is checked to stay so).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest
from lab_support import CLEAN_HOST
from role_support import wait_for
from rollout_support import (INSTALL_WITHOUT_RESTART, LAST_GOOD_DIR, PROGRESS, ROLLOUT, SIM_ENV, UNIT_PATH,
                             FleetInventory, Playbook, Records, add_workers, assert_record_matches_host,
                             assert_records_consistent, assert_runs, describe, failures, fleet_state, play_batches,
                             remove_workers, router_workers, run_playbook_argv, ssh_clients_to, worker_url)
# Fixtures (pytest finds them in this module's namespace).
from rollout_support import lab, make_inventory, need_router  # noqa: F401 pylint: disable=unused-import

OLD, NEW, OTHER = 1024, 2048, 4096  # draft windows: deployed, rolled out, a second rollout's
SLOW_LOAD = {"SGLANG_SIM_LOAD_SECONDS": "20"}  # a wait long enough to break something during it
LOCK_HELD = r"(\S+) is leased by rollout (\S+) on (\S+) by"


def names(hosts):
    return [h["name"] for h in hosts]


def limit_of(hosts):
    return ",".join(names(hosts) + ["localhost"])  # the finish play runs on localhost


def rollout(inv, results, hosts, *args, **kwargs) -> Playbook:
    """gpufleet.inference.rollout on `hosts`, recording in `results`, in the background."""
    logs = sorted(results.parent.glob("rollout-*.log"))
    return Playbook(inv.hosts_yml, ROLLOUT, *args, extra_vars={"rollout_results_dir": str(results)},
                    limit=limit_of(hosts), log=results.parent / f"rollout-{len(logs) + 1}.log", env=inv.env, **kwargs)


def finished(run: Playbook, timeout: float = 900) -> Playbook:
    try:
        return run.wait(timeout)
    finally:
        run.kill()


def assert_untouched(state: dict) -> None:
    """A host outside the rollout stays clean: no unit, no process, no record on it."""
    assert state["unit"] is None and state["main_pid"] == 0 and state["active"] != "active", describe(state)
    assert state["last_good"] is None and not state["serving"], describe(state)
    assert state.get("in_router") in (None, False), describe(state)


def assert_last_good(state: dict, invocation: str, window: int) -> None:
    assert (state["last_good"] or {}).get("invocation_id") == invocation, describe(state)
    assert state["last_good_window"] == window, describe(state)


def wait_started(run: Playbook, host: str, timeout: float = 600) -> None:
    """Block until `host` is inside the wait for its new process: a progress line of the wait (printed
    as it comes, before the callback shows the handler's name)."""
    run.wait_for(PROGRESS.format(host=re.escape(host), text="(new invocation|loading)"), timeout)


@pytest.fixture
def rollout_fleet(clean_fleet, need_router, make_inventory, lab, lab_hosts):
    """(inventory on window OLD, deploy(hosts)): hosts deployed on OLD and joined to the router."""
    inv = make_inventory()
    inv.set_vars(sglang_speculative_draft_window_size=OLD)

    def deploy(hosts):
        inv.deploy(limit=",".join(names(hosts)), join_router=True)
        state = fleet_state(lab, lab_hosts, need_router)
        for host in hosts:
            assert_runs(state[host["name"]], OLD, in_router=True)
        return state
    return inv, deploy


# ------------------------------------------------------------------ tests that change nothing

@pytest.fixture(scope="class")
def deployed(lab_inventory, lab_hosts, server_vars, router_url, tmp_path_factory, lab, sh):
    """Every lab host on window OLD, in the router, kept as last-known-good by the role. Shared: a test
    of the class must leave it so (each checks that it changed nothing)."""
    if not router_url:
        pytest.skip("the lab inventory sets no sglang_router_url (lab.py up --router)")

    def clean():
        for host in lab_hosts:
            sh(host, CLEAN_HOST, check=False)
        remove_workers(router_url, lab_hosts)
    clean()
    inv = FleetInventory(tmp_path_factory.mktemp("deployed"), lab_inventory, server_vars)
    inv.set_vars(sglang_speculative_draft_window_size=OLD)
    inv.deploy(join_router=True)
    state = fleet_state(lab, lab_hosts, router_url)
    for host_state in state.values():
        assert_runs(host_state, OLD, in_router=True)
        # the role keeps what it verified as last-known-good (issue 29: it advances on every verified change)
        assert_last_good(host_state, host_state["invocation"], OLD)
    yield state
    inv.close()
    clean()


def assert_nothing_changed(before: dict, after: dict) -> None:
    for name, state in before.items():
        now = after[name]
        for key in ("invocation", "unit", "cmdline", "in_router", "last_good", "restarts"):
            assert now[key] == state[key], (key, describe(state), describe(now))
        assert_runs(now, OLD, in_router=state["in_router"])


class TestOnADeployedFleet:
    """Runs that must change nothing, on one shared deployment (window OLD, every host in the router)."""

    def test_check_run_writes_nothing_takes_no_lock_and_lists_the_differences(
            self, deployed, make_inventory, lab, lab_hosts, router_url, tmp_path):
        """Finding 7 (--check), and run ids unique for runs started in the same second."""
        inv = make_inventory()
        inv.set_vars(sglang_speculative_draft_window_size=NEW)
        files_before = {h["name"]: host_files(lab, h) for h in lab_hosts}
        results = tmp_path / "results"
        runs = [rollout(inv, results, lab_hosts, "--check") for _i in range(2)]  # started together
        runs = [finished(run) for run in runs]
        after = fleet_state(lab, lab_hosts, router_url)

        for run in runs:
            assert run.rc == 0, run
            assert "(check mode: nothing was changed)" in run.out, run
            assert not any(play_batches(run.out)), run  # no host reached the apply phase
        assert_nothing_changed(deployed, after)
        assert {h["name"]: host_files(lab, h) for h in lab_hosts} == files_before

        records = Records(results)
        assert records.lock() is None, "a check run took the fleet's lock"
        run_ids = records.run_ids()
        for host in lab_hosts:  # nothing of a check run is written on a host
            assert (records.ledger(host["name"]) or {}).get("run_id") not in run_ids, host
        assert len(run_ids) == 2 and run_ids[0] != run_ids[1], run_ids
        for run_id in run_ids:
            assert run_id.endswith("-check"), run_id
            meta = records.run(run_id)
            assert meta["check_mode"] is True and meta["status"] == "check", meta
            hosts = assert_records_consistent(records, run_id)
            assert sorted(hosts) == names(lab_hosts)
            for name, record in hosts.items():
                assert record["status"] == "would change", record
                window = [d for d in record["differences"] if d["what"] == "config line"
                          and d["key"] == "draft_window_size"]
                assert window and window[0]["expected"] == NEW and window[0]["observed"] == OLD, record
                assert record["old_invocation"] == deployed[name]["invocation"], record
        print(f"\ntwo check runs started together: {sorted(run_ids)} "
              f"({runs[0].seconds:.1f} s, {runs[1].seconds:.1f} s)")

    @pytest.mark.parametrize("form", ["key=value", "json"])
    def test_bad_rollout_batches_fail_before_any_change(self, deployed, make_inventory, lab, lab_hosts,
                                                        router_url, tmp_path, form):
        """Finding 8: invalid rollout_batches fail at the first task, in plain words."""
        inv = make_inventory()
        inv.set_vars(sglang_speculative_draft_window_size=NEW)
        bad = {"0": 0, "-1": -1, "150%": "150%", "abc": "abc", "a mapping": {"a": 1}}
        started = {}
        for label, value in bad.items():
            results = tmp_path / f"results-{len(started)}"
            if form == "key=value":
                text = "{a: 1}" if isinstance(value, dict) else str(value)
                args = ("-e", f"rollout_batches={text}")
            else:
                args = ("-e", json.dumps({"rollout_batches": value}))
            started[label] = (results, rollout(inv, results, lab_hosts, *args))
        for label, (results, run) in started.items():
            finished(run)
            assert run.rc not in (0, 250) and "Traceback" not in run.out, (label, run)
            # The first task failed, in plain words: nothing compared, recorded or applied.
            (task, _host, message), = failures(run.out)[:1] or [(None, None, "")]
            assert task == "Check the rollout's variables", (label, run)
            assert "rollout_batches" in message, (label, message)
            assert "TASK [gpufleet.inference.sglang : Compare this host" not in run.out, (label, run)
            # ... and that failure is the only one: the finish play has no run to finish and says nothing more.
            assert len(failures(run.out)) == 1 and "has no attribute" not in run.out, (label, run)
            assert Records(results).run_ids() == [] and Records(results).lock() is None, label
        assert_nothing_changed(deployed, fleet_state(lab, lab_hosts, router_url))

    def test_a_rollout_that_matches_no_host_fails_saying_so(self, deployed, make_inventory, lab, lab_hosts,
                                                            router_url, tmp_path):
        """A mistyped rollout_hosts (or a --limit outside it) fails naming the pattern, not with a template error."""
        inv = make_inventory()
        inv.set_vars(sglang_speculative_draft_window_size=NEW)
        results = tmp_path / "results"
        run = finished(rollout(inv, results, lab_hosts, "-e", "rollout_hosts=gpu-typo"))
        assert run.rc not in (0, 250) and "Traceback" not in run.out, run
        (task, host, message), = failures(run.out)
        assert task == "Stop when no host matched the rollout (nothing was compared or changed)", run
        message = message.replace("''", "'")  # the yaml callback's quoting
        assert host == "localhost" and "No host matched rollout_hosts 'gpu-typo' with --limit" in message, message
        assert "has no attribute" not in run.out and "HostVarsVars" not in run.out, run
        assert Records(results).run_ids() == [] and Records(results).lock() is None
        assert_nothing_changed(deployed, fleet_state(lab, lab_hosts, router_url))

    def test_capacity_guard_waits_then_stops_naming_the_unhealthy_hosts(
            self, deployed, make_inventory, lab, lab_hosts, router_url, tmp_path):
        """Finding 9: one host out of the router; rollout_min_healthy 3 of the 4 hosts of the group
        leaves no room for the canary, the only host to change (the others are in sync and count)."""
        inv = make_inventory()
        inv.set_vars(sglang_speculative_draft_window_size=OLD)
        inv.set_host_vars(lab_hosts[0]["name"], sglang_speculative_draft_window_size=NEW)
        out_of_router = lab_hosts[-1]
        results = tmp_path / "results"
        remove_workers(router_url, [out_of_router])
        try:
            before = fleet_state(lab, lab_hosts, router_url)
            started = time.monotonic()
            run = finished(rollout(inv, results, lab_hosts, "-e", "rollout_min_healthy=3",
                                   "-e", "rollout_capacity_wait=6"))
            after = fleet_state(lab, lab_hosts, router_url)
        finally:
            add_workers(router_url, [out_of_router])
        assert run.rc != 0, run
        stop = re.search(r"Rollout stopped at (\S+): .*", run.out)
        assert stop, run
        text = " ".join(run.out.split())
        assert "capacity guard" in stop.group(0) and "rollout_min_healthy 3" in stop.group(0), run
        assert "would leave 2 healthy worker(s)" in stop.group(0), run
        assert f"Not in the router: {out_of_router['name']}" in text, run
        assert re.search(r"Waited [6-9]s|Waited \d\ds", stop.group(0)), run
        assert time.monotonic() - started >= 6
        assert_nothing_changed(before, after)

        records = Records(results)
        run_id = records.only_run()
        hosts = assert_records_consistent(records, run_id)
        canary = names(lab_hosts)[0]
        assert hosts[canary]["status"] == "failed" and "capacity guard" in hosts[canary]["error"], hosts[canary]
        assert hosts[canary]["reverted"] is False, hosts[canary]
        for name, record in hosts.items():
            if name == out_of_router["name"]:  # the operator took it out: left out, and said so
                assert record["status"] == "unchanged (verified), out of the router", record
            elif name != canary:
                assert record["status"] == "unchanged (verified)", record
            assert_record_matches_host(record, after[name])
        assert records.lock() is None and records.run(run_id)["status"] == "failed"

    def test_last_host_with_invalid_settings_fails_before_the_canary_changes(
            self, deployed, make_inventory, lab, lab_hosts, router_url, tmp_path):
        """Issue 11: the prepare phase checks every host before the canary is touched."""
        inv = make_inventory()
        inv.set_vars(sglang_speculative_draft_window_size=NEW)
        last = lab_hosts[-1]["name"]
        inv.set_host_vars(last, sglang_speculative_draft_window_size=-5)
        results = tmp_path / "results"
        run = finished(rollout(inv, results, lab_hosts))
        after = fleet_state(lab, lab_hosts, router_url)

        assert run.rc != 0, run
        assert not any(play_batches(run.out)), run  # the apply phase never started
        assert_nothing_changed(deployed, after)  # the canary's InvocationID among the rest
        records = Records(results)
        run_id = records.only_run()
        # nothing was written on a host: their records are still the last run's that changed them
        hosts = assert_records_consistent(records, run_id, last_writer=False)
        for host in lab_hosts:
            assert (records.ledger(host["name"]) or {}).get("run_id") != run_id, host
        assert hosts[last]["status"] == "failed", hosts[last]
        assert "sglang_speculative_draft_window_size" in hosts[last]["error"], hosts[last]
        stop = re.search(r"Rollout stopped at (\S+): (.*)", run.out)
        assert stop and stop.group(1) == last and "sglang_speculative_draft_window_size" in stop.group(2), run
        for name, record in hosts.items():
            if name != last:
                assert record["status"] == "pending", record
            assert_record_matches_host(record, after[name])
        assert records.lock() is None

    @pytest.mark.parametrize("bad,expected", [
        ({"sglang_extra_args": {"--bogus-flag": "x"}}, "rejects the intended arguments (parse)"),
        ({"sglang_python": "/opt/no-sglang/bin/python"},
         "cannot tell which SGLang /opt/no-sglang/bin/python (sglang_python) has"),
    ], ids=["its-sglang-rejects-the-arguments", "no-sglang-at-sglang_python"])
    def test_last_host_its_own_sglang_refuses_fails_before_the_canary_changes(
            self, bad, expected, deployed, make_inventory, lab, lab_hosts, router_url, tmp_path):
        """Issue 11: the host's own SGLang checks the arguments (or cannot be found) in the prepare phase,
        through the connection as commands whose input comes on stdin: a token in sglang_environment never
        shows on a command line (Ansible's -vvv prints every command it runs)."""
        token = "gpf-test-token-5b1f"
        inv = make_inventory()
        inv.set_vars(sglang_speculative_draft_window_size=NEW)
        last = lab_hosts[-1]["name"]
        inv.set_host_vars(last, sglang_environment=dict(SIM_ENV, GPF_TEST_TOKEN=token), **bad)
        results = tmp_path / "results"
        run = finished(rollout(inv, results, lab_hosts, "-vvv"))
        after = fleet_state(lab, lab_hosts, router_url)

        assert run.rc != 0, run
        assert not any(play_batches(run.out)), run  # the apply phase never started
        assert_nothing_changed(deployed, after)  # the canary's InvocationID among the rest
        records = Records(results)
        hosts = assert_records_consistent(records, records.only_run(), last_writer=False)  # no host written
        assert hosts[last]["status"] == "failed" and expected in hosts[last]["error"], hosts[last]
        # The error line (with -vvv the results above it are printed wrapped).
        stop = re.search(r"^\[ERROR\]: .*Rollout stopped at (\S+): (.*)$", run.out, re.M)
        assert stop and stop.group(1) == last and expected in stop.group(2), run
        for name, record in hosts.items():
            if name != last:
                assert record["status"] == "pending", record
        commands = [line for line in run.out.splitlines() if "EXEC" in line]
        assert any("GPUFLEET_PREFLIGHT" not in line and "os.execve" in line for line in commands), \
            "the preflight did not run as a command"
        assert not [line for line in commands if token in line]
        assert records.lock() is None


def host_files(lab, host) -> str:
    """Checksums of every file the role or a rollout may write on a host."""
    return lab.enter(host["name"], ["sh", "-c", "find /etc/systemd/system /etc/systemd/journald.conf.d "
                                          "/var/lib/gpufleet-inference /etc/sglang -type f 2>/dev/null | sort | "
                                          "xargs -r sha256sum"], check=False)


# ------------------------------------------------------------------ tests that roll a change out

def test_two_rollouts_started_together_one_is_refused_naming_the_holder(
        rollout_fleet, make_inventory, lab, lab_hosts, need_router, tmp_path):
    """Finding 1: the second rollout is refused before anything, the fleet ends on one config,
    and the two runs' records never mix."""
    _inv, deploy = rollout_fleet
    hosts, rest = lab_hosts[:2], lab_hosts[2:]
    before = deploy(hosts)
    windows = {"a": NEW, "b": OTHER}
    invs = {}
    for key, window in windows.items():
        invs[key] = make_inventory(f"inventory-{key}")
        invs[key].set_vars(sglang_speculative_draft_window_size=window)
    results = tmp_path / "results"  # one fleet, one results root (where its lock lives)
    runs = {key: rollout(inv, results, hosts) for key, inv in invs.items()}
    runs = {key: finished(run) for key, run in runs.items()}
    after = fleet_state(lab, lab_hosts, need_router)

    winner = [key for key, run in runs.items() if run.rc == 0]
    assert len(winner) == 1, runs
    (winner,) = winner
    (loser,) = set(runs) - {winner}
    records = Records(results)
    run_id = records.only_run()  # the refused run left no run directory
    refused = re.search(LOCK_HELD, " ".join(runs[loser].out.split()))
    assert refused and refused.group(2) == run_id, runs[loser]
    task, _host, _message = failures(runs[loser].out)[0]
    # refused at its plan (the other run's leases were there) or at the first host's lease (both planned at once)
    assert task in ("Plan the run from what the fleet holds (leases, records, the router's workers)",
                    "Take the lease of the run's first host"), runs[loser]
    assert not any(play_batches(runs[loser].out)), runs[loser]

    window = windows[winner]
    recs = assert_records_consistent(records, run_id)
    assert records.run(run_id)["status"] == "finished" and records.lock() is None
    for host in hosts:
        state = after[host["name"]]
        assert_runs(state, window, in_router=True)
        assert state["invocation"] != before[host["name"]]["invocation"]
        record = recs[host["name"]]
        assert record["status"] == "updated" and record["observed"]["draft_window_size"] == window, record
        assert record["old_invocation"] == before[host["name"]]["invocation"], record
        assert_record_matches_host(record, state)
        assert_last_good(state, state["invocation"], window)
    for host in rest:
        assert_untouched(after[host["name"]])
    print(f"\ntwo rollouts started together: {winner} ({window}) ran as {run_id} in {runs[winner].seconds:.1f} s; "
          f"{loser} refused after {runs[loser].seconds:.1f} s: {refused.group(0)}")


class RunNotResumed(AssertionError):
    """A re-run recovered the hosts under a new run id instead of continuing the run."""


def test_ssh_lost_during_the_wait_is_recorded_and_a_rerun_recovers(
        rollout_fleet, lab, lab_hosts, need_router, tmp_path):
    """Finding 2: sshd stopped and every SSH session to the canary ended during its wait; the
    record says where the host was left, and the same command brings it to the intended settings."""
    inv, deploy = rollout_fleet
    hosts, rest = lab_hosts[:2], lab_hosts[2:]
    canary, second = hosts
    before = deploy(hosts)
    # the connection stays lost past the wait's retry budget (shortened from 120 s: the same path, sooner)
    inv.set_vars(sglang_speculative_draft_window_size=NEW, sglang_environment=SIM_ENV | SLOW_LOAD,
                 sglang_ready_connection_retry_seconds=15)
    results = tmp_path / "results"
    run = rollout(inv, results, hosts)
    try:
        wait_started(run, canary["name"])
        lab.cut_ssh(canary["name"])
        finished(run)
        cut = fleet_state(lab, lab_hosts, need_router)
    finally:
        lab.restore_ssh(canary["name"])

    assert run.rc != 0, run
    assert f"{canary['name']}: " in run.out and "connection lost" in run.out, run
    records = Records(results)
    run_id = records.only_run()  # the results directory is not empty
    recs = assert_records_consistent(records, run_id)
    record = recs[canary["name"]]
    assert record["status"] == "failed" and record["connection_lost"] is True, record
    assert record["failed_step"] == "applying" and record["in_router"] is False, record
    assert "the new unit, not verified" in record["runs"] and "OUT of the router" in record["outcome"], record
    assert record["reverted"] is False, record
    assert re.search(r"connection to \S+ lost", record["error"]), record
    assert recs[second["name"]]["status"] == "pending", recs[second["name"]]
    # What the record says is what is there: the canary out of the router on the new unit (its
    # server came up meanwhile), last-known-good still the unit it ran before.
    state = cut[canary["name"]]
    assert state["in_router"] is False and state["unit_window"] == NEW, describe(state)
    assert_last_good(state, before[canary["name"]]["invocation"], OLD)
    assert_runs(cut[second["name"]], OLD, in_router=True)

    rerun = finished(rollout(inv, results, hosts))  # the same command
    after = fleet_state(lab, lab_hosts, need_router)
    assert rerun.rc == 0, rerun
    newest = records.run_ids()[-1]  # run ids start with their UTC start time
    recs = assert_records_consistent(records, newest)
    record = recs[canary["name"]]
    assert record["status"] == "recovered", record
    assert run_id in record["recovering"] and "applying" in record["recovering"], record
    assert recs[second["name"]]["status"] == "updated", recs[second["name"]]
    for host in hosts:
        state = after[host["name"]]
        assert_runs(state, NEW, in_router=True)
        assert_record_matches_host(recs[host["name"]], state)
        assert_last_good(state, state["invocation"], NEW)
    for host in rest:
        assert_untouched(after[host["name"]])
    if records.run_ids() != [run_id]:
        raise RunNotResumed(f"the re-run recorded a new run {newest} instead of resuming {run_id}: "
                            f"{records.run(run_id)['status']=}, lock after the first run: none")


def test_transient_connection_breaks_during_the_wait_neither_fail_nor_revert(rollout_fleet, lab, lab_hosts,
                                                                             need_router, tmp_path):
    """Findings 2 and 6, and 8's key=value form: in one batch of two (-e rollout_batches=[2]), the
    first host's sshd is stopped with its sessions for a few seconds, the second host's wait loses
    the ssh client of its slice (SIGKILL) while the ControlPersist master lives. Both waits go on."""
    inv, deploy = rollout_fleet
    hosts, rest = lab_hosts[:2], lab_hosts[2:]
    first, second = hosts
    before = deploy(hosts)
    inv.set_vars(sglang_speculative_draft_window_size=NEW, sglang_environment=SIM_ENV | SLOW_LOAD)
    results = tmp_path / "results"
    run = rollout(inv, results, hosts, "-e", "rollout_batches=[2]")
    try:
        wait_started(run, first["name"])
        wait_started(run, second["name"])

        def break_first():
            lab.cut_ssh(first["name"])
            time.sleep(5)
            lab.restore_ssh(first["name"])
        master = inv.master_pid(second["address"])
        assert master, "no SSH master (ControlPersist) to the second host during its wait"
        breaker = threading.Thread(target=break_first)
        breaker.start()

        seen = {}

        def kill_a_client():
            # The master is checked right before the kill: after it, the wait may stop the master itself (it
            # resets a connection that lost a slice), so a check then would race the code under test.
            alive = inv.master_pid(second["address"]) == master
            pids = kill_ssh_clients(run, second["address"])
            if pids:
                seen.update(killed=pids, master_alive=alive)
            return bool(pids)
        wait_for(kill_a_client, 60, 0.2, f"an ssh client of the wait to {second['name']}")
        killed = seen["killed"]
        assert master not in killed and seen["master_alive"]  # a client of the wait died while its master lived
        breaker.join(30)
        finished(run)
    finally:
        lab.restore_ssh(first["name"])
    after = fleet_state(lab, lab_hosts, need_router)

    assert run.rc == 0, run
    assert play_batches(run.out) == [names(hosts)], run
    for host in hosts:
        name = re.escape(host["name"])
        assert re.search(PROGRESS.format(host=name, text=r"connection lost .*retrying"), run.out, re.M), run
        assert re.search(PROGRESS.format(host=name, text="connection back after"), run.out, re.M), run
    records = Records(results)
    run_id = records.only_run()
    assert records.run(run_id)["batches"] == [2]
    recs = assert_records_consistent(records, run_id)
    for host in hosts:
        state, record = after[host["name"]], recs[host["name"]]
        assert record["status"] == "updated" and record["restarted"] is True, record
        assert "revert" not in record or not record["revert"], record
        assert [s["step"] for s in record["steps"]] == ["prepared", "draining", "applying", "verified", "rejoined"]
        assert_runs(state, NEW, in_router=True)
        assert state["restarts"] == 0, describe(state)  # one restart (by the rollout), no revert
        assert_record_matches_host(record, state)
        assert_last_good(state, state["invocation"], NEW)
        assert record["old_invocation"] == before[host["name"]]["invocation"]
    for host in rest:
        assert_untouched(after[host["name"]])
    print(f"\nrollout of 2 hosts with transient breaks ({run.seconds:.1f} s): killed ssh client(s) {killed}")


def kill_ssh_clients(run: Playbook, address: str) -> list[int]:
    """SIGKILL the ssh clients the playbook runs to `address` now (the ControlPersist master is not
    one of them); [] when none runs (between two slices)."""
    pids = ssh_clients_to(run, address)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def test_ctrl_c_during_the_canary_wait_then_a_rerun_resumes(rollout_fleet, lab, lab_hosts, need_router, tmp_path):
    """Finding 3: SIGINT to ansible-playbook's process group (Ctrl-C) during the canary's wait."""
    inv, deploy = rollout_fleet
    hosts, rest = lab_hosts[:2], lab_hosts[2:]
    canary, second = hosts
    before = deploy(hosts)
    inv.set_vars(sglang_speculative_draft_window_size=NEW, sglang_environment=SIM_ENV | SLOW_LOAD)
    results = tmp_path / "results"
    run = rollout(inv, results, hosts)
    wait_started(run, canary["name"])
    run.interrupt()
    try:
        run.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        # ansible-playbook's own shutdown once hung on the first Ctrl-C on a loaded CI machine (its main thread in
        # a futex wait, no worker left, nothing printed): an operator presses Ctrl-C again. What the collection
        # left on the fleet is checked below either way.
        print("\nansible-playbook still running 60 s after Ctrl-C: Ctrl-C again")
        run.interrupt()
    finished(run, timeout=120)
    interrupted = fleet_state(lab, lab_hosts, need_router)

    assert run.rc != 0, run
    records = Records(results)
    run_id = records.only_run()
    leases = records.lock()  # left behind on both hosts, naming the run and its ansible-playbook process
    assert leases and sorted(leases) == names(hosts), leases
    for lease in leases.values():
        assert lease["holder"]["run_id"] == run_id and lease["holder"]["process"]["pid"] == run.pid, lease
    recs = assert_records_consistent(records, run_id)
    record = recs[canary["name"]]
    assert record["step"] == "applying" and record["status"] == "in progress", record
    assert record["in_router"] is False and "the new unit, not verified" in record["runs"], record
    assert recs[second["name"]]["status"] == "pending", recs[second["name"]]
    state = interrupted[canary["name"]]
    assert state["in_router"] is False and state["unit_window"] == NEW, describe(state)
    assert state["invocation"] != before[canary["name"]]["invocation"], describe(state)  # it was restarted
    assert_last_good(state, before[canary["name"]]["invocation"], OLD)
    assert_runs(interrupted[second["name"]], OLD, in_router=True)

    rerun = finished(rollout(inv, results, hosts))  # the same command
    after = fleet_state(lab, lab_hosts, need_router)
    assert rerun.rc == 0, rerun
    taken = re.search(r"resuming run (\S+): it left (\S+) mid-change \(its ansible-playbook on this controller "
                      r"ended\)", " ".join(rerun.out.split()))
    assert taken and taken.group(1) == run_id and taken.group(2) == canary["name"], rerun
    assert records.run_ids() == [run_id] and records.lock() is None
    meta = records.run(run_id)
    assert meta["status"] == "finished" and len(meta["resumes"]) == 1, meta
    recs = assert_records_consistent(records, run_id)
    record = recs[canary["name"]]
    assert record["status"] == "recovered" and run_id in record["recovering"], record
    # Brought to the intended settings without a second restart: the process the interrupted run
    # started was verified and put back.
    assert after[canary["name"]]["invocation"] == state["invocation"], describe(after[canary["name"]])
    assert recs[second["name"]]["status"] == "updated", recs[second["name"]]
    for host in hosts:
        assert_runs(after[host["name"]], NEW, in_router=True)
        assert_record_matches_host(recs[host["name"]], after[host["name"]])
        assert_last_good(after[host["name"]], after[host["name"]]["invocation"], NEW)
    for host in rest:
        assert_untouched(after[host["name"]])


# The task before the rejoin (controller only): the router is paused or killed from then on.
VERIFIED = r"sglang_rollout \| \S+: \[ *[0-9.]+s\] verified invocation \S+; putting it back into the router"


def test_router_paused_at_rejoin_leaves_the_verified_host_as_it_is(rollout_fleet, lab, lab_hosts, need_router,
                                                                   tmp_path):
    """Finding 4 (paused): the router SIGSTOPped when the verified canary rejoins, for longer than
    the rejoin's retries; resumed after the rollout gave up on it."""
    inv, deploy = rollout_fleet
    hosts, rest = lab_hosts[:1], lab_hosts[1:]
    (canary,) = hosts
    before = deploy(hosts)
    inv.set_vars(sglang_speculative_draft_window_size=NEW)
    results = tmp_path / "results"
    run = rollout(inv, results, hosts, "-e", "rollout_rejoin_retries=1")
    paused_at = None
    try:
        run.wait_for(VERIFIED)
        lab.pause_router()
        paused_at = time.monotonic()
        run.wait_for(rf"^fatal: \[{re.escape(canary['name'])}\]", 300, after=run.matched_at)
        time.sleep(max(0.0, 45 - (time.monotonic() - paused_at)))
    finally:
        lab.resume_router()
    paused = time.monotonic() - paused_at
    finished(run)
    after = fleet_state(lab, lab_hosts, need_router)
    assert_verified_not_rejoined(run, Records(results), canary, before, after)
    for host in rest:
        assert_untouched(after[host["name"]])
    print(f"\nrouter paused {paused:.0f} s at the canary's rejoin: {run.seconds:.1f} s")


def assert_verified_not_rejoined(run, records, canary, before, after):
    """The canary was verified and could not rejoin: not reverted, not restarted again, out of the
    router, last-known-good not advanced; a "Rollout stopped" message and consistent records."""
    assert run.rc != 0, run
    stop = re.search(r"Rollout stopped at (\S+): Put this host back into the router: (.*)", run.out)
    assert stop and stop.group(1) == canary["name"], run
    assert "Revert to the last-known-good unit" not in "\n".join(
        line for line in run.out.splitlines() if line.startswith(("changed:", "ok:"))), run
    run_id = records.only_run()
    recs = assert_records_consistent(records, run_id)
    record = recs[canary["name"]]
    assert record["status"] == "verified, not rejoined" and record["in_router"] is False, record
    assert record["reverted"] is False and not record.get("revert"), record
    assert "NOT reverted" in record["outcome"], record
    summary = records.summary(run_id)
    assert summary["counts"] == {"verified, not rejoined": 1} and records.run(run_id)["status"] == "failed", summary
    assert records.lock() is None
    state = after[canary["name"]]
    assert_runs(state, NEW, in_router=False)
    assert state["invocation"] == record["new_invocation"] != before[canary["name"]]["invocation"], record
    assert state["restarts"] == 0, describe(state)
    assert_last_good(state, before[canary["name"]]["invocation"], OLD)  # not advanced while out
    return record


def test_router_killed_at_rejoin_stops_with_a_consistent_record_and_a_rerun_puts_it_back(
        rollout_fleet, lab, lab_hosts, need_router, tmp_path):
    """Finding 4 (killed): the router killed when the verified canary rejoins; started again with
    the lab's `up --router`, a re-run puts the host back."""
    inv, deploy = rollout_fleet
    hosts, rest = lab_hosts[:1], lab_hosts[1:]
    (canary,) = hosts
    before = deploy(hosts)
    inv.set_vars(sglang_speculative_draft_window_size=NEW)
    results = tmp_path / "results"
    run = rollout(inv, results, hosts)
    try:
        run.wait_for(VERIFIED)
        lab.kill_router()
        finished(run)
    finally:
        killed = run.rc is not None
        lab.start_router()
    assert killed
    # The lab's up adds every host whose server answers; the rollout had left the canary out. The
    # router may list an added worker a moment later: wait for it before taking it out again.
    deadline = time.monotonic() + 30
    while worker_url(canary) not in {w["url"] for w in router_workers(need_router)} and time.monotonic() < deadline:
        time.sleep(0.3)
    remove_workers(need_router, hosts)
    after = fleet_state(lab, lab_hosts, need_router)
    records = Records(results)
    record = assert_verified_not_rejoined(run, records, canary, before, after)
    assert "Connection refused" in record["error"] or "refused" in record["error"].lower(), record
    for host in rest:
        assert_untouched(after[host["name"]])

    rerun = finished(rollout(inv, results, hosts))
    again = fleet_state(lab, lab_hosts, need_router)
    assert rerun.rc == 0, rerun
    run_ids = records.run_ids()
    assert len(run_ids) == 2, run_ids
    new_id = (set(run_ids) - {record["run_id"]}).pop()
    recs = assert_records_consistent(records, new_id)
    recovered = recs[canary["name"]]
    assert recovered["status"] == "recovered" and record["run_id"] in recovered["recovering"], recovered
    assert recovered["restarted"] is False, recovered
    state = again[canary["name"]]
    assert_runs(state, NEW, in_router=True)
    assert state["invocation"] == after[canary["name"]]["invocation"], describe(state)  # not restarted
    assert_record_matches_host(recovered, state)
    assert_last_good(state, state["invocation"], NEW)


BOGUS_LAST_GOOD = r"""
import json, os, sys
unit, directory = sys.argv[1], sys.argv[2]
text = open(unit).read()
broken = text.replace('"--port" \\\n', '"--bogus-flag" \\\n    "x" \\\n    "--port" \\\n', 1)
assert broken != text
os.makedirs(directory, 0o700, exist_ok=True)
copy = "file" + unit.replace("/", "__")
with open(os.path.join(directory, copy), "w") as out:
    out.write(broken)
os.chmod(os.path.join(directory, copy), 0o644)
record = {"invocation_id": sys.argv[3], "observed": {"draft_window_size": 1024}, "source": "journal",
          "intent": {"expect": {"draft_window_size": 1024, "compact_cache": True, "block_size": 16},
                     "config_line": "required"},
          "files": [{"path": unit, "copy": copy, "mode": "0644"}], "saved_at": 0}
with open(os.path.join(directory, "record.json"), "w") as out:
    json.dump(record, out)
"""


def test_failed_revert_says_the_host_is_out_of_the_router_and_serves_nothing_cause_first(
        rollout_fleet, lab, lab_hosts, need_router, tmp_path):
    """Finding 5: a last-known-good unit SGLang rejects (--bogus-flag x) and a change that fails
    verification: the revert fails, and the message says so plainly."""
    inv, deploy = rollout_fleet
    hosts, rest = lab_hosts[:1], lab_hosts[1:]
    (canary,) = hosts
    before = deploy(hosts)
    lab.enter(canary["name"], ["python3", "-", UNIT_PATH, LAST_GOOD_DIR, before[canary["name"]]["invocation"]],
              stdin=BOGUS_LAST_GOOD)
    inv.set_vars(sglang_speculative_draft_window_size=NEW)
    inv.set_host_vars(canary["name"], sglang_environment=SIM_ENV | {"SGLANG_SIM_FAULT": "ignore_window"})
    results = tmp_path / "results"
    run = finished(rollout(inv, results, hosts))
    after = fleet_state(lab, lab_hosts, need_router)

    assert run.rc != 0, run
    stop = re.search(r"Rollout stopped at (\S+): (.*)", run.out)
    assert stop and stop.group(1) == canary["name"], run
    records = Records(results)
    run_id = records.only_run()
    recs = assert_records_consistent(records, run_id)
    record = recs[canary["name"]]
    assert record["status"] == "failed" and record["reverted"] is False, record
    assert record["in_router"] is False and "draft_window_size" in record["error"], record
    assert "OUT of the router, serving nothing" in record["outcome"], record
    revert_msg = record["revert"]["msg"]
    cause = revert_msg.find("unrecognized arguments: --bogus-flag x")
    assert 0 <= cause < 300, revert_msg  # the cause first, not the last of many journal lines
    assert "unrecognized arguments: --bogus-flag x" in record["message"], record
    state = after[canary["name"]]
    assert state["in_router"] is False and not state["serving"], describe(state)
    assert "--bogus-flag" in state["unit"] and state["active"] != "active" or state["sub"] != "running" \
        or not state["serving"], describe(state)
    assert_record_matches_host(record, state)
    for host in rest:
        assert_untouched(after[host["name"]])
    print(f"\nfailed revert message: {record['message'][:600]}")


def test_unit_installed_without_its_restart_is_restarted_not_reported_as_a_mismatch(
        rollout_fleet, lab, lab_hosts, need_router, tmp_path):
    """Issue 9's lost handler: a play installed the new unit and died before its restart handler;
    the rollout notices that the process does not run the installed unit and restarts it."""
    inv, deploy = rollout_fleet
    hosts, rest = lab_hosts[:1], lab_hosts[1:]
    (canary,) = hosts
    before = deploy(hosts)
    inv.set_vars(sglang_speculative_draft_window_size=NEW)
    lost = run_playbook_argv(inv.hosts_yml, str(write_playbook(tmp_path, INSTALL_WITHOUT_RESTART)),
                             "--limit", canary["name"], env=inv.env)
    assert lost.rc == 0, lost
    half = fleet_state(lab, lab_hosts, need_router)[canary["name"]]
    assert half["unit_window"] == NEW and half["process_window"] == half["logged_window"] == OLD, describe(half)
    assert half["invocation"] == before[canary["name"]]["invocation"]

    results = tmp_path / "results"
    run = finished(rollout(inv, results, hosts))
    after = fleet_state(lab, lab_hosts, need_router)
    assert run.rc == 0, run
    name = re.escape(canary["name"])
    assert not re.search(rf"sglang_rollout \| {name}: \[ *[0-9.]+s\] installing", run.out), run
    assert re.search(rf"sglang_rollout \| {name}: \[ *[0-9.]+s\] restarting sglang.service \(.*installed", run.out), run
    records = Records(results)
    run_id = records.only_run()
    record = assert_records_consistent(records, run_id)[canary["name"]]
    assert record["status"] == "updated" and record["restarted"] is True, record
    assert record["restart_pending"] is True, record
    assert "file" not in [d["what"] for d in record["differences"]], record  # the file was right
    state = after[canary["name"]]
    assert_runs(state, NEW, in_router=True)
    assert state["invocation"] != before[canary["name"]]["invocation"]
    assert_record_matches_host(record, state)
    assert_last_good(state, state["invocation"], NEW)
    for host in rest:
        assert_untouched(after[host["name"]])


def test_a_rollout_with_verification_off_never_records_an_unverified_restart_as_verified(
        rollout_fleet, lab, lab_hosts, need_router, tmp_path):
    """sglang_verify false (found on the lab): a restarted host was recorded "unchanged (verified)" with
    the OLD invocation, and its unverified unit was kept as last-known-good - a revert would have
    brought it back as good. Now: "updated (not verified)", no invocation claimed, last-known-good
    still the unit that ran before (adopted at the first change)."""
    inv, deploy = rollout_fleet
    hosts, rest = lab_hosts[:1], lab_hosts[1:]
    (canary,) = hosts
    before = deploy(hosts)[canary["name"]]
    inv.set_vars(sglang_speculative_draft_window_size=NEW, sglang_verify=False)
    results = tmp_path / "results"
    run = finished(rollout(inv, results, hosts))
    assert run.rc == 0, run
    name = re.escape(canary["name"])
    assert re.search(rf"sglang_rollout \| {name}: \[ *[0-9.]+s\] not verified \(sglang_verify is off\)", run.out), run
    assert not re.search(rf"sglang_rollout \| {name}: \[ *[0-9.]+s\] verified invocation", run.out), run
    records = Records(results)
    run_id = records.only_run()
    record = assert_records_consistent(records, run_id)[canary["name"]]
    assert record["status"] == "updated (not verified)", record
    assert record["restarted"] is True and record["verified"] is False and record["new_invocation"] is None, record
    assert record["last_good_saved"] is False and "not verified" in record["last_good_note"], record
    assert records.run(run_id)["status"] == "finished" and records.lock() is None
    # What the host runs is checked here, through the container: the restart did happen.

    def serving_new():
        now = fleet_state(lab, hosts, need_router)[canary["name"]]
        return now if now["serving"] and now["logged_window"] == NEW else None
    state = wait_for(serving_new, 120, what="the new process serving")
    assert_runs(state, NEW, in_router=True)
    assert state["invocation"] != before["invocation"]
    assert_last_good(state, before["invocation"], OLD)  # the unit that ran before, not the unverified one
    after = fleet_state(lab, lab_hosts, need_router)
    for host in rest:
        assert_untouched(after[host["name"]])


def write_playbook(tmp_path, text):
    path = tmp_path / "playbook.yml"
    path.write_text(text)
    return path


def test_failing_change_after_a_lost_handler_reverts_to_what_ran_before(
        rollout_fleet, lab, lab_hosts, need_router, tmp_path):
    """The lost handler again, with a change that fails verification (the host's SGLang ignores the
    window): the revert must bring back what the host ran before, not the installed file."""
    inv, deploy = rollout_fleet
    hosts = lab_hosts[:1]
    (canary,) = hosts
    before = deploy(hosts)
    inv.set_vars(sglang_speculative_draft_window_size=NEW)
    inv.set_host_vars(canary["name"], sglang_environment=SIM_ENV | {"SGLANG_SIM_FAULT": "ignore_window"})
    lost = run_playbook_argv(inv.hosts_yml, str(write_playbook(tmp_path, INSTALL_WITHOUT_RESTART)),
                             "--limit", canary["name"], env=inv.env)
    assert lost.rc == 0, lost
    results = tmp_path / "results"
    run = finished(rollout(inv, results, hosts))
    after = fleet_state(lab, lab_hosts, need_router)

    assert run.rc != 0, run
    records = Records(results)
    record = assert_records_consistent(records, records.only_run())[canary["name"]]
    state = after[canary["name"]]
    assert_record_matches_host(record, state)
    assert record["status"] == "reverted" and record["reverted"] is True, record
    assert_runs(state, OLD, in_router=True)
    assert state["invocation"] not in (before[canary["name"]]["invocation"], record.get("new_invocation"))
