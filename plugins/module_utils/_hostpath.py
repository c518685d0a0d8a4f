# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one implementation of what the collection does to a host: apply, wait, keep and revert.

Private to this collection: no compatibility promise. Controller-side and free of Ansible: it runs
modules through an injected ``run(name, args) -> result`` and waits through ``wait(args) -> result``
(the action plugins give Ansible's module execution and the sliced wait; unit tests give fakes).

The role's entry points (``apply``, ``adopt_last_good``, ``save_last_good``, ``revert``), its
restart handler and the rollout's per-host task all call these steps, so a step's name, its
module arguments and its message exist once. The wait's arguments are built in one place
(:func:`wait_args`).

``settings`` are the role's variables by their own names (``sglang_ready_timeout``, ...);
``prepared`` is what the drift check prepared for the host (``sglang_drift.prepared``: version,
endpoint, intent, rendered files and their paths, the config file's place - never its content);
``drift`` is the drift check's result.
"""
from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils import _records
from ansible_collections.gpufleet.inference.plugins.module_utils._args import config_file_text
from ansible_collections.gpufleet.inference.plugins.module_utils._flags import CONFIG_FLAG
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import flag_value

# The steps, named as an operator reads them in task names, records and messages.
BLOCKING = "Stop before changing anything when drop-ins override what the role manages"
ADOPT = "Keep what runs now as last-known-good (first change on this host)"
ACCOUNTS = "Create the SGLang user and group"
JOURNALD = "Raise journald's rate limit so SGLang's startup lines are kept"
INSTALL = "Install the SGLang unit and config file (what differs)"
RESTART = "Reload systemd and restart SGLang"
START = "Ensure SGLang is enabled and running"
STOP = "Stop SGLang (a serving group's nodes head first)"
START_NODE = "Reload systemd and start SGLang (a serving group's nodes followers first, all at once)"
WAIT = "Wait until the new SGLang process runs the intended settings"
VERIFY = "Verify the running SGLang process (nothing was restarted)"
SAVE = "Keep the verified unit as last-known-good"
HOLD = "Hold this host's lease (no other writer of the collection changes it meanwhile)"
REVERT = "Revert to the last-known-good unit and verify it"

UNIT_FILES = "gpufleet.inference.sglang_unit_files"
READY = "gpufleet.inference.sglang_ready"
LAST_GOOD = "gpufleet.inference.sglang_last_good"
INFO = "gpufleet.inference.sglang_info"
LEASE = "gpufleet.inference.sglang_lease"
SYSTEMD = "ansible.builtin.systemd_service"
GROUP = "ansible.builtin.group"
# What every changing host runs on its critical path: a rollout builds their payloads before its first batch.
CRITICAL_PATH_MODULES = (LEASE, UNIT_FILES, READY, LAST_GOOD)
# The modules that renew the lease and write a deferred record themselves (their `lease` option), before they
# change anything: a step's record rides on the step's own module run instead of a run of its own.
RIDERS = (UNIT_FILES, LAST_GOOD)
USER = "ansible.builtin.user"

# The role's variables the host path reads (defaults in roles/sglang/defaults/main.yml).
SETTINGS = ("sglang_unit_name", "sglang_api_key", "sglang_user", "sglang_group", "sglang_ready_timeout",
            "sglang_min_ready_seconds", "sglang_accept_unverified", "sglang_probe_prompt",
            "sglang_probe_max_new_tokens", "sglang_journal_grace", "sglang_receipt_dir", "sglang_last_good_dir",
            "sglang_progress", "sglang_verify", "sglang_fleet_dir", "sglang_lease_seconds",
            "sglang_ready_connection_retry_seconds")
# The wait's arguments and the role variable each one comes from.
_WAIT_SETTINGS = (("timeout", "sglang_ready_timeout"), ("min_ready_seconds", "sglang_min_ready_seconds"),
                  ("accept_unverified", "sglang_accept_unverified"), ("prompt", "sglang_probe_prompt"),
                  ("max_new_tokens", "sglang_probe_max_new_tokens"), ("journal_grace", "sglang_journal_grace"),
                  ("receipt_dir", "sglang_receipt_dir"), ("progress", "sglang_progress"),
                  ("connection_retry_seconds", "sglang_ready_connection_retry_seconds"))


class StepFailed(Exception):
    """A step failed; ``result`` is what it returned (msg, verdict, unreachable)."""

    def __init__(self, step, result):
        super(StepFailed, self).__init__(step)
        self.step = step
        self.result = result


# sglang_ready's slice when none is given (plugin_utils/_slices.py's default)
SLICE_SECONDS = 30.0


def wait_args(settings, url, intent, after=None, api_key=None, api_key_file=None):
    """sglang_ready's arguments: the one place they are built (the wait of an apply, of a check of the
    running process, of a revert). `api_key_file` (read on the host) stands in for `api_key` when the
    process runs with another key than the settings' (a revert during a rotation)."""
    args = dict(unit=settings["sglang_unit_name"], url=url, expect=intent.get("expect") or {},
                config_line=intent.get("config_line"), command=intent.get("command"),
                environment=intent.get("environment"), after_invocation=after,
                api_key=None if api_key_file else api_key, api_key_file=api_key_file,
                follower=True if intent.get("follower") else None)
    for name, variable in _WAIT_SETTINGS:
        args[name] = settings.get(variable)
    return dict((key, value) for key, value in args.items() if value not in (None, ""))


def config_of(command):
    """The path after --config in an SGLang command line (list of words), or None."""
    return flag_value([str(word) for word in command or []], CONFIG_FLAG)[1]


class Lease(object):
    """This writer's lease of one host (gpufleet.inference.sglang_lease), taken, renewed and released
    through ``run``. ``holder`` names the writer (kind, run_id, session, controller, user, job);
    ``generation`` is set once taken, so a renewal of a lease someone took over fails."""

    def __init__(self, run, settings, holder, clock, gone=None):
        self.run = run
        self.gone = gone  # whether a lease's holder is provably gone (controller side), else None
        self.unit = settings["sglang_unit_name"]
        self.directory = settings["sglang_fleet_dir"]
        self.seconds = int(settings["sglang_lease_seconds"])
        self.holder = dict(holder)
        self.clock = clock
        self.renewed_at = None
        self.pending = None  # a record deferred to the next module run that changes the host

    @property
    def held(self):
        return self.holder.get("generation") is not None

    def hold(self, record=None, intent_digest=None, longer=0):
        """Take or renew the lease (and write `record` into the host's record); raises StepFailed.
        ``longer``: seconds added for a step that runs without renewing it (a drain)."""
        self.flush()
        args = dict(unit=self.unit, directory=self.directory, state="held", holder=self.holder,
                    seconds=self.seconds + int(longer))
        if intent_digest:
            args["intent_digest"] = intent_digest
        if record:
            args["record"] = record
        result = self.run(LEASE, args)
        refused = result.get("failed") and result.get("action") == "refused" and self.holder.get("generation") is None
        if refused and self.gone and self.gone(result.get("lease")):
            # its holder was a run on this controller that ended (Ctrl-C): take over its lease now
            args["takeover_runs"] = [((result.get("lease") or {}).get("holder") or {}).get("run_id")]
            result = self.run(LEASE, args)
        if result.get("failed"):
            raise StepFailed(HOLD, result)
        self.holder["generation"] = (result.get("lease") or {}).get("generation")
        self.renewed_at = self.clock()
        return result

    def defer(self, record, intent_digest=None):
        """Record a step before the next change, on the module run that makes it (RIDERS) when there is one:
        the record is written by the first module the host runs after this - carried by a rider, else by a
        lease run of its own just before. A lease not yet taken is taken now (with `intent_digest`)."""
        if not self.held:
            return self.hold(record=record, intent_digest=intent_digest)
        self.flush()
        self.pending = record
        return None

    def rider(self):
        """The `lease` option that carries the deferred record (RIDERS' argument spec, _lease.RIDER_SPEC)."""
        return dict(unit=self.unit, directory=self.directory, holder=self.holder, seconds=self.seconds,
                    record=self.pending)

    def carried(self, result):
        """After a rider ran with the option: a lease taken over fails the step (HOLD, nothing was changed);
        a module that held it wrote the record. A module that never ran (unreachable) leaves it deferred."""
        if result.get("action") == "refused":
            raise StepFailed(HOLD, result)
        if result.get("lease"):
            self.pending = None
            self.renewed_at = self.clock()

    def flush(self):
        """The deferred record written by a lease run of its own (before a module that does not carry it)."""
        if self.pending is not None:
            record, self.pending = self.pending, None
            self.hold(record=record)

    def discard(self):
        """A failure's record supersedes a deferred one (a step that failed before its module ran)."""
        self.pending = None

    def renew_if_due(self):
        """Between the slices of a wait (each at most a third of the lease): renew once a third of the lease
        has passed, so a renewal comes at most two thirds of a lease after the last. A lease taken over meanwhile
        fails the next step, before it touches the host."""
        if self.held and (self.renewed_at is None or self.clock() - self.renewed_at >= self.seconds / 3.0):
            try:
                self.hold()
            except StepFailed:
                pass

    def release(self, record=None):
        """Release the lease, writing `record` (it supersedes a deferred record no module carried)."""
        self.discard()
        if not self.held:
            return {}
        args = dict(unit=self.unit, directory=self.directory, state="released", holder=self.holder)
        if record:
            args["record"] = record
        result = self.run(LEASE, args)
        if not result.get("failed"):
            self.holder["generation"] = None
        return result


class HostPath(object):
    """The steps on one host. ``changed`` says whether any step changed it."""

    def __init__(self, run, wait, settings, prepared, drift, say=None, host=None, lease=None):
        self.run = run
        self.host = host or settings["sglang_unit_name"]
        self.lease = lease
        self.wait = wait
        self.settings = settings
        self.prepared = prepared or {}
        self.drift = drift or {}
        self.say = say or (lambda text: None)
        self.unit = settings["sglang_unit_name"]
        self.changed = False
        self.adopted = {}
        self.reverted_config = None

    # ------------------------------------------------------------------ plumbing

    def _module(self, name, args):
        """A module run on the host; the lease's deferred record rides on it (RIDERS) or is written first."""
        riding = self.lease is not None and self.lease.pending is not None and name in RIDERS
        if riding:
            args = dict(args, lease=self.lease.rider())
        elif self.lease is not None:
            self.lease.flush()
        result = self.run(name, args)
        if result.get("unreachable"):
            result["failed"] = True
        if riding:
            self.lease.carried(result)
        return result

    def _step(self, step, name, args):
        result = self._module(name, args)
        if result.get("failed"):
            raise StepFailed(step, result)
        self.changed = self.changed or bool(result.get("changed"))
        return result

    def _leased_wait(self, args, between=None):
        """The wait, renewing the lease between its slices: a slice lasts at most a third of the lease, so
        a renewal comes before the lease could run out. ``between`` (optional) runs between slices too (a
        serving group's head watches its followers there)."""
        if self.lease is not None:
            self.lease.flush()  # a deferred record is written before the wait (no module of it carries one)
        if self.lease is None and between is None:
            return self.wait(args)
        if self.lease is not None:
            args = dict(args, slice_seconds=min(float(args.get("slice_seconds") or SLICE_SECONDS),
                                                self.lease.seconds / 3.0))

        def between_slices():
            if self.lease is not None:
                self.lease.renew_if_due()
            if between is not None:
                between()
        return self.wait(args, between=between_slices)

    def _wait(self, step, args, between=None):
        result = self._leased_wait(args, between)
        if result.get("verdict") == "connection_lost":
            result["unreachable"] = True
        if result.get("failed"):
            raise StepFailed(step, result)
        return result

    @property
    def url(self):
        return (self.prepared.get("endpoint") or {}).get("url")

    def secret_files(self):
        """The config file with the API key: its place from the prepare phase, its content from the key."""
        meta = self.prepared.get("config_file")
        if not meta:
            return []
        key = self.settings.get("sglang_api_key")
        if key in (None, ""):
            raise StepFailed(INSTALL, {"failed": True, "msg": "%s: the prepare phase names an SGLang config file (%s) "
                                       "but sglang_api_key is empty: the key is needed to write it" % (
                                           self.unit, meta.get("path"))})
        return [dict(meta, content=config_file_text({"sglang_api_key": key}))]

    def unit_files(self):
        paths = self.prepared.get("paths") or {}
        return [dict(path=paths.get("unit"), content=self.prepared.get("unit_text"), verify_unit=True)]

    # ------------------------------------------------------------------ apply

    def check_blocking(self):
        """Drop-ins that override what the role manages: a restart could not apply the intent."""
        if self.drift.get("blocking"):
            raise StepFailed(BLOCKING, {"failed": True, "msg": (
                "%s: %s. A restart cannot apply the intended settings while they override them: remove the drop-ins, "
                "or set what they set through the role's variables. Nothing changed." % (
                    self.host, "; ".join(self.drift["blocking"])))})

    def restart_reasons(self):
        return self.drift.get("restart_reasons") or ["restart pending"]

    def restart_pending(self):
        """The process does not run the installed unit (a play died before its restart)."""
        return bool(self.drift.get("restart_pending")) and self.drift.get("active_state") == "active"

    def install(self, restart=False):
        """Accounts, journald's rate limit, the unit and its config file - what differs. With `restart`,
        the same module run reloads systemd and restarts the unit when it wrote a file (or a restart was
        pending anyway). Returns {changed_files, restart_due, restarted, status}."""
        self.check_blocking()
        changed = set(self.drift.get("changed_files") or [])
        missing = self.drift.get("missing_accounts") or []
        user, group = self.settings["sglang_user"], self.settings["sglang_group"]
        if "group %s" % group in missing:
            self._step(ACCOUNTS, GROUP, dict(name=group, system=True))
        if "user %s" % user in missing:
            self._step(ACCOUNTS, USER, dict(name=user, group=group, system=True, create_home=False,
                                            shell="/usr/sbin/nologin"))
        journald = dict(path=(self.prepared.get("paths") or {}).get("journald"),
                        content=self.prepared.get("journald_text"))
        if journald["path"] in changed:
            self._step(JOURNALD, UNIT_FILES, dict(files=[journald]))
            self._step(JOURNALD, SYSTEMD, dict(name="systemd-journald.service", state="restarted"))
        files = [item for item in self.unit_files() if item["path"] in changed]
        secrets = [item for item in self.secret_files() if item["path"] in changed]
        pending = self.restart_pending()
        outcome = dict(changed_files=[], restarted=False, status=None)
        if files or secrets:
            self.say("installing %s" % ", ".join(item["path"] for item in files + secrets))
            args = dict(files=self.unit_files(), secret_files=self.secret_files())
            if restart:
                args["restart"] = dict(unit=self.unit, force=pending)
            try:
                installed = self._step(INSTALL, UNIT_FILES, args)
            except StepFailed as failed:
                if failed.result.get("failed_at") == "restart":  # the files were written: a change
                    self.changed = True
                    raise StepFailed(RESTART, failed.result)
                raise
            # What the module wrote: a file the drift saw differ may be right by now (another operator).
            outcome.update(changed_files=installed.get("changed_files") or [],
                           restarted=bool(installed.get("restarted")), status=installed.get("status"))
            if installed.get("diff"):
                outcome["diff"] = installed["diff"]  # with --diff: what it wrote (or would write, --check)
            if outcome["restarted"]:
                self.say("restarted %s (%s)" % (self.unit, "the unit or its config file changed"))
        outcome["restart_due"] = bool(outcome["changed_files"]) or pending
        return outcome

    def restart(self):
        """daemon-reload, enable and restart; returns the module's result (``status``: the unit before)."""
        self.say("restarting %s (%s)" % (self.unit, "; ".join(self.restart_reasons())))
        return self._step(RESTART, UNIT_FILES, dict(restart=dict(unit=self.unit, force=True)))

    def start(self):
        self.say("starting %s" % self.unit)
        return self._step(START, SYSTEMD, dict(name=self.unit, enabled=True, state="started"))

    def stop(self):
        """Stop the unit and return once it is inactive (a stop also cancels a restart systemd had scheduled);
        the module's ``status`` is the unit before (its InvocationID: the process a start replaces)."""
        self.say("stopping %s" % self.unit)
        return self._step(STOP, SYSTEMD, dict(name=self.unit, state="stopped"))

    def start_node(self):
        """A serving group's node: reload systemd (its files were installed without a restart) and queue its start
        without waiting for it - every node waits for the others anyway, up to --dist-timeout."""
        self.say("starting %s (its serving group's nodes start together)" % self.unit)
        return self._step(START_NODE, SYSTEMD, dict(name=self.unit, enabled=True, state="started",
                                                    daemon_reload=True, no_block=True))

    def not_running(self):
        return not self.drift.get("enabled") or self.drift.get("active_state") != "active"

    def wait_for_new(self, started):
        """The NEW process after a restart or start: its InvocationID differs from the one it replaced - the
        restart's own reading before it restarted (sglang_unit_files), else the drift check's (a start:
        systemd_service reports the unit as it found it or left it, which may be the new invocation)."""
        before = (started or {}).get("status") if (started or {}).get("restarted") else None
        previous = (before or {}).get("InvocationID") or self.drift.get("invocation_id")
        return self._wait(WAIT, wait_args(self.settings, self.url, self.prepared.get("intent") or {}, after=previous,
                                          api_key=self.settings.get("sglang_api_key")))

    def verify_running(self):
        """The running process, nothing restarted (a drift check that verified it already is enough)."""
        if self.drift.get("in_sync") and self.drift.get("receipt"):
            return _records.verified_from_drift(self.drift)
        return self._wait(VERIFY, wait_args(self.settings, self.url, self.prepared.get("intent") or {},
                                            api_key=self.settings.get("sglang_api_key")))

    def apply(self):
        """Install what differs, restart (or start) and wait for the new process, or verify the running one:
        the verification (_records.verification's shape)."""
        installed = self.install(restart=True)
        started = installed if installed["restarted"] else None
        if started is None and installed["restart_due"]:
            started = self.restart()
        elif started is None and self.not_running():
            started = self.start()
        return self.verified(started)

    def verified(self, started):
        """After the restart or start (`started`, or None when nothing restarted): the verification."""
        ready, running = {}, {}
        if self.settings.get("sglang_verify", True):
            if started is not None:
                ready = self.wait_for_new(started)
            else:
                running = self.verify_running()
        return _records.verification([ready, running, dict(self.drift, host=self.host)],
                                     restarted=started is not None)

    # ------------------------------------------------------------------ last-known-good

    def adopt_last_good(self):
        """Before the first change of a host without a last-known-good copy: keep what runs now,
        verified against what that process showed (rebuilt from the process after a lost handler)."""
        if (self.drift.get("last_good") or {}).get("exists") or self.drift.get("active_state") != "active":
            return None
        record = _records.adopted_record(dict(self.drift, version=self.prepared.get("version")))
        self.adopted = self._step(ADOPT, LAST_GOOD, dict(
            unit=self.unit, directory=self.settings["sglang_last_good_dir"], files=self.prepared.get("unit_files"),
            record=record, from_process=bool(self.drift.get("restart_pending")), state="saved"))
        return self.adopted

    def has_last_good(self):
        return bool((self.drift.get("last_good") or {}).get("exists") or self.adopted.get("exists"))

    def save_last_good(self, verified):
        """Keep the unit as last-known-good, only when its process was verified. Returns (saved, error)."""
        if verified.get("verdict") != "pass":
            return None, None
        record = dict(invocation_id=verified.get("invocation_id"), observed=verified.get("observed"),
                      source=verified.get("source"), version=self.prepared.get("version"),
                      intent=self.prepared.get("intent"))
        saved = self._module(LAST_GOOD, dict(unit=self.unit, directory=self.settings["sglang_last_good_dir"],
                                             files=self.prepared.get("unit_files"), record=record, state="saved"))
        if saved.get("failed"):
            return None, str(saved.get("msg") or saved)
        self.changed = self.changed or bool(saved.get("changed"))
        return saved, None

    def restore_last_good(self):
        """Put the last-known-good files back (nothing restarted): (the invocation running before, the module's
        result, whose ``record`` is what the files were verified with)."""
        # the files first: a record deferred to this step rides on their module run (nothing restarts in between)
        restored = self._module(LAST_GOOD, dict(unit=self.unit, directory=self.settings["sglang_last_good_dir"],
                                                state="restored"))
        reverting = self._module(INFO, dict(unit=self.unit, probe_server=False))
        if not restored.get("failed"):
            self.changed = self.changed or bool(restored.get("changed"))
        return reverting.get("invocation_id"), restored

    def reverted_wait_args(self, restored, after, follower=False):
        """The wait for the process of the restored files, held to what was recorded with them."""
        intent = dict((restored.get("record") or {}).get("intent") or {})
        if follower:
            intent["follower"] = True  # a copy adopted from what ran has no intent of a group's node
        # The reverted process runs with the key of the config file its command names (--config; the
        # role never puts the key on the command line): read there, on the host - the old key of a
        # rotation or of a removed key, not the key of the settings that failed. No --config: no key.
        self.reverted_config = config_of(intent.get("command"))
        return wait_args(self.settings, self.url, intent, after=after, api_key_file=self.reverted_config)

    def revert(self):
        """Put the last-known-good files back, restart, and verify the reverted process against what was
        recorded with them (never raises): _records.revert_outcome's shape."""
        self.say("reverting to the last-known-good unit")
        before, restored = self.restore_last_good()
        restart, wait = {}, {}
        if not restored.get("failed"):
            restart = self._module(SYSTEMD, dict(name=self.unit, daemon_reload=True, state="restarted"))
            self.changed = True
        if not restored.get("failed") and not restart.get("failed"):
            wait = self._leased_wait(self.reverted_wait_args(restored, before))
        return _records.revert_outcome([restored, restart, wait])
