# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role's steps on its host, through the one host path (module_utils/_hostpath.py).

Reads the role's variables by their own names and the drift check's result (fact ``sglang_drift``,
with ``sglang_drift.prepared``); runs the same modules, with the same arguments, as the rollout's
per-host task. A step that changes the host holds the host's lease (a sweep's, when the role runs
inside one - fact ``sglang_lease_holder`` of kind sweep - else the role's own, released when the
apply or revert is done). Documentation: plugins/modules/sglang_host.py.
"""
from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.inference.plugins.module_utils import _hostpath as hp
from ansible_collections.gpufleet.inference.plugins.module_utils import _records
from ansible_collections.gpufleet.inference.plugins.module_utils._rollout import new_run_id
from ansible_collections.gpufleet.inference.plugins.plugin_utils import _holder
from ansible_collections.gpufleet.inference.plugins.plugin_utils._slices import ActionRunner

STATES = ("installed", "restarted", "verified", "adopted", "last_good_saved", "reverted", "leased", "released",
          "reset")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def _settings(self, task_vars):
        missing = [name for name in hp.SETTINGS if name not in task_vars]
        if missing:
            raise AnsibleActionFail("sglang_host runs inside the role gpufleet.inference.sglang; %s undefined"
                                    % ", ".join(missing))
        return self._templar.template(dict((name, task_vars[name]) for name in hp.SETTINGS))

    def _holder(self, task_vars):
        """Who holds the host while the role changes it: the caller's holder (a sweep), else the role's own,
        kept between the role's tasks as the fact sglang_lease_holder."""
        given = self._templar.template(task_vars.get("sglang_lease_holder") or {})
        leasing = self._task.args.get("state") == "leased"
        held = given.get("generation") is not None
        # a caller's lease while it is held; the role's own holder again (it takes and releases per step)
        mine = given.get("kind") == "role"
        if given.get("session") and ((held and not mine) or (mine and not leasing)):
            return dict(given)
        kind = str(self._task.args.get("kind") or "sweep") if leasing else "role"
        return _holder.make_holder(kind, "%s-%s" % (kind, new_run_id()), task_vars)

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        state = self._task.args.get("state")
        if state not in STATES:
            raise AnsibleActionFail("state must be one of %s, got %r" % (", ".join(STATES), state))
        if state == "reset":  # nothing on the host: the facts of an earlier apply are forgotten
            result.update(changed=False, ansible_facts={"sglang_verified": {}}, msg="forgot sglang_verified")
            return result
        settings = self._settings(task_vars)
        drift = self._templar.template(task_vars.get("sglang_drift") or {})
        if not drift.get("prepared"):
            raise AnsibleActionFail("sglang_host needs the fact sglang_drift of the role's drift entry point")
        host = task_vars.get("inventory_hostname", "?")
        runner = ActionRunner(self, task_vars, host, boolean(settings.get("sglang_progress", True), strict=False))
        lease = hp.Lease(runner.run, settings, _holder.with_worker(self._holder(task_vars)), time.monotonic,
                         gone=_holder.gone)
        path = hp.HostPath(runner.run, runner.wait, settings, drift["prepared"], drift, say=runner.say, host=host,
                           lease=lease)
        # installed runs its modules in check mode (they report, with --diff, what they would write)
        if self._task.check_mode and state not in ("installed", "verified", "leased", "released"):
            result.update(changed=bool(drift.get("changed_files")) or path.restart_pending(), skipped=True,
                          msg="check mode: %s changes nothing on the host" % state)
            return result
        try:
            result.update(getattr(self, "_" + state)(path, task_vars))
            lease.flush()  # a step's record that no module of the step carried
        except hp.StepFailed as failed:
            result.update(dict(failed.result), failed=True, failed_step=failed.step,
                          msg="%s: %s: %s" % (host, failed.step, failed.result.get("msg")))
            self._release(path, "failed", failed.step)
        result["changed"] = path.changed or result.get("changed", False)
        facts = result.setdefault("ansible_facts", {})
        facts["sglang_lease_holder"] = lease.holder
        return result

    # ------------------------------------------------------------------ the lease

    @staticmethod
    def _hold(path, step, status="in progress"):
        """The step recorded on the host before it changes anything there: on the step's own module run
        when it has one that carries the lease (HostPath.RIDERS), else by a lease run just before."""
        holder = path.lease.holder
        path.lease.defer(record={"kind": holder.get("kind"), "run_id": holder.get("run_id"), "step": step,
                                 "status": status, "intent_digest": path.prepared.get("digest")},
                         intent_digest=path.prepared.get("digest"))

    @staticmethod
    def _release(path, step, status):
        """The role's own lease is released when it is done (or failed); a caller's stays with the caller."""
        holder = path.lease.holder
        if holder.get("kind") != "role" or not path.lease.held:
            return
        path.lease.release(record={"kind": "role", "run_id": holder.get("run_id"), "step": step, "status": status,
                                   "intent_digest": path.prepared.get("digest")})

    # ------------------------------------------------------------------ states

    @staticmethod
    def _whole_group(path, task_vars):
        """A node of a serving group changes only with every node of its group in the play: its nodes restart
        together (a node restarted alone takes the group's server down, or hangs in its stop until the unit's
        TimeoutStopSec); the rollout changes a group in SGLang's order."""
        group = path.prepared.get("group")
        if not group or not (path.drift.get("changed_files") or path.restart_pending() or path.not_running()):
            return
        nodes = [group.get("head")] + list(group.get("followers") or [])
        missing = [host for host in nodes if host not in (task_vars.get("ansible_play_hosts_all") or nodes)]
        if missing:
            raise hp.StepFailed(hp.INSTALL, {"failed": True, "msg": (
                "%s must change, and it is a node of serving group %s, whose nodes restart together: %s %s not in "
                "this play. Include every node of the group (or roll it out with gpufleet.inference.rollout). "
                "Nothing changed." % (path.host, group.get("name"), ", ".join(missing),
                                      "is" if len(missing) == 1 else "are"))})

    def _installed(self, path, task_vars):
        """What differs, installed; changed (and the handler notified) when a restart is due."""
        self._whole_group(path, task_vars)
        if path.drift.get("changed_files") or path.restart_pending() or path.not_running():
            self._hold(path, "applying")
        if path.drift.get("changed_files") or path.restart_pending():
            path.adopt_last_good()
        installed = path.install(restart=False)
        reasons = installed["changed_files"] and ["the unit or its config file changed"] or \
            (path.restart_reasons() if installed["restart_due"] else [])
        return dict(installed, changed=installed["restart_due"] or bool(installed["changed_files"]),
                    restart_reasons=reasons, msg="; ".join(reasons) or "nothing to install")

    def _restarted(self, path, task_vars):
        """The handler: restart, wait for the new process, keep it as last-known-good once verified."""
        self._hold(path, "restarting")
        started = path.restart()
        replaced = (started.get("status") or {}).get("InvocationID") or None
        try:
            verified = path.verified(started)
        except hp.StepFailed as failed:
            failed.result.setdefault("replaced_invocation", replaced)  # which process the failed one replaced
            raise
        return dict(self._keep(path, verified), replaced_invocation=replaced)

    def _verified(self, path, task_vars):
        """After the handlers: start a unit that is not running, or verify the running process."""
        done = task_vars.get("sglang_verified") or {}
        if done.get("verdict"):  # the restart handler verified this run's change
            done = self._templar.template(done)
            self._release(path, "done", "verified" if done.get("verdict") == "pass" else done.get("verdict"))
            return dict(done, changed=False, ansible_facts={"sglang_verified": done})
        if self._task.check_mode:
            verified = _records.verification([{}, {}, dict(path.drift, host=path.host)])
            return dict(verified, changed=False, skipped=True, msg="check mode: nothing is started or verified")
        if path.not_running():
            self._hold(path, "starting")
            out = self._keep(path, path.verified(path.start()))
            self._release(path, "done", "started")
            return out
        verified = path.verified(None)
        self._release(path, "done", "verified")
        return dict(verified, ansible_facts={"sglang_verified": verified})

    def _keep(self, path, verified):
        """The verification as the result (sglang_ready's keys), and the unit kept as last-known-good."""
        saved, error = (None, None)
        if boolean(self._task.args.get("keep_last_good", True), strict=False):
            saved, error = path.save_last_good(verified)
        out = dict(verified, ansible_facts={"sglang_verified": verified}, last_good_saved=bool(saved and saved.get(
            "exists")))
        if error:
            out["last_good_error"] = error
        return out

    def _adopted(self, path, task_vars):
        if (path.drift.get("last_good") or {}).get("exists") or path.drift.get("active_state") != "active":
            return {"last_good": {}, "msg": "a last-known-good copy exists already (or nothing runs)"}
        self._hold(path, "adopting")
        adopted = path.adopt_last_good()
        self._release(path, "done", "adopted")
        return {"last_good": adopted or {}, "msg": "kept what runs as last-known-good"}

    def _last_good_saved(self, path, task_vars):
        verified = task_vars.get("sglang_verified") or {}
        if verified.get("verdict") != "pass":
            return {"failed": True, "msg": "%s: the unit is not kept as last-known-good: its process was not verified "
                    "(%s). The last-known-good unit is still the one from before." % (
                        path.host, verified.get("msg") or "no fact sglang_verified: run the entry point apply first")}
        self._hold(path, "saving")
        saved, error = path.save_last_good(verified)
        self._release(path, "done", "kept as last-known-good" if not error else "failed")
        if error:
            return {"failed": True, "msg": error}
        return {"last_good": saved, "msg": "kept as last-known-good"}

    def _leased(self, path, task_vars):
        """A writer that changes the host over several tasks (a sweep) holds it from here to `released`."""
        if self._task.check_mode:
            return {"msg": "check mode: the lease is not taken", "lease": {}}
        holder = path.lease.holder
        taken = path.lease.hold(record={"kind": holder.get("kind"), "run_id": holder.get("run_id"), "step": "started",
                                        "status": "in progress"})
        return {"changed": True, "lease": taken.get("lease"), "msg": "leased for %s %s" % (
            holder.get("kind"), holder.get("run_id"))}

    def _released(self, path, task_vars):
        holder = path.lease.holder
        if self._task.check_mode or not path.lease.held:
            return {"msg": "no lease of this play to release", "lease": {}}
        released = path.lease.release(record={"kind": holder.get("kind"), "run_id": holder.get("run_id"),
                                              "step": "done", "status": "done"})
        return {"changed": True, "lease": released.get("lease"), "msg": "released"}

    def _reverted(self, path, task_vars):
        self._hold(path, "reverting")
        outcome = path.revert()
        self._release(path, "done", "reverted" if outcome.get("healthy") else "revert failed")
        return {"revert": outcome, "ansible_facts": {"sglang_revert": outcome}, "msg": outcome.get("msg")}
