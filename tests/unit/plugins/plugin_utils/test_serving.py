# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Serving groups as a play sees them: only the hosts a group involves are read, each once; facts and
registered results are never compared between nodes; a single-node host reads nobody else."""
import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._groups import GroupError
from ansible_collections.gpufleet.inference.plugins.plugin_utils import _serving

COMMON = {"sglang_model_path": "/models/Kimi-K2.6", "sglang_tp_size": 2, "sglang_port": 30000}


class Views(dict):
    """hostvars: host -> its variables; counts which hosts were read (Ansible computes them on access)."""

    def __init__(self, *args, **kwargs):
        super(Views, self).__init__(*args, **kwargs)
        self.read = []

    def __getitem__(self, host):
        self.read.append(host)
        return dict.__getitem__(self, host)


def play(**changes):
    hostvars = Views({
        "g1-head": dict(COMMON, group_names=["gpu", "serving_1"], sglang_serving_groups=["serving_1"],
                        sglang_node_rank=0, sglang_host="10.0.0.1"),
        "g1-node": dict(COMMON, group_names=["gpu", "serving_1"], sglang_serving_groups=["serving_1"],
                        sglang_node_rank=1, sglang_host="10.0.0.2"),
        "v-head": dict(COMMON, group_names=["gpu"], sglang_serving_group="v", sglang_node_rank=0,
                       sglang_host="10.0.0.3"),
        "v-node": dict(COMMON, group_names=["gpu"], sglang_serving_group="v", sglang_node_rank=1,
                       sglang_host="10.0.0.4"),
        "single": dict(COMMON, group_names=["gpu"], sglang_serving_groups=["serving_1"], sglang_host="10.0.0.5"),
    })
    for host, variables in changes.items():
        hostvars[host] = dict(dict.__getitem__(hostvars, host), **variables)
    groups = {"all": list(hostvars), "gpu": list(hostvars), "serving_1": ["g1-head", "g1-node"]}
    return {"hostvars": hostvars, "groups": groups}


def test_a_node_gets_its_group_from_the_inventory_group_it_names_and_reads_only_that_groups_hosts():
    task_vars = dict(play(), inventory_hostname="g1-node")
    groups = _serving.groups_of_host(task_vars)
    assert list(groups) == ["serving_1"] and groups["serving_1"].head == "g1-head"
    assert set(task_vars["hostvars"].read) == {"g1-head", "g1-node"}


def test_a_node_by_variable_finds_the_hosts_that_share_it():
    groups = _serving.groups_of_host(dict(play(), inventory_hostname="v-head"))
    assert groups["v"].hosts == ["v-head", "v-node"]


def test_a_single_node_host_reads_nobody_else():
    task_vars = dict(play(), inventory_hostname="single")
    assert _serving.groups_of_host(task_vars) == {}
    assert set(task_vars["hostvars"].read) == {"single"}


def test_facts_and_registered_results_differ_between_nodes_without_an_error():
    task_vars = dict(play(**{"g1-node": {"sglang_drift": {"verdict": "drifted"}, "sglang_verified": {"x": 1}}}),
                     inventory_hostname="g1-head")
    assert list(_serving.groups_of_host(task_vars)) == ["serving_1"]


def test_a_setting_that_differs_between_nodes_or_a_rank_typo_names_host_and_variable():
    with pytest.raises(GroupError, match="host g1-node of serving group serving_1: sglang_tp_size is 8"):
        _serving.groups_of_host(dict(play(**{"g1-node": {"sglang_tp_size": 8}}), inventory_hostname="g1-head"))
    with pytest.raises(GroupError, match="host g1-node: sglang_node_rank 3 is out of range"):
        _serving.groups_of_host(dict(play(**{"g1-node": {"sglang_node_rank": 3}}), inventory_hostname="g1-head"))


def test_a_misspelt_group_name_or_a_rank_without_group_involves_the_host_itself():
    with pytest.raises(GroupError, match="'serving_l', which is no inventory group"):
        _serving.groups_of_host(dict(play(single={"sglang_serving_groups": ["serving_l"]}), inventory_hostname="single"))
    with pytest.raises(GroupError, match="host single sets sglang_node_rank but belongs to no serving group"):
        _serving.groups_of_host(dict(play(single={"sglang_node_rank": 0}), inventory_hostname="single"))


def test_the_groups_of_a_run_are_judged_whole_also_for_the_hosts_it_leaves_out():
    task_vars = play()
    groups = _serving.groups_of_hosts(task_vars, ["g1-head", "single", "v-node"])
    assert sorted(groups) == ["serving_1", "v"] and groups["v"].hosts == ["v-head", "v-node"]


def test_a_variable_that_cannot_be_templated_is_named():
    class Broken(dict):
        def __getitem__(self, name):
            if name == "sglang_model_path":
                raise ValueError("'vault_x' is undefined")
            return dict.__getitem__(self, name)

    task_vars = play()
    dict.__setitem__(task_vars["hostvars"], "g1-node", Broken(dict.__getitem__(task_vars["hostvars"], "g1-node")))
    with pytest.raises(GroupError, match="host g1-node: sglang_model_path cannot be templated: 'vault_x'"):
        _serving.groups_of_host(dict(task_vars, inventory_hostname="g1-head"))
