"""The real sglang-router in front of two simulator workers."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import free_port, http


def _router_cmd():
    exe = shutil.which("sglang-router") or os.path.join(os.path.dirname(sys.executable), "sglang-router")
    if os.path.exists(exe):
        return [exe, "launch"]
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "sglang_router.launch_router"]


ROUTER = _router_cmd()
pytestmark = pytest.mark.skipif(ROUTER is None, reason="sglang-router (import sglang_router / executable) not installed")


def _generate(url, prompt):
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    status, _headers, raw = http("POST", url + "/generate", body)
    assert status == 200, raw
    return json.loads(raw)["meta_info"]["sim_worker"]


def test_router_round_robin_and_remove(start_sim):
    workers = [start_sim(base=["--model-path", "m"]) for _i in range(2)]
    for worker in workers:
        worker.wait_ready()
    port, metrics_port = free_port(), free_port()
    router_url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    router = subprocess.Popen(
        ROUTER + ["--host", "127.0.0.1", "--port", str(port),
                  "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
                  "--worker-urls", *[w.url for w in workers], "--policy", "round_robin"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        seen = set()
        while time.monotonic() < deadline and len(seen) < 2:
            try:
                seen.add(_generate(router_url, "hello"))
            except (AssertionError, OSError):
                time.sleep(0.2)
        names = {f"127.0.0.1:{w.port}" for w in workers}
        assert seen == names, (seen, log.seek(0) or log.read()[-3000:])

        listing = json.loads(http("GET", router_url + "/workers")[2])
        victim = next(w for w in listing["workers"] if w["url"] == workers[1].url)
        status, _headers, raw = http("DELETE", f"{router_url}/workers/{victim['id']}")
        assert status in (200, 202), raw
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            urls = [w["url"] for w in json.loads(http("GET", router_url + "/workers")[2])["workers"]]
            if workers[1].url not in urls:
                break
            time.sleep(0.1)
        after = {_generate(router_url, f"p{i}") for i in range(6)}
        assert after == {f"127.0.0.1:{workers[0].port}"}
    finally:
        try:
            os.killpg(router.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        router.wait(timeout=10)
        log.close()
