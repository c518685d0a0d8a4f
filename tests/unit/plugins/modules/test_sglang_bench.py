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


@pytest.fixture(autouse=True)
def module_exits(monkeypatch):
    def finish(self, **kwargs):
        raise Done(kwargs)
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", finish)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", lambda self, **kw: finish(self, failed=True, **kw))


def run_module(args):
    with patch_module_args(args):
        with pytest.raises(Done) as done:
            sglang_bench.main()
    return done.value.args[0]


def test_bench_against_the_simulator_streams_and_reports_bench_servings_figures(sim):
    result = run_module({"url": sim, "num_prompts": 12, "max_concurrency": 3, "output_len": 32, "input_len": 16,
                         "details": True})
    assert not result.get("failed") and result["changed"] is False
    assert result["completed"] == 12 and result["failed_requests"] == 0 and result["errors"] == []
    assert result["total_output_tokens"] == 12 * 32 and result["total_input_tokens"] >= 12 * 16
    assert result["output_throughput"] > 0 and result["concurrency"] > 0
    assert 0 < result["median_ttft_ms"] <= result["p99_ttft_ms"] < result["median_e2e_latency_ms"]
    assert 0 < result["median_tpot_ms"] and 0 < result["median_itl_ms"] <= result["max_itl_ms"]
    assert result["accept_length"] > 1.0
    assert len(result["details"]["ttfts"]) == 12 and all(len(itl) == 31 for itl in result["details"]["itls"])


def test_bench_uses_the_given_prompts_with_the_old_option_names(sim):
    result = run_module({"url": sim, "num_prompts": 4, "concurrency": 2, "max_new_tokens": 8, "prompts": ["a, b", "c"]})
    assert result["completed"] == 4 and result["total_output_tokens"] == 32


def test_bench_fails_when_every_request_fails():
    url = "http://127.0.0.1:%d" % free_port()
    result = run_module({"url": url, "num_prompts": 3, "max_concurrency": 2, "timeout": 2})
    assert result["failed"] is True and result["failed_requests"] == 3 and result["errors"] == ["connection refused"]
    assert result["msg"] == "all 3 requests to %s/generate failed: connection refused" % url


def test_bench_refuses_a_bad_workload_before_any_request():
    result = run_module({"url": "http://127.0.0.1:1", "max_concurrency": 0})
    assert result["failed"] is True
    assert result["msg"] == "workload max_concurrency must be a whole number of at least 1, got 0"


def test_bench_refuses_an_empty_prompts_list():
    result = run_module({"url": "http://127.0.0.1:1", "prompts": []})
    assert result["failed"] is True and result["msg"] == "prompts must not be empty"
