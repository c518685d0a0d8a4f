"""Multi-node serving groups (issue 32) on a lab of 2 groups x 2 nodes plus 2 single-node hosts behind the real
sglang-router (`lab.py up --groups 2x2`; tests/run_layers.py integration brings one up for this module).

One deployment for the module (the role on every host at once, each node verified as what it is in its group);
then the cases of the issue, cheapest first: a --limit that splits a group and a rank typo (both refused before
anything changes), a rollout across the mixed fleet (a group is one member of a batch and one server of the
capacity guard), a follower that crashes while it loads and a head that never sees its follower (both fail the
group naming the node, and the group is reverted as one), and verify.yml's one line per group, which names a
follower that runs other arguments than its head.

Every test checks the fleet itself - the processes, their command lines and config lines, the router's
workers, each node's record - not only what the playbook printed.
"""
from __future__ import annotations

import time

import pytest
from lab_support import CLEAN_HOST, ansible_playbook
from rollout_support import (ROLLOUT, WINDOW_FLAG, FleetInventory, Records, add_workers, argv_window, describe,
                             fleet_state, play_batches, remove_workers)
from rollout_support import lab  # noqa: F401 pylint: disable=unused-import
from role_support import generate

OLD, NEW, OTHER = 1024, 2048, 512  # draft windows: deployed, rolled out, a rollout that fails
DROP_IN = "/etc/systemd/system/sglang.service.d/50-test.conf"
# A follower whose process crashes the first time it loads (the simulator's crash_once), set from a file the
# unit reads (EnvironmentFile=): the drift check compares Environment=, which it leaves as intended.
CRASH_ONCE = ("mkdir -p /etc/systemd/system/sglang.service.d && rm -f /var/tmp/gpf-crashed && "
              "echo SGLANG_SIM_FAULT=crash_once=/var/tmp/gpf-crashed > /etc/default/gpf-fault && "
              "printf '[Service]\\nEnvironmentFile=-/etc/default/gpf-fault\\n' > " + DROP_IN + " && "
              "systemctl daemon-reload")
# A follower whose first start never gets to SGLang (it sits in ExecStartPre): its head never sees it.
STALL_ONCE = ("mkdir -p /etc/systemd/system/sglang.service.d && rm -f /var/tmp/gpf-stalled && "
              "printf '[Service]\\nExecStartPre=/bin/sh -c \"test -e /var/tmp/gpf-stalled || "
              "{ touch /var/tmp/gpf-stalled; exec sleep 600; }\"\\n' > " + DROP_IN + " && systemctl daemon-reload")
NO_FAULT = "rm -f " + DROP_IN + " /etc/default/gpf-fault; systemctl daemon-reload"
FOLLOWER_PASS = "joined its serving group as a follower node"


class GroupFleet:
    """The deployed lab: its inventory, hosts by name, the groups (head, follower) and the single hosts."""

    def __init__(self, inv, hosts, router):
        self.inv, self.router = inv, router
        self.hosts = dict((host["name"], host) for host in hosts)
        names = [host["name"] for host in hosts]
        self.groups = {"serving_1": tuple(names[0:2]), "serving_2": tuple(names[2:4])}
        self.singles = names[4:6]
        self.servers = [names[0], names[2]] + self.singles

    def state(self, lab):
        return fleet_state(lab, list(self.hosts.values()), self.router)

    def rollout(self, results, limit=None, **extra):
        return ansible_playbook(self.inv.hosts_yml, ROLLOUT, dict({"rollout_results_dir": str(results)}, **extra),
                                limit=limit, env=self.inv.env)

    def invocations(self, lab):
        return dict((name, state["invocation"]) for name, state in self.state(lab).items())


@pytest.fixture(scope="module")
def grouped(lab_inventory, lab_hosts, server_vars, router_url, lab, tmp_path_factory, sh):  # noqa: F811
    if "sglang_serving_groups" not in lab_inventory.read_text() or len(lab_hosts) < 6 or not router_url:
        pytest.skip("needs a lab of 2 serving groups x 2 nodes and 2 single hosts with a router "
                    "(lab.py up --groups 2x2 --router, HOSTS=6; tests/run_layers.py integration brings one up)")
    for host in lab_hosts:
        sh(host, CLEAN_HOST, check=False)
    remove_workers(router_url, lab_hosts)
    inv = FleetInventory(tmp_path_factory.mktemp("groups") / "inventory", lab_inventory, server_vars)
    inv.set_vars(sglang_speculative_draft_window_size=OLD, sglang_tp_size=2)
    fleet = GroupFleet(inv, lab_hosts[:6], router_url)
    # The role on every host at once: each node installs its unit and is verified as what it is in its group.
    deployed = inv.deploy()
    assert deployed.out.count(FOLLOWER_PASS) == 2, deployed
    add_workers(router_url, [fleet.hosts[name] for name in fleet.servers])
    yield fleet
    inv.close()
    for host in lab_hosts:
        sh(host, CLEAN_HOST, check=False)
    remove_workers(router_url, lab_hosts)


def text_of(run) -> str:
    return " ".join(run.out.split())


def assert_node(state, window, rank, head_address):
    """A follower runs `window` with its node's flags: alive, its command line, out of the router."""
    argv = state["cmdline"] or []
    assert state["active"] == "active" and state["sub"] == "running", describe(state)
    assert state["unit_window"] == argv_window(argv) == window, describe(state)
    assert argv[argv.index("--node-rank") + 1] == str(rank), argv
    assert argv[argv.index("--dist-init-addr") + 1] == f"{head_address}:50000", argv
    assert state["in_router"] is False and not state["config_lines"], describe(state)  # only the head logs it


def assert_serves(state, window):
    """A head (or single host) runs `window`: unit, process and its config line agree, /generate answers, in the
    router."""
    assert state["active"] == "active" and state["sub"] == "running", describe(state)
    assert state["unit_window"] == state["process_window"] == state["logged_window"] == window, describe(state)
    assert state["serving"] and state["in_router"] is True, describe(state)


# ------------------------------------------------------------------ refused before anything changes

def test_a_limit_that_splits_a_serving_group_fails_before_any_change_naming_the_group(grouped, lab, tmp_path):
    head, follower = grouped.groups["serving_1"]
    before = grouped.invocations(lab)
    grouped.inv.set_vars(sglang_speculative_draft_window_size=NEW, sglang_tp_size=2)
    run = grouped.rollout(tmp_path / "results", limit=f"{head},{grouped.singles[0]},localhost")
    assert run.rc != 0, run
    assert (f"serving group serving_1 is only partly in this run (--limit): {head} (rank 0) in, {follower} (rank 1) "
            "not; changing part of a group takes its whole server down") in text_of(run), run
    assert "Nothing was compared or changed." in text_of(run), run
    assert grouped.invocations(lab) == before and not Records(tmp_path / "results").run_ids()
    assert not any(state["leased"] for state in grouped.state(lab).values())


def test_a_rank_typo_in_the_inventory_fails_before_any_change_naming_host_and_variable(grouped, lab, tmp_path):
    head, follower = grouped.groups["serving_2"]
    before = grouped.invocations(lab)
    grouped.inv.set_host_vars(follower, sglang_node_rank=2)
    try:
        run = grouped.rollout(tmp_path / "results")
    finally:
        (grouped.inv.dir / "host_vars" / f"{follower}.yml").unlink()
    assert run.rc != 0, run
    assert (f"host {follower}: sglang_node_rank 2 is out of range for serving group serving_2 of 2 hosts "
            "(ranks 0..1)") in text_of(run), run
    assert "serving group serving_2 has no host with sglang_node_rank 1" in text_of(run), run
    assert grouped.invocations(lab) == before and not Records(tmp_path / "results").run_ids()


# ------------------------------------------------------------------ a rollout across the mixed fleet

def test_a_rollout_counts_each_serving_group_as_one_member_of_a_batch_and_one_server_of_the_capacity_guard(
        grouped, lab, tmp_path):
    """Batches [1, 2] over 4 servers (2 groups, 2 single hosts): the canary is a group, the second batch a group and a
    single host. rollout_min_healthy 50% of 4 servers is 2, so taking 2 out in the second batch passes; counted by
    hosts (6) it would need 3 and refuse that batch."""
    (head1, follower1), (head2, follower2) = grouped.groups["serving_1"], grouped.groups["serving_2"]
    before = grouped.invocations(lab)
    grouped.inv.set_vars(sglang_speculative_draft_window_size=NEW, sglang_tp_size=2)
    run = grouped.rollout(tmp_path / "results", rollout_batches=[1, 2], rollout_min_healthy="50%")
    assert run.rc == 0, run
    assert play_batches(run.out) == [[head1], [head2, grouped.singles[0]], [grouped.singles[1]]], run
    state = grouped.state(lab)
    for name in grouped.servers:
        assert_serves(state[name], NEW)
    assert_node(state[follower1], NEW, 1, grouped.hosts[head1]["address"])
    assert_node(state[follower2], NEW, 1, grouped.hosts[head2]["address"])
    assert all(state[name]["invocation"] != before[name] for name in grouped.hosts)  # every node restarted
    records = Records(tmp_path / "results")
    hosts = records.hosts(records.only_run())
    assert set(record["status"] for record in hosts.values()) == {"updated"}, hosts
    for name, record in hosts.items():
        assert record["new_invocation"] == state[name]["invocation"], record
        assert state[name]["fleet_record"]["status"] == "updated" and not state[name]["leased"], describe(state[name])
        assert state[name]["last_good_window"] == NEW, describe(state[name])  # each node keeps its own
    assert hosts[follower1]["in_router"] is None and hosts[head1]["in_router"] is True

    verify = ansible_playbook(grouped.inv.hosts_yml, "playbooks/verify.yml",
                              {"verify_results_dir": str(tmp_path / "verify")}, env=grouped.inv.env)
    assert verify.rc == 0, verify
    assert f"serving group serving_1 ({head1} rank 0, {follower1} rank 1): in sync | {head1}: in sync" in verify.out
    assert f"{grouped.singles[0]}: in sync" in verify.out and f"\n{follower1}: in sync" not in verify.out


# ------------------------------------------------------------------ a group that fails is reverted as one

def test_a_follower_that_crashes_during_load_fails_the_group_naming_it_and_the_group_is_reverted(
        grouped, lab, sh, tmp_path):
    head, follower = grouped.groups["serving_1"]
    before = grouped.state(lab)
    window = before[head]["unit_window"]
    sh(grouped.hosts[follower], CRASH_ONCE)
    try:
        grouped.inv.set_vars(sglang_speculative_draft_window_size=OTHER, sglang_tp_size=2)
        run = grouped.rollout(tmp_path / "results", limit="serving_1,localhost")
    finally:
        sh(grouped.hosts[follower], NO_FAULT)
    assert run.rc != 0, run
    text = text_of(run)
    assert f"serving group serving_1: node {follower} (rank 1) failed, so the group cannot serve" in text, run
    assert "Scheduler hit an exception" in text and "simulated crash_during_load" in text, run  # its journal's tail
    # reverted as one: both nodes back on what they ran, restarted (new invocations), the head back in the router
    state = grouped.state(lab)
    assert_serves(state[head], window)
    assert_node(state[follower], window, 1, grouped.hosts[head]["address"])
    assert state[head]["invocation"] != before[head]["invocation"]
    assert state[follower]["invocation"] != before[follower]["invocation"]
    records = Records(tmp_path / "results")
    hosts = records.hosts(records.only_run())
    assert hosts[head]["status"] == hosts[follower]["status"] == "reverted", hosts
    assert hosts[follower]["revert"]["healthy"] and hosts[follower]["revert"]["invocation_id"] == \
        state[follower]["invocation"]
    assert state[follower]["fleet_record"]["status"] == "reverted" and not state[follower]["leased"]


def test_a_head_that_never_sees_its_follower_times_out_naming_the_missing_rank_and_the_group_is_reverted(
        grouped, lab, sh, tmp_path):
    head, follower = grouped.groups["serving_2"]
    before = grouped.state(lab)
    window = before[head]["unit_window"]
    sh(grouped.hosts[follower], STALL_ONCE)
    try:
        grouped.inv.set_vars(sglang_speculative_draft_window_size=OTHER, sglang_tp_size=2, sglang_ready_timeout=12)
        run = grouped.rollout(tmp_path / "results", limit="serving_2,localhost")
    finally:
        sh(grouped.hosts[follower], NO_FAULT)
    assert run.rc != 0, run
    text = text_of(run)
    assert (f"serving group serving_2 did not come up: its head {head} waited for rank 1 ({follower}), which has not "
            f"joined the group - rank 1 ({follower}): ") in text, run
    assert "(unit activating/start-pre)" in text and "Its head: timed out after 12" in text, run
    state = grouped.state(lab)
    assert_serves(state[head], window)
    assert_node(state[follower], window, 1, grouped.hosts[head]["address"])
    records = Records(tmp_path / "results")
    hosts = records.hosts(records.only_run())
    assert hosts[head]["status"] == hosts[follower]["status"] == "reverted", hosts
    assert WINDOW_FLAG in state[follower]["cmdline"]


# ------------------------------------------------------------------ verify.yml: a group is one line

def test_verify_catches_a_follower_that_runs_other_arguments_than_its_head(grouped, lab, sh, tmp_path):
    """A follower restarted by hand with another window in its unit: the head (killed with it, restarted by systemd)
    comes back and the group serves again - on two different windows. verify.yml names it on the group's line."""
    head, follower = grouped.groups["serving_1"]
    window = grouped.state(lab)[head]["unit_window"]
    sh(grouped.hosts[follower], f"sed -i '/draft-window-size\" \\\\/{{n;s/\"{window}\"/\"{OTHER}\"/}}' "
                                "/etc/systemd/system/sglang.service && systemctl daemon-reload && "
                                "systemctl restart sglang.service")
    deadline = time.monotonic() + 90
    while not generate(grouped.hosts[head]["address"], timeout=5):
        assert time.monotonic() < deadline, describe(grouped.state(lab)[head])
        time.sleep(1)
    verify = ansible_playbook(grouped.inv.hosts_yml, "playbooks/verify.yml",
                              {"verify_results_dir": str(tmp_path / "verify")}, env=grouped.inv.env)
    assert verify.rc != 0, verify
    line = [line for line in verify.out.splitlines() if line.startswith("serving group serving_1 ")][0]
    assert line.startswith(f"serving group serving_1 ({head} rank 0, {follower} rank 1): DRIFTED |"), line
    assert (f"{follower} (rank 1) runs other arguments than its head {head}: {WINDOW_FLAG}: head {window}, "
            f"node {OTHER}") in line, line
    assert f"serving group serving_2 ({grouped.groups['serving_2'][0]} rank 0" in verify.out
