# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Take an SGLang worker out of a real ``sglang-router`` (and put it back), draining it in between.

Private to this collection: no compatibility promise. Stdlib only (HTTP through _http).

What sglang-router 0.3.2 offers (measured against the real binary):

- ``GET /workers`` -> ``{"workers": [{"id", "url", "is_healthy", "load", ...}], "total", "stats"}``;
  only workers whose add job finished are listed.
- ``POST /workers {"url": ..., "api_key": ...}`` -> 202 ``{"worker_id", "location", ...}``. The
  add runs as a background job that retries the worker's ``/health`` (back-off capped at 5 s)
  until ``--worker-startup-timeout-secs`` (default 1800 s), then gives up and drops it.
  ``GET /workers/<id>`` shows ``job_status`` ({"job_type", "status": processing|failed, "message"}).
- ``DELETE /workers/<id>`` -> 202; the removal is a job too. Requests already proxied to the
  worker keep running to completion; new requests go elsewhere.
- Control-plane auth (``--control-plane-api-keys id:name:admin:KEY``): ``Authorization: Bearer KEY``.

The drain signal is the worker's own queue: ``GET /v1/loads`` (``aggregate.total_reqs``, running
plus waiting; the only one left in 0.5.23), ``GET /get_load`` (per-DP ``num_reqs``, 0.5.11) and, when
neither exists, ``/metrics`` (``sglang:num_running_reqs`` + ``sglang:num_queue_reqs``).
"""
from __future__ import annotations

import re
import time

from ansible_collections.gpufleet.inference.plugins.module_utils._http import (
    ERROR,
    HTTP,
    REFUSED,
    HttpClient,
    Response,
    open_url_transport,
)


def http_result(status=None, text="", error=None):
    """A Response built by hand (fake transports): a status, or no answer and why."""
    if status is not None:
        return Response(HTTP, status, text)
    return Response(REFUSED if "refused" in str(error).lower() else ERROR, error=error)


class RouterError(Exception):
    """What was being done and what was seen; the module fails with this text."""


def normalize_url(url):
    return (url or "").strip().rstrip("/")


# --------------------------------------------------------------------------- router API

class RouterClient(object):
    def __init__(self, router_url, api_key=None, transport=None, timeout=10.0):
        self.base = normalize_url(router_url)
        self.http = HttpClient(self.base, api_key, transport=transport or open_url_transport(), timeout=timeout)

    def _call(self, method, path, payload=None):
        return self.http.request(method, path, payload)

    def list_workers(self):
        resp = self._call("GET", "/workers")
        data = resp.json()
        if resp.status != 200 or not isinstance(data, dict) or not isinstance(data.get("workers"), list):
            hint = ""
            if resp.status == 401:
                hint = " (the router wants a control-plane key: set api_key)"
            raise RouterError("listing the router's workers at %s/workers: %s%s" % (self.base, resp.describe(), hint))
        return [summarize_worker(w) for w in data["workers"] if isinstance(w, dict)]

    def add(self, worker_url, worker_api_key=None):
        payload = {"url": worker_url}
        if worker_api_key:
            payload["api_key"] = worker_api_key
        resp = self._call("POST", "/workers", payload)
        data = resp.json()
        if resp.status not in (200, 201, 202):
            raise RouterError("adding %s to the router %s: %s" % (worker_url, self.base, resp.describe()))
        return (data or {}).get("worker_id") if isinstance(data, dict) else None

    def remove(self, worker_id, worker_url):
        resp = self._call("DELETE", "/workers/%s" % worker_id)
        if resp.status == 404:
            return False  # already gone: someone else removed it between our list and delete
        if resp.status not in (200, 202, 204):
            raise RouterError("removing %s (id %s) from the router %s: %s"
                              % (worker_url, worker_id, self.base, resp.describe()))
        return True

    def job_status(self, worker_id):
        """The background job of a worker id ({} when unknown or not reported)."""
        if not worker_id:
            return {}
        data = self._call("GET", "/workers/%s" % worker_id).json()
        if isinstance(data, dict) and isinstance(data.get("job_status"), dict):
            return data["job_status"]
        return {}


def summarize_worker(entry):
    return {
        "url": normalize_url(entry.get("url")),
        "id": entry.get("id"),
        "healthy": bool(entry.get("is_healthy")),
        "model_id": entry.get("model_id"),
        "worker_type": entry.get("worker_type"),
        "load": entry.get("load"),
    }


def find_worker(workers, worker_url):
    wanted = normalize_url(worker_url)
    for worker in workers:
        if worker["url"] == wanted:
            return worker
    return None


def worker_urls(workers):
    return sorted(w["url"] for w in workers)


# --------------------------------------------------------------------------- drain signal

def parse_loads(payload):
    """In-flight requests (running + waiting) from /v1/loads or /get_load JSON; None if unknown.

    Real /v1/loads: {"loads": [{"num_running_reqs", "num_waiting_reqs", ...}], "aggregate":
    {"total_reqs", ...}}. /get_load (and the simulator's /v1/loads): [{"num_reqs", ...}] per DP
    rank where num_reqs already includes the waiting ones.
    """
    if isinstance(payload, dict):
        aggregate = payload.get("aggregate")
        if isinstance(aggregate, dict) and isinstance(aggregate.get("total_reqs"), int):
            return aggregate["total_reqs"]
        loads = payload.get("loads")
        if isinstance(loads, list):
            total = 0
            for rank in loads:
                if not isinstance(rank, dict) or "num_running_reqs" not in rank:
                    return None
                total += int(rank.get("num_running_reqs") or 0) + int(rank.get("num_waiting_reqs") or 0)
            return total
        return None
    if isinstance(payload, list) and payload:
        total = 0
        for rank in payload:
            if not isinstance(rank, dict) or "num_reqs" not in rank:
                return None
            total += int(rank.get("num_reqs") or 0)
        return total
    return None


_METRIC = re.compile(r"^sglang[:_](num_running_reqs|num_queue_reqs)(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


def parse_metrics(text):
    """Running + queued requests from Prometheus text (summed over ranks); None if absent."""
    found = _METRIC.findall(text or "")
    if not found:
        return None
    return int(round(sum(float(value) for dummy, value in found)))


class WorkerLoad(object):
    """Reads how many requests a worker still holds, remembering which endpoint answered."""

    SIGNALS = ("/v1/loads", "/get_load", "/metrics")

    def __init__(self, worker_url, api_key=None, transport=None, timeout=5.0):
        self.base = normalize_url(worker_url)
        self.http = HttpClient(self.base, api_key, transport=transport or open_url_transport(), timeout=timeout)
        self.signal = None

    def read(self):
        """(in_flight, signal). in_flight 0 with signal "refused" when nothing answers the port.

        Raises RouterError when the worker answers but none of the endpoints gives a count.
        """
        tried = []
        refused = []
        for path in ([self.signal] if self.signal else self.SIGNALS):
            resp = self.http.get(path)
            if resp.status is None:
                # Nothing listens any more: a stopped server holds no requests.
                if resp.kind == REFUSED or "refused" in str(resp.error).lower():
                    return 0, "refused"
                raise RouterError("reading the load of %s%s: %s" % (self.base, path, resp.describe()))
            if resp.status == 401:
                # The key is missing or not this process's (a rotation): /metrics is open without one.
                refused.append(path)
                continue
            count = None
            if resp.status == 200:
                count = parse_metrics(resp.text) if path == "/metrics" else parse_loads(resp.json())
            if count is not None:
                self.signal = path
                return count, path
            tried.append("%s: %s" % (path, resp.describe()[:120]))
        self.signal = None
        if refused:
            raise RouterError(
                "reading the load of %s: HTTP 401 on %s; the worker runs with --api-key and %s. Set worker_api_key "
                "to the key the RUNNING process has, or run it with --enable-metrics (/metrics needs no key)%s" % (
                    self.base, ", ".join(refused),
                    "this key was refused" if self.http.api_key else "no worker_api_key was given",
                    " (tried %s)" % "; ".join(tried) if tried else ""))
        raise RouterError("no in-flight request count from %s (tried %s)" % (self.base, "; ".join(tried)))


# --------------------------------------------------------------------------- the two states

class WorkerManager(object):
    """ensure_present / ensure_absent with waits on an injectable clock.

    Waits poll fast first and back off: the router lists a removed or added worker a few
    milliseconds after the call, so a fixed half-second poll would put half a second on a host's
    time out of service for nothing. ``poll`` is the longest gap; ``first_poll`` the first one.
    """

    def __init__(self, router, load=None, clock=None, sleep=None, poll=0.5, first_poll=0.05, confirm_gap=0.2):
        self.router = router
        self.load = load
        self.clock = clock or time.monotonic
        self.sleep = sleep or time.sleep
        self.poll = poll
        self.first_poll = min(first_poll, poll)
        # The drain's two zero readings are at least this far apart (a request between the
        # router and the scheduler is in transit for milliseconds).
        self.confirm_gap = confirm_gap

    def _wait(self, timeout, predicate, first_poll=None):
        """Check first, then sleep: returns the predicate's last truthy value or None on timeout."""
        deadline = self.clock() + timeout
        gap = self.first_poll if first_poll is None else first_poll
        while True:
            value = predicate()
            if value:
                return value
            if self.clock() >= deadline:
                return None
            self.sleep(gap)
            gap = min(gap * 2, self.poll)

    def ensure_present(self, worker_url, worker_api_key=None, wait_healthy=True, timeout=300, check_mode=False):
        worker_url = normalize_url(worker_url)
        before = self.router.list_workers()
        entry = find_worker(before, worker_url)
        result = {"changed": entry is None, "before": before, "drained": False, "drain_seconds": 0.0}
        if check_mode:
            after = list(before)
            if entry is None:
                after.append({"url": worker_url, "id": None, "healthy": False, "model_id": None,
                              "worker_type": None, "load": None})
            result["workers"] = after
            return result
        worker_id = entry["id"] if entry else self.router.add(worker_url, worker_api_key)
        state = {"workers": before}

        def ready():
            state["workers"] = self.router.list_workers()
            found = find_worker(state["workers"], worker_url)
            if found is None:
                job = self.router.job_status(worker_id)
                if job.get("status") == "failed" and job.get("job_type") == "AddWorker":
                    raise RouterError("the router gave up adding %s: %s" % (worker_url, job.get("message")))
                return False
            return found["healthy"] or not wait_healthy

        started = self.clock()
        if entry is None or wait_healthy:
            if not self._wait(timeout, ready):
                found = find_worker(state["workers"], worker_url)
                seen = ("listed but not healthy" if found else
                        "not listed; add job: %s (the router keeps retrying it until its "
                        "--worker-startup-timeout-secs)" % (self.router.job_status(worker_id) or "unknown"))
                raise RouterError("%s did not become %s in the router within %ss: %s"
                                  % (worker_url, "healthy" if wait_healthy else "listed", timeout, seen))
        result["workers"] = state["workers"]
        result["wait_seconds"] = round(self.clock() - started, 3)
        return result

    def ensure_absent(self, worker_url, drain_timeout=300, timeout=60, check_mode=False):
        worker_url = normalize_url(worker_url)
        before = self.router.list_workers()
        entry = find_worker(before, worker_url)
        result = {"changed": entry is not None, "before": before, "drained": False, "drain_seconds": 0.0}
        if check_mode:
            result["workers"] = [w for w in before if w["url"] != worker_url]
            return result
        state = {"workers": before}
        if entry is not None and self.load is not None and drain_timeout > 0:
            # The drain must be able to count the worker's requests: find out BEFORE the router forgets
            # the worker (and the key it was added with). A worker that refuses the key raises here,
            # with the router unchanged.
            self.load.read()
        if entry is not None:
            self.router.remove(entry["id"], worker_url)

            def gone():
                state["workers"] = self.router.list_workers()
                return find_worker(state["workers"], worker_url) is None

            if not self._wait(timeout, gone):
                job = self.router.job_status(entry["id"])
                raise RouterError("%s is still listed by the router %ss after its removal; job: %s"
                                  % (worker_url, timeout, job or "unknown"))
        result["workers"] = state["workers"]
        if self.load is not None:
            result.update(self.drain(drain_timeout))
        return result

    def drain(self, drain_timeout):
        """Wait for two zero readings in a row (one request may be between router and scheduler)."""
        started = self.clock()
        seen = {"zeros": 0, "last": None, "signal": None}

        def empty():
            count, signal = self.load.read()
            seen["last"], seen["signal"] = count, signal
            seen["zeros"] = seen["zeros"] + 1 if count == 0 else 0
            # A port nobody answers holds nothing; otherwise confirm the zero once.
            return signal == "refused" or seen["zeros"] >= 2

        if drain_timeout > 0:
            drained = bool(self._wait(drain_timeout, empty, first_poll=max(self.first_poll, self.confirm_gap)))
        else:  # no waiting: one reading, reported as it is
            empty()
            drained = seen["last"] == 0
        elapsed = round(self.clock() - started, 3)
        if drain_timeout > 0 and not drained:
            raise RouterError("%s was removed from the router but still has %s in-flight request(s) after %ss "
                              "(signal %s)" % (self.load.base, seen["last"], drain_timeout, seen["signal"]))
        return {"drained": drained, "drain_seconds": elapsed, "in_flight": seen["last"], "drain_signal": seen["signal"]}


# --------------------------------------------------------------------------- one change of a worker

def worker_change(params, check_mode, transport=None, clock=None, sleep=None):
    """sglang_router_worker's work (params as its arguments): put a worker into the router or take it out
    and drain it. Returns the result dict or raises RouterError."""
    transport = transport or open_url_transport(params["validate_certs"])
    router = RouterClient(params["router_url"], params.get("api_key"), transport, params["request_timeout"])
    load = None
    if params["state"] == "absent":
        load = WorkerLoad(params["worker_url"], params.get("worker_api_key"), transport, params["request_timeout"])
    manager = WorkerManager(router, load, clock=clock, sleep=sleep)
    if params["state"] == "present":
        result = manager.ensure_present(params["worker_url"], params.get("worker_api_key"),
                                        params["wait_healthy"], params["timeout"], check_mode)
    else:
        result = manager.ensure_absent(params["worker_url"], params["drain_timeout"], params["timeout"], check_mode)
    before = result.pop("before")
    result["diff"] = {
        "before": "\n".join(worker_urls(before)) + "\n",
        "after": "\n".join(worker_urls(result["workers"])) + "\n",
    }
    return result
