# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a rollout does once per batch before the batch's hosts leave the router (controller side).

Private to this collection: no compatibility promise. Used by the action gpufleet.inference.sglang_rollout
(``state=batch`` and ``state=capacity``):

- the leases of the run's hosts outside the batch are renewed once half a lease has passed since their last
  renewal (the prepare phase took them for a lease plus one batch's longest time);
- the group's batch slot is taken - one batch of the group out of the router at a time, whichever run takes it
  out - on the host that keeps it, asked again while another run holds it;
- the capacity guard: the group (every server of the rollout's group, not only the play's) keeps
  ``min_healthy`` healthy workers while the batch is out - membership from the router, health from a fresh
  ``/generate`` of each worker (the router's own health flag lags a stopped server).

Modules on other hosts run through ``nodes`` (plugin_utils/_nodes.py: ``nodes(host).run(module, args)``).
"""
from __future__ import annotations

import math
import os
import threading
import time

from ansible_collections.gpufleet.inference.plugins.module_utils import _fleet
from ansible_collections.gpufleet.inference.plugins.module_utils import _http
from ansible_collections.gpufleet.inference.plugins.module_utils import _rollout as ro
from ansible_collections.gpufleet.inference.plugins.module_utils._probe import generate, generate_verdict
from ansible_collections.gpufleet.inference.plugins.module_utils._router import RouterClient, RouterError

LEASE_MODULE = "gpufleet.inference.sglang_lease"
# How often a batch asks again for the group's batch slot another run holds.
SLOT_POLL_SECONDS = 5.0
# How long one worker's probe may take, and how long the guard waits for every probe of one look.
PROBE_TIMEOUT = 5.0
PROBE_JOIN = 15.0


def renew_waiting(nodes, run, batch, hostvars, template, check_mode=False):
    """Renew the leases of the run's hosts outside `batch` once half a lease has passed since they were last
    renewed; the list of renewals (host, ok, msg). A renewal that fails is left to the host's own step: a lease
    taken over stops the run at that host, before it is touched."""
    if check_mode or not run.get("leases", True):
        return []
    marker = os.path.join(run["run_dir"], ".leases_renewed")  # its time is the last renewal's
    last = float(run.get("leases_taken_at") or 0)
    try:
        last = max(last, os.stat(marker).st_mtime)
    except OSError:
        pass
    if time.time() - last < float(run.get("lease_seconds") or 300) / 2.0:
        return []
    renewed = []
    for host in [name for name in run.get("hosts") or [] if name not in batch]:
        facts = hostvars[host] if host in hostvars else {}
        lease = template(((facts.get("sglang_drift") or {}).get("prepared") or {}).get("lease") or {})
        generation = ((template(facts.get("rollout_lease") or {})).get("lease") or {}).get("generation")
        if not lease or generation is None:
            continue
        result = nodes(host).run(LEASE_MODULE, dict(
            state="held", unit=lease["unit"], directory=lease["directory"], seconds=run["pending_lease_seconds"],
            holder=dict(run["holder"], generation=generation)))
        renewed.append({"host": host, "ok": not result.get("failed"), "msg": result.get("msg")})
    with open(marker, "w"):
        pass
    return renewed


def take_slot(nodes, run):
    """The group's batch slot, held on its anchor host: asked again every SLOT_POLL_SECONDS while another run holds
    it, for at most the run's capacity wait. The lease module's result (``failed`` when it was not taken)."""
    slot = run["slot"]
    args = dict(state="held", unit=slot["unit"], directory=slot["directory"], seconds=run["pending_lease_seconds"],
                holder=run["holder"], takeover_runs=run.get("takeover_runs") or [])
    deadline = time.monotonic() + float(run.get("capacity_wait", 300))
    while True:
        result = nodes(slot["anchor"]).run(LEASE_MODULE, args)
        if not result.get("failed") or result.get("unreachable") or time.monotonic() >= deadline:
            return result
        time.sleep(SLOT_POLL_SECONDS)


def addresses_of(hostvars, host):
    """Where a host can be reached: what a router worker URL of it may name."""
    facts = hostvars.get(host) or {}
    found = [host, facts.get("ansible_host"), facts.get("sglang_host")]
    worker = facts.get("sglang_router_worker_url")
    if worker:
        found.append(_fleet.url_host(worker))
    return [str(item) for item in found if item and str(item) not in ("0.0.0.0", "::", "[::]", "*")]


def probe(url, api_key, timeout):
    """(healthy, why): one /generate of a worker, as the wait judges one."""
    resp = generate(_http.HttpClient(url, api_key or None, True), "ping", 1, timeout)
    ok = generate_verdict(resp)[0]
    return ok, "answers /generate" if ok else "/generate: %s" % resp.describe()


def group_workers(listed, group, hostvars):
    """{worker url: host} of the router's workers that belong to a host of the group."""
    members = {}
    for host in group:
        names = set(address.strip("[]").lower() for address in addresses_of(hostvars, host))
        for worker in listed:
            url = str(worker.get("url") or "").rstrip("/")
            if _fleet.url_host(url) in names:
                members[url] = host
    return members


def probe_all(members, api_key_of):
    """A fresh probe of every worker at once: {url: (healthy, why)}."""
    found = {}

    def one(url, host):
        try:
            found[url] = probe(url, api_key_of(host), PROBE_TIMEOUT)
        except Exception as exc:  # pylint: disable=broad-except  # a probe that breaks is an unhealthy worker
            found[url] = (False, str(exc))
    # daemon threads: a probe stuck past its join must never keep the controller's process from exiting
    threads = [threading.Thread(target=one, args=(url, host), daemon=True) for url, host in members.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PROBE_JOIN)
    return dict((url, found.get(url, (False, "no answer within %.0fs" % PROBE_JOIN))) for url in members)


def required_count(min_healthy, group_size):
    """(spec, count): rollout_min_healthy - a count or "N%" of the group - as a number of workers."""
    spec = ro.parse_count(min_healthy, "rollout_min_healthy")
    if isinstance(spec, str):
        return spec, int(math.ceil(float(spec.rstrip("%")) / 100.0 * group_size))
    return spec, int(spec)


def capacity(args, hostvars, api_key_of):
    """The capacity guard (``args``: router_url, router_api_key, group, leaving, batch, analysis, min_healthy,
    capacity_wait, poll, slot): the check's figures, or RolloutError naming the unhealthy hosts and how after
    waiting capacity_wait seconds for capacity to come back. A slot not taken refuses the batch first."""
    group = list(args.get("group") or [])
    leaving = [str(url).rstrip("/") for url in args.get("leaving") or [] if url]
    analysis = args.get("analysis") or {}
    if analysis.get("isolate") and analysis.get("canary") in (args.get("batch") or []):
        leaving.append(str(analysis["baseline_url"]).rstrip("/"))  # out of the router for the analysis
    required_spec, required = required_count(args.get("min_healthy", 0), len(group))
    wait = float(args.get("capacity_wait", 300))
    poll = float(args.get("poll", 2))
    slot = args.get("slot") or {}
    if slot.get("failed") or slot.get("unreachable"):
        raise ro.RolloutError(
            "capacity guard: the group's batch slot (one batch of the group out of the router at a time, whichever "
            "run) could not be taken within rollout_capacity_wait: %s. Nothing was changed in this batch." % (
                slot.get("msg") or "unreachable"))
    client = RouterClient(args["router_url"], args.get("router_api_key") or None, timeout=10.0)
    started = time.monotonic()
    while True:
        try:
            listed = client.list_workers()
            problem = None
        except RouterError as exc:
            listed, problem = [], str(exc)
        members = group_workers(listed, group, hostvars)
        healthy = probe_all(members, api_key_of)
        ok, remaining, unhealthy = _fleet.capacity(members, healthy, leaving, required)
        if problem is None and ok:
            return {"healthy": sorted(url for url in members if healthy[url][0]), "remaining": len(remaining),
                    "required": required, "group": len(group), "waited": round(time.monotonic() - started, 1)}
        waited = time.monotonic() - started
        if waited >= wait:
            absent = sorted(set(group) - set(members.values()))
            raise ro.RolloutError(
                "capacity guard: taking %s out of the router would leave %d healthy worker(s) of the group's %d "
                "server(s) (a serving group counts once), below rollout_min_healthy %s (%d). Unhealthy (probed now): "
                "%s. Not in the router: %s. Waited %.0fs (rollout_capacity_wait) for capacity to come back; nothing "
                "was changed in this batch." % (", ".join(leaving) or "nothing", len(remaining), len(group),
                                                required_spec, required, "; ".join(unhealthy) or "none",
                                                ", ".join(absent) or "none" if problem is None else problem, waited))
        time.sleep(max(0.0, min(poll, wait - waited)))
