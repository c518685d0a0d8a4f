# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's side of a rollout: inputs, the fleet lock, records, the capacity guard, the end.

Runs on the controller only (no module is sent to a host); see plugins/modules/sglang_rollout.py
for the documentation and plugins/module_utils/_rollout.py for the file layout.
"""
from __future__ import annotations

import getpass
import math
import os
import socket
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro
from ansible_collections.gpufleet.inference.plugins.module_utils._router import RouterClient, RouterError

display = Display()

# step -> (in_router, what runs on the host, status while at that step)
STEPS = {
    "draining": (False, "the previous unit (leaving the router)", "in progress"),
    "applying": (False, "the new unit, not verified yet (install, restart, wait)", "in progress"),
    "verified": (False, "the new unit, verified", "verified, not rejoined"),
    "rejoined": (True, "the new unit, verified", "updated"),
}
DONE_STATUSES = ("updated", "recovered", "unchanged (verified)", "reverted")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = self._task.args
        handler = getattr(self, "_" + str(args.get("state", "")), None)
        if handler is None or str(args.get("state", "")).startswith("_"):
            raise AnsibleActionFail("state must be one of start, record, capacity, finish; got %r" % args.get("state"))
        try:
            result.update(handler(args, task_vars or {}))
        except ro.RolloutError as exc:
            result.update(failed=True, msg=str(exc))
        result.setdefault("changed", False)
        return result

    # ------------------------------------------------------------------ start

    def _start(self, args, task_vars):
        root = os.path.abspath(os.path.expanduser(str(args.get("results_dir") or "results/rollout")))
        batches = ro.parse_batches(args.get("batches") if args.get("batches") not in (None, "") else [1, "25%"])
        min_healthy = ro.parse_count(args.get("min_healthy", 0), "rollout_min_healthy")
        try:
            capacity_wait = float(args.get("capacity_wait", 300))
            max_age = float(args.get("lock_max_age", 24))
        except (TypeError, ValueError):
            raise ro.RolloutError("rollout_capacity_wait and rollout_lock_max_age must be numbers (seconds, hours)")
        hosts = sorted(args.get("hosts") or [])
        requested = ro.check_run_id(str(args["run_id"])) if args.get("run_id") else None
        common = dict(batches=batches, min_healthy=min_healthy, capacity_wait=capacity_wait, results_dir=root,
                      hosts=hosts)
        if self._task.check_mode:
            run_id = ro.new_run_id() + "-check"
            run = {"run_id": run_id, "check_mode": True, "started": ro.iso(), "hosts": hosts, "status": "check",
                   "note": "a check run (--check): nothing was changed; the records say what would change"}
            ro.write_json(os.path.join(root, run_id, "run.json"), run)
            return dict(common, run_id=run_id, run_dir=os.path.join(root, run_id), resumed=False, check_mode=True,
                        fleet=self._fleet(root, hosts), note=run["note"])
        with ro.RootLock(root):
            lock = ro.read_json(os.path.join(root, ro.LOCK))
            resumed, note, broken = False, None, None
            if lock:
                previous = ro.read_json(os.path.join(root, str(lock.get("run_id")), "run.json"), {})
                action, note = ro.decide_lock(lock, requested, bool(args.get("break_lock")), max_age,
                                              ro.holder_alive(lock), ro.lock_age_hours(lock),
                                              previous.get("status") in ("finished", "failed", "abandoned"))
                if action == "resume":
                    run_id, resumed = lock["run_id"], True
                else:
                    run_id = requested or ro.new_run_id()
                    broken = lock
                    if previous and previous.get("status") == "running":
                        previous.update(status="abandoned", abandoned=ro.iso(), abandoned_by=run_id)
                        ro.write_json(os.path.join(root, str(lock["run_id"]), "run.json"), previous)
            else:
                run_id = requested or ro.new_run_id()
                existing = ro.read_json(os.path.join(root, run_id, "run.json"))
                resumed = bool(existing) and existing.get("status") == "running"
                if resumed:
                    note = "resuming run %s (rollout_run_id)" % run_id
            pid = os.getppid()  # the ansible-playbook process (this worker's parent)
            ro.write_json(os.path.join(root, ro.LOCK), {
                "run_id": run_id, "pid": pid, "pid_start": ro.process_start(pid),
                "controller": socket.gethostname(), "user": getpass.getuser(), "started": ro.iso(), "hosts": hosts})
            run_path = os.path.join(root, run_id, "run.json")
            run = ro.read_json(run_path) or {"run_id": run_id, "started": ro.iso(), "resumes": []}
            run.update(status="running", hosts=sorted(set(run.get("hosts", [])) | set(hosts)), batches=batches,
                       min_healthy=min_healthy, pid=pid)
            if resumed:
                run.setdefault("resumes", []).append({"at": ro.iso(), "note": note})
            if broken:
                run["broke_lock_of"] = broken
            ro.write_json(run_path, run)
        if note:
            display.warning(note)
        return dict(common, run_id=run_id, run_dir=os.path.join(root, run_id), resumed=resumed, check_mode=False,
                    fleet=self._fleet(root, hosts), note=note)

    @staticmethod
    def _fleet(root, hosts):
        return dict((host, ro.read_json(os.path.join(root, ro.FLEET, "%s.json" % host))) for host in hosts)

    # ------------------------------------------------------------------ record

    def _record(self, args, task_vars):
        run = args.get("run") or {}
        if not run.get("run_dir"):
            raise ro.RolloutError("record needs run (the result of state=start)")
        host = args.get("host") or task_vars.get("inventory_hostname")
        step = args.get("step")
        record = self._build_record(host, step, args, run)
        root = os.path.dirname(run["run_dir"])
        with ro.RootLock(root):
            path = os.path.join(run["run_dir"], "%s.json" % host)
            merged = dict(ro.read_json(path) or {}, **record)
            merged["steps"] = (merged.get("steps") or []) + [{"step": step, "at": ro.iso(), "status": merged["status"]}]
            ro.write_json(path, merged)
            if not run.get("check_mode"):  # the fleet's ledger: where each host was left, by any run
                ro.write_json(os.path.join(root, ro.FLEET, "%s.json" % host), {
                    "host": host, "run_id": run["run_id"], "step": step, "status": merged["status"],
                    "failed_step": merged.get("failed_step") if step == "failed" else None,
                    "in_router": merged.get("in_router"), "runs": merged.get("runs"), "at": ro.iso()})
            self._write_summary(run)
        return {"ansible_facts": {"rollout_host_state": merged}, "record": merged}

    def _build_record(self, host, step, args, run):
        drift = args.get("drift") or {}
        fleet = (run.get("fleet") or {}).get(host) or {}
        record = {"host": host, "run_id": run.get("run_id")}
        if step == "prepared":
            left_out = fleet.get("in_router") is False
            if run.get("check_mode"):
                status = "in sync" if drift.get("in_sync") and not left_out else "would change"
            elif drift.get("in_sync") and not left_out:
                status = "unchanged (verified)"
            else:
                status = "pending"
            record.update(status=status, step=step, old_invocation=drift.get("invocation_id"),
                          endpoint=args.get("endpoint"),
                          observed=drift.get("observed"), differences=drift.get("differences") or [],
                          restart_pending=drift.get("restart_pending"), drift_verdict=drift.get("verdict"),
                          in_router=None if not args.get("router") else (False if left_out else None))
            if left_out:
                record["recovering"] = ("left out of the router by run %s at step %s (%s); it is brought to the "
                                        "intended settings, verified and put back" % (
                                            fleet.get("run_id"), fleet.get("failed_step") or fleet.get("step"),
                                            fleet.get("at")))
            return record
        if step in STEPS:
            in_router, runs, status = STEPS[step]
            if not args.get("router"):
                in_router = None
            if step == "rejoined" and args.get("recovering"):
                status = "recovered"
            record.update(step=step, status=status, in_router=in_router, runs=runs)
            verified = args.get("verified") or {}
            if step in ("verified", "rejoined") and verified:
                restarted = verified.get("invocation_id") != drift.get("invocation_id")
                record.update(new_invocation=verified.get("invocation_id"), observed=verified.get("observed"),
                              config_line_mode=verified.get("config_line_mode"), source=verified.get("source"),
                              verified=verified.get("verified"), restarted=restarted,
                              time_to_ready=(verified.get("phases") or {}).get("generate", {}).get("elapsed")
                              if restarted else None,
                              settle_seconds=args.get("min_ready_seconds"), verify_msg=verified.get("msg"))
                if step == "rejoined" and not restarted and status == "updated":
                    record["status"] = "recovered" if args.get("recovering") else "unchanged (verified)"
            if args.get("drained") is not None:
                record["drained_seconds"] = (args.get("drained") or {}).get("drain_seconds")
            if step == "rejoined":
                saved = args.get("last_good") or {}
                record["last_good_saved"] = bool(saved.get("exists")) and not args.get("last_good_error")
                if args.get("last_good_error"):
                    record["last_good_error"] = args["last_good_error"]
            return record
        if step == "failed":
            return self._failure(record, args)
        raise ro.RolloutError("unknown step %r" % step)

    @staticmethod
    def _failure(record, args):
        reached = (args.get("state_before") or {}).get("step")
        failure = args.get("failure") or {}
        revert = args.get("revert") or {}
        router = bool(args.get("router"))
        lost = failure.get("verdict") == "connection_lost" or failure.get("unreachable")
        cause = failure.get("msg") or "unknown failure"
        if isinstance(cause, list):
            cause = "; ".join(str(item) for item in cause)
        task = args.get("task") or "?"
        rejoined = bool(args.get("rejoined_after_revert"))
        left = reached in ("draining", "applying")  # it had been taken out of the router
        if reached == "verified":
            status = "verified, not rejoined"
            outcome = ("the new settings were verified, but the host could not be put back into the router: it runs "
                       "the new, verified unit and serves no router traffic. It was NOT reverted (nothing is wrong "
                       "with it); re-run the rollout to put it back")
            in_router = False
            runs = STEPS["verified"][1]
        elif lost:
            outcome = ("the connection to the host was lost at step %s: nothing more is known of it; it %s and "
                       "runs %s. Re-run the rollout when it is reachable: it resumes this run" % (
                           reached or "prepared", "is OUT of the router" if router and left else
                           "was not taken out of the router" if router else "was not reverted",
                           STEPS.get(reached, (None, "the previous unit"))[1]))
            status, in_router, runs = "failed", ((not left) if router else None), \
                STEPS.get(reached, (None, "unknown", None))[1]
        elif not args.get("changed"):
            status, outcome = "failed", "nothing on the host had changed; no revert needed"
            in_router = (rejoined or not left) if router else None
            runs = "the previous unit (unchanged)"
            if router and left and not rejoined:
                outcome += "; it is OUT of the router (it had left it)"
        elif not revert:
            status = "failed"
            outcome = "NO last-known-good unit to revert to: the host is left as it is%s" % (
                " and is OUT of the router, serving nothing" if router else "")
            in_router, runs = (False if router else None), "the new unit, not verified"
        elif revert.get("healthy"):
            status = "reverted"
            outcome = "reverted to the last-known-good unit: invocation %s verified (%s)%s" % (
                revert.get("invocation_id"), revert.get("observed"),
                "; back in the router" if router and rejoined else "; NOT back in the router" if router else "")
            in_router, runs = (rejoined if router else None), "the last-known-good unit, verified"
        else:
            status = "failed"
            outcome = ("the revert to the last-known-good unit FAILED too (%s): %s. The host is %s and runs the "
                       "last-known-good unit, not verified" % (revert.get("verdict"), revert.get("msg"),
                                                               "OUT of the router, serving nothing" if router
                                                               else "not serving verified settings"))
            in_router, runs = (False if router else None), "the last-known-good unit, not verified"
        record.update(step="failed", status=status, failed_step=reached, failed_task=task, error=cause,
                      in_router=in_router, runs=runs, connection_lost=bool(lost), outcome=outcome,
                      reverted=bool(revert.get("healthy")), revert=revert or None,
                      message="Rollout stopped at %s: %s: %s. %s." % (record["host"], task, cause.rstrip("."),
                                                                      outcome))
        return record

    @staticmethod
    def _write_summary(run):
        run_dir = run["run_dir"]
        records = []
        for name in sorted(os.listdir(run_dir)):
            if name.endswith(".json") and name not in ("summary.json", "run.json") and not name.startswith("."):
                item = ro.read_json(os.path.join(run_dir, name))
                if item:
                    records.append(item)
        meta = ro.read_json(os.path.join(run_dir, "run.json"), {})
        ro.write_json(os.path.join(run_dir, "summary.json"), ro.summarize(meta, records))
        return meta, records

    # ------------------------------------------------------------------ capacity

    def _capacity(self, args, task_vars):
        router_url = args.get("router_url")
        workers = [str(url).rstrip("/") for url in args.get("workers") or []]
        leaving = [str(url).rstrip("/") for url in args.get("leaving") or []]
        required_spec = ro.parse_count(args.get("min_healthy", 0), "rollout_min_healthy")
        if isinstance(required_spec, str):
            required = int(math.ceil(float(required_spec.rstrip("%")) / 100.0 * len(workers)))
        else:
            required = int(required_spec)
        wait = float(args.get("capacity_wait", 300))
        poll = float(args.get("poll", 2))
        client = RouterClient(router_url, args.get("api_key"), timeout=float(args.get("request_timeout", 10)))
        started = time.monotonic()
        while True:
            try:
                listed = client.list_workers()
                problem = None
            except RouterError as exc:
                listed, problem = [], str(exc)
            healthy = sorted(w["url"] for w in listed if w["url"] in workers and w["healthy"])
            remaining = [url for url in healthy if url not in leaving]
            if problem is None and len(remaining) >= required:
                return {"healthy": healthy, "remaining": len(remaining), "required": required,
                        "waited": round(time.monotonic() - started, 1)}
            waited = time.monotonic() - started
            if waited >= wait:
                unhealthy = sorted(set(workers) - set(healthy))
                raise ro.RolloutError(
                    "capacity guard: taking %s out of the router would leave %s healthy worker(s) of this rollout's "
                    "group, below rollout_min_healthy %s (%s). Not healthy in the router: %s. Waited %.0fs "
                    "(rollout_capacity_wait) for capacity to come back; nothing was changed in this batch." % (
                        ", ".join(leaving) or "nothing", len(remaining), required, required_spec,
                        ", ".join(unhealthy) or "none" if problem is None else problem, waited))
            time.sleep(max(0.0, min(poll, wait - waited)))

    # ------------------------------------------------------------------ finish

    def _finish(self, args, task_vars):
        run = args.get("run") or {}
        if not run.get("run_dir"):
            raise ro.RolloutError("finish needs run (the result of state=start)")
        root = os.path.dirname(run["run_dir"])
        with ro.RootLock(root):
            meta, records = self._write_summary(run)
            stopped = [r for r in records if r.get("status") in ("failed", "verified, not rejoined", "reverted")]
            pending = [r["host"] for r in records if r.get("status") in ("pending", "in progress")]
            # A host lost mid-change is in a state nobody knows: the run keeps the fleet's lock, so
            # the same command resumes it (and no other rollout starts beside an unknown host).
            lost = [r["host"] for r in records if r.get("connection_lost") and r.get("status") == "failed"]
            if run.get("check_mode"):
                meta["status"] = "check"
            elif lost:
                kept = ("connection lost to %s: this run keeps the fleet's lock until it is resumed (the same "
                        "command) or broken (-e rollout_break_lock=true)" % ", ".join(lost))
                meta.update(status="interrupted", interrupted=ro.iso(), lost=lost, lock_kept=kept)
            else:
                meta.pop("lost", None)
                meta.pop("lock_kept", None)
                meta.update(status="failed" if stopped or pending else "finished", finished=ro.iso())
                lock = ro.read_json(os.path.join(root, ro.LOCK))
                if lock and lock.get("run_id") == run["run_id"] and lock.get("pid") == os.getppid():
                    os.unlink(os.path.join(root, ro.LOCK))
            ro.write_json(os.path.join(run["run_dir"], "run.json"), meta)
            self._write_summary(run)
        display.display("\nRollout %s%s:\n%s\nResults: %s/summary.json" % (
            run["run_id"], " (check mode: nothing was changed)" if run.get("check_mode") else "", ro.table(records),
            run["run_dir"]))
        counts = {}
        for record in records:
            counts[record.get("status")] = counts.get(record.get("status"), 0) + 1
        text = ", ".join("%s %s" % (count, status) for status, count in sorted(counts.items()))
        if stopped:
            first = stopped[0]
            return {"failed": True, "records": records,
                    "msg": "%s Not reached: %s. (%s)%s" % (first.get("message") or "Rollout stopped at %s: %s" % (
                        first["host"], first.get("status")), ", ".join(pending) or "none", text,
                        " " + meta["lock_kept"][0].upper() + meta["lock_kept"][1:] + "."
                        if meta.get("status") == "interrupted" else "")}
        if pending and not run.get("check_mode"):
            return {"failed": True, "records": records,
                    "msg": "Rollout %s ended with hosts not done: %s (%s)" % (run["run_id"], ", ".join(pending), text)}
        return {"records": records, "msg": "Rollout %s: %s" % (run["run_id"], text)}
