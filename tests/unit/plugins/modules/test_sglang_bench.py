# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sglang_bench against a real simulator process (stdlib HTTP, killed by PID) and its failure path."""
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.inference.plugins.modules import sglang_bench

SIM = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "sglang_sim"))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def sim():
    port = free_port()
    env = dict(os.environ, PYTHONPATH=SIM, SGLANG_SIM_LOAD_SECONDS="0.3", SGLANG_SIM_ACCESS_LOG="0")
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path", "m", "--host", "127.0.0.1",
                             "--port", str(port), "--speculative-algorithm", "DFLASH",
                             "--speculative-draft-model-path", "d", "--speculative-num-draft-tokens", "16"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = "http://127.0.0.1:%d" % port
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "simulator did not come up"
            time.sleep(0.1)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


class Done(Exception):
    pass


@pytest.fixture
def module_exits(monkeypatch):
    def finish(self, **kwargs):
        raise Done(kwargs)
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", finish)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", lambda self, **kw: finish(self, failed=True, **kw))


def test_bench_against_the_simulator(sim, module_exits):
    with patch_module_args({"url": sim, "num_prompts": 12, "concurrency": 3, "max_new_tokens": 32,
                            "prompts": ["a, b", "c"]}):
        with pytest.raises(Done) as done:
            sglang_bench.main()
    result = done.value.args[0]
    assert not result.get("failed") and result["changed"] is False
    assert result["requests_ok"] == 12 and result["requests_failed"] == 0
    assert result["output_tokens"] == 12 * 32
    assert result["output_tokens_per_s"] > 0 and result["p50_ms"] <= result["p90_ms"] <= result["p99_ms"]
    assert result["spec_accept_length_mean"] > 1.0


def test_bench_fails_when_every_request_fails(module_exits):
    url = "http://127.0.0.1:%d" % free_port()
    with patch_module_args({"url": url, "num_prompts": 3, "concurrency": 2, "timeout": 2}):
        with pytest.raises(Done) as done:
            sglang_bench.main()
    result = done.value.args[0]
    assert result["failed"] is True and result["requests_failed"] == 3
    assert result["msg"].startswith("all 3 requests to %s/generate failed" % url)


def test_bench_rejects_zero_concurrency(module_exits):
    with patch_module_args({"url": "http://127.0.0.1:1", "concurrency": 0}):
        with pytest.raises(Done) as done:
            sglang_bench.main()
    assert done.value.args[0]["msg"] == "concurrency must be at least 1, got 0"
