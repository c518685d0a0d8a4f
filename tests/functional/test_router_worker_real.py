# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sglang_router_worker against the real sglang-router and two simulator workers (no lab).

Everything runs on 127.0.0.1 free ports; the router's Prometheus exporter gets its own port (its
default 0.0.0.0:29000 collides). Every process is killed by PID (its own session) in finally.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _router

SIM = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "sglang_sim"))


def _router_cmd():
    exe = os.path.join(os.path.dirname(sys.executable), "sglang-router")
    if os.path.exists(exe):
        return [exe, "launch"]
    if shutil.which("sglang-router"):
        return [shutil.which("sglang-router"), "launch"]
    try:
        import sglang_router  # noqa: F401  pylint: disable=unused-import
    except ImportError:
        return None
    return [sys.executable, "-m", "sglang_router.launch_router"]


ROUTER = _router_cmd()
pytestmark = pytest.mark.skipif(ROUTER is None, reason="sglang-router is not installed")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(method, url, body=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read().decode()


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


def requests_served(url):
    """The worker's own count of finished requests (/metrics, --enable-metrics)."""
    text = http("GET", url + "/metrics")[1]
    for line in text.splitlines():
        if line.startswith("sglang:num_requests_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no sglang:num_requests_total in /metrics of " + url)


def params(router_url, worker_url, state, **extra):
    base = {"router_url": router_url, "worker_url": worker_url, "state": state, "api_key": None,
            "worker_api_key": None, "drain_timeout": 60, "wait_healthy": True, "timeout": 60,
            "request_timeout": 5.0, "validate_certs": True}
    base.update(extra)
    return base


class Traffic(object):
    """Requests through the router in a loop; records which worker answered each and any failure."""

    def __init__(self, router_url, max_new_tokens=16):
        self.router_url, self.max_new_tokens = router_url, max_new_tokens
        self.answers, self.failures = [], []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.loop, args=(i,), daemon=True) for i in range(3)]

    def loop(self, index):
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                raw = http("POST", self.router_url + "/generate",
                           {"text": "t%d-%d" % (index, n), "sampling_params": {"max_new_tokens": self.max_new_tokens}},
                           timeout=30)[1]
                self.answers.append((time.monotonic(), json.loads(raw)["meta_info"]["sim_worker"]))
            except Exception as exc:  # pylint: disable=broad-except
                self.failures.append(repr(exc))

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


def test_remove_drains_and_stops_traffic_then_add_back():
    procs, logs = [], []
    try:
        env = dict(os.environ, PYTHONPATH=SIM, SGLANG_SIM_LOAD_SECONDS="0.3", SGLANG_SIM_ACCESS_LOG="0")
        workers = []
        for dummy in range(2):
            port = free_port()
            log = tempfile.TemporaryFile()
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "sglang.launch_server", "--model-path", "m", "--host", "127.0.0.1",
                 "--port", str(port), "--enable-metrics"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            workers.append("http://127.0.0.1:%d" % port)
        router_port, metrics_port = free_port(), free_port()
        router_url = "http://127.0.0.1:%d" % router_port
        log = tempfile.TemporaryFile()
        logs.append(log)
        # No --worker-urls: workers join through the module once they answer.
        procs.append(subprocess.Popen(
            ROUTER + ["--host", "127.0.0.1", "--port", str(router_port), "--prometheus-host", "127.0.0.1",
                      "--prometheus-port", str(metrics_port), "--policy", "round_robin"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        wait_for(lambda: http("GET", router_url + "/workers")[0] == 200, 30, "the router")
        for url in workers:
            wait_for(lambda u=url: http("GET", u + "/health")[0] == 200, 30, url)

        # present: added, healthy; again: unchanged
        for url in workers:
            assert _router.worker_change(params(router_url, url, "present"), False)["changed"] is True
        again = _router.worker_change(params(router_url, workers[1], "present"), False)
        assert again["changed"] is False
        assert sorted(w["url"] for w in again["workers"]) == sorted(workers)
        names = ["127.0.0.1:%s" % url.rsplit(":", 1)[1] for url in workers]

        # Long requests in flight on both workers, then take workers[1] out under steady traffic.
        long_results = []

        def long_request(i):
            status, raw = http("POST", router_url + "/generate",
                               {"text": "long %d" % i, "sampling_params": {"max_new_tokens": 1000}}, timeout=60)
            long_results.append((status, json.loads(raw)["meta_info"]["sim_worker"]))

        longs = [threading.Thread(target=long_request, args=(i,)) for i in range(4)]
        with Traffic(router_url) as traffic:
            for thread in longs:
                thread.start()
            time.sleep(0.5)
            removed = _router.worker_change(params(router_url, workers[1], "absent"), False)
            removed_at = time.monotonic()
            served_after_drain = requests_served(workers[1])
            time.sleep(1.5)
            served_later = requests_served(workers[1])
            for thread in longs:
                thread.join(timeout=60)
        assert removed["changed"] is True and removed["drained"] is True
        assert removed["drain_signal"] in ("/v1/loads", "/get_load", "/metrics")
        assert removed["drain_seconds"] > 0.3, removed  # the long requests were still running
        assert [w["url"] for w in removed["workers"]] == [workers[0]]
        assert not traffic.failures, traffic.failures[:3]
        # The long requests on the removed worker finished normally (drained, not cut).
        assert len(long_results) == 4 and all(status == 200 for status, dummy in long_results)
        assert names[1] in [name for dummy, name in long_results]
        late = [name for at, name in traffic.answers if at > removed_at]
        assert len(late) > 10 and set(late) == {names[0]}
        assert served_later == served_after_drain  # nothing reached the worker after the drain

        # absent again: no change
        assert _router.worker_change(params(router_url, workers[1], "absent"), False)["changed"] is False

        # add back: traffic reaches it again
        added = _router.worker_change(params(router_url, workers[1], "present"), False)
        assert added["changed"] is True and all(w["healthy"] for w in added["workers"])
        with Traffic(router_url) as traffic:
            wait_for(lambda: names[1] in [name for dummy, name in traffic.answers], 10, "traffic on the re-added worker")
        assert not traffic.failures
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        for log in logs:
            log.close()
