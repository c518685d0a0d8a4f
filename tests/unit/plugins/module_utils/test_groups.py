# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Serving groups from the inventory: membership, ranks, same settings, derived addresses, order."""
import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._groups import (
    DEFAULT_DIST_INIT_PORT, GroupError, check_whole, group_of, members, node_args, node_differences, router_worker,
    serving_groups, split_groups)

COMMON = {
    "sglang_model_path": "/models/Kimi-K2.6",
    "sglang_tp_size": 16,
    "sglang_port": 30000,
    "sglang_speculative_algorithm": "DFLASH",
    "sglang_speculative_draft_model_path": "/models/Kimi-K2.6-DFlash",
    "sglang_extra_args": {"--trust-remote-code": True},
}


def host(address, groups=("gpu",), **variables):
    """One host's variables as hostvars holds them: connection, bind address, group_names."""
    return {"ansible_host": address, "sglang_host": address, "group_names": list(groups),
            **COMMON, **variables}


def fleet(**changes):
    """The lab's mixed shape: groups a (by variable) and b (by inventory group), two single hosts.

    ``changes``: host -> variables to set on it (None deletes the variable).
    """
    hostvars = {
        "a-head": host("127.0.1.11", sglang_serving_group="a", sglang_node_rank=0),
        "a-node": host("127.0.1.12", sglang_serving_group="a", sglang_node_rank=1),
        "b-head": host("127.0.1.13", groups=("gpu", "k26_b"), sglang_serving_groups=["k26_b"],
                       sglang_node_rank=0),
        "b-node": host("127.0.1.14", groups=("gpu", "k26_b"), sglang_serving_groups=["k26_b"],
                       sglang_node_rank=1),
        "single-1": host("127.0.1.15", sglang_serving_groups=["k26_b"], sglang_tp_size=8),
        "single-2": host("127.0.1.16", sglang_tp_size=8),
    }
    for name, variables in changes.items():
        for key, value in variables.items():
            if value is None:
                hostvars[name].pop(key, None)
            else:
                hostvars[name][key] = value
    return hostvars


def errors_of(hostvars):
    with pytest.raises(GroupError) as caught:
        serving_groups(hostvars)
    return caught.value.errors


# ---------------------------------------------------------------- derivation

def test_groups_by_variable_and_by_inventory_group_are_derived_with_their_heads_and_addresses():
    groups = serving_groups(fleet())
    assert sorted(groups) == ["a", "k26_b"]
    a, b = groups["a"], groups["k26_b"]
    assert (a.nnodes, a.head, a.followers, a.dist_init_addr) == (2, "a-head", ["a-node"], "127.0.1.11:50000")
    assert (b.head, b.followers, b.dist_init_addr) == ("b-head", ["b-node"], "127.0.1.13:50000")
    assert a.defined_by == "sglang_serving_group" and b.defined_by == "sglang_serving_groups"
    assert group_of(groups, "single-1") is None and group_of(groups, "b-node") is b


def test_node_args_are_the_same_for_every_node_but_the_rank():
    groups = serving_groups(fleet())
    assert node_args(groups, "a-head") == ["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "127.0.1.11:50000"]
    assert node_args(groups, "a-node") == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "127.0.1.11:50000"]
    assert node_args(groups, "single-2") == []


def test_a_dist_timeout_and_a_port_are_passed_on():
    both = {"sglang_dist_timeout": 900, "sglang_dist_init_port": 29500}
    groups = serving_groups(fleet(**{"a-head": both, "a-node": both}))
    assert groups["a"].node_args("a-node")[-4:] == ["--dist-init-addr", "127.0.1.11:29500", "--dist-timeout", "900"]
    assert groups["k26_b"].port == DEFAULT_DIST_INIT_PORT


def test_ranks_order_the_nodes_whatever_the_inventory_order():
    hostvars = fleet(**{"a-head": {"sglang_node_rank": 1}, "a-node": {"sglang_node_rank": 0}})
    group = serving_groups(hostvars)["a"]
    assert group.hosts == ["a-node", "a-head"] and group.head == "a-node"
    assert group.dist_init_addr == "127.0.1.12:50000"


@pytest.mark.parametrize("bind,connect_to,override,expected", [
    ("10.0.0.5", "gpu-a01.example.internal", None, "10.0.0.5:50000"),
    ("0.0.0.0", "gpu-a01.example.internal", None, "gpu-a01.example.internal:50000"),
    ("127.0.0.1", "10.0.0.5", None, "10.0.0.5:50000"),
    ("::", "fd00::5", None, "[fd00::5]:50000"),
    ("0.0.0.0", "10.0.0.5", "192.168.100.5", "192.168.100.5:50000"),  # e.g. the fabric's address
    ("0.0.0.0", None, None, "a-head:50000"),  # no ansible_host: the inventory hostname
])
def test_the_head_address_is_one_the_other_nodes_can_reach(bind, connect_to, override, expected):
    head = {"sglang_host": bind, "ansible_host": connect_to, "sglang_dist_init_host": override}
    node = {"sglang_host": "0.0.0.0"}
    assert serving_groups(fleet(**{"a-head": head, "a-node": node}))["a"].dist_init_addr == expected


def test_order_head_first_to_stop_and_last_to_start_and_only_the_head_is_a_router_worker():
    three = {f"n{i}": host(f"10.0.0.{i}", sglang_serving_group="g", sglang_node_rank=i, sglang_tp_size=3)
             for i in range(3)}
    group = serving_groups(three)["g"]
    assert group.stop_order() == ["n0", "n1", "n2"]
    assert group.start_order() == ["n1", "n2", "n0"]
    groups = serving_groups(fleet())
    assert [h for h in fleet() if router_worker(groups, h)] == ["a-head", "b-head", "single-1", "single-2"]


def test_members_count_a_group_once_at_its_first_host():
    groups = serving_groups(fleet())
    assert members(groups, ["single-1", "a-node", "b-head", "a-head", "b-node", "single-2"]) == [
        ("single-1",), ("a-head", "a-node"), ("b-head", "b-node"), ("single-2",)]


def test_to_dict_describes_the_group():
    assert serving_groups(fleet())["a"].to_dict() == {
        "name": "a", "nnodes": 2, "head": "a-head", "followers": ["a-node"],
        "ranks": {"a-head": 0, "a-node": 1}, "dist_init_addr": "127.0.1.11:50000", "dist_timeout": None,
        "defined_by": "sglang_serving_group"}


def test_an_inventory_without_groups_has_none():
    assert serving_groups({"h1": host("10.0.0.1"), "h2": host("10.0.0.2")}) == {}


# ---------------------------------------------------------------- validation

def test_a_rank_typo_names_the_host_the_variable_and_the_missing_rank():
    errors = errors_of(fleet(**{"a-node": {"sglang_node_rank": 2}}))
    assert errors == [
        "host a-node: sglang_node_rank 2 is out of range for serving group a of 2 hosts (ranks 0..1)",
        "serving group a has no host with sglang_node_rank 1"]


def test_two_heads_and_no_head_are_named():
    assert errors_of(fleet(**{"a-node": {"sglang_node_rank": 0}})) == [
        "serving group a has 2 heads with sglang_node_rank 0: a-head, a-node",
        "serving group a has no host with sglang_node_rank 1"]
    three = {f"n{i}": host(f"10.0.0.{i}", sglang_serving_group="g", sglang_node_rank=rank, sglang_tp_size=3)
             for i, rank in enumerate((1, 2, 1))}
    assert errors_of(three) == [
        "serving group g has 2 nodes with sglang_node_rank 1: n0, n2",
        "serving group g has no head: no host has sglang_node_rank 0"]


@pytest.mark.parametrize("rank", ["one", -1, True, 1.5])
def test_a_rank_that_is_no_integer_is_refused(rank):
    assert errors_of(fleet(**{"a-node": {"sglang_node_rank": rank}}))[0] == (
        f"host a-node: sglang_node_rank must be an integer 0..1, got {rank!r}")


def test_a_rank_given_as_text_counts():
    assert serving_groups(fleet(**{"a-node": {"sglang_node_rank": "1"}}))["a"].rank_of("a-node") == 1


def test_a_node_without_a_rank_and_a_rank_without_a_group_are_named():
    assert errors_of(fleet(**{"a-node": {"sglang_node_rank": None}}))[0] == (
        "host a-node is in serving group a but has no sglang_node_rank")
    assert errors_of(fleet(**{"single-2": {"sglang_node_rank": 0}})) == [
        "host single-2 sets sglang_node_rank but belongs to no serving group: set sglang_serving_group on it, "
        "or name its inventory group in sglang_serving_groups"]


def test_a_different_setting_names_the_host_the_variable_and_both_values():
    errors = errors_of(fleet(**{"a-node": {"sglang_tp_size": 8, "sglang_speculative_draft_window_size": 2048}}))
    assert errors == [
        "host a-node of serving group a: sglang_speculative_draft_window_size is 2048, its head a-head has not set;"
        " every node runs the same settings except the rank",
        "host a-node of serving group a: sglang_tp_size is 8, its head a-head has 16; every node runs the same "
        "settings except the rank"]


def test_a_different_secret_is_named_without_its_value():
    errors = errors_of(fleet(**{"a-node": {"sglang_api_key": "s3cr3t"}}))
    assert errors == ["host a-node of serving group a: sglang_api_key is (hidden), its head a-head has not set; "
                      "every node runs the same settings except the rank"]
    assert "s3cr3t" not in str(GroupError(errors))


def test_per_node_variables_and_connection_variables_may_differ():
    groups = serving_groups(fleet(**{"a-node": {"sglang_router_worker_url": "http://x:1", "ansible_port": 2222}}))
    assert groups["a"].nnodes == 2


def test_launch_checks_of_sglang_are_made_before_any_change():
    odd = {"sglang_tp_size": 3}
    assert errors_of(fleet(**{"a-head": odd, "a-node": odd})) == [
        "serving group a: sglang_tp_size 3 is not divisible by its 2 nodes (SGLang: 'tp_size must be divisible by "
        "number of nodes')"]
    pp = {"sglang_tp_size": 1, "sglang_extra_args": {"--pp-size": 3}}
    assert "sglang_tp_size 1 x --pp-size 3 is not divisible by its 2 nodes" in errors_of(
        fleet(**{"a-head": pp, "a-node": pp}))[0]
    dp = {"sglang_extra_args": {"--dp-size": 2}}
    assert errors_of(fleet(**{"a-head": dp, "a-node": dp})) == [
        "serving group a: sglang_extra_args --dp-size 2 on a-head: SGLang refuses data-parallel replicas across "
        "nodes (use attention DP, --attn-dp-size)"]
    attention = {"sglang_extra_args": {"--dp-size": 2, "--enable-dp-attention": True}}
    assert serving_groups(fleet(**{"a-head": attention, "a-node": attention}))["a"]


@pytest.mark.parametrize("flag", ["--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr",
                                  "--dist-timeout", "--nnode"])
def test_group_flags_in_extra_args_are_refused(flag):
    extra = {"sglang_extra_args": {flag: 2}}
    assert errors_of(fleet(**{"a-head": extra, "a-node": extra})) == [
        f"host a-head: sglang_extra_args[{flag!r}] is set by serving group a (from sglang_node_rank, "
        "sglang_dist_init_port, sglang_dist_timeout); remove it"]


@pytest.mark.parametrize("port,error", [
    (0, "host a-head: sglang_dist_init_port must be a port 1..65535, got 0"),
    ("x", "host a-head: sglang_dist_init_port must be a port 1..65535, got 'x'"),
    (30000, "serving group a: sglang_dist_init_port 30000 is the head's sglang_port; the rendezvous needs a "
            "port of its own"),
])
def test_a_bad_rendezvous_port_is_refused(port, error):
    both = {"sglang_dist_init_port": port}
    assert errors_of(fleet(**{"a-head": both, "a-node": both})) == [error]


def test_a_bad_dist_timeout_and_head_address_are_refused():
    both = {"sglang_dist_timeout": 0, "sglang_dist_init_host": "10.0.0.1:50000/x"}
    assert errors_of(fleet(**{"a-head": both, "a-node": both})) == [
        "host a-head: sglang_dist_init_host must be a host name or address, got '10.0.0.1:50000/x'",
        "host a-head: sglang_dist_timeout must be a positive number of seconds, got 0"]


def test_a_group_of_one_host_is_refused():
    assert errors_of(fleet(**{"a-node": {"sglang_serving_group": "other", "sglang_node_rank": 0}})) == [
        "serving group a has one host (a-head): a group spans at least 2 hosts; a single-node server needs no "
        "sglang_node_rank",
        "serving group other has one host (a-node): a group spans at least 2 hosts; a single-node server needs no "
        "sglang_node_rank"]


def test_membership_mistakes_are_named():
    both = fleet(**{"b-head": {"sglang_serving_group": "a"}})
    assert errors_of(both)[0] == ("host b-head belongs to 2 serving groups (a, k26_b: sglang_serving_group, "
                                  "sglang_serving_groups); a host runs one server")
    typo = fleet(**{"a-head": {"sglang_serving_groups": ["k26_bb"]}})
    assert errors_of(typo) == ["sglang_serving_groups names 'k26_bb', which is no inventory group of any host"]
    assert errors_of(fleet(**{"a-head": {"sglang_serving_groups": "k26_b"}}))[0] == (
        "host a-head: sglang_serving_groups must be a list of inventory group names, got 'k26_b'")
    assert errors_of(fleet(**{"a-head": {"sglang_serving_group": 7}}))[0] == (
        "host a-head: sglang_serving_group must be a group name (a string), got 7")


def test_every_problem_is_reported_at_once():
    hostvars = fleet(**{"a-node": {"sglang_node_rank": 5}, "b-node": {"sglang_tp_size": 8}})
    errors = errors_of(hostvars)
    assert len(errors) == 3 and any("b-node" in e for e in errors) and any("a-node" in e for e in errors)


# ---------------------------------------------------------------- a run that splits a group

def test_a_limit_that_splits_a_group_is_named_before_any_change():
    groups = serving_groups(fleet())
    with pytest.raises(GroupError) as caught:
        check_whole(groups, ["a-node", "single-1", "b-head", "b-node"], "--limit")
    assert caught.value.errors == [
        "serving group a is only partly in --limit: a-node (rank 1) in, a-head (rank 0) not; changing part of a "
        "group takes its whole server down - include all of its hosts or none"]
    assert [g.name for g, _in, _out in split_groups(groups, ["a-node", "b-node"])] == ["a", "k26_b"]


def test_a_run_with_whole_groups_or_none_passes():
    groups = serving_groups(fleet())
    check_whole(groups, ["a-head", "a-node", "single-2"])
    check_whole(groups, ["single-1"])
    assert split_groups(groups, list(fleet())) == []


# ---------------------------------------------------------------- the example inventory

def test_the_example_inventory_has_one_valid_two_node_group():
    from pathlib import Path

    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import VaultSecret
    from ansible.vars.manager import VariableManager

    repo = Path(__file__).resolve().parents[4]
    loader = DataLoader()  # the example keeps its API key in a vault (the test password)
    password = (repo / "tests" / "functional" / "data" / "example-vault-password").read_bytes().strip()
    loader.set_vault_secrets([("default", VaultSecret(password))])
    inventory = InventoryManager(loader=loader, sources=[str(repo / "inventories" / "example" / "hosts.yml")])
    variables = VariableManager(loader=loader, inventory=inventory)
    hostvars = {host.name: variables.get_vars(host=host) for host in inventory.get_hosts()}
    groups = serving_groups(hostvars)
    assert list(groups) == ["k26_2node"]
    group = groups["k26_2node"]
    assert group.hosts == ["gpu-c01.example.internal", "gpu-c02.example.internal"]
    # sglang_host is 0.0.0.0 there and no ansible_host is set: the head's inventory name
    assert group.node_args("gpu-c02.example.internal") == [
        "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "gpu-c01.example.internal:50000",
        "--dist-timeout", "900"]
    assert [h for h in hostvars if router_worker(groups, h)] == [
        h for h in hostvars if h != "gpu-c02.example.internal"]


def test_a_group_judged_among_some_hosts_knows_every_inventory_group_it_is_told_of():
    some = dict((name, variables) for name, variables in fleet().items() if name.startswith("b-"))
    some["b-head"]["sglang_serving_groups"] = ["k26_b", "k26_elsewhere"]
    with pytest.raises(GroupError, match="names 'k26_elsewhere', which is no inventory group"):
        serving_groups(some)
    groups = serving_groups(some, inventory_groups=["gpu", "k26_b", "k26_elsewhere"])
    assert list(groups) == ["k26_b"]


HEAD_ARGV = ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/m", "--host", "10.0.0.1",
             "--speculative-draft-window-size", "2048", "--nnodes", "2", "--node-rank", "0",
             "--dist-init-addr", "10.0.0.1:50000"]


def test_a_node_running_its_heads_arguments_but_its_own_rank_and_address_differs_in_nothing():
    node = [word.replace("10.0.0.1", "10.0.0.2") if word == "10.0.0.1" else word for word in HEAD_ARGV]
    node[node.index("--node-rank") + 1] = "1"
    assert node_differences(HEAD_ARGV, node) == []


def test_a_node_running_other_arguments_than_its_head_is_named_flag_by_flag():
    node = list(HEAD_ARGV)
    node[node.index("--speculative-draft-window-size") + 1] = "1024"
    node[node.index("--dist-init-addr") + 1] = "10.9.9.9:50000"
    assert node_differences(HEAD_ARGV, node) == [
        {"key": "--dist-init-addr", "expected": "10.0.0.1:50000", "observed": "10.9.9.9:50000"},
        {"key": "--speculative-draft-window-size", "expected": "2048", "observed": "1024"}]
    assert node_differences(HEAD_ARGV, HEAD_ARGV[:5])[0]["observed"] is None
