# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One host of a rollout's apply phase: the critical path in one task.

Record, leave the router and drain, keep what runs as last-known-good (first change), install
what differs, restart, wait for the NEW process, record it verified, rejoin, save it as
last-known-good, record it done. A failing step reverts the host to its last-known-good unit
when it had changed, puts it back into the router when it is healthy, and records where it
stopped. Each step is recorded BEFORE it can leave the host worse.

The host's steps are the collection's one host path (module_utils/_hostpath.py), the same the
role's entry points and handler run; this action adds the router and the records around them.
One task per host keeps a batch's critical path free of per-task overhead.

The head of a multi-node serving group runs this task for its whole group (its followers are in no
batch): the group's path (module_utils/_grouppath.py) over every node's host path, each follower
reached from here (plugin_utils/_nodes.py); every node keeps its own lease, record and last-known-good,
the group fails and reverts as one, and only the head is a router worker.
Documentation: plugins/modules/sglang_rollout_host.py.
"""
from __future__ import annotations

import os
import time

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.inference.plugins.module_utils import _grouppath
from ansible_collections.gpufleet.inference.plugins.module_utils import _hostpath as hp
from ansible_collections.gpufleet.inference.plugins.module_utils import _http
from ansible_collections.gpufleet.inference.plugins.module_utils import _records
from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro
from ansible_collections.gpufleet.inference.plugins.module_utils._canary import Analysis, AnalysisError, write_report
from ansible_collections.gpufleet.inference.plugins.module_utils._canary_judge import INCONCLUSIVE, REGRESSION
from ansible_collections.gpufleet.inference.plugins.module_utils._router import (
    RouterClient,
    RouterError,
    find_worker,
    worker_change,
)
from ansible_collections.gpufleet.inference.plugins.plugin_utils import _holder
from ansible_collections.gpufleet.inference.plugins.plugin_utils._nodes import NodeRunners
from ansible_collections.gpufleet.inference.plugins.plugin_utils._slices import ActionRunner, connection_lost

# urllib and ssl loaded with this plugin, in ansible-playbook's main process: each worker inherits them.
_http.preload()

PREFIX = "sglang_rollout | "
REJOIN_DELAY = 5.0

# The rollout's own steps (the host's steps are named in module_utils/_hostpath.py).
CAPACITY = "Check that the router keeps enough healthy workers while this batch is out"
DRAIN = "Take this host out of the router and let it drain"
REJOIN = "Put this host back into the router"
ANALYSIS = "Compare the canary with a host still on the previous settings"


def _summary(analysis):
    """What a record keeps of a canary analysis: the verdict, why, against whom, the report's files."""
    if not analysis:
        return None
    return {"verdict": analysis.get("verdict"), "message": analysis.get("message"),
            "baseline": (analysis.get("baseline") or {}).get("name"), "report": analysis.get("report")}


ARGUMENT_SPEC = dict(
    run=dict(type="dict", required=True),
    lease=dict(type="dict", required=True),
    plan=dict(type="dict", default={}),
    capacity=dict(type="dict", default={}),
    router=dict(type="dict", default={}, options=dict(
        url=dict(type="str", default=""),
        api_key=dict(type="str", no_log=True),
        worker_url=dict(type="str"),
        drain_timeout=dict(type="int", default=300),
        rejoin_timeout=dict(type="int", default=120),
        rejoin_retries=dict(type="int", default=3),
    )),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    # ------------------------------------------------------------------ plumbing

    def _say(self, text):
        self._runner.say(text)

    def _record(self, step, drained_by=None, worker_url=None, on_host=True, defer=False, controller=True, **values):
        """One step on the host (its record, with the lease renewed), then in the controller's copy: a host
        that cannot be reached, or whose lease was taken over, fails here - before the step's work. A serving
        group's followers record the same step, each with its own share of the values.

        With `defer` (a host that heads no serving group), the host's record rides on the step's own module
        run (the install, the last-known-good copy) or is written just before the next module that carries
        none (HostPath): the host fails there, still before that module changes anything. `controller`
        False: the host's record only (the controller's copy follows when the step's values are complete)."""
        values.update(router=self._use_router)
        nodes = [(self._host, self._lease, values, drained_by, worker_url)] + [
            (host, lease, self._node_values(host, values), None, None) for host, (dummy, lease) in self._followers.items()]
        for host, lease, node_values, out_by, url in nodes:
            if on_host:
                fields = ro.build_record(host, step, node_values, self._run)
                record = ro.host_record(fields, self._run, drained_by=out_by, worker_url=url)
                if defer and not self._followers:
                    self._deferred = (step, self._state.get("step"))
                    lease.defer(record)
                else:
                    # the drain renews nothing while it waits: the lease covers it
                    lease.hold(record=record, longer=self._router_args["drain_timeout"] if step == "draining" else 0)
            if not controller:
                continue
            state = ro.record_step(self._run, host, step, node_values)
            if host == self._host:
                self._state = state
        return self._state

    def _node_values(self, host, values):
        """A follower's share of a step's values: its own drift check, verification, revert and last-known-good;
        nothing of the router (only its head is a router worker)."""
        out = dict((key, value) for key, value in values.items() if key not in (
            "drained", "rejoined_at", "left_out", "kept_out_of_router", "rejoined_after_revert"))
        out["router"] = False
        if "drift" in values:
            out["drift"] = self._followers[host][0]
        for key in ("verified", "revert"):
            if values.get(key):
                out[key] = (values[key].get("nodes") or {}).get(host) or {}
        if "last_good" in values:
            out["last_good"], out["last_good_error"] = self._unit.saved.get(host, (None, None))
        return out

    def _router(self, state, worker_url=None, **extra):
        params = dict(router_url=self._router_args["url"], worker_url=worker_url or self._router_args["worker_url"],
                      state=state,
                      api_key=self._router_args.get("api_key") or None, worker_api_key=self._worker_key,
                      drain_timeout=600, wait_healthy=True, timeout=300, request_timeout=10.0, validate_certs=True)
        params.update(extra)
        try:
            return worker_change(params, False)
        except RouterError as exc:
            return {"failed": True, "msg": str(exc)}

    # ------------------------------------------------------------------ run

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        task_vars = task_vars or {}
        self._task_vars = task_vars
        self._host = task_vars.get("inventory_hostname", "?")
        if not args["run"].get("run_dir"):
            raise AnsibleActionFail("sglang_rollout_host: run must be the result of sglang_rollout state=start")
        if args["router"]["url"] and not args["router"].get("worker_url"):
            raise AnsibleActionFail("sglang_rollout_host: router.worker_url is needed with router.url")
        if self._task.check_mode:
            result.update(skipped=True, changed=False, msg="check mode: a rollout's check run changes no host")
            return result
        missing = [name for name in hp.SETTINGS if name not in task_vars]
        if missing or not (task_vars.get("sglang_drift") or {}).get("prepared"):
            raise AnsibleActionFail("sglang_rollout_host runs in the role gpufleet.inference.sglang after its drift "
                                    "check (fact sglang_drift); undefined: %s" % (", ".join(missing) or "sglang_drift"))
        settings = self._templar.template(dict((name, task_vars[name]) for name in hp.SETTINGS))
        drift = self._templar.template(task_vars["sglang_drift"])
        self._run = args["run"]
        self._router_args = dict(args.get("router") or {})
        # The server's own key (sglang_api_key): the drain reads the worker's load with it, and the worker
        # goes back into the router with it - the router calls a worker with the key it was added with
        # (its health check, /health, needs none: without the key it would list the worker healthy
        # while every request it forwards is refused).
        self._worker_key = settings.get("sglang_api_key") or None
        self._use_router = bool(self._router_args.get("url"))
        self._runner = ActionRunner(self, task_vars, self._host, boolean(settings.get("sglang_progress", True),
                                                                         strict=False), prefix=PREFIX)
        holder = _holder.with_worker(dict(args["run"].get("holder") or {}, generation=(
            args["lease"].get("lease") or args["lease"]).get("generation")))
        self._lease = hp.Lease(self._runner.run, settings, holder, time.monotonic)
        self._path = hp.HostPath(self._runner.run, self._runner.wait, settings, drift["prepared"], drift,
                                 say=self._runner.say, host=self._host, lease=self._lease)
        self._unit = self._path  # what changes as one: this host, or the serving group it heads
        self._followers = {}  # a group's follower -> (its drift, its lease)
        self._node_runners = NodeRunners(self, task_vars, self._runner.progress, prefix=PREFIX)
        if drift["prepared"].get("group"):
            self._unit = self._group(drift["prepared"]["group"], settings, task_vars)
        self._plan = args.get("plan") or {}
        # The worker the router has for this host now (its current URL, which a port change makes differ from
        # the one it rejoins with); none when the router does not list it.
        self._drain_url = self._plan.get("drain_url")
        self._drift = drift
        self._state = {}
        self._deferred = None  # (the step whose host record is deferred, the step before it)
        before = ro.read_json(os.path.join(self._run["run_dir"], "%s.json" % self._host)) or {}
        try:
            outcome = self._critical_path(args, recovering="recovering" in before)
        except hp.StepFailed as failed:
            outcome = self._fail(failed)
        finally:
            self._node_runners.close()
        result.update(outcome)
        result["changed"] = self._unit.changed
        return result

    def _group(self, group, settings, task_vars):
        """The serving group this host heads, every follower reached from here with its own drift check and lease
        (the prepare phase's, from hostvars). Every node runs the same settings (_groups checked it)."""
        if group.get("head") != self._host:
            raise AnsibleActionFail("sglang_rollout_host: %s is a follower of serving group %s; its head %s rolls the "
                                    "group out" % (self._host, group.get("name"), group.get("head")))
        paths = {self._host: self._path}
        hostvars = task_vars.get("hostvars") or {}
        for host in group.get("followers") or []:
            found = hostvars[host] if host in hostvars else {}
            drift = self._templar.template(found.get("sglang_drift") or {})
            taken = self._templar.template(found.get("rollout_lease") or {})
            if not drift.get("prepared") or not (taken.get("lease") or {}).get("generation"):
                raise AnsibleActionFail("sglang_rollout_host: %s (rank %s of serving group %s) has no drift check or "
                                        "no lease of this run: its whole group must be in the run" % (
                                            host, (group.get("ranks") or {}).get(host), group.get("name")))
            runner = self._node_runners(host)
            lease = hp.Lease(runner.run, settings, _holder.with_worker(dict(
                self._run.get("holder") or {}, generation=taken["lease"]["generation"])), time.monotonic)
            paths[host] = hp.HostPath(runner.run, runner.wait, settings, drift["prepared"], drift, say=runner.say,
                                      host=host, lease=lease)
            self._followers[host] = (drift, lease)
        return _grouppath.GroupPath(group, paths)

    def _critical_path(self, args, recovering):
        capacity = args.get("capacity") or {}
        if capacity.get("failed"):  # the batch's capacity check (run once for the batch) said no
            raise hp.StepFailed(CAPACITY, capacity)
        self._unit.check_blocking()
        self._unit.secret_files()  # a config file that cannot be written fails before the host leaves
        out_by = self._run["run_id"] if self._use_router else None
        # Written on the host first: a host whose SSH is down, or whose lease was taken over, fails here,
        # before it leaves the router.
        self._record("draining", drained_by=out_by)
        drained = None
        if self._use_router and self._drain_url:
            self._say("leaving the router (%s) and draining" % self._drain_url)
            drained = self._router("absent", worker_url=self._drain_url,
                                   drain_timeout=self._router_args["drain_timeout"])
            if drained.get("failed"):
                raise hp.StepFailed(DRAIN, drained)
        self._record("applying", drained_by=out_by, defer=True)
        self._unit.adopt_last_good()
        verified = self._unit.apply()
        self._record("verified", drained_by=out_by, drift=self._drift, verified=verified)
        rejoined_at, analysis = None, None
        stay_out = self._use_router and bool(self._plan.get("stay_out"))
        isolate = bool((self._run.get("analysis") or {}).get("isolate"))
        if isolate:  # compared while it is still out of the router (the baseline leaves it too)
            analysis = self._analyse(verified)
            if analysis and analysis["verdict"] == REGRESSION:
                return self._reject(analysis, in_router=False)
        if self._use_router and not stay_out:
            self._say("verified invocation %s; putting it back into the router" % verified.get("invocation_id")
                      if verified.get("verdict") != _records.NOT_VERIFIED else
                      "not verified (sglang_verify is off); putting it back into the router")
            self._rejoin()
            rejoined_at = ro.iso()
        if not isolate:  # compared while both serve router traffic (the report says how much each got)
            analysis = self._analyse(verified)
            if analysis and analysis["verdict"] == REGRESSION:
                return self._reject(analysis, in_router=rejoined_at is not None)
        held = bool(analysis and analysis["verdict"] == INCONCLUSIVE and
                    self._run["analysis"].get("on_inconclusive") == "stop")
        values = dict(drift=self._drift, verified=verified, drained=drained, rejoined_at=rejoined_at,
                      min_ready_seconds=self._path.settings.get("sglang_min_ready_seconds"), recovering=recovering,
                      left_out=stay_out, analysis=_summary(analysis), held=held)
        worker_url = self._router_args.get("worker_url")
        # on the host first, riding on the last-known-good copy (when there is one to keep)
        self._record("rejoined", worker_url=worker_url, defer=True, controller=False, **values)
        # a canary the analysis could not clear is not kept as last-known-good
        saved, error = (None, None) if held else self._unit.save_last_good(verified)
        self._lease.flush()
        self._state = self._record("rejoined", worker_url=worker_url, on_host=False, last_good=saved,
                                   last_good_error=error, **values)
        self._say(self._state.get("status"))
        status = self._state.get("status")
        return {"msg": "%s: %s (invocation %s)" % (self._host, status, verified.get("invocation_id")),
                "verified": verified, "record": self._state}

    # ------------------------------------------------------------------ canary analysis

    def _analyse(self, verified):
        """The canary against a host still on the previous settings (the run's plan chose both): the result of
        _canary.Analysis with its report in the run's copy, or None when this host is not the canary."""
        settings = self._run.get("analysis") or {}
        if not settings.get("enabled") or settings.get("canary") != self._host or \
                verified.get("verdict") == _records.NOT_VERIFIED:
            return None
        baseline = settings["baseline"]
        hostvars = self._task_vars.get("hostvars") or {}
        key = self._templar.template((hostvars[baseline] if baseline in hostvars else {}).get("sglang_api_key")
                                     or "") or None
        canary_url = self._router_args.get("worker_url") or (self._drift["prepared"].get("endpoint") or {}).get(
            "worker_url")
        params = dict(canary={"name": self._host, "url": canary_url, "api_key": self._worker_key},
                      baseline={"name": baseline, "url": settings["baseline_url"], "api_key": key},
                      workload=settings["workload"], rounds=settings["rounds"], thresholds=settings["thresholds"],
                      router_url=self._router_args.get("url") or None,
                      router_api_key=self._router_args.get("api_key") or None)
        self._say("canary analysis against %s (%d rounds each)" % (baseline, settings["rounds"]))
        left = None
        if settings.get("isolate") and self._use_router:
            left = self._router("absent", worker_url=settings["baseline_url"], worker_api_key=key,
                                drain_timeout=self._router_args["drain_timeout"])

        def progress(line):
            self._say("canary analysis: %s" % line)
            self._renew_leases()
        try:
            outcome = Analysis.prepare(params, progress=progress).run()
        except AnalysisError as exc:
            outcome = {"verdict": INCONCLUSIVE, "message": "the analysis could not run: %s" % exc}
        finally:
            if left is not None and not left.get("failed"):
                self._router("present", worker_url=settings["baseline_url"], worker_api_key=key)
        if outcome.get("metrics"):
            try:
                outcome["report"] = write_report(outcome, os.path.join(self._run["run_dir"], "analysis"), True, False)
            except OSError as exc:
                outcome["report_error"] = str(exc)
        self._say("canary analysis: %s" % outcome.get("message"))
        return outcome

    def _renew_leases(self):
        """Between the canary analysis's rounds (minutes on real GPUs): this host's lease - and its serving group's -
        renewed when due, as the wait renews it between its slices. A lease taken over is found by the next record."""
        for lease in [self._lease] + [lease for dummy, lease in self._followers.values()]:
            lease.renew_if_due()

    def _reject(self, analysis, in_router):
        """A canary slower than its baseline: out of the router, reverted to its last-known-good unit and verified,
        back in; the rollout stops."""
        if in_router:
            self._say("leaving the router again: the canary analysis found a regression")
            drained = self._router("absent", drain_timeout=self._router_args["drain_timeout"])
            in_router = bool(drained.get("failed"))
        revert = self._unit.revert()  # this host, or its whole serving group
        rejoined = in_router
        if revert.get("healthy") and self._use_router and not in_router:
            back = self._router("present", timeout=self._router_args["rejoin_timeout"])
            rejoined = not back.get("failed")
        self._state = self._record("failed", on_host=False, state_before={"step": "applying"}, task=ANALYSIS,
                                   failure={"msg": analysis.get("message")}, changed=True, revert=revert,
                                   rejoined_after_revert=rejoined, analysis=_summary(analysis))
        self._write_host_records(None if rejoined else (self._run["run_id"] if self._use_router else None))
        self._say(self._state.get("status"))
        return {"failed": True, "msg": self._state.get("message"), "failed_step": ANALYSIS, "revert": revert,
                "analysis": analysis, "record": self._state}

    def _rejoin(self):
        retries = self._router_args["rejoin_retries"]
        timeout = self._router_args["rejoin_timeout"]
        for attempt in range(retries + 1):
            rejoined = self._router("present", timeout=timeout)
            if not rejoined.get("failed"):
                return rejoined
            if attempt < retries:
                self._say("could not rejoin the router (%s); retrying in %.0fs" % (rejoined.get("msg"), REJOIN_DELAY))
                time.sleep(REJOIN_DELAY)
        raise hp.StepFailed(REJOIN, rejoined)

    # ------------------------------------------------------------------ failure

    def _fail(self, failed):
        failure = dict(failed.result)
        reached = self._state.get("step") or "prepared"
        if self._lease.pending is not None and self._deferred and self._deferred[0] == reached:
            # the step's record never reached the host, nor did the step: no module of it ran there
            reached = self._deferred[1] or "prepared"
        self._lease.discard()  # the failure's record supersedes it
        lost = bool(failure.get("unreachable")) or failure.get("verdict") == "connection_lost" or \
            connection_lost(failure) is not None
        if lost:
            failure["unreachable"] = True
        if failed.step == hp.HOLD and not lost:
            # Another writer holds the host now: this run touches it no more (no revert, no router call).
            self._state = self._record("failed", on_host=False, state_before={"step": reached}, task=failed.step,
                                       failure=failure, taken_over=True)
            self._say(self._state.get("status"))
            return {"failed": True, "msg": self._state.get("message"), "failed_step": failed.step,
                    "failure": failure, "revert": None, "record": self._state}
        revert = None
        if reached == "applying" and not lost and self._unit.has_last_good():
            revert = self._unit.revert()
        rejoined, kept_out = False, None
        if reached == "prepared" or (reached == "draining" and not self._drain_url):
            rejoined = self._drain_url is not None  # never taken out (or was not in the router)
        elif self._use_router and not lost and reached == "draining" and self._still_listed():
            # The drain failed before the worker was removed (its load could not be read): it never left.
            rejoined = True
        elif self._key_differs(revert, reached):
            # The host runs the previous key (not changed yet, or reverted); the router calls a worker with
            # the key it is added with, the new one (or none) here, which the host refuses.
            kept_out = ("the host %s the previous API key (this rollout changes it), and the router would call it "
                        "with the new one: put it back into the router with its key by hand, or roll out again"
                        % ("runs" if reached == "draining" else "was reverted to"))
        elif self._plan.get("stay_out"):
            kept_out = "it was out of the router before the rollout, not taken out by it: left out"
        elif self._use_router and not lost and reached in ("draining", "applying") and \
                (reached == "draining" or (revert or {}).get("healthy")):
            back = self._router("present", timeout=self._router_args["rejoin_timeout"])
            rejoined = not back.get("failed") and "workers" in back
        values = dict(state_before={"step": reached}, task=failed.step, failure=failure, changed=reached == "applying",
                      revert=revert, rejoined_after_revert=rejoined,
                      kept_out_of_router=kept_out if self._use_router else None)
        self._state = self._record("failed", on_host=False, **values)
        out_by = self._run["run_id"] if self._use_router and self._state.get("in_router") is False else None
        if not lost and failed.step != hp.HOLD:
            self._write_host_records(out_by)
        self._say(self._state.get("status"))
        return {"failed": True, "msg": self._state.get("message"), "failed_step": failed.step,
                "failure": failure, "revert": revert, "record": self._state}

    def _write_host_records(self, out_by):
        """A failed (or reverted) host's record - and each of its group's followers' - written on the host."""
        try:
            self._lease.hold(record=ro.host_record(self._state, self._run, drained_by=out_by,
                                                   worker_url=self._router_args.get("worker_url")))
        except hp.StepFailed as exc:
            self._state["host_record_error"] = str(exc.result.get("msg"))
        for host, (dummy, lease) in self._followers.items():
            state = ro.read_json(os.path.join(self._run["run_dir"], "%s.json" % host)) or {}
            try:
                lease.hold(record=ro.host_record(state, self._run))
            except hp.StepFailed:
                pass  # its copy on the controller says what happened; a re-run reads what the host holds

    def _key_differs(self, revert, reached):
        """Whether the host runs another API key than the one it would be re-added to the router with."""
        config = ((self._drift.get("prepared") or {}).get("config_file") or {}).get("path")
        changed = config in (self._drift.get("changed_files") or [])
        if revert:
            old = self._path.reverted_config
            # A key the reverted process has and the new settings do not (removed), or another one (rotated).
            # A process without a key answers any: a key added by this rollout does no harm.
            return bool(old) and (not config or config != old or changed)
        return reached == "draining" and bool(config) and changed

    def _still_listed(self):
        """Whether the router lists this host's worker now (False when it cannot be read)."""
        try:
            client = RouterClient(self._router_args["url"], self._router_args.get("api_key") or None, timeout=10.0)
            return find_worker(client.list_workers(), self._router_args["worker_url"]) is not None
        except RouterError:
            return False
