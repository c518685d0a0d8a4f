# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Records the role keeps about a host: what verified it, what a revert may restore.

Private to this collection: no compatibility promise. Pure functions of module results, used by
the host path (_hostpath.py) and the rollout's records.
"""
from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils._flags import SETTING_KEYS


def verified_from_drift(drift):
    """A verification result made of a drift check that found the running invocation verified
    (in sync, with the receipt of its earlier verification): no need to wait again."""
    return {
        "verdict": "pass",
        "verified": True,
        "invocation_id": drift.get("invocation_id"),
        "main_pid": drift.get("main_pid"),
        "observed": drift.get("observed"),
        "config_line": drift.get("config_line"),
        "config_lines": drift.get("config_lines") or [],
        "source": drift.get("source"),
        "elapsed": 0.0,
        "phases": {},
        "msg": "%s: invocation %s runs the intended settings (drift check; verified before, receipt kept)" % (
            drift.get("host"), drift.get("invocation_id")),
    }


# The verdict of a restart or a running process that nothing verified (sglang_verify off).
NOT_VERIFIED = "not_verified"


def verification(results, restarted=False):
    """[the restart's wait, the no-restart verification, the drift check] -> the one that verified:
    the first that ran (not skipped, not absent), else the drift check's in-sync verification.

    When nothing verified (sglang_verify off, or the wait was skipped), no process was seen: the
    invocation is unknown (None, never the drift check's, which may be the process a restart
    replaced), and whether the process is new is `restarted` (the step restarted or started the
    unit), not a comparison of invocations."""
    results = list(results)
    waits, drift = results[:-1], (results[-1] if results else None) or {}
    for result in waits:
        if isinstance(result, dict) and result and not result.get("skipped"):
            return result
    if drift.get("in_sync") and drift.get("receipt"):
        return verified_from_drift(drift)
    return {"verdict": NOT_VERIFIED, "verified": False, "invocation_id": None, "restarted": bool(restarted),
            "previous_invocation": drift.get("invocation_id"), "observed": None, "source": None, "phases": {},
            "elapsed": 0.0,
            "msg": "%s: not verified (sglang_verify is off, or the verification was skipped); %s; drift check "
                   "before: %s" % (drift.get("host"), "the unit was restarted or started, its new process was not "
                                   "seen" if restarted else "nothing was restarted", drift.get("verdict"))}


def adopted_record(drift):
    """The last-known-good record of a unit nobody verified against an intent yet: what its running
    process showed (config lines, command line, environment) is what a revert must bring back."""
    observed = drift.get("observed") or {}
    if drift.get("config_lines"):
        mode = "required"
    elif drift.get("source") in ("journal", "receipt"):
        mode = "absent"
    else:
        mode = "optional"  # its journal lost the start: nothing to hold a revert to
    effective = drift.get("effective") or {}
    return {
        "invocation_id": drift.get("invocation_id"),
        "observed": observed or None,
        "source": drift.get("source"),
        "version": drift.get("version"),
        "adopted": True,
        "intent": {
            "expect": dict((key, observed[key]) for key in SETTING_KEYS if key in observed),
            "config_line": mode,
            "command": drift.get("command"),
            "environment": effective.get("environment"),
        },
    }


def revert_outcome(results):
    """[restored, restart, wait] results of the role's revert -> what happened, cause first."""
    restored, restart, wait = (list(results) + [{}, {}, {}])[:3]
    restored, restart, wait = restored or {}, restart or {}, wait or {}
    outcome = {"restored": not restored.get("failed") and not restored.get("skipped"),
               "files": restored.get("changed_files") or [], "record": restored.get("record"),
               "invocation_id": wait.get("invocation_id"), "observed": wait.get("observed"),
               "verdict": wait.get("verdict")}
    if restored.get("failed"):
        outcome.update(verdict="not_restored", msg="the last-known-good files could not be put back: %s" % (
            restored.get("msg")))
    elif restart.get("failed"):
        outcome.update(verdict="restart_failed", msg="restarting with the last-known-good unit failed: %s" % (
            restart.get("msg")))
    elif wait.get("skipped") or not wait:
        outcome.update(verdict="not_verified", msg="the reverted process was not verified")
    else:
        outcome["msg"] = wait.get("msg")
    outcome["healthy"] = outcome["verdict"] == "pass"
    return outcome
