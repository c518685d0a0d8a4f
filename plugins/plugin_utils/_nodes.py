# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Modules run on the other nodes of a serving group from its head's task (controller side).

Private to this collection: no compatibility promise.

A serving group's steps interleave across its hosts: its head stops before its followers, every
follower starts before the head is waited for, every follower is watched while the head loads, and a
failure reverts them all. Tasks that each run on one host cannot hold that order (a task per step would
put the group's logic in YAML, and a step's task on one host cannot watch another). So the head's task
runs each follower's modules itself, over a connection to that follower made as Ansible's ``delegate_to``
makes one: the follower's own variables (its connection, shell and become variables, its interpreter),
the play's and the task's (not the head's host variables), and the task's become settings.
"""
from __future__ import annotations

import os

from ansible.errors import AnsibleError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.loader import become_loader

from ansible_collections.gpufleet.inference.plugins.plugin_utils._slices import ActionRunner

# The action plugin that runs modules (ansible.legacy.normal: what a task with no action of its own uses).
NORMAL = "ansible.legacy.normal"


def node_variables(task_vars, host):
    """The variables of inventory host `host` as a task delegated to it sees them: its own (inventory, facts), then
    everything of the task's that is not the task host's own (play, role and magic variables)."""
    hostvars = task_vars["hostvars"]
    own = dict(hostvars.raw_get(host))
    task_host = dict(hostvars.raw_get(task_vars["inventory_hostname"]))
    variables = dict((name, value) for name, value in task_vars.items() if name not in task_host and name not in own)
    variables.update(own)
    variables.update(inventory_hostname=host, inventory_hostname_short=host.split(".")[0])
    return variables


def _become(action, variables, templar, connection, play_context):
    """The become plugin of the task (or the host's ansible_become*), set on `connection` (TaskExecutor's way)."""
    if variables.get("ansible_become") is not None:
        become = boolean(templar.template(variables["ansible_become"]), strict=False)
    else:
        become = action._task.become
    plugin = None
    if become:
        method = templar.template(variables.get("ansible_become_method") or action._task.become_method or
                                  play_context.become_method or "sudo")
        plugin = become_loader.get(method)
        if plugin is None:
            raise AnsibleError("become method %r not found" % method)
    connection.set_become_plugin(plugin)
    return plugin


def _plugin_options(plugin, kind, variables, templar, task_keys):
    from ansible import constants as C
    options = dict((name, templar.template(variables[name])) for name in C.config.get_plugin_vars(kind, plugin._load_name)
                   if name in variables)
    plugin.set_options(task_keys=task_keys, var_options=options)


def node_action(action, task_vars, host):
    """(action, variables): an action plugin like `action` (the same task) whose connection reaches `host`, and the
    task variables its modules run with."""
    variables = node_variables(task_vars, host)
    templar = action._templar.copy_with_new_env(available_variables=variables)
    connection_type = templar.template(variables.get("ansible_connection") or action._task.connection or "ssh")
    play_context = action._play_context.set_task_and_variable_override(
        task=action._task, variables=variables, templar=templar)
    loader = action._shared_loader_obj
    connection = loader.connection_loader.get(connection_type, play_context, None, task_uuid=action._task._uuid,
                                              ansible_playbook_pid=str(os.getppid()))
    if connection is None:
        raise AnsibleError("the connection plugin %r was not found (for %s)" % (connection_type, host))
    become = _become(action, variables, templar, connection, play_context)
    play_context.set_attributes_from_plugin(connection)
    task_keys = action._task.dump_attrs()
    task_keys["timeout"] = play_context.timeout
    task_keys.pop("retries", None)
    connection.set_options(task_keys=task_keys, var_options=connection._resolve_option_variables(variables, templar))
    _plugin_options(connection._shell, "shell", variables, templar, task_keys)
    if become is not None:
        _plugin_options(become, "become", variables, templar, task_keys)
    node = loader.action_loader.get(NORMAL, task=action._task, connection=connection, play_context=play_context,
                                    loader=action._loader, templar=templar, shared_loader_obj=loader)
    return node, variables


class NodeRunners(object):
    """One ActionRunner per other node of the group (made when first used), closed together."""

    def __init__(self, action, task_vars, progress=True, prefix="sglang | "):
        self.action, self.task_vars, self.progress, self.prefix = action, task_vars, progress, prefix
        self.runners = {}

    def __call__(self, host):
        if host not in self.runners:
            node, variables = node_action(self.action, self.task_vars, host)
            self.runners[host] = ActionRunner(node, variables, host, self.progress, prefix=self.prefix)
        return self.runners[host]

    def close(self):
        for runner in self.runners.values():
            try:
                runner.action._connection.close()
            except Exception:  # pylint: disable=broad-except  # a connection already gone
                pass
