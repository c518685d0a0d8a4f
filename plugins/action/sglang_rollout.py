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

from ansible_collections.gpufleet.inference.plugins.action.sglang_rollout_host import CRITICAL_PATH_MODULES
from ansible_collections.gpufleet.inference.plugins.module_utils import _http
from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro
from ansible_collections.gpufleet.inference.plugins.module_utils._router import RouterClient, RouterError
from ansible_collections.gpufleet.inference.plugins.plugin_utils._builds import collector_paused

display = Display()
# urllib and ssl loaded with this plugin, in ansible-playbook's main process: each worker inherits them.
_http.preload()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = self._task.args
        handler = getattr(self, "_" + str(args.get("state", "")), None)
        if handler is None or str(args.get("state", "")).startswith("_"):
            raise AnsibleActionFail("state must be one of start, prepared, record, capacity, finish; got %r" % (
                args.get("state"),))
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
                        note=run["note"])
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
                    note=note)

    # ------------------------------------------------------------------ record

    def _record(self, args, task_vars):
        run = args.get("run") or {}
        host = args.get("host") or task_vars.get("inventory_hostname")
        merged = ro.record_step(run, host, args.get("step"), args)
        return {"ansible_facts": {"rollout_host_state": merged}, "record": merged}

    # ------------------------------------------------------------------ prepared

    def _prepared(self, args, task_vars):
        """Record every host of the prepare phase at once (one task, not one per host) and say which
        hosts go to the apply phase: those that must change, in inventory order - none when a host
        failed or was lost in the prepare phase (the canary is never touched then)."""
        run = args.get("run") or {}
        hostvars = task_vars.get("hostvars") or {}
        alive = set(args.get("alive") or [])
        apply, failed, lost, worker_urls = [], [], [], {}
        for host in args.get("hosts") or []:
            facts = hostvars[host] if host in hostvars else {}
            state = facts.get("rollout_host_state") or {}
            if state.get("step") == "failed":
                failed.append(host)  # its failure was recorded where it happened
                continue
            if host not in alive or not facts.get("sglang_drift"):
                lost.append(host)
                # Nothing was changed on it (the prepare phase only reads): not a lost connection mid-change.
                ro.record_step(run, host, "failed", dict(
                    task="Compare this host with its intent", router=args.get("router"),
                    failure={"msg": "the host left the prepare phase without a result (unreachable, or it failed "
                                    "outside the comparison)"}))
                continue
            endpoint = (facts["sglang_drift"].get("prepared") or {}).get("endpoint") or {}
            if endpoint.get("worker_url"):
                worker_urls[host] = endpoint["worker_url"]
            record = ro.record_step(run, host, "prepared", dict(
                drift=facts["sglang_drift"], endpoint=endpoint or None, router=args.get("router")))
            if record["status"] == "pending":
                apply.append(host)
        if failed or lost:
            return {"apply": [], "failed_hosts": failed, "lost_hosts": lost, "prebuilt": [], "worker_urls": worker_urls,
                    "msg": "the prepare phase failed on %s: no host is changed" % ", ".join(failed + lost)}
        prebuilt = self._prebuild(task_vars) if apply and not self._task.check_mode else []
        return {"apply": apply, "failed_hosts": [], "lost_hosts": [], "prebuilt": prebuilt, "worker_urls": worker_urls,
                "msg": "%d host(s) to change: %s" % (len(apply), ", ".join(apply) or "none")}

    def _prebuild(self, task_vars):
        """Build the critical path's module payloads into this run's module cache now, while no host
        is out of service: each worker of the apply phase then reads them instead of building them
        (~0.3 s per module, paid by the canary otherwise). Nothing runs on a host; a module that
        cannot be built here is built when it is used, as without this."""
        # The payload does not depend on the interpreter: name one so nothing is discovered remotely.
        build_vars = dict(task_vars, ansible_python_interpreter=task_vars.get("ansible_python_interpreter")
                          or "/usr/bin/python3")
        built = []
        for name in CRITICAL_PATH_MODULES:
            try:
                with collector_paused():
                    self._configure_module(name, {}, build_vars)
            except Exception as exc:  # pylint: disable=broad-except
                display.vvv("sglang_rollout: could not prebuild %s: %s" % (name, exc))
                continue
            built.append(name)
        return built

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
            meta, records = ro.write_summary(run)
            stopped = [r for r in records if r.get("status") in ro.STOPPED_STATUSES]
            # Neither done (the run could go on past it) nor stopped: not reached, or left mid-way.
            pending = [r["host"] for r in records
                       if r.get("status") not in ro.CONTINUE_STATUSES + ro.STOPPED_STATUSES]
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
            ro.write_summary(run)
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
