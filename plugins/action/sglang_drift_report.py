# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The end of a drift check: one line per host, the report files, the verdict (controller only).

Reads each host's ``sglang_drift`` fact (the role's drift entry point) from hostvars; a host without
one could not be checked (unreachable, or its settings are invalid: the fact then holds the error).
"""
from __future__ import annotations

import os

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro

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
        good = [r["host"] for r in records if r["verdict"] == "in_sync"
                or (accept_unverified and r["verdict"] == "unverified")]
        bad = [r["host"] for r in records if r["host"] not in good]
        run_id = ro.new_run_id()
        root = os.path.abspath(os.path.expanduser(str(args.get("results_dir") or "results/verify")))
        run_dir = os.path.join(root, run_id)
        summary = {"run_id": run_id, "at": ro.iso(), "check_mode": bool(self._task.check_mode),
                   "in_sync": [r["host"] for r in records if r["verdict"] == "in_sync"],
                   "unverified": [r["host"] for r in records if r["verdict"] == "unverified"],
                   "drifted": bad, "hosts": records}
        for record in records:
            ro.write_json(os.path.join(run_dir, "%s.json" % record["host"]), record)
        ro.write_json(os.path.join(run_dir, "summary.json"), summary)
        for record in records:
            display.display(host_line(record))
        result.update(changed=False, run_dir=run_dir, records=records, in_sync=good, drifted=bad)
        if bad:
            result.update(failed=True, msg="Drift on %s: %s. Report: %s/summary.json" % (
                ", ".join(bad), " | ".join(host_line(r) for r in records if r["host"] in bad), run_dir))
        else:
            result["msg"] = "All %s host(s) in sync. Report: %s/summary.json" % (len(records), run_dir)
        return result
