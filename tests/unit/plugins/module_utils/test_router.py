# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_router: the router's worker API, the drain signal and the present/absent state machine (fake HTTP)."""
import json

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._router import (
    http_result,
    RouterClient,
    RouterError,
    WorkerLoad,
    WorkerManager,
    parse_loads,
    parse_metrics,
)

ROUTER = "http://router:30080"
W1 = "http://10.0.0.11:30000"
W2 = "http://10.0.0.12:30000"


class FakeClock(object):
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class FakeRouter(object):
    """The subset of sglang-router 0.3.2's control plane the module uses, as observed on the real one."""

    def __init__(self, clock, workers=(), add_delay=1.0, api_key=None):
        self.clock = clock
        self.workers = dict((url, {"id": "id-%s" % url[-8:-6], "url": url, "is_healthy": True, "load": 0,
                                   "model_id": "m", "worker_type": "regular"}) for url in workers)
        self.pending = {}  # url -> (ready_at, fail)
        self.add_delay = add_delay
        self.api_key = api_key
        self.calls = []
        self.answering = set(workers)  # worker URLs whose /health answers
        self.loads = {}  # worker url -> list of in-flight counts, one per read
        self.load_paths = {}  # worker url -> the endpoint that exists ("/v1/loads", "/get_load", "/metrics")

    def _tick(self):
        for url, (ready_at, fail) in list(self.pending.items()):
            if self.clock() >= ready_at and url in self.answering:
                del self.pending[url]
                self.workers[url] = {"id": "id-%s" % url[-8:-6], "url": url, "is_healthy": True, "load": 0,
                                     "model_id": "m", "worker_type": "regular"}

    def __call__(self, method, url, payload, headers, timeout):
        self.calls.append((method, url, payload, headers.get("Authorization")))
        if url.startswith(ROUTER):
            return self.router(method, url[len(ROUTER):], payload, headers)
        return self.worker(method, url, headers)

    def router(self, method, path, payload, headers):
        if self.api_key and headers.get("Authorization") != "Bearer %s" % self.api_key:
            return http_result(401, "Missing or invalid Authorization header")
        self._tick()
        if method == "GET" and path == "/workers":
            return http_result(200, json.dumps({"workers": list(self.workers.values()), "total": len(self.workers)}))
        if method == "POST" and path == "/workers":
            url = payload["url"]
            self.pending.setdefault(url, (self.clock() + self.add_delay, False))
            return http_result(202, json.dumps({"status": "accepted", "worker_id": "id-%s" % url[-8:-6]}))
        if path.startswith("/workers/"):
            wid = path[len("/workers/"):]
            for url, entry in list(self.workers.items()):
                if entry["id"] == wid:
                    if method == "DELETE":
                        del self.workers[url]
                        return http_result(202, json.dumps({"status": "accepted"}))
                    return http_result(200, json.dumps(entry))
            for url in self.pending:
                if "id-%s" % url[-8:-6] == wid and method == "GET":
                    return http_result(200, json.dumps({"id": wid, "url": url, "job_status": {
                        "job_type": "AddWorker", "status": "processing", "message": None}}))
            return http_result(404, json.dumps({"error": "Worker %s not found" % wid}))
        return http_result(404, "")

    def worker(self, method, url, headers):
        base, path = url.rsplit(":30000", 1)[0] + ":30000", url.rsplit(":30000", 1)[1]
        if base not in self.answering:
            return http_result(error="[Errno 111] Connection refused")
        exists = self.load_paths.get(base, "/v1/loads")
        if path != exists:
            return http_result(404, '{"detail": "Not Found"}')
        queue = self.loads.get(base, [0])
        count = queue.pop(0) if len(queue) > 1 else queue[0]
        if path == "/v1/loads":
            return http_result(200, json.dumps({"loads": [{"num_running_reqs": count, "num_waiting_reqs": 0}],
                                               "aggregate": {"total_reqs": count}}))
        if path == "/get_load":
            return http_result(200, json.dumps([{"dp_rank": 0, "num_reqs": count, "num_waiting_reqs": 0}]))
        return http_result(200, 'sglang:num_running_reqs{tp_rank="0"} %d\nsglang:num_queue_reqs{tp_rank="0"} 0\n' % count)


def manager(fake, clock, worker=W1, api_key=None):
    router = RouterClient(ROUTER, api_key, fake)
    return WorkerManager(router, WorkerLoad(worker, None, fake), clock=clock, sleep=clock.sleep, poll=0.5)


# ---------------------------------------------------------------- parsing

def test_parse_loads_real_v1_loads_uses_the_aggregate():
    assert parse_loads({"loads": [], "aggregate": {"total_reqs": 3}}) == 3


def test_parse_loads_v1_loads_without_aggregate_sums_running_and_waiting():
    payload = {"loads": [{"num_running_reqs": 2, "num_waiting_reqs": 1}, {"num_running_reqs": 0, "num_waiting_reqs": 4}]}
    assert parse_loads(payload) == 7


def test_parse_loads_get_load_list_sums_dp_ranks():
    assert parse_loads([{"dp_rank": 0, "num_reqs": 2}, {"dp_rank": 1, "num_reqs": 5}]) == 7


@pytest.mark.parametrize("payload", [None, {}, [], [{"dp_rank": 0}], {"loads": [{"x": 1}]}, "text"])
def test_parse_loads_unknown_shapes_give_none(payload):
    assert parse_loads(payload) is None


def test_parse_metrics_sums_running_and_queued_over_ranks():
    text = ("# HELP sglang:num_running_reqs x\nsglang:num_running_reqs{tp_rank=\"0\"} 2.0\n"
            "sglang:num_running_reqs{tp_rank=\"1\"} 1\nsglang:num_queue_reqs{tp_rank=\"0\"} 3\n"
            "sglang:generation_tokens_total{tp_rank=\"0\"} 99\n")
    assert parse_metrics(text) == 6
    assert parse_metrics("sglang:generation_tokens_total 1\n") is None


# ---------------------------------------------------------------- load signal fallbacks

@pytest.mark.parametrize("path", ["/v1/loads", "/get_load", "/metrics"])
def test_worker_load_falls_back_to_the_endpoint_that_exists_and_remembers_it(path):
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W1])
    fake.load_paths[W1] = path
    fake.loads[W1] = [4, 4]
    load = WorkerLoad(W1, None, fake)
    assert load.read() == (4, path)
    calls = len(fake.calls)
    assert load.read() == (4, path)
    assert len(fake.calls) == calls + 1


def test_worker_load_refused_counts_as_empty():
    fake = FakeRouter(FakeClock())
    assert WorkerLoad(W1, None, fake).read() == (0, "refused")


def test_worker_load_401_asks_for_the_worker_key():
    def transport(method, url, payload, headers, timeout):
        return http_result(401, '{"error": "Unauthorized"}')
    with pytest.raises(RouterError, match="HTTP 401 on /v1/loads, /get_load, /metrics.*no worker_api_key was given"):
        WorkerLoad(W1, None, transport).read()
    with pytest.raises(RouterError, match="this key was refused. Set worker_api_key to the key the RUNNING"):
        WorkerLoad(W1, "rotated", transport).read()


def test_worker_load_refused_with_a_key_reads_the_open_metrics():
    # A key the running process does not have (a rotation): /metrics needs none.
    seen = []

    def transport(method, url, payload, headers, timeout):
        seen.append((url.rsplit("/", 1)[-1], headers.get("Authorization")))
        if url.endswith("/metrics"):
            return http_result(200, 'sglang:num_running_reqs{tp_rank="0"} 2\nsglang:num_queue_reqs{tp_rank="0"} 1\n')
        return http_result(401, '{"error": "Unauthorized"}')
    assert WorkerLoad(W1, "new-key", transport).read() == (3, "/metrics")
    assert [name for name, dummy in seen] == ["loads", "get_load", "metrics"]
    assert seen[0][1] == "Bearer new-key"


def test_worker_load_without_any_count_fails_naming_what_was_tried():
    def transport(method, url, payload, headers, timeout):
        return http_result(404, "nope")
    with pytest.raises(RouterError, match="/v1/loads.*/get_load.*/metrics"):
        WorkerLoad(W1, None, transport).read()


# ---------------------------------------------------------------- absent

def test_absent_removes_then_waits_for_two_zero_readings():
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W1, W2])
    fake.loads[W1] = [3, 3, 2, 1, 0, 0]  # the first: read before the removal (the drain can count)
    result = manager(fake, clock).ensure_absent(W1, drain_timeout=60)
    assert result["changed"] is True
    assert [w["url"] for w in result["workers"]] == [W2]
    assert result["drained"] is True and result["in_flight"] == 0
    assert result["drain_signal"] == "/v1/loads"
    # 5 readings; the gaps start at the confirmation gap (0.2 s) and double up to poll (0.5 s)
    assert result["drain_seconds"] == pytest.approx(0.2 + 0.4 + 0.5 + 0.5)
    deletes = [c for c in fake.calls if c[0] == "DELETE"]
    assert deletes == [("DELETE", ROUTER + "/workers/id-11", None, None)]


def test_absent_leaves_the_router_untouched_when_the_workers_load_cannot_be_read():
    # e.g. a worker that refuses the key (a key rotation): removing it first would lose the key the
    # router calls it with; nothing is removed and the error says why.
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W1, W2])
    fake.load_paths[W1] = "/nowhere"
    with pytest.raises(RouterError, match="no in-flight request count from"):
        manager(fake, clock).ensure_absent(W1, drain_timeout=60)
    assert not [c for c in fake.calls if c[0] == "DELETE"] and W1 in fake.workers


def test_absent_is_idempotent_but_still_reports_the_drain():
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W2])
    fake.answering.add(W1)
    result = manager(fake, clock).ensure_absent(W1, drain_timeout=60)
    assert result["changed"] is False
    assert result["drained"] is True
    assert not [c for c in fake.calls if c[0] == "DELETE"]


def test_absent_drain_timeout_fails_with_the_last_count():
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W1])
    fake.loads[W1] = [2]
    with pytest.raises(RouterError, match=r"still has 2 in-flight request\(s\) after 5s"):
        manager(fake, clock).ensure_absent(W1, drain_timeout=5)
    assert W1 not in fake.workers  # the removal happened; only the drain failed


def test_absent_drain_timeout_zero_reads_once_and_never_fails():
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W1])
    fake.loads[W1] = [2]
    result = manager(fake, clock).ensure_absent(W1, drain_timeout=0)
    assert result["drained"] is False and result["in_flight"] == 2


def test_absent_check_mode_changes_nothing():
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W1, W2])
    result = manager(fake, clock).ensure_absent(W1, drain_timeout=60, check_mode=True)
    assert result["changed"] is True and [w["url"] for w in result["workers"]] == [W2]
    assert result["drained"] is False
    assert [c[0] for c in fake.calls] == ["GET"]
    assert W1 in fake.workers


# ---------------------------------------------------------------- present

def test_present_adds_and_waits_until_listed_healthy():
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W2], add_delay=2.0)
    fake.answering.add(W1)
    result = manager(fake, clock).ensure_present(W1 + "/", timeout=30)
    assert result["changed"] is True
    assert sorted(w["url"] for w in result["workers"]) == [W1, W2]
    # polls back off from 0.05 s to 0.5 s: 0.05 0.15 0.35 0.75 1.25 1.75 2.25 -> first at or after 2.0
    assert result["wait_seconds"] == pytest.approx(2.25)
    posts = [c for c in fake.calls if c[0] == "POST"]
    assert posts == [("POST", ROUTER + "/workers", {"url": W1}, None)]


def test_a_worker_listed_at_once_costs_one_short_poll_not_half_a_second():
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W2], add_delay=0.01)
    fake.answering.add(W1)
    result = manager(fake, clock).ensure_present(W1, timeout=30)
    assert result["wait_seconds"] == pytest.approx(0.05)


def test_the_drain_confirms_a_zero_after_the_confirmation_gap():
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W1])
    fake.loads[W1] = [0, 0]
    result = manager(fake, clock).ensure_absent(W1, drain_timeout=60)
    assert result["drained"] is True
    assert result["drain_seconds"] == pytest.approx(0.2)


def test_present_sends_the_worker_key_to_the_router():
    clock = FakeClock()
    fake = FakeRouter(clock, add_delay=0)
    fake.answering.add(W1)
    manager(fake, clock).ensure_present(W1, worker_api_key="wk", timeout=5)
    assert [c[2] for c in fake.calls if c[0] == "POST"] == [{"url": W1, "api_key": "wk"}]


def test_present_is_idempotent():
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W1])
    result = manager(fake, clock).ensure_present(W1, timeout=30)
    assert result["changed"] is False
    assert not [c for c in fake.calls if c[0] == "POST"]


def test_present_timeout_reports_the_pending_job():
    clock = FakeClock()
    fake = FakeRouter(clock)  # the worker never answers
    with pytest.raises(RouterError, match="did not become healthy .* within 10s: not listed; add job: .*processing"):
        manager(fake, clock).ensure_present(W1, timeout=10)


def test_present_fails_at_once_when_the_router_gives_up():
    clock = FakeClock()
    fake = FakeRouter(clock)

    def transport(method, url, payload, headers, timeout):
        if method == "GET" and url.endswith("/workers/id-11"):
            status = {"job_type": "AddWorker", "status": "failed", "message": "health checks failed"}
            return http_result(200, json.dumps({"job_status": status}))
        return fake(method, url, payload, headers, timeout)

    mgr = WorkerManager(RouterClient(ROUTER, None, transport), None, clock=clock, sleep=clock.sleep)
    with pytest.raises(RouterError, match="gave up adding .*health checks failed"):
        mgr.ensure_present(W1, timeout=100)
    assert clock.now == 0.0


def test_present_check_mode_predicts_the_new_worker():
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W2])
    result = manager(fake, clock).ensure_present(W1, check_mode=True)
    assert result["changed"] is True
    assert [w["url"] for w in result["workers"]] == [W2, W1]
    assert [c[0] for c in fake.calls] == ["GET"]


def test_router_key_is_sent_and_401_explains_itself():
    clock = FakeClock()
    fake = FakeRouter(clock, workers=[W1], api_key="admin-key")
    with pytest.raises(RouterError, match="control-plane key"):
        manager(fake, clock).ensure_present(W1)
    result = manager(fake, clock, api_key="admin-key").ensure_present(W1)
    assert result["changed"] is False
    assert fake.calls[-1][3] == "Bearer admin-key"
