# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A follower's modules from its head's task: a connection made as delegate_to makes one - the follower's own
connection and become variables, never the head's - with Ansible's real plugin loaders (nothing connects)."""
import types

from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task
from ansible.plugins import loader as plugin_loader
from ansible.template import Templar

from ansible_collections.gpufleet.inference.plugins.plugin_utils import _nodes


class Hostvars(dict):
    def raw_get(self, host):
        return self[host]


def task_and_vars(**node):
    hostvars = Hostvars({"head": {"ansible_host": "10.0.0.1", "ansible_port": 2201, "ansible_user": "admin"},
                         "node": dict({"ansible_host": "10.0.0.2", "ansible_ssh_private_key_file": "/keys/ops"},
                                      **node)})
    task_vars = dict(hostvars["head"], hostvars=hostvars, inventory_hostname="head", sglang_ready_timeout=900)
    task = Task()
    task.action = "gpufleet.inference.sglang_rollout_host"
    loader = DataLoader()
    action = types.SimpleNamespace(_task=task, _templar=Templar(loader=loader, variables=task_vars),
                                   _play_context=PlayContext(), _shared_loader_obj=plugin_loader, _loader=loader)
    return action, task_vars


def test_the_followers_own_variables_and_the_plays_but_never_the_heads_host_variables():
    action, task_vars = task_and_vars(ansible_user="ops")
    variables = _nodes.node_variables(task_vars, "node")
    assert variables["ansible_host"] == "10.0.0.2" and variables["ansible_user"] == "ops"
    assert "ansible_port" not in variables  # the head's port is the head's
    assert variables["sglang_ready_timeout"] == 900 and variables["inventory_hostname"] == "node"


def test_the_connection_reaches_the_follower_as_its_inventory_says_with_its_become():
    action, task_vars = task_and_vars(ansible_user="ops", ansible_become=True)
    node, variables = _nodes.node_action(action, task_vars, "node")
    connection = node._connection
    assert connection._load_name == "ssh" and connection.get_option("host") == "10.0.0.2"
    assert connection.get_option("remote_user") == "ops" and connection.get_option("private_key_file") == "/keys/ops"
    assert connection.get_option("port") is None
    assert connection.become is not None and connection.become.name == "sudo"
    assert node._task is action._task  # the same task: its check mode, its module defaults


def test_a_follower_without_become_gets_none_and_the_runners_are_made_once_and_closed():
    action, task_vars = task_and_vars()
    node, dummy = _nodes.node_action(action, task_vars, "node")
    assert node._connection.become is None
    runners = _nodes.NodeRunners(action, task_vars, progress=False, prefix="p | ")
    first = runners("node")
    assert runners("node") is first and first.host == "node" and first.prefix == "p | "
    runners.close()  # never connected: closing does nothing and raises nothing
