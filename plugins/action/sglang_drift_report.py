# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The end of a drift check: one line per host, the report files, the verdict (controller only).

Reads each host's ``sglang_drift`` fact (the role's drift entry point) from hostvars; a host without
one could not be checked (unreachable, or its settings are invalid: the fact then holds the error).
A serving group (one server across hosts) is one line with its nodes: it is in sync when every node
is and every follower runs its head's arguments (its own rank and address aside).
"""
from __future__ import annotations

import os

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro
from ansible_collections.gpufleet.inference.plugins.module_utils._groups import node_differences

display = Display()


def host_line(record):
    verdict = record.get("verdict")
    head = "%s: %s (invocation %s)" % (record["host"], {"in_sync": "in sync", "drifted": "DRIFTED",
                                                        "unverified": "UNVERIFIED", "not_running": "NOT RUNNING",
                                                        "not_installed": "NOT INSTALLED",
                                                        "unchecked": "NOT CHECKED"}.get(verdict, verdict),
                                       record.get("invocation_id") or "none")
    parts = ["%s %s: expected %s, observed %s" % (d.get("what"), d.get("key"), d.get("expected"), d.get("observed"))
             for d in record.get("differences") or []]
    if verdict == "unverified" and record.get("unverified_reason"):
        parts.append(record["unverified_reason"])
    parts.extend("blocking: %s" % item for item in record.get("blocking") or [])
    return head + ("; " + "; ".join(parts) if parts else "")


def group_report(group, nodes, accept_unverified=False):
    """A serving group as one: {name, nodes, in_sync, differences (a follower's arguments against its head's),
    line}. ``nodes``: host -> its record (a node the run left out has none)."""
    head = group["head"]
    ranks = group.get("ranks") or {}
    hosts = [head] + list(group.get("followers") or [])
    differences = []
    head_argv = (nodes.get(head) or {}).get("command")
    for host in hosts[1:]:
        argv = (nodes.get(host) or {}).get("command")
        if head_argv and argv:
            differences += [dict(item, host=host) for item in node_differences(head_argv, argv)]
    good = ("in_sync", "unverified") if accept_unverified else ("in_sync",)
    in_sync = all(host in nodes and nodes[host].get("verdict") in good for host in hosts) and not differences
    parts = [host_line(nodes[host]) if host in nodes else "%s: NOT CHECKED (not in this run)" % host for host in hosts]
    by_node = {}
    for item in differences:
        text = "%s: head %s, node %s" % (item["key"], item["expected"], item["observed"])
        by_node.setdefault(item["host"], []).append(text)
    parts += ["%s (rank %s) runs other arguments than its head %s: %s" % (host, ranks.get(host), head, "; ".join(found))
              for host, found in sorted(by_node.items())]
    status = "in sync" if in_sync else "DRIFTED" if differences or any(
        nodes[host].get("verdict") not in good for host in hosts if host in nodes) else \
        "NOT JUDGED (a node was not checked)"
    line = "serving group %s (%s): %s | %s" % (
        group["name"], ", ".join("%s rank %s" % (host, ranks.get(host)) for host in hosts), status, " | ".join(parts))
    return {"name": group["name"], "nodes": hosts, "in_sync": in_sync, "differences": differences, "line": line}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        args = self._task.args
        hostvars = task_vars.get("hostvars", {})
        hosts = list(args.get("hosts") or task_vars.get("ansible_play_hosts_all") or [])
        records = []
        for host in hosts:
            drift = (hostvars.get(host) or {}).get("sglang_drift")
            if not isinstance(drift, dict) or not drift.get("verdict"):
                drift = {"host": host, "verdict": "unchecked", "in_sync": False, "differences": [
                    {"what": "check", "key": "host", "expected": "reachable, valid settings",
                     "observed": "no result (unreachable, or the check failed before comparing)"}]}
            record = dict((key, value) for key, value in drift.items() if not key.startswith("_") and key not in (
                "changed", "failed", "invocation", "warnings", "deprecations"))
            record["host"] = host
            records.append(record)
        accept_unverified = bool(args.get("accept_unverified", False))
        members = {}
        for record in records:
            group = (record.get("prepared") or {}).get("group")
            if group:
                members.setdefault(group["name"], (group, {}))[1][record["host"]] = record
        groups = [group_report(group, nodes, accept_unverified) for group, nodes in
                  (members[name] for name in sorted(members))]
        # a follower that runs other arguments than its head: every node of that group is drifted
        split = set(host for group in groups if group["differences"] for host in group["nodes"])
        good = [r["host"] for r in records if (r["verdict"] == "in_sync"
                or (accept_unverified and r["verdict"] == "unverified")) and r["host"] not in split]
        bad = [r["host"] for r in records if r["host"] not in good]
        run_id = ro.new_run_id()
        root = os.path.abspath(os.path.expanduser(str(args.get("results_dir") or "results/verify")))
        run_dir = os.path.join(root, run_id)
        summary = {"run_id": run_id, "at": ro.iso(), "check_mode": bool(self._task.check_mode),
                   "in_sync": [r["host"] for r in records if r["verdict"] == "in_sync"],
                   "unverified": [r["host"] for r in records if r["verdict"] == "unverified"],
                   "drifted": bad, "hosts": records,
                   "groups": [dict((key, group[key]) for key in ("name", "nodes", "in_sync", "differences"))
                              for group in groups]}
        for record in records:
            ro.write_json(os.path.join(run_dir, "%s.json" % record["host"]), record)
        ro.write_json(os.path.join(run_dir, "summary.json"), summary)
        in_groups = set(host for group in groups for host in group["nodes"])
        lines = [host_line(record) for record in records if record["host"] not in in_groups]
        lines += [group["line"] for group in groups]
        for line in lines:
            display.display(line)
        result.update(changed=False, run_dir=run_dir, records=records, in_sync=good, drifted=bad,
                      groups=summary["groups"])
        if bad:
            result.update(failed=True, msg="Drift on %s: %s. Report: %s/summary.json" % (
                ", ".join(bad), " | ".join([host_line(r) for r in records if r["host"] in bad and r["host"] not in
                                            in_groups] + [g["line"] for g in groups if not g["in_sync"]]), run_dir))
        else:
            result["msg"] = "All %s host(s) in sync. Report: %s/summary.json" % (len(records), run_dir)
        return result
