# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Serving groups as a play sees them (controller side): module_utils/_groups.py over the variables
Ansible holds for each host (``hostvars``).

Private to this collection: no compatibility promise. Reading another host's variables makes Ansible
compute them (every group_vars file, templated): a host's drift check reads only the hosts its own group
can involve, so a fleet of single-node servers pays nothing.

Only the role's variables are compared between the nodes of a group: a fact or a registered result
(``sglang_drift``, ``sglang_verified``) differs from host to host by nature.
"""
from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils import _args
from ansible_collections.gpufleet.inference.plugins.module_utils import _groups
from ansible_collections.gpufleet.inference.plugins.module_utils import _hostpath

# The variables _groups reads of a host: its membership, the group's own, and the role's settings.
READ = frozenset({"group_names", "ansible_host", _groups.GROUP_VARIABLE, _groups.GROUPS_VARIABLE,
                  _groups.RANK_VARIABLE, _groups.PORT_VARIABLE, _groups.HOST_VARIABLE, _groups.TIMEOUT_VARIABLE,
                  "sglang_version", "sglang_router_worker_url"} | set(_args.SETTINGS) | set(_hostpath.SETTINGS))


def variables_of(view, host):
    """The variables of `host` that _groups reads, templated (``view``: its hostvars entry, or a dict)."""
    found = {}
    for name in READ:
        if name not in view:
            continue
        try:
            found[name] = view[name]
        except Exception as exc:  # pylint: disable=broad-except  # an undefined variable, a vault not opened
            raise _groups.GroupError(["host %s: %s cannot be templated: %s" % (host, name, exc)])
    return found


class PlayHosts(object):
    """The hosts' variables as ``hostvars`` holds them, each host read once."""

    def __init__(self, task_vars):
        self.hostvars = task_vars.get("hostvars") or {}
        self.inventory_groups = task_vars.get("groups") or {}
        self.read = {}
        self.by_shared_name = None

    def variables(self, host):
        if host not in self.read:
            self.read[host] = variables_of(self.hostvars[host], host)
        return self.read[host]

    def sharing(self, value):
        """The hosts whose sglang_serving_group is `value` (every host's variable read once)."""
        if self.by_shared_name is None:
            self.by_shared_name = {}
            for host in self.hostvars:
                view = self.hostvars[host]
                if _groups.GROUP_VARIABLE in view:
                    self.by_shared_name.setdefault(view[_groups.GROUP_VARIABLE], []).append(host)
        return self.by_shared_name.get(value, [])

    def involved(self, host):
        """The hosts `host`'s serving group can involve, from its own variables: the inventory group it names in
        sglang_serving_groups, the hosts that share its sglang_serving_group, itself when it has a rank; [] for
        a single-node server."""
        variables = self.variables(host)
        listed = variables.get(_groups.GROUPS_VARIABLE) or []
        names = set(variables.get("group_names") or ())
        hosts = set()
        # a value _groups refuses (a typo of a group's name, not a list) involves the host itself: it is named
        wrong = not isinstance(listed, (list, tuple))
        for name in listed if not wrong else ():
            if name in names:
                hosts.update(self.inventory_groups.get(name) or ())
            elif name not in self.inventory_groups:
                wrong = True
        shared = variables.get(_groups.GROUP_VARIABLE)
        if isinstance(shared, str) and shared:
            hosts.update(self.sharing(shared))
        elif shared not in (None, ""):
            wrong = True
        if hosts or wrong or variables.get(_groups.RANK_VARIABLE) is not None:
            hosts.add(host)
        return sorted(hosts)

    def groups(self, hosts):
        """{name: ServingGroup} of every serving group `hosts` belong to, each judged whole (its hosts that
        `hosts` leaves out are read too); raises _groups.GroupError."""
        pending, seen = [host for host in hosts if host in self.hostvars], set()
        while pending:
            host = pending.pop()
            if host in seen:
                continue
            seen.add(host)
            pending.extend(self.involved(host))
        involved = dict((host, self.variables(host)) for host in seen if self.involved(host))
        return _groups.serving_groups(involved, inventory_groups=list(self.inventory_groups))


def groups_of_host(task_vars):
    """{name: ServingGroup} of the task's host's serving group ({} for a single-node server); raises
    _groups.GroupError naming host and variable."""
    return PlayHosts(task_vars).groups([task_vars.get("inventory_hostname")])


def groups_of_hosts(task_vars, hosts):
    """{name: ServingGroup} of every serving group `hosts` belong to (each judged whole); raises GroupError."""
    return PlayHosts(task_vars).groups(hosts)
