# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's side of a rollout: inputs, the run's plan from what the fleet holds, what each batch does
before it leaves the router (plugin_utils/_batch.py: renewals, the group's batch slot, the capacity guard), the
end - and the controller's copy of the records.

Runs on the controller only (no module is sent to a host). The fleet is the source of truth: each host's
lease and record (module_utils/_lease.py, read by the prepare phase's drift check and written by
gpufleet.inference.sglang_lease), the router's own list of workers, and a fresh probe of each worker.
Documentation: plugins/modules/sglang_rollout.py.
"""
from __future__ import annotations

import os
import shutil
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.inference.plugins.module_utils import _bench, _canary_judge
from ansible_collections.gpufleet.inference.plugins.module_utils import _fleet
from ansible_collections.gpufleet.inference.plugins.module_utils._canary import DEFAULT_ROUNDS
from ansible_collections.gpufleet.inference.plugins.module_utils import _groups
from ansible_collections.gpufleet.inference.plugins.module_utils._hostpath import CRITICAL_PATH_MODULES
from ansible_collections.gpufleet.inference.plugins.module_utils import _http
from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro
from ansible_collections.gpufleet.inference.plugins.module_utils._router import RouterClient, RouterError
from ansible_collections.gpufleet.inference.plugins.plugin_utils import _batch
from ansible_collections.gpufleet.inference.plugins.plugin_utils import _holder
from ansible_collections.gpufleet.inference.plugins.plugin_utils import _serving
from ansible_collections.gpufleet.inference.plugins.plugin_utils._nodes import NodeRunners

display = Display()
# urllib and ssl loaded with this plugin, in ansible-playbook's main process: each worker inherits them.
_http.preload()

STATES = ("start", "record", "prepared", "leased", "batch", "capacity", "finish", "status")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = self._task.args
        state = str(args.get("state", ""))
        if state not in STATES:
            raise AnsibleActionFail("state must be one of %s; got %r" % (", ".join(STATES), args.get("state")))
        try:
            result.update(getattr(self, "_" + state)(args, task_vars or {}))
        except (ro.RolloutError, _fleet.PlanError) as exc:
            result.update(failed=True, msg=str(exc))
        except _groups.GroupError as exc:
            result.update(failed=True, msg="%s. Nothing was compared or changed." % exc)
        result.setdefault("changed", False)
        return result

    # ------------------------------------------------------------------ start

    def _start(self, args, task_vars):
        """The run's inputs, checked before anything is asked of a host; who runs it."""
        root = os.path.abspath(os.path.expanduser(str(args.get("results_dir") or "results/rollout")))
        batches = ro.parse_batches(args.get("batches") if args.get("batches") not in (None, "") else [1, "25%"])
        min_healthy = ro.parse_count(args.get("min_healthy", 0), "rollout_min_healthy")
        try:
            capacity_wait = float(args.get("capacity_wait", 300))
        except (TypeError, ValueError):
            raise ro.RolloutError("rollout_capacity_wait must be a number of seconds")
        hosts = sorted(args.get("hosts") or [])
        group = sorted(set(args.get("group") or []) | set(hosts))
        servers = self._servers(task_vars, hosts, group, args.get("group") or [])
        requested = ro.check_run_id(str(args["run_id"])) if args.get("run_id") else None
        lease_seconds = ro.parse_seconds(args.get("lease_seconds", 300), "sglang_lease_seconds", minimum=10)
        timeouts = dict((name, ro.parse_seconds(value, "batch_timeouts.%s" % name))
                        for name, value in (args.get("batch_timeouts") or {}).items())
        # the longest a batch may take: its capacity wait, drain, wait for the new process, settle, rejoins
        batch_seconds = int(capacity_wait) + sum(timeouts.get(name, 0) for name in ("drain", "ready", "settle")) + \
            timeouts.get("rejoin", 0) * (timeouts.get("rejoin_retries", 0) + 1)
        check_mode = bool(self._task.check_mode)
        run_id = ro.new_run_id() + ("-check" if check_mode else "")
        holder = _holder.make_holder("rollout", run_id, task_vars)
        analysis = self._analysis_settings(args.get("analysis") or {})
        return dict(run_id=run_id, run_dir=os.path.join(root, run_id), results_dir=root, check_mode=check_mode,
                    analysis=analysis,
                    batches=batches, min_healthy=min_healthy, capacity_wait=capacity_wait, hosts=hosts, group=group,
                    servers=servers,
                    requested=requested, takeover=bool(args.get("takeover")), break_lease=bool(args.get("break_lease")),
                    holder=holder, lease_seconds=lease_seconds, pending_lease_seconds=lease_seconds + batch_seconds)

    @staticmethod
    def _analysis_settings(given):
        """The canary analysis's settings (rollout_analysis*), checked before anything is asked of a host."""
        enabled = given.get("enabled", True)
        if not isinstance(enabled, bool) and str(enabled).lower() not in ("true", "false", "yes", "no", "1", "0"):
            raise ro.RolloutError("rollout_analysis must be true or false, got %r" % (enabled,))
        enabled = enabled if isinstance(enabled, bool) else str(enabled).lower() in ("true", "yes", "1")
        on_inconclusive = str(given.get("on_inconclusive") or "stop")
        if on_inconclusive not in ("stop", "continue"):
            raise ro.RolloutError("rollout_analysis_on_inconclusive must be stop or continue, got %r" % on_inconclusive)
        try:
            workload = _bench.check_workload(given.get("workload") or {})
            thresholds = _canary_judge.check_thresholds(given.get("thresholds") or {})
        except (_bench.WorkloadError, _canary_judge.ThresholdError) as exc:
            raise ro.RolloutError("rollout_analysis: %s" % exc)
        rounds = ro.parse_seconds(given.get("rounds", DEFAULT_ROUNDS), "rollout_analysis_rounds", minimum=2)
        return {"enabled": enabled, "isolate": bool(given.get("isolate")), "on_inconclusive": on_inconclusive,
                "workload": workload, "thresholds": thresholds, "rounds": rounds,
                "baseline": str(given.get("baseline") or "") or None}

    @staticmethod
    def _servers(task_vars, hosts, group, pattern):
        """The group's servers (a single-node host, or a serving group's head: what a router lists), after checking
        that neither the run (--limit) nor rollout_hosts takes part of a serving group: changing part of one takes
        its whole server down. Raises GroupError naming the group, before anything is asked of a host."""
        groups = _serving.groups_of_hosts(task_vars, group)
        _groups.check_whole(groups, pattern, "rollout_hosts")
        _groups.check_whole(groups, hosts, "this run (--limit)")
        return [host for host in group if _groups.router_worker(groups, host)]

    # ------------------------------------------------------------------ record (a prepare-phase failure)

    @staticmethod
    def _record(args, task_vars):
        """A host that fails the prepare phase: its record, kept as a fact until the plan writes the copy."""
        failure = dict(step="failed", task=args.get("task"), failure=args.get("failure"), router=args.get("router"))
        return {"ansible_facts": {"rollout_host_state": {"step": "failed", "args": failure}}}

    # ------------------------------------------------------------------ prepared: the plan

    def _router_workers(self, args):
        if not args.get("router_url"):
            return None, None
        try:
            client = RouterClient(args["router_url"], args.get("router_api_key") or None, timeout=10.0)
            return client.list_workers(), None
        except RouterError as exc:
            return [], str(exc)

    def _prepared(self, args, task_vars):
        """Every host's lease, record and router membership -> the run's plan (new or resumed); the copy of
        the records; the hosts that must change, in inventory order."""
        run = dict(args.get("run") or {})
        hostvars = task_vars.get("hostvars") or {}
        alive = set(args.get("alive") or [])
        hosts = list(args.get("hosts") or [])
        failed, lost, facts = [], [], {}
        workers, router_problem = self._router_workers(args)
        if router_problem:
            raise ro.RolloutError("the router's workers could not be read (%s): router membership comes from the "
                                  "router, so nothing was changed" % router_problem)
        for host in hosts:
            hvars = hostvars[host] if host in hostvars else {}
            state = hvars.get("rollout_host_state") or {}
            drift = hvars.get("sglang_drift") or {}
            if state.get("step") == "failed":
                failed.append(host)
                continue
            if host not in alive or not drift.get("prepared"):
                lost.append(host)
                continue
            prepared = drift["prepared"]
            record = drift.get("record") or {}
            listed = None
            follower = (prepared.get("group") or {}).get("rank", 0) > 0  # a serving group's node that serves no HTTP
            if workers is not None and not follower:
                listed = _fleet.router_url_of(workers, (prepared.get("endpoint") or {}).get("worker_url"),
                                              record.get("worker_url"), _batch.addresses_of(hostvars, host))
            lease = dict(drift.get("lease") or {})
            if lease.get("live"):
                lease["gone"] = _holder.gone(lease)
            facts[host] = {"lease": lease, "record": record, "in_sync": drift.get("in_sync"),
                           "digest": prepared.get("digest"), "listed": listed,
                           "router": workers is not None and not follower,
                           "serving": drift.get("active_state") == "active",
                           "drift": drift}
        if failed or lost:
            stopped = self._write_prepare_failure(run, hosts, failed, lost, hostvars, args)
            return {"failed": True, "apply": [], "run": run, "msg": "%s The prepare phase failed on %s: no host was "
                    "leased or changed." % (" ".join(stopped), ", ".join(failed + lost))}
        request = dict(run_id=run["run_id"], requested=run.get("requested"), session=run["holder"]["session"],
                       takeover=run.get("takeover"), break_lease=run.get("break_lease"),
                       outside=self._outside(args["outside"] if args.get("outside") is not None else
                                             self._read_outside(run, hosts, task_vars)))
        planned = _fleet.plan(hosts, facts, request)
        groups = dict((fact["drift"]["prepared"]["group"]["name"], fact["drift"]["prepared"]["group"])
                      for fact in facts.values() if fact["drift"]["prepared"].get("group"))
        _fleet.group_plan(planned["hosts"], groups)
        if planned["run_id"] != run["run_id"]:
            run.update(run_id=planned["run_id"], run_dir=os.path.join(run["results_dir"], planned["run_id"]))
            run["holder"] = dict(run["holder"], run_id=planned["run_id"])
        outside = request["outside"]
        reachable = list(facts) + [host for host, fact in outside.items() if not fact.get("unreachable")]
        slot = _fleet.batch_slot(run.get("group") or hosts, reachable, hosts)
        # (hostvars of a name it does not know is an undefined marker, not None: ask only for a host)
        anchor_vars = hostvars[slot["anchor"]] if slot["anchor"] in facts else {}
        anchor_lease = (((anchor_vars or {}).get("sglang_drift") or {}).get("prepared") or {}).get(
            "lease") or (facts[hosts[0]]["drift"]["prepared"].get("lease") if hosts else None) or {}
        slot["directory"] = anchor_lease.get("directory") or "/var/lib/gpufleet-inference/fleet"
        run.update(resumed=planned["resumed"], digests=dict((host, facts[host]["digest"]) for host in hosts),
                   takeover_runs=planned["takeover_runs"], slot=slot)
        for note in planned["notes"]:
            display.warning(note)
        self._write_run(run, planned)
        apply, records = [], {}
        for host in hosts:
            entry = planned["hosts"][host]
            merged = ro.record_step(run, host, "prepared", dict(drift=facts[host]["drift"], router=facts[host]["router"],
                                                                endpoint=(facts[host]["drift"]["prepared"] or {}).get(
                                                                    "endpoint"), plan=entry))
            records[host] = ro.host_record(merged, run, drained_by=entry.get("drained_by"),
                                           worker_url=entry.get("drain_url"))
            # a check run's records say what would change; no host goes on. A follower goes with its head.
            if entry["action"] in ("apply", "recover") and not run.get("check_mode") and \
                    entry.get("head") in (None, host):
                apply.append(host)
        # A run that changes no host holds none: the plan already refused any host another run holds. It
        # still leases them to take over a dead run's leases, to resume one, or to break one it was told to.
        needs_leases = bool(apply or planned["takeover_runs"] or planned["resumed"] or run.get("break_lease"))
        run["leases"] = needs_leases and not run.get("check_mode")
        run["leases_taken_at"] = time.time()  # taken next, for a lease plus one batch: renewals count from here
        run["analysis"] = self._analysis_targets(run, apply, planned["hosts"], facts)
        if run["analysis"].get("note"):
            display.display("Canary analysis: %s" % run["analysis"]["note"])
        prebuilt = self._prebuild(task_vars) if apply and not run.get("check_mode") else []
        return {"run": run, "apply": apply, "records": records, "notes": planned["notes"], "prebuilt": prebuilt,
                "plan": planned["hosts"], "holder": run["holder"],
                "msg": "run %s%s: %d host(s) to change: %s" % (run["run_id"], " (resumed)" if planned["resumed"] else "",
                                                               len(apply), ", ".join(apply) or "none")}

    @staticmethod
    def _analysis_targets(run, apply, planned, facts):
        """The canary (the first host of the first batch) and its baseline: a host of a later batch, still on
        the previous settings, serving and in the router (rollout_analysis_baseline, else the first such)."""
        analysis = dict(run.get("analysis") or {}, canary=None, baseline_url=None, note=None)
        if not analysis.get("enabled") or not apply or run.get("check_mode"):
            return dict(analysis, enabled=False)
        first = ro.batch_sizes(run["batches"], len(apply))[0]
        later = [host for host in apply[first:] if planned[host]["action"] == "apply" and facts[host].get("serving")
                 and (planned[host].get("drain_url") or not facts[host].get("router"))]
        wanted = analysis.get("baseline")
        if wanted and wanted not in later:
            raise ro.RolloutError("rollout_analysis_baseline %s is not a host of a later batch that still serves the "
                                  "previous settings (those are: %s)" % (wanted, ", ".join(later) or "none"))
        baseline = wanted or (later[0] if later else None)
        if baseline is None:
            return dict(analysis, enabled=False, note="no host of a later batch still serves the previous settings: "
                        "the canary is verified, not compared")
        endpoint = (facts[baseline]["drift"].get("prepared") or {}).get("endpoint") or {}
        return dict(analysis, canary=apply[0], baseline=baseline,
                    baseline_url=planned[baseline].get("drain_url") or endpoint.get("worker_url"),
                    note="%s will be compared with %s (still on the previous settings) after the first batch" % (
                        apply[0], baseline))

    def _read_outside(self, run, hosts, task_vars):
        """The lease and record of each host of the group this run leaves out (--limit, rollout_hosts): one may be
        mid-change from an interrupted run, which the plan must know before it drains anything else. Read-only; an
        unreachable host is a result, reported by the plan."""
        left_out = [host for host in run.get("group") or [] if host not in hosts]
        if not left_out:
            return []
        hostvars = task_vars.get("hostvars") or {}
        nodes = NodeRunners(self, task_vars, progress=False)
        results = []
        try:
            for host in left_out:
                own = hostvars[host] if host in hostvars else {}
                where = dict((name, self._templar.template(own.get(name) or task_vars.get(name)))
                             for name in ("sglang_unit_name", "sglang_fleet_dir"))
                try:
                    result = nodes(host).run(_batch.LEASE_MODULE, dict(
                        state="query", unit=where["sglang_unit_name"], directory=where["sglang_fleet_dir"]))
                except Exception as exc:  # pylint: disable=broad-except  # no connection to it could be made
                    result = {"failed": True, "unreachable": True, "msg": str(exc)}
                results.append(dict(result, item=host))
        finally:
            nodes.close()
        return results

    @staticmethod
    def _outside(results):
        """{host: {record, unreachable}} from the query of the group's hosts this run leaves out."""
        found = {}
        for item in results or []:
            host = item.get("item")
            if not host:
                continue
            if item.get("unreachable") or item.get("failed"):
                found[host] = {"unreachable": item.get("msg") or "unreachable"}
            else:
                found[host] = {"record": item.get("record") or {}, "lease": item.get("lease")}
        return found

    def _prebuild(self, task_vars):
        """Build the critical path's module payloads into this run's module cache now, while no host is out
        of service: each worker of the apply phase then reads them instead of building them while the canary
        is out of the router. Nothing runs on a host; a module that cannot be built here is built when used."""
        # The payload does not depend on the interpreter: name one so nothing is discovered remotely.
        build_vars = dict(task_vars, ansible_python_interpreter=task_vars.get("ansible_python_interpreter")
                          or "/usr/bin/python3")
        built = []
        for name in CRITICAL_PATH_MODULES:
            try:
                self._configure_module(name, {}, build_vars)
            except Exception as exc:  # pylint: disable=broad-except  # built when used instead
                display.vvv("sglang_rollout: could not prebuild %s: %s" % (name, exc))
                continue
            built.append(name)
        return built

    @staticmethod
    def _write_run(run, planned):
        if run.get("check_mode"):
            meta = {"run_id": run["run_id"], "check_mode": True, "status": "check", "started": ro.iso(),
                    "hosts": run["hosts"], "note": "a check run (--check): nothing was changed; the records say what "
                                                   "would change"}
            ro.write_json(os.path.join(run["run_dir"], "run.json"), meta)
            return
        path = os.path.join(run["run_dir"], "run.json")
        meta = ro.read_json(path) or {"run_id": run["run_id"], "started": ro.iso(), "resumes": []}
        meta.update(status="running", hosts=sorted(set(meta.get("hosts", [])) | set(run["hosts"])),
                    batches=run["batches"], min_healthy=run["min_healthy"], group=run["group"],
                    controller=run["holder"]["controller"], user=run["holder"]["user"], job=run["holder"]["job"])
        if planned["resumed"] or planned["notes"]:
            meta.setdefault("resumes", []).append({"at": ro.iso(), "notes": planned["notes"],
                                                   "controller": run["holder"]["controller"]})
        ro.write_json(path, meta)

    @staticmethod
    def _write_prepare_failure(run, hosts, failed, lost, hostvars, args):
        """The copy of a run stopped in its prepare phase; returns each failed host's message."""
        messages = []
        for host in hosts:
            state = (hostvars.get(host) or {}).get("rollout_host_state") or {}
            if host in failed:
                messages.append(ro.record_step(run, host, "failed", state.get("args") or {}).get("message"))
            elif host in lost:
                messages.append(ro.record_step(run, host, "failed", dict(
                    task="Compare this host with its intent", router=bool(args.get("router_url")),
                    failure={"msg": "the host left the prepare phase without a result (unreachable, or it failed "
                                    "outside the comparison)"})).get("message"))
        ro.write_json(os.path.join(run["run_dir"], "run.json"), {
            "run_id": run["run_id"], "status": "failed", "finished": ro.iso(), "hosts": hosts,
            "note": "the prepare phase failed on %s: no host was leased or changed" % ", ".join(failed + lost)})
        ro.write_summary(run)
        return [message for message in messages if message]

    # ------------------------------------------------------------------ leased: all or none

    @staticmethod
    def _leased(args, task_vars):
        """Every host of the run leased, or none: the hosts whose lease was taken are to be released."""
        hostvars = task_vars.get("hostvars") or {}
        gate = args.get("gate") or {}
        if gate.get("failed") or gate.get("unreachable"):
            ActionModule._forget_copy(args.get("run"))
            return {"failed": True, "release": [], "msg": "the run's first host could not be leased, so no host was: "
                    "%s. Nothing was changed." % (gate.get("msg") or "unreachable")}
        refused, taken, generations = [], [], {}
        for host in args.get("hosts") or []:
            lease = (hostvars.get(host) or {}).get("rollout_lease") or {}
            if lease.get("failed") or lease.get("unreachable") or not lease.get("lease"):
                refused.append("%s: %s" % (host, lease.get("msg") or "no lease taken"))
            else:
                taken.append(host)
                generations[host] = lease["lease"].get("generation")
        if refused:
            ActionModule._forget_copy(args.get("run"))
            return {"failed": True, "release": taken, "msg": "not every host of the run could be leased, so none is "
                    "kept and nothing was changed: %s" % "; ".join(refused)}
        return {"release": [], "generations": generations, "msg": "%d host(s) leased" % len(taken)}

    @staticmethod
    def _forget_copy(run):
        """A new run refused at its leases changed nothing and held nothing: its copy goes too (a resumed run's
        copy is the run's, and stays)."""
        run = run or {}
        run_dir = run.get("run_dir")
        if not run_dir or run.get("resumed") or os.path.basename(run_dir) != run.get("run_id"):
            return
        shutil.rmtree(run_dir, ignore_errors=True)

    # ------------------------------------------------------------------ batch: before a batch leaves the router

    def _batch(self, args, task_vars):
        """Once per batch of the apply phase, one task (plugin_utils/_batch.py): renew the waiting hosts' leases,
        take the group's batch slot, check the group's capacity. The slot taken is in the result (``slot``) even
        when the capacity check refuses, so that it is released."""
        run = args.get("run") or {}
        if not run.get("run_dir"):
            raise ro.RolloutError("batch needs run (the result of state=prepared)")
        hostvars = task_vars.get("hostvars") or {}
        nodes = NodeRunners(self, task_vars, progress=False)
        try:
            out = {"renewed": _batch.renew_waiting(nodes, run, list(args.get("batch") or []), hostvars,
                                                   self._templar.template, self._task.check_mode)}
            if not args.get("router_url"):
                out["msg"] = "no router: no batch slot, no capacity guard"
                return out
            slot = _batch.take_slot(nodes, run) if (run.get("slot") or {}).get("anchor") else {}
            if slot:
                out["slot"] = slot
        finally:
            nodes.close()
        try:
            out.update(self._capacity(dict(args, slot=slot, group=run.get("servers"), min_healthy=run.get(
                "min_healthy", 0), capacity_wait=run.get("capacity_wait", 300), analysis=run.get("analysis")),
                task_vars))
        except ro.RolloutError as exc:
            out.update(failed=True, msg=str(exc))
        return out

    def _capacity(self, args, task_vars):
        """The capacity guard over the whole group (plugin_utils/_batch.py), each worker probed with its host's key."""
        hostvars = task_vars.get("hostvars") or {}
        return _batch.capacity(args, hostvars, lambda host: self._templar.template(
            (hostvars.get(host) or {}).get("sglang_api_key") or ""))

    # ------------------------------------------------------------------ finish

    def _finish(self, args, task_vars):
        """The copy's summary, one table, which leases to release (hosts done or never touched), the verdict."""
        run = args.get("run") or {}
        if not run.get("run_dir"):
            raise ro.RolloutError("finish needs run (the result of state=prepared)")
        root = os.path.dirname(run["run_dir"])
        with ro.RootLock(root):
            meta, records = ro.write_summary(run)
            meta.setdefault("run_id", run["run_id"])
            stopped = [r for r in records if r.get("status") in ro.STOPPED_STATUSES]
            pending = [r["host"] for r in records
                       if r.get("status") not in ro.CONTINUE_STATUSES + ro.STOPPED_STATUSES]
            # A host caught mid-change keeps its lease: its state is known only on it; a re-run resumes it.
            kept = [r["host"] for r in records if r.get("step") in _fleet.MID_CHANGE_STEPS
                    or (r.get("connection_lost") and r.get("status") == "failed")]
            release = [r["host"] for r in records if r["host"] not in kept]
            if run.get("check_mode"):
                meta["status"] = "check"
            elif kept:
                meta.update(status="interrupted", interrupted=ro.iso(), kept_leased=kept)
            else:
                meta.pop("kept_leased", None)
                meta.update(status="failed" if stopped or pending else "finished", finished=ro.iso())
            ro.write_json(os.path.join(run["run_dir"], "run.json"), meta)
            summary = ro.summarize(meta, records)
            ro.write_summary_file(os.path.join(run["run_dir"], "summary.json"), summary)
            ro.write_markdown(os.path.join(run["run_dir"], "summary.md"), summary)
        display.display("\nRollout %s%s:\n%s\nResults (a copy; the hosts hold the records): %s/summary.json" % (
            run["run_id"], " (check mode: nothing was changed)" if run.get("check_mode") else "", ro.table(records),
            run["run_dir"]))
        counts = summary["counts"]
        text = ", ".join("%s %s" % (count, status) for status, count in sorted(counts.items()))
        out = {"records": records, "release": release if run.get("leases", not run.get("check_mode")) else [],
               "kept_leased": kept,
               "summary": ro.stats(summary), "status": meta.get("status")}
        if stopped:
            first = stopped[0]
            out["failed_msg"] = "%s Not reached: %s. (%s)%s" % (
                first.get("message") or "Rollout stopped at %s: %s" % (first["host"], first.get("status")),
                ", ".join(pending) or "none", text, " Kept leased (caught mid-change; the same command resumes the "
                "run): %s." % ", ".join(kept) if kept else "")
        elif pending and not run.get("check_mode"):
            out["failed_msg"] = "Rollout %s ended with hosts not done: %s (%s)" % (
                run["run_id"], ", ".join(pending), text)
        out["msg"] = out.get("failed_msg") or "Rollout %s: %s" % (run["run_id"], text)
        return out

    # ------------------------------------------------------------------ status (read-only)

    def _status(self, args, task_vars):
        """Per host: lease, the run and step of its record, settings digest, in the router - like
        `kubectl rollout status`."""
        hostvars = task_vars.get("hostvars") or {}
        workers, problem = self._router_workers(args)
        rows = []
        for host in args.get("hosts") or []:
            state = (hostvars.get(host) or {}).get("sglang_status") or {}
            record = state.get("record") or {}
            lease = state.get("lease") or {}
            listed = None
            if workers is not None:
                listed = _fleet.router_url_of(workers, None, record.get("worker_url"), _batch.addresses_of(hostvars, host))
            rows.append({"host": host, "reachable": bool(state) and not state.get("unreachable"),
                         "run_id": record.get("run_id"), "kind": record.get("kind"), "step": record.get("step"),
                         "status": record.get("status"), "intent_digest": record.get("intent_digest"),
                         "in_router": (listed is not None) if workers is not None else None, "router_url": listed,
                         "lease": (lease.get("text") + (" (its holder is gone: it ended on this controller)"
                                                        if _holder.gone(lease) else "")) if lease.get("live")
                         else ("free (last: %s)" % lease.get("text") if lease else None),
                         "leased": bool(lease.get("live")), "updated": record.get("updated")})
        display.display("\n" + ro.status_table(rows))
        return {"hosts": rows, "router_error": problem, "msg": "%d host(s)" % len(rows)}
