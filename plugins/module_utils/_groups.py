# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Serving groups: one SGLang server that spans several hosts (``--nnodes``), derived from the inventory.

A serving group is either an inventory group named in ``sglang_serving_groups`` or the hosts that
share a value of ``sglang_serving_group``; each of its hosts carries ``sglang_node_rank``. Everything
else is derived, never typed twice: the number of nodes, the head (rank 0), the address the other
nodes rendezvous at (the head's ``sglang_dist_init_host``, else its ``sglang_host`` when other hosts
can reach it, else its ``ansible_host``) and the port (``sglang_dist_init_port``, default 50000).

What SGLang does with a group decides the helpers (the guide's multi-node page, measured on the simulator
and read in SGLang 0.5.11-0.5.23): only the head serves HTTP and is a router worker; a follower's
scheduler that dies takes the head down, and a follower's main process ignores SIGTERM (0.5.21+)
until the head's shutdown reaches it, so a group stops head first and starts all at once.

Pure: the input is per-host data (inventory hostname -> its variables, ``group_names`` included,
as ``hostvars`` holds them), no Ansible, no I/O. Every error names the host and the variable.

Private to this collection: no compatibility promise.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from ansible_collections.gpufleet.inference.plugins.module_utils._process import command_differences

GROUP_VARIABLE = "sglang_serving_group"
GROUPS_VARIABLE = "sglang_serving_groups"
RANK_VARIABLE = "sglang_node_rank"
PORT_VARIABLE = "sglang_dist_init_port"
HOST_VARIABLE = "sglang_dist_init_host"
TIMEOUT_VARIABLE = "sglang_dist_timeout"
DEFAULT_DIST_INIT_PORT = 50000

# Variables that may differ between the nodes of a group: the rank, each node's own bind
# address, and what only the head's value means (how a router reaches the server, where the
# other nodes reach the head).
NODE_VARIABLES = frozenset({RANK_VARIABLE, "sglang_host", "sglang_router_worker_url", HOST_VARIABLE})
# What a node's command line has of its own: its rank and its bind address (sglang_host); the rest is the group's.
NODE_FLAGS = ("--node-rank", "--host")
# The flags a group sets on every node (with SGLang's alias): sglang_extra_args must not.
GROUP_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr", "--dist-timeout")
# SGLang's own defaults, for a variable the inventory leaves unset.
SGLANG_DEFAULTS = {"sglang_tp_size": 1, "sglang_port": 30000, "sglang_host": "127.0.0.1"}
# Bind addresses no other host can reach the head at.
_LOCAL_ONLY = frozenset({"", "0.0.0.0", "::", "localhost", "127.0.0.1", "::1"})
_SECRET = re.compile(r"key|token|password|secret", re.IGNORECASE)
_PP_FLAGS = ("--pp-size", "--pipeline-parallel-size")
_DP_FLAGS = ("--dp-size", "--data-parallel-size")


class GroupError(ValueError):
    """An inventory whose serving groups SGLang could not run; one message per problem."""

    def __init__(self, errors):
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))


@dataclass(frozen=True)
class Node:
    host: str  # inventory hostname
    rank: int


@dataclass(frozen=True)
class ServingGroup:
    name: str
    nodes: tuple  # Node, in rank order
    head_address: str
    port: int
    timeout: int | None  # --dist-timeout, None: SGLang's default
    defined_by: str  # "sglang_serving_group" or "sglang_serving_groups"

    @property
    def nnodes(self):
        return len(self.nodes)

    @property
    def hosts(self):
        """Inventory hostnames in rank order."""
        return [node.host for node in self.nodes]

    @property
    def head(self):
        """The rank-0 host: the only one that serves HTTP, the group's router worker."""
        return self.nodes[0].host

    @property
    def followers(self):
        return self.hosts[1:]

    @property
    def dist_init_addr(self):
        """``--dist-init-addr`` as SGLang parses it (an IPv6 address in brackets)."""
        return f"[{self.head_address}]:{self.port}" if _is_ipv6(self.head_address) else \
            f"{self.head_address}:{self.port}"

    def rank_of(self, host):
        for node in self.nodes:
            if node.host == host:
                return node.rank
        raise KeyError(host)

    def node_args(self, host):
        """The argv a node adds to the group's common SGLang arguments."""
        args = ["--nnodes", str(self.nnodes), "--node-rank", str(self.rank_of(host)),
                "--dist-init-addr", self.dist_init_addr]
        if self.timeout is not None:
            args += ["--dist-timeout", str(self.timeout)]
        return args

    def stop_order(self):
        """Head first: its drain ends every follower cleanly (they exit 0 and stay down).

        A follower stopped first either ignores SIGTERM until the unit's stop timeout kills it
        (KillMode=mixed, 0.5.21+) or loses its schedulers at once; either way the head fails
        (exit 137) and ``Restart=on-failure`` brings it back into a half-stopped group.
        """
        return self.hosts

    def start_order(self):
        """Followers, then the head, without waiting in between: every rank waits for the others
        (up to ``--dist-timeout``), so the order costs nothing; the head last means its wait
        starts when the whole group has been started."""
        return self.followers + [self.head]

    def to_dict(self):
        return {"name": self.name, "nnodes": self.nnodes, "head": self.head, "followers": self.followers,
                "ranks": {node.host: node.rank for node in self.nodes}, "dist_init_addr": self.dist_init_addr,
                "dist_timeout": self.timeout, "defined_by": self.defined_by}


def _is_ipv6(host):
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


def _int(value):
    """An int from YAML or -e text; None for anything else (booleans are not ints)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        return int(value)
    return None


def _shown(name, value):
    if _SECRET.search(name):
        return "(hidden)" if value is not None else "not set"
    return "not set" if value is None else repr(value)


def _extra(variables):
    extra = variables.get("sglang_extra_args") or {}
    return extra if isinstance(extra, dict) else {}


def _flag_value(extra, flags):
    for flag in flags:
        if flag in extra:
            return extra[flag]
    return None


# ---------------------------------------------------------------------------- membership

def _membership(hostvars, errors, inventory_groups=None):
    """{group name: (defined_by, [hosts])} and the hosts that carry a rank."""
    known_groups = set(inventory_groups or ())
    for variables in hostvars.values():
        known_groups.update(variables.get("group_names") or ())
    members = {}
    listed_anywhere = set()
    for host in sorted(hostvars):
        variables = hostvars[host]
        found = []
        by_variable = variables.get(GROUP_VARIABLE)
        if by_variable not in (None, ""):
            if not isinstance(by_variable, str):
                errors.append(f"host {host}: {GROUP_VARIABLE} must be a group name (a string), "
                              f"got {by_variable!r}")
            else:
                found.append((by_variable, GROUP_VARIABLE))
        listed = variables.get(GROUPS_VARIABLE) or []
        if isinstance(listed, str) or not isinstance(listed, (list, tuple)) or \
                not all(isinstance(name, str) for name in listed):
            errors.append(f"host {host}: {GROUPS_VARIABLE} must be a list of inventory group names, "
                          f"got {listed!r}")
            listed = []
        listed_anywhere.update(listed)
        for name in listed:
            if name in (variables.get("group_names") or ()):
                found.append((name, GROUPS_VARIABLE))
        names = sorted({name for name, _by in found})
        if len(names) > 1:
            errors.append(f"host {host} belongs to {len(names)} serving groups ({', '.join(names)}: "
                          f"{', '.join(sorted({by for _n, by in found}))}); a host runs one server")
            continue
        if names:
            name = names[0]
            by = found[0][1]
            entry = members.setdefault(name, [by, []])
            if entry[0] != by:
                entry[0] = f"{GROUP_VARIABLE} and {GROUPS_VARIABLE}"
            entry[1].append(host)
        elif variables.get(RANK_VARIABLE) is not None:
            errors.append(f"host {host} sets {RANK_VARIABLE} but belongs to no serving group: set "
                          f"{GROUP_VARIABLE} on it, or name its inventory group in {GROUPS_VARIABLE}")
    for name in sorted(listed_anywhere - known_groups):
        errors.append(f"{GROUPS_VARIABLE} names {name!r}, which is no inventory group of any host")
    return members


# ---------------------------------------------------------------------------- one group

def _ranks(name, hosts, hostvars, errors):
    """{host: rank} when the ranks are 0..N-1, each once; else errors naming hosts and ranks."""
    count = len(hosts)
    ranks = {}
    for host in hosts:
        raw = hostvars[host].get(RANK_VARIABLE)
        rank = _int(raw)
        if raw is None:
            errors.append(f"host {host} is in serving group {name} but has no {RANK_VARIABLE}")
        elif rank is None or rank < 0:
            errors.append(f"host {host}: {RANK_VARIABLE} must be an integer 0..{count - 1}, got {raw!r}")
        elif rank >= count:
            errors.append(f"host {host}: {RANK_VARIABLE} {rank} is out of range for serving group {name} "
                          f"of {count} hosts (ranks 0..{count - 1})")
        else:
            ranks[host] = rank
    by_rank = {}
    for host, rank in ranks.items():
        by_rank.setdefault(rank, []).append(host)
    ok = len(ranks) == count
    for rank, owners in sorted(by_rank.items()):
        if len(owners) > 1:
            ok = False
            role = "heads" if rank == 0 else "nodes"
            errors.append(f"serving group {name} has {len(owners)} {role} with {RANK_VARIABLE} {rank}: "
                          f"{', '.join(sorted(owners))}")
    for rank in range(count):
        if rank not in by_rank:
            ok = False
            what = "no head: no host has" if rank == 0 else "no host with"
            errors.append(f"serving group {name} has {what} {RANK_VARIABLE} {rank}")
    return ranks if ok else None


def _same_settings(name, hosts, reference, hostvars, errors):
    """Every node runs the reference node's settings, except the per-node variables."""
    names = set()
    for host in hosts:
        names.update(key for key in hostvars[host] if key.startswith("sglang_"))
    names -= NODE_VARIABLES | {GROUP_VARIABLE, GROUPS_VARIABLE}
    base = hostvars[reference]
    for host in hosts:
        if host == reference:
            continue
        for variable in sorted(names):
            mine, theirs = hostvars[host].get(variable), base.get(variable)
            if mine != theirs:
                errors.append(f"host {host} of serving group {name}: {variable} is {_shown(variable, mine)}, "
                              f"its head {reference} has {_shown(variable, theirs)}; every node runs the "
                              "same settings except the rank")


def _launch_checks(name, head, count, variables, errors):
    """What SGLang's check_server_args() refuses at launch, before anything changes."""
    tp = _int(variables.get("sglang_tp_size", SGLANG_DEFAULTS["sglang_tp_size"]))
    pp = _int(_flag_value(_extra(variables), _PP_FLAGS) or 1)
    if tp is not None and pp is not None and (tp * pp) % count:
        errors.append(f"serving group {name}: sglang_tp_size {tp}"
                      f"{f' x --pp-size {pp}' if pp != 1 else ''} is not divisible by its {count} nodes "
                      "(SGLang: 'tp_size must be divisible by number of nodes')")
    extra = _extra(variables)
    dp = _int(_flag_value(extra, _DP_FLAGS) or 1)
    if dp is not None and dp > 1 and not extra.get("--enable-dp-attention"):
        errors.append(f"serving group {name}: sglang_extra_args --dp-size {dp} on {head}: SGLang refuses "
                      "data-parallel replicas across nodes (use attention DP, --attn-dp-size)")
    # argparse takes an unambiguous abbreviation too, so a prefix of a group flag collides.
    for flag in sorted(key for key in extra if isinstance(key, str)):
        if any(group_flag.startswith(flag) for group_flag in GROUP_FLAGS):
            errors.append(f"host {head}: sglang_extra_args[{flag!r}] is set by serving group {name} "
                          f"(from {RANK_VARIABLE}, {PORT_VARIABLE}, {TIMEOUT_VARIABLE}); remove it")


def _head_address(head, variables, errors):
    override = variables.get(HOST_VARIABLE)
    if override not in (None, ""):
        if not isinstance(override, str) or re.search(r"[\s/\[\]]", override):
            errors.append(f"host {head}: {HOST_VARIABLE} must be a host name or address, got {override!r}")
            return None
        return override
    bind = variables.get("sglang_host", SGLANG_DEFAULTS["sglang_host"])
    if isinstance(bind, str) and bind not in _LOCAL_ONLY:
        return bind
    address = variables.get("ansible_host") or head
    return str(address)


def _port(name, head, variables, errors):
    raw = variables.get(PORT_VARIABLE, DEFAULT_DIST_INIT_PORT)
    port = _int(raw)
    if port is None or not 1 <= port <= 65535:
        errors.append(f"host {head}: {PORT_VARIABLE} must be a port 1..65535, got {raw!r}")
        return None
    http_port = _int(variables.get("sglang_port", SGLANG_DEFAULTS["sglang_port"]))
    if port == http_port:
        errors.append(f"serving group {name}: {PORT_VARIABLE} {port} is the head's sglang_port; the "
                      "rendezvous needs a port of its own")
        return None
    return port


def _timeout(head, variables, errors):
    raw = variables.get(TIMEOUT_VARIABLE)
    if raw in (None, ""):
        return None
    timeout = _int(raw)
    if timeout is None or timeout <= 0:
        errors.append(f"host {head}: {TIMEOUT_VARIABLE} must be a positive number of seconds, got {raw!r}")
        return None
    return timeout


# ---------------------------------------------------------------------------- public API

def serving_groups(hostvars, inventory_groups=None):
    """{group name: ServingGroup} from every host's variables; raise GroupError before any change.

    ``hostvars``: inventory hostname -> that host's variables (``group_names`` included). Give it
    every host of the groups judged, not only the play's: a group is judged whole. ``inventory_groups``:
    the names of every inventory group (a group named in ``sglang_serving_groups`` is checked against
    them), when ``hostvars`` holds only some hosts.
    """
    errors = []
    members = _membership(hostvars, errors, inventory_groups)
    groups = {}
    for name in sorted(members):
        defined_by, hosts = members[name]
        group_errors = []
        if len(hosts) < 2:
            group_errors.append(f"serving group {name} has one host ({hosts[0]}): a group spans at least 2 hosts; "
                                f"a single-node server needs no {RANK_VARIABLE}")
            errors.extend(group_errors)
            continue
        ranks = _ranks(name, hosts, hostvars, group_errors)
        ordered = sorted(hosts, key=lambda h: (ranks or {}).get(h, _int(hostvars[h].get(RANK_VARIABLE)) or 0))
        reference = ordered[0]
        _same_settings(name, ordered, reference, hostvars, group_errors)
        head_vars = hostvars[reference]
        _launch_checks(name, reference, len(hosts), head_vars, group_errors)
        address = _head_address(reference, head_vars, group_errors)
        port = _port(name, reference, head_vars, group_errors)
        timeout = _timeout(reference, head_vars, group_errors)
        errors.extend(group_errors)
        if group_errors:
            continue
        nodes = tuple(Node(host, ranks[host]) for host in ordered)
        groups[name] = ServingGroup(name, nodes, address, port, timeout, defined_by)
    if errors:
        raise GroupError(errors)
    return groups


def group_of(groups, host):
    """The ServingGroup ``host`` belongs to, or None (a single-node server)."""
    for group in groups.values():
        if host in group.hosts:
            return group
    return None


def node_args(groups, host):
    """The per-node argv of ``host`` (``--nnodes N --node-rank i --dist-init-addr HEAD:PORT``
    [``--dist-timeout S``]); [] for a host that is no group's node."""
    group = group_of(groups, host)
    return group.node_args(host) if group else []


def split_groups(groups, hosts):
    """The groups ``hosts`` (a play's hosts, a batch) include only partly: [(group, in, out)]."""
    chosen = set(hosts)
    split = []
    for group in groups.values():
        inside = [h for h in group.hosts if h in chosen]
        if inside and len(inside) < group.nnodes:
            split.append((group, inside, [h for h in group.hosts if h not in chosen]))
    return split


def check_whole(groups, hosts, what="this run"):
    """Raise GroupError naming every group ``hosts`` would split (e.g. a --limit)."""
    errors = []
    for group, inside, outside in split_groups(groups, hosts):
        errors.append(f"serving group {group.name} is only partly in {what}: "
                      f"{', '.join(f'{h} (rank {group.rank_of(h)})' for h in inside)} in, "
                      f"{', '.join(f'{h} (rank {group.rank_of(h)})' for h in outside)} not; "
                      "changing part of a group takes its whole server down - include all of its hosts or none")
    if errors:
        raise GroupError(errors)


def members(groups, hosts):
    """``hosts`` as units of change, in the order given: a group once (its hosts in stop order, at
    the place of its first host), a single-node host alone. What a batch or a capacity guard counts."""
    units = []
    seen = set()
    for host in hosts:
        group = group_of(groups, host)
        if group is None:
            units.append((host,))
        elif group.name not in seen:
            seen.add(group.name)
            units.append(tuple(group.stop_order()))
    return units


def router_worker(groups, host):
    """True when ``host`` serves HTTP, i.e. belongs in a router: a single-node host or a group's head."""
    group = group_of(groups, host)
    return group is None or group.head == host


def _without_node_flags(argv):
    words, skip = [], False
    for word in argv or []:
        if skip:
            skip = False
            continue
        if word in NODE_FLAGS:
            skip = True
            continue
        if any(word.startswith(flag + "=") for flag in NODE_FLAGS):
            continue
        words.append(word)
    return words


def node_differences(head_argv, node_argv):
    """What a node runs other than its head (both running command lines), its own flags (NODE_FLAGS) aside:
    [{key, expected (the head's), observed (the node's)}]; a group runs one server, so any is drift."""
    differences, dummy = command_differences(_without_node_flags(head_argv), _without_node_flags(node_argv))
    return differences
