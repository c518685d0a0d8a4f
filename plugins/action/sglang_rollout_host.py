# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One host of a rollout's apply phase: the critical path in one task.

Record, leave the router and drain, keep what runs as last-known-good (first change), install
what differs, restart, wait for the NEW process, record it verified, rejoin, save it as
last-known-good, record it done. A failing step reverts the host to its last-known-good unit
when it had changed, puts it back into the router when it is healthy, and records where it
stopped. Each step is recorded BEFORE it can leave the host worse.

Why one action: each Ansible task costs a fork of the controller, templating of its arguments
and ~0.5 s of latency before its module starts on the host; the modules run here are the same
ones the role's tasks run (sglang_unit_files, ansible.builtin.systemd_service, sglang_ready in
slices, sglang_last_good, sglang_info), with the same arguments, from the same role values.
Documentation: plugins/modules/sglang_rollout_host.py.
"""
from __future__ import annotations

import os
import time

from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.inference.plugins.action.sglang_ready import (
    connection_lost,
    execute_slice,
    reset_connection,
    wait_in_slices,
)
from ansible_collections.gpufleet.inference.plugins.module_utils import _args
from ansible_collections.gpufleet.inference.plugins.module_utils import _http
from ansible_collections.gpufleet.inference.plugins.module_utils import _records
from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro
from ansible_collections.gpufleet.inference.plugins.module_utils._router import RouterClient, RouterError, find_worker
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import flag_value
from ansible_collections.gpufleet.inference.plugins.modules import sglang_router_worker

display = Display()
# urllib and ssl loaded with this plugin, in ansible-playbook's main process: each worker inherits them.
_http.preload()

PREFIX = "sglang_rollout | "
REJOIN_DELAY = 5.0

# The steps, named as an operator reads them in records and messages.
CAPACITY = "Check that the router keeps enough healthy workers while this batch is out"
BLOCKING = "Stop before changing anything when drop-ins override what the role manages"
DRAIN = "Take this host out of the router and let it drain"
ADOPT = "Keep what runs now as last-known-good (first change on this host)"
ACCOUNTS = "Create the SGLang user and group"
JOURNALD = "Raise journald's rate limit so SGLang's startup lines are kept"
INSTALL = "Install the SGLang unit and config file (what differs)"
RESTART = "Reload systemd and restart SGLang"
START = "Ensure SGLang is enabled and running"
WAIT = "Wait until the new SGLang process runs the intended settings"
VERIFY = "Verify the running SGLang process (nothing was restarted)"
REJOIN = "Put this host back into the router"
SAVE = "Keep the verified unit as last-known-good (verified, settled and back in the router)"


# The modules every changing host runs on its critical path. The prepare phase builds their
# payloads into this run's module cache (sglang_rollout state=prepared), so the canary's time out
# of the router does not include building them.
# Built before the first batch (sglang_rollout state=prepared). ansible.builtin.systemd_service is not
# among them: the restart runs inside sglang_unit_files; it is built (~0.5 s) only when a host needs
# a start, a pending restart without a file change, a journald restart or a revert.
CRITICAL_PATH_MODULES = (
    "gpufleet.inference.sglang_unit_files",
    "gpufleet.inference.sglang_ready",
    "gpufleet.inference.sglang_last_good",
)


ARGUMENT_SPEC = dict(
    run=dict(type="dict", required=True),
    capacity=dict(type="dict", default={}),
    router=dict(type="dict", default={}, options=dict(
        url=dict(type="str", default=""),
        api_key=dict(type="str", no_log=True),
        worker_url=dict(type="str"),
        drain_timeout=dict(type="int", default=300),
        rejoin_timeout=dict(type="int", default=120),
        rejoin_retries=dict(type="int", default=3),
    )),
    drift=dict(type="dict", required=True),
    version=dict(type="str"),
    unit=dict(type="str", required=True),
    intent=dict(type="dict", required=True),
    files=dict(type="list", elements="dict", required=True),
    secret_files=dict(type="list", elements="dict", no_log=True),
    journald=dict(type="dict", default={}),
    accounts=dict(type="dict", default={}),
    last_good=dict(type="dict", required=True),
    wait=dict(type="dict", required=True, no_log=False),
    verify=dict(type="bool", default=True),
)


def config_of(command):
    """The path after --config in an SGLang command line (list of words), or None."""
    return flag_value([str(word) for word in command or []], _args.CONFIG_FLAG)[1]


class StepFailed(Exception):
    """A step of the critical path failed; ``result`` is what it returned (msg, verdict, unreachable)."""

    def __init__(self, step, result):
        super(StepFailed, self).__init__(step)
        self.step = step
        self.result = result


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    # ------------------------------------------------------------------ plumbing

    def _module(self, name, module_args):
        """One module on the host; a broken connection is a result (unreachable), not an exception."""
        try:
            result = self._execute_module(module_name=name, module_args=module_args, task_vars=self._vars)
        except AnsibleConnectionFailure as exc:
            return {"unreachable": True, "failed": True, "msg": str(exc)}
        if result.get("unreachable"):
            result["failed"] = True
        return result

    def _step(self, step, name, module_args):
        result = self._module(name, module_args)
        if result.get("failed"):
            raise StepFailed(step, result)
        self._changed = self._changed or bool(result.get("changed"))
        return result

    def _say(self, text):
        if self._progress:
            display.display(PREFIX + "%s: [%6.1fs] %s" % (self._host, time.monotonic() - self._started, text))

    def _record(self, step, **values):
        values.update(router=self._use_router)
        self._state = ro.record_step(self._run, self._host, step, values)
        return self._state

    def _router(self, state, **extra):
        params = dict(router_url=self._router_args["url"], worker_url=self._router_args["worker_url"], state=state,
                      api_key=self._router_args.get("api_key") or None, worker_api_key=self._worker_key,
                      drain_timeout=600,
                      wait_healthy=True, timeout=300, request_timeout=10.0, validate_certs=True)
        params.update(extra)
        try:
            return sglang_router_worker.run(params, False)
        except RouterError as exc:
            return {"failed": True, "msg": str(exc)}

    def _wait(self, step, module_args):
        result = wait_in_slices(execute_slice(self, self._vars), reset_connection(self), module_args, self._host)
        if result.get("verdict") == "connection_lost":
            result["unreachable"] = True
        return result

    # ------------------------------------------------------------------ run

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        self._vars = task_vars or {}
        self._host = self._vars.get("inventory_hostname", "?")
        if not args["run"].get("run_dir"):
            raise AnsibleActionFail("sglang_rollout_host: run must be the result of sglang_rollout state=start")
        if args["router"]["url"] and not args["router"].get("worker_url"):
            raise AnsibleActionFail("sglang_rollout_host: router.worker_url is needed with router.url")
        if self._task.check_mode:
            result.update(skipped=True, changed=False, msg="check mode: a rollout's check run changes no host")
            return result
        if args["secret_files"] is None:
            args["secret_files"] = self._secret_files(args)
        self._run = args["run"]
        self._drift = args["drift"]
        self._router_args = dict(args.get("router") or {})
        # The server's own key (sglang_api_key): the drain reads the worker's load with it, and the worker
        # goes back into the router with it - the router calls a worker with the key it was added with
        # (its health check, /health, needs none: without the key it would list the worker healthy
        # while every request it forwards is refused).
        self._worker_key = args["wait"].get("api_key") or None
        self._use_router = bool(self._router_args.get("url"))
        self._progress = boolean(args["wait"].get("progress", True), strict=False)
        self._changed = False
        self._state = {}
        self._started = time.monotonic()
        self._adopted = {}
        self._reverted_config = None
        before = ro.read_json(os.path.join(self._run["run_dir"], "%s.json" % self._host)) or {}
        try:
            outcome = self._critical_path(args, recovering="recovering" in before)
        except StepFailed as failed:
            outcome = self._fail(args, failed)
        result.update(outcome)
        result["changed"] = self._changed
        return result

    @staticmethod
    def _secret_files(args):
        """The config file with the API key, from what the prepare phase found (drift.prepared.config_file:
        path, mode, owner, group - never the content) and the key the wait probes with (wait.api_key)."""
        meta = (args["drift"].get("prepared") or {}).get("config_file")
        if not meta:
            return []
        api_key = args["wait"].get("api_key")
        if api_key in (None, ""):
            raise AnsibleActionFail("sglang_rollout_host: drift.prepared names an SGLang config file (%s) but "
                                    "wait.api_key is empty: the API key is needed to write it" % meta.get("path"))
        return [dict(meta, content=_args.config_file_text({"sglang_api_key": api_key}))]

    def _critical_path(self, args, recovering):
        drift = self._drift
        capacity = args.get("capacity") or {}
        if capacity.get("failed"):  # the batch's capacity check (run once for the batch) said no
            raise StepFailed(CAPACITY, capacity)
        if drift.get("blocking"):
            raise StepFailed(BLOCKING, {"failed": True, "msg": (
                "%s: %s. A restart cannot apply the intended settings while they override them: remove the drop-ins, "
                "or set what they set through the role's variables. Nothing changed." % (
                    self._host, "; ".join(drift["blocking"])))})
        self._record("draining")
        drained = None
        if self._use_router:
            self._say("leaving the router and draining")
            drained = self._router("absent", drain_timeout=self._router_args["drain_timeout"])
            if drained.get("failed"):
                raise StepFailed(DRAIN, drained)
        last_good = args["last_good"]
        if not (drift.get("last_good") or {}).get("exists") and drift.get("active_state") == "active":
            record = _records.adopted_record(dict(drift, version=args.get("version")))
            self._adopted = self._step(ADOPT, "gpufleet.inference.sglang_last_good", dict(
                unit=args["unit"], directory=last_good["directory"], files=last_good["files"], record=record,
                from_process=bool(drift.get("restart_pending")), state="saved"))
        self._record("applying")
        verified = self._apply(args)
        self._record("verified", drift=drift, verified=verified)
        rejoined_at = None
        if self._use_router:
            self._say("verified invocation %s; putting it back into the router" % verified.get("invocation_id")
                      if verified.get("verdict") != _records.NOT_VERIFIED else
                      "not verified (sglang_verify is off); putting it back into the router")
            self._rejoin()
            rejoined_at = ro.iso()
        saved, error = self._save_last_good(args, verified)
        self._state = self._record("rejoined", drift=drift, verified=verified, drained=drained, rejoined_at=rejoined_at,
                                   min_ready_seconds=args["wait"].get("min_ready_seconds"), recovering=recovering,
                                   last_good=saved, last_good_error=error)
        self._say(self._state.get("status"))
        status = self._state.get("status")
        return {"msg": "%s: %s (invocation %s)" % (self._host, status, verified.get("invocation_id")),
                "verified": verified, "record": self._state}

    def _apply(self, args):
        """Install what differs, restart (or start) and wait for the new process, or verify the running one."""
        drift, unit = self._drift, args["unit"]
        changed_files = set(drift.get("changed_files") or [])
        missing = drift.get("missing_accounts") or []
        accounts = args.get("accounts") or {}
        if "group %s" % accounts.get("group") in missing:
            self._step(ACCOUNTS, "ansible.builtin.group", dict(name=accounts["group"], system=True))
        if "user %s" % accounts.get("user") in missing:
            self._step(ACCOUNTS, "ansible.builtin.user", dict(
                name=accounts["user"], group=accounts["group"], system=True, create_home=False,
                shell="/usr/sbin/nologin"))
        journald = args.get("journald") or {}
        if journald.get("path") in changed_files:
            self._step(JOURNALD, "gpufleet.inference.sglang_unit_files", dict(files=[journald]))
            self._step(JOURNALD, "ansible.builtin.systemd_service", dict(name="systemd-journald.service",
                                                                         state="restarted"))
        unit_files = [f for f in args["files"] if f.get("path") in changed_files]
        secret_files = [f for f in args.get("secret_files") or [] if f.get("path") in changed_files]
        pending = bool(drift.get("restart_pending")) and drift.get("active_state") == "active"
        started = None
        if unit_files or secret_files:
            # One run on the host: write what differs, then (when something was written, or a restart was
            # pending anyway) reload systemd, enable and restart - as the systemd_service step below would.
            self._say("installing %s" % ", ".join(f["path"] for f in unit_files + secret_files))
            try:
                installed = self._step(INSTALL, "gpufleet.inference.sglang_unit_files", dict(
                    files=args["files"], secret_files=args.get("secret_files") or [],
                    restart=dict(unit=unit, force=pending)))
            except StepFailed as failed:
                if failed.result.get("failed_at") == "restart":  # the files were written: a change
                    self._changed = True
                    raise StepFailed(RESTART, failed.result)
                raise
            if installed.get("restarted"):
                self._say("restarted %s (%s)" % (unit, "the unit or its config file changed" if installed.get(
                    "changed_files") else "; ".join(drift.get("restart_reasons") or ["restart pending"])))
                started = installed
        if started is None and pending:
            self._say("restarting %s (%s)" % (unit, "; ".join(drift.get("restart_reasons") or ["restart pending"])))
            started = self._step(RESTART, "ansible.builtin.systemd_service", dict(
                name=unit, daemon_reload=True, enabled=True, state="restarted"))
        elif started is None and (not drift.get("enabled") or drift.get("active_state") != "active"):
            self._say("starting %s" % unit)
            started = self._step(START, "ansible.builtin.systemd_service",
                                 dict(name=unit, enabled=True, state="started"))
        wait = dict(args["wait"], unit=unit, expect=args["intent"].get("expect"),
                    config_line=args["intent"].get("config_line"), command=args["intent"].get("command"),
                    environment=args["intent"].get("environment"))
        wait = dict((key, value) for key, value in wait.items() if value not in (None, ""))
        ready, running = {}, {}
        if started is not None and args.get("verify", True):
            previous = (started.get("status") or {}).get("InvocationID") or drift.get("invocation_id")
            if previous:
                wait["after_invocation"] = previous
            ready = self._wait(WAIT, wait)
            if ready.get("failed"):
                raise StepFailed(WAIT, ready)
        elif args.get("verify", True) and not (drift.get("in_sync") and drift.get("receipt")):
            running = self._wait(VERIFY, wait)
            if running.get("failed"):
                raise StepFailed(VERIFY, running)
        return _records.verification([ready, running, dict(drift, host=self._host)], restarted=started is not None)

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
        raise StepFailed(REJOIN, rejoined)

    def _save_last_good(self, args, verified):
        """Keep the unit as last-known-good, only when its process was verified (a revert brings it back)."""
        if verified.get("verdict") == _records.NOT_VERIFIED:
            return None, None
        last_good = args["last_good"]
        record = dict(invocation_id=verified.get("invocation_id"), observed=verified.get("observed"),
                      source=verified.get("source"), version=args.get("version"), intent=args["intent"])
        saved = self._module("gpufleet.inference.sglang_last_good", dict(
            unit=args["unit"], directory=last_good["directory"], files=last_good["files"], record=record,
            state="saved"))
        if saved.get("failed"):
            return None, str(saved.get("msg") or saved)
        self._changed = self._changed or bool(saved.get("changed"))
        return saved, None

    # ------------------------------------------------------------------ failure

    def _fail(self, args, failed):
        failure = dict(failed.result)
        reached = self._state.get("step") or "prepared"
        lost = bool(failure.get("unreachable")) or failure.get("verdict") == "connection_lost" or \
            connection_lost(failure) is not None
        if lost:
            failure["unreachable"] = True
        has_last_good = (self._drift.get("last_good") or {}).get("exists") or self._adopted.get("exists")
        revert = None
        if reached == "applying" and not lost and has_last_good:
            revert = self._revert(args)
        rejoined, kept_out = False, None
        if self._use_router and not lost and reached == "draining" and self._still_listed():
            # The drain failed before the worker was removed (its load could not be read): it never left.
            rejoined = True
        elif self._key_differs(revert, reached):
            # The host runs the previous key (not changed yet, or reverted); the router calls a worker with
            # the key it is added with, the new one (or none) here, which the host refuses.
            kept_out = ("the host %s the previous API key (this rollout changes it), and the router would call it "
                        "with the new one: put it back into the router with its key by hand, or roll out again"
                        % ("runs" if reached == "draining" else "was reverted to"))
        elif self._use_router and not lost and reached in ("draining", "applying") and \
                (reached == "draining" or (revert or {}).get("healthy")):
            back = self._router("present", timeout=self._router_args["rejoin_timeout"])
            rejoined = not back.get("failed") and "workers" in back
        self._state = self._record("failed", state_before={"step": reached}, task=failed.step, failure=failure,
                                   changed=reached == "applying", revert=revert, rejoined_after_revert=rejoined,
                                   kept_out_of_router=kept_out if self._use_router else None)
        self._say(self._state.get("status"))
        return {"failed": True, "msg": self._state.get("message"), "failed_step": failed.step,
                "failure": failure, "revert": revert, "record": self._state}

    def _key_differs(self, revert, reached):
        """Whether the host runs another API key than the one it would be re-added to the router with."""
        config = ((self._drift.get("prepared") or {}).get("config_file") or {}).get("path")
        changed = config in (self._drift.get("changed_files") or [])
        if revert:
            old = self._reverted_config
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

    def _revert(self, args):
        """Put the last-known-good files back, restart, and verify the reverted process (never raises)."""
        unit = args["unit"]
        self._say("reverting to the last-known-good unit")
        reverting = self._module("gpufleet.inference.sglang_info", dict(unit=unit, probe_server=False))
        restored = self._module("gpufleet.inference.sglang_last_good", dict(
            unit=unit, directory=args["last_good"]["directory"], state="restored"))
        restart, wait = {}, {}
        if not restored.get("failed"):
            self._changed = self._changed or bool(restored.get("changed"))
            restart = self._module("ansible.builtin.systemd_service", dict(name=unit, daemon_reload=True,
                                                                           state="restarted"))
            self._changed = True
        if not restored.get("failed") and not restart.get("failed"):
            intent = (restored.get("record") or {}).get("intent") or {}
            settings = args["wait"]
            # The reverted process runs with the key of the config file its command names (--config; the
            # role never puts the key on the command line): read it there, on the host - the old key of a
            # rotation or of a removed key, not the key of the settings that failed. No --config: no key.
            self._reverted_config = config_of(intent.get("command"))
            key = dict(api_key_file=self._reverted_config) if self._reverted_config else {}
            wait_args = dict(unit=unit, url=settings.get("url"),
                             after_invocation=reverting.get("invocation_id"), expect=intent.get("expect") or {},
                             config_line=intent.get("config_line"), command=intent.get("command"),
                             environment=intent.get("environment"), timeout=settings.get("timeout"),
                             min_ready_seconds=settings.get("min_ready_seconds"),
                             receipt_dir=settings.get("receipt_dir"), progress=settings.get("progress"), **key)
            wait = self._wait(WAIT, dict((k, v) for k, v in wait_args.items() if v not in (None, "")))
        return _records.revert_outcome([restored, restart, wait])
