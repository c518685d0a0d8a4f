# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A rollout's state as the fleet holds it: which run owns which host, what each host is in the middle of,
who took it out of the router - and the plan of a run made from that, on any controller.

Private to this collection: no compatibility promise. Controller-side and pure: host facts (each host's
lease and record, read by its drift check), the router's workers and the run's request in; a plan out.

The rules (README, "Rollouts that never leave a fleet worse off"):
- a host leased by a live holder of another session is refused, named;
- a run resumes only the same intent: a dead run left hosts mid-change; a re-run resumes it when its
  settings digest matches on every such host and covers them all, else it says what differs and
  refuses (``takeover`` brings those hosts to the new settings instead, named as recovering);
- a run id is never reopened: one the fleet holds no state of is refused;
- router membership comes from the router: the worker to drain is the one the router has for the host;
  a host the collection took out and left out is put back once verified, one taken out by someone else
  is reported and left out.
"""
from __future__ import annotations

import hashlib
import json

try:  # urllib's parser: stdlib everywhere the controller runs
    from urllib.parse import urlsplit
except ImportError:  # pragma: no cover - Python 2
    from urlparse import urlsplit

# A rollout's record steps (the host's record, kind rollout) while the host is being changed.
MID_CHANGE_STEPS = ("draining", "applying", "verified")
# Record statuses that leave nothing for a later run to finish.
SETTLED_STATUSES = ("updated", "recovered", "unchanged (verified)", "updated (not verified)",
                    "unchanged (not verified)", "reverted", "updated, left out of the router",
                    "unchanged (verified), out of the router")


class PlanError(Exception):
    """The run cannot start: what refuses it, in words."""


def intent_digest(prepared):
    """A short digest of what a host must run (intent and rendered files; never the API key's value)."""
    prepared = prepared or {}
    data = json.dumps({"intent": prepared.get("intent"), "unit": prepared.get("unit_text"),
                       "journald": prepared.get("journald_text"),
                       "config_file": (prepared.get("config_file") or {}).get("path")}, sort_keys=True, default=str)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()[:16]


def url_host(url):
    """The host part of a worker URL, without brackets (IPv6)."""
    try:
        return (urlsplit(str(url)).hostname or "").lower()
    except ValueError:
        return ""


def router_url_of(workers, wanted, previous=None, addresses=()):
    """The worker the router has for a host: its intended URL, else the one the collection put in last,
    else the only listed worker at one of the host's addresses. None when the router lists none."""
    listed = [str(worker.get("url") or "").rstrip("/") for worker in workers or []]
    for url in (wanted, previous):
        if url and str(url).rstrip("/") in listed:
            return str(url).rstrip("/")
    hosts = set(str(address).strip("[]").lower() for address in addresses if address)
    found = [url for url in listed if url_host(url) in hosts]
    return found[0] if len(found) == 1 else None


def mid_change(record):
    """A rollout left this host mid-change (drained, changing, or verified but not back)."""
    record = record or {}
    if record.get("kind") != "rollout":
        return False
    return record.get("step") in MID_CHANGE_STEPS or bool(record.get("connection_lost"))


def plan(hosts, facts, request):
    """The run's plan from what the fleet holds.

    ``facts[host]``: ``lease`` (sglang_lease's view: holder, session, live, text; ``gone`` when its holder's
    process is provably gone - plugin_utils/_holder.py), ``record`` (the host's
    record), ``in_sync``, ``digest`` (this run's intent digest for the host), ``listed`` (the worker URL the
    router has for it, None), ``router`` (a router is used) and ``serving`` (its unit was running). ``request``: ``run_id`` (this run's new id),
    ``requested`` (rollout_run_id, or None), ``session``, ``takeover``, ``break_lease``, ``outside``
    ({host: {record, unreachable}} of the group's hosts this run leaves out).

    Returns {run_id, resumed, resumed_from, notes, takeover_runs (the dead runs whose leases this run takes
    over), hosts: {host: {action, reason, drain_url, drained_by, digest}}}
    where action is ``apply`` (change it), ``recover`` (bring it back and into the router), ``keep`` (in
    sync, nothing to do) or ``left_out`` (in sync but out of the router, not by the collection); ``stay_out``
    on an ``apply`` entry: it is changed but not put into the router (it served out of it, not by the collection;
    a host that did not run yet joins).
    Raises PlanError naming what refuses the run.
    """
    session = request.get("session")
    refusals, notes = [], []

    def holder_run(lease):
        return (lease.get("holder") or {}).get("run_id")

    def binds(lease):  # a live lease of another session whose holder is not provably gone (``gone``)
        return bool(lease.get("live")) and lease.get("session") != session and not lease.get("gone")

    def left_by(lease):  # a rollout's lease its run never released (it ended before its finish)
        return bool(lease) and not lease.get("released") and (lease.get("holder") or {}).get("kind") == "rollout" \
            and lease.get("session") != session

    leases = dict((host, facts[host].get("lease") or {}) for host in hosts)
    left = dict((host, facts[host].get("record") or {}) for host in hosts if mid_change(facts[host].get("record")))
    # A run is dead when none of its leases on this run's hosts binds: it expired, or its holder is provably
    # gone. A run still renewing the lease of a host it left mid-change is alive, so its other leases bind
    # too; one whose mid-change hosts' leases all lapsed is dead, and its longer leases of the hosts it had
    # not reached yet are taken over by the run that resumes it (or replaces it).
    dead = set(holder_run(lease) for lease in leases.values() if left_by(lease) and not binds(lease))
    dead |= set(record.get("run_id") for record in left.values())
    for host, record in left.items():
        if binds(leases[host]) and holder_run(leases[host]) == record.get("run_id"):
            dead.discard(record.get("run_id"))
    dead.discard(None)
    for host in hosts:
        lease = leases[host]
        if not binds(lease) or holder_run(lease) in dead:
            continue
        if request.get("break_lease"):
            notes.append("%s: breaking the live lease of %s (rollout_break_lease)" % (host, lease.get("text")))
        else:
            refusals.append("%s is leased by %s" % (host, lease.get("text")))
    if refusals:
        raise PlanError("%s. Wait for that run to end, or stop it; if its controller is gone, its lease expires "
                        "by itself (or re-run with -e rollout_break_lease=true). Nothing was changed." % (
                            "; ".join(refusals)))

    outside = request.get("outside") or {}
    stranded = ["%s (run %s, step %s)" % (host, (fact.get("record") or {}).get("run_id"),
                                          (fact.get("record") or {}).get("step"))
                for host, fact in sorted(outside.items()) if mid_change(fact.get("record"))]
    if stranded:
        raise PlanError("an interrupted rollout left %s mid-change, and this run leaves it out (--limit or "
                        "rollout_hosts): include it, so that the run brings it back first. Nothing was changed." %
                        ", ".join(stranded))
    for host, fact in sorted(outside.items()):
        if fact.get("unreachable"):
            notes.append("%s (of the group, not in this run) could not be read (%s): if an interrupted run left "
                         "it mid-change, the capacity guard counts it out of the router" % (host, fact["unreachable"]))

    # The interrupted runs: dead runs that left leases unreleased or hosts mid-change. Each host they hold
    # says with which settings (the record of a host left mid-change, else the lease).
    held = {}
    for host in hosts:
        if left_by(leases[host]) and holder_run(leases[host]) in dead:
            held.setdefault(holder_run(leases[host]), {})[host] = leases[host].get("intent_digest")
    for host, record in left.items():
        held.setdefault(record.get("run_id"), {})[host] = record.get("intent_digest")
    requested = request.get("requested")
    run_id, resumed_from = request["run_id"], None
    if requested and requested not in held:
        raise PlanError("run %s left no host of this rollout leased or mid-change: a finished or unknown run is "
                        "never reopened. Re-run without rollout_run_id for a new run." % requested)
    candidates = [requested] if requested else sorted(held)
    differ, mid = [], []
    for run in candidates:
        for host, digest in sorted(held[run].items()):
            if digest != facts[host].get("digest"):
                differ.append("%s (left %s by run %s with settings %s; this run's settings are %s)" % (
                    host, "at step %s" % left[host].get("step") if host in left else "leased", run, digest,
                    facts[host].get("digest")))
                if host in left:
                    mid.append(host)
    mid_runs = sorted(set(left[host].get("run_id") for host in left if left[host].get("run_id") in candidates))
    if len(mid_runs) > 1:
        mid.append("several")
        differ.append("hosts left mid-change by %d runs (%s)" % (len(mid_runs), ", ".join(mid_runs)))
    if mid and not request.get("takeover"):
        raise PlanError("an interrupted rollout left hosts mid-change and this run brings other settings: %s. "
                        "Roll out that run's settings again to finish it (it resumes), or re-run with -e "
                        "rollout_takeover=true to bring those hosts to these settings. Nothing was changed." % (
                            "; ".join(differ)))
    if differ:
        notes.append("replacing the interrupted %s: %s" % (", ".join(candidates), "; ".join(differ)))
    elif candidates:
        # one interrupted run with these settings: resumed under its id (several: the newest, the others named)
        run_id = resumed_from = (mid_runs or candidates)[-1]
        ended = any(leases[host].get("gone") and holder_run(leases[host]) == run_id for host in hosts)
        where = sorted(host for host in left if left[host].get("run_id") == run_id)
        notes.append("resuming run %s: %s (%s)" % (
            run_id, "it left %s mid-change" % ", ".join(where) if where else "it ended before its finish",
            "its ansible-playbook on this controller ended" if ended else
            "its controller is gone: its leases expired"))
    dead_runs = sorted(dead)

    planned = {}
    for host in hosts:
        fact = facts[host]
        record = fact.get("record") or {}
        listed = fact.get("listed")
        drained_by = record.get("drained_by") if fact.get("router") else None
        out_by_us = bool(fact.get("router") and drained_by and not listed)
        entry = {"digest": fact.get("digest"), "drain_url": listed, "drained_by": drained_by if out_by_us else None}
        if resumed_from and record.get("kind") == "rollout" and record.get("run_id") == run_id \
                and record.get("status") in SETTLED_STATUSES:
            # done before the run was interrupted: the copy says what the run did to it
            entry["earlier"] = dict((key, record.get(key)) for key in ("status", "old_invocation", "new_invocation"))
        if mid_change(record) or out_by_us:
            # left by a run of this collection: brought to the settings (changed when it differs) and put back
            entry["recovering"] = "left %s by run %s (step %s); brought to the settings and put back" % (
                "out of the router" if out_by_us else "mid-change", record.get("run_id"), record.get("step"))
        if not fact.get("in_sync"):
            entry.update(action="apply", reason="settings differ")
            if fact.get("router") and not listed and not out_by_us and fact.get("serving") and \
                    not entry.get("recovering"):
                # it served, out of the router, and not by this collection: an operator's choice, kept
                entry.update(stay_out=True, reason="settings differ; out of the router and not taken out by this "
                             "collection (an operator's choice?): changed, and left out")
        elif entry.get("recovering"):
            entry.update(action="recover", reason=entry["recovering"])
        elif fact.get("router") and not listed:
            entry.update(action="left_out", reason="in sync, but out of the router and not taken out by this "
                         "collection (an operator's choice?): left out")
        else:
            entry.update(action="keep", reason="in sync")
        if entry["action"] == "left_out" or entry.get("stay_out"):
            notes.append("%s: %s" % (host, entry["reason"]))
        planned[host] = entry
    return {"run_id": run_id, "resumed": resumed_from is not None, "resumed_from": resumed_from, "notes": notes,
            "hosts": planned, "takeover_runs": dead_runs}


def group_plan(planned, groups):
    """A serving group changes as one: when any of its nodes must change (or be recovered), every node is restarted,
    so every node's entry says so, naming the node that needs it. ``planned``: plan()'s hosts; ``groups``: {name:
    {head, followers}} of the run's serving groups. A follower is never in a batch by itself: its head carries it.
    Returns ``planned`` with each node's entry updated (``group``, ``head``)."""
    for name, group in sorted(groups.items()):
        nodes = [group["head"]] + list(group.get("followers") or [])
        changing = [host for host in nodes if planned[host]["action"] in ("apply", "recover")]
        for host in nodes:
            planned[host].update(group=name, head=group["head"])
        if not changing:
            continue
        action = "apply" if any(planned[host]["action"] == "apply" for host in changing) else "recover"
        why = "; ".join("%s: %s" % (host, planned[host]["reason"]) for host in changing)
        for host in nodes:
            entry = planned[host]
            if host not in changing:
                if entry["action"] == "left_out":  # the head an operator took out: changed, and left out
                    entry["stay_out"] = True
                entry.update(action=action, reason="serving group %s restarts as one (%s)" % (name, why))
    return planned


def batch_slot(group, reachable, run_hosts=()):
    """Where the group's batch slot is kept: one lease for the whole group (whichever run, whichever controller),
    held while a batch is out of the router, so two runs over disjoint hosts of one group never take their
    batches out at once past each other's capacity guard. It lives on the group's first host (by name) that
    answered; its name is derived from the group's hosts.

    No anchor (no slot is taken) when no host of the group answered, or when the run holds every host of the
    group (``run_hosts``): then no other run can take a batch of the group out."""
    names = sorted(set(group))
    anchor = next((host for host in names if host in set(reachable)), None)
    if set(names) <= set(run_hosts):
        anchor = None
    digest = hashlib.sha256("\n".join(names).encode("utf-8")).hexdigest()[:12]
    return {"anchor": anchor, "unit": "gpufleet-batch-%s" % digest}


def capacity(group_workers, healthy, leaving, required):
    """Whether the group keeps `required` healthy workers while `leaving` is out.

    ``group_workers`` {url: host} of the group listed in the router; ``healthy`` {url: (ok, how)} from a
    fresh probe of each. Returns (ok, remaining, unhealthy) - unhealthy as ["host url: how", ...]."""
    leaving = set(str(url).rstrip("/") for url in leaving if url)
    good = [url for url in group_workers if healthy.get(url, (False, "not probed"))[0]]
    remaining = [url for url in good if url not in leaving]
    unhealthy = ["%s %s: %s" % (group_workers[url], url, healthy.get(url, (False, "not probed"))[1])
                 for url in sorted(group_workers) if url not in good]
    return len(remaining) >= required, remaining, unhealthy
