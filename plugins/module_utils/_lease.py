# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who is changing this host, and what the last change did: the lease and the record, kept ON the host.

Private to this collection: no compatibility promise. Host-side: pure decisions plus the file I/O of
one directory (``sglang_fleet_dir``), next to the last-known-good copies and the receipts.

Every writer of the collection - a rollout, a sweep, the role's apply and revert - holds the host's
lease while it changes the host. A lease names its holder (kind, run id, the controller's session,
controller, user, AWX job), when it was taken, renewed, and when it expires. A holder is dead when its
lease expired, never because it runs on another machine: any controller can judge it, and a job that
vanished (an AWX container) leaves a lease that expires by itself.

A lease is ours when its session and generation are the ones we took: a renewal of a lease that
someone took over - even one they released since - fails, so a run that lost a host stops before it
touches it. The record says what the last writer did to the host (run id, intent digest, steps, status,
invocations, whether it took the host out of the router), so any controller can rebuild a run's state
from the hosts.

Times are the host's clock (time.time()): a lease is written and judged on the same clock.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time

from ansible_collections.gpufleet.inference.plugins.module_utils._files import write_json

LEASE_VERSION = 1
HISTORY = 5  # finished runs kept in a host's record


class LeaseError(Exception):
    """The lease is held by a live holder, or ours was taken over."""


def paths(directory, unit):
    return {"lease": os.path.join(directory, "%s.lease.json" % unit),
            "record": os.path.join(directory, "%s.record.json" % unit),
            "lock": os.path.join(directory, ".%s.lock" % unit)}


@contextlib.contextmanager
def locked(directory, unit):
    """One writer of the host's lease and record at a time (every writer runs on the host)."""
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    with open(paths(directory, unit)["lock"], "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read(path):
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (IOError, OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def live(lease, now):
    """Whether the lease binds: taken, not released, not expired."""
    return bool(lease) and not lease.get("released") and float(lease.get("expires") or 0) > now


def ours(lease, holder):
    return bool(lease) and lease.get("session") == holder.get("session") and \
        lease.get("generation") == holder.get("generation")


def describe(lease, now):
    """The holder in words: which run of which kind, from where, by whom, since when, until when."""
    if not lease:
        return "nobody"
    holder = lease.get("holder") or {}
    left = float(lease.get("expires") or 0) - now
    state = "released" if lease.get("released") else (
        "expires in %ds" % left if left > 0 else "expired %ds ago" % -left)
    job = " (AWX job %s)" % holder["job"] if holder.get("job") else ""
    return "%s %s on %s by %s%s, taken %s, renewed %s, %s" % (
        holder.get("kind") or "?", holder.get("run_id") or "?", holder.get("controller") or "?",
        holder.get("user") or "?", job, _iso(lease.get("acquired")), _iso(lease.get("renewed")), state)


def _iso(stamp):
    if not stamp:
        return "?"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(stamp)))


def decide(lease, holder, now, force=False, takeover_runs=()):
    """What taking `lease` for `holder` means: ("renew" | "acquire" | "take_over" | "break", note).

    ``holder`` has ``session`` (one ansible-playbook run) and ``generation`` (the lease it took, or None
    when it takes one now). ``takeover_runs``: runs whose controller is gone (the plan found the hosts
    they left mid-change with their leases expired) - their other leases are taken over by the run that
    resumes them.
    Raises LeaseError when a live lease is someone else's, or when the holder had a lease that is no
    longer its own (taken over since)."""
    if holder.get("generation") is not None:
        if ours(lease, holder) and not lease.get("released"):
            return "renew", None
        raise LeaseError("this run's lease of the host was taken over: it is now held by %s. The host was not "
                         "touched by this run after that" % describe(lease, now))
    if not lease or lease.get("released"):
        return "acquire", None
    if not live(lease, now):
        return "take_over", "took over an expired lease (its holder is gone): %s" % describe(lease, now)
    if lease.get("session") == holder.get("session"):
        return "renew", None
    if (lease.get("holder") or {}).get("run_id") in (takeover_runs or ()):
        return "take_over", "took over the lease of run %s, whose controller is gone: %s" % (
            (lease.get("holder") or {}).get("run_id"), describe(lease, now))
    if force:
        return "break", "broke the live lease of %s" % describe(lease, now)
    raise LeaseError("the host is leased by %s" % describe(lease, now))


def take(lease, holder, now, seconds, intent_digest=None, force=False, takeover_runs=()):
    """The lease after `holder` takes (or renews) it, and a note; raises LeaseError (see decide)."""
    action, note = decide(lease, holder, now, force, takeover_runs)
    if action == "renew":
        new = dict(lease, renewed=now, expires=now + seconds, seconds=seconds)
        if intent_digest:
            new["intent_digest"] = intent_digest
        return new, action, note
    generation = int((lease or {}).get("generation") or 0) + 1
    new = {"version": LEASE_VERSION, "holder": _holder_fields(holder), "session": holder.get("session"),
           "generation": generation, "acquired": now, "renewed": now, "expires": now + seconds, "seconds": seconds,
           "intent_digest": intent_digest, "released": False}
    if action in ("take_over", "break"):
        new["previous"] = dict((key, lease.get(key)) for key in ("holder", "acquired", "renewed", "expires"))
    return new, action, note


def _holder_fields(holder):
    return dict((key, holder.get(key)) for key in ("kind", "run_id", "controller", "user", "job", "process"))


def release(lease, holder, now):
    """The lease released by its holder; (lease, released?). Someone else's lease is left as it is."""
    if not lease or lease.get("released") or lease.get("session") != holder.get("session"):
        return lease, False
    return dict(lease, released=True, released_at=now, expires=now), True


def merge_record(record, update, now):
    """The host's record with one step of a writer merged: a new run moves the previous one to history."""
    record = dict(record or {})
    update = dict(update or {})
    run_id = update.get("run_id")
    if record and run_id and record.get("run_id") not in (None, run_id):
        previous = dict((key, record.get(key)) for key in (
            "run_id", "kind", "status", "step", "intent_digest", "new_invocation", "updated"))
        history = [previous] + list(record.get("history") or [])
        record = {"history": history[:HISTORY]}
    steps = list(record.get("steps") or [])
    if update.get("step"):
        steps.append({"step": update["step"], "status": update.get("status"), "at": now})
    record.update(update)
    record["steps"] = steps
    record["updated"] = now
    return record


def view(lease, now):
    """The lease as a result shows it: its fields, whether it binds, how long it has left."""
    if not lease:
        return None
    shown = dict(lease)
    shown["live"] = live(lease, now)
    shown["expires_in"] = round(float(lease.get("expires") or 0) - now, 1)
    shown["text"] = describe(lease, now)
    return shown


def write(path, data):
    write_json(path, data, mode=0o644)


# The holder's fields as a module's argument spec reads them (sglang_lease's holder, and the lease
# option of the modules a step of a writer runs).
HOLDER_SPEC = dict(kind=dict(type="str"), run_id=dict(type="str"), session=dict(type="str"),
                   generation=dict(type="int"), controller=dict(type="str"), user=dict(type="str"),
                   job=dict(type="str"), process=dict(type="dict"))
# The lease option of a module that changes a host for a writer holding its lease (sglang_unit_files,
# sglang_last_good): the lease is renewed and the step recorded before the module changes anything.
RIDER_SPEC = dict(unit=dict(type="str", required=True), directory=dict(type="path", required=True),
                  holder=dict(type="dict", required=True),
                  seconds=dict(type="int", default=300), record=dict(type="dict"))


class Refused(LeaseError):
    """The lease could not be held: ``lease`` and ``record`` are what the host has (as results show them)."""

    def __init__(self, message, lease, record):
        super(Refused, self).__init__(message)
        self.lease = lease
        self.record = record


def hold(directory, unit, holder, seconds, now, record=None, check_mode=False, intent_digest=None, force=False,
         takeover_runs=()):
    """Take or renew the lease and merge `record` into the host's record, under the lock: the result
    (changed, action, lease, record, note). Raises Refused. In check mode it decides and writes nothing
    (without the lock: taking it would create the lock file)."""
    files = paths(directory, unit)
    with locked(directory, unit) if not check_mode else contextlib.nullcontext():
        lease, kept = read(files["lease"]), read(files["record"])
        try:
            new, action, note = take(lease, holder, now, seconds, intent_digest, force, takeover_runs)
        except LeaseError as exc:
            raise Refused(str(exc), view(lease, now), kept)
        if record:
            kept = merge_record(kept, record, now)
        changed = new != lease or bool(record)
        if changed and not check_mode:
            if new != lease:
                write(files["lease"], new)
            if record:
                write(files["record"], kept)
    result = dict(changed=changed, action=action, lease=view(new, now), record=kept)
    if note:
        result["note"] = note
    return result


def ride(module):
    """A module's ``lease`` option (RIDER_SPEC), before it changes anything: the caller's lease renewed and
    the step's record written, or the module fails - nothing changed - with ``action: refused``. Returns
    what the module's result adds: ``{"lease": the lease as results show it}``, or {} without the option."""
    params = module.params.get("lease")
    if not params:
        return {}
    if params["holder"].get("generation") is None:
        module.fail_json(msg="lease.holder.generation is needed: the lease option renews a lease its holder took "
                         "(gpufleet.inference.sglang_lease takes one). Nothing was changed.", changed=False)
    try:
        held = hold(params["directory"], params["unit"], params["holder"], params["seconds"], time.time(),
                    record=params.get("record"), check_mode=module.check_mode)
    except Refused as exc:
        module.fail_json(msg="%s: %s. Nothing was changed." % (params["unit"], exc), action="refused",
                         lease=exc.lease, changed=False)
    return {"lease": held["lease"]}
