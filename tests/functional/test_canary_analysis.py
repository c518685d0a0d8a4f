# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet.inference.sglang_canary_analysis in a real ansible-playbook against simulator processes (no lab):
equal settings pass, a canary that decodes 2x slower (SGLANG_SIM_FAULT=slow_decode=2) is a regression, with
the real sglang-router in front of both hosts sending other traffic during the window.

Everything binds to 127.0.0.1 free ports; every process is killed by PID (its own session) in finally.
The simulators run without per-process drift (SGLANG_SIM_DRIFT=0): how often drift makes equal settings
fail is what tests/benchmarks/bench_canary.py measures, over many runs; here the pipeline is under test.
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
from pathlib import Path

import pytest

SIM = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "sglang_sim"))
KEY = "sk-canary-functional"
ROUTER_EXE = os.path.join(os.path.dirname(sys.executable), "sglang-router")
ROUTER = [ROUTER_EXE, "launch"] if os.path.exists(ROUTER_EXE) else (
    [shutil.which("sglang-router"), "launch"] if shutil.which("sglang-router") else None)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(url, path="/health"):
    try:
        with urllib.request.urlopen(url + path, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_for(predicate, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.1)


class Fleet(object):
    """A baseline and a canary simulator (the canary with a fault), and a router in front of both."""

    def __init__(self, canary_fault):
        self.procs = []
        self.logs = []
        self.urls = {}
        for name, fault in (("baseline", ""), ("canary", canary_fault)):
            port = free_port()
            env = dict(os.environ, PYTHONPATH=SIM, SGLANG_SIM_LOAD_SECONDS="0.3", SGLANG_SIM_ACCESS_LOG="0",
                       SGLANG_SIM_TOKEN_SECONDS="0.01", SGLANG_SIM_DRIFT="0", SGLANG_SIM_FAULT=fault)
            self._start([sys.executable, "-m", "sglang.launch_server", "--model-path", "m", "--host", "127.0.0.1",
                         "--port", str(port), "--api-key", KEY, "--enable-metrics", "--speculative-algorithm", "DFLASH",
                         "--speculative-draft-model-path", "d", "--speculative-num-draft-tokens", "16"], env)
            self.urls[name] = "http://127.0.0.1:%d" % port
        self.router = None
        if ROUTER:
            port = free_port()
            self.router = "http://127.0.0.1:%d" % port
            self._start(ROUTER + ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
                                  "--prometheus-port", str(free_port()), "--policy", "round_robin", "--api-key", KEY,
                                  "--worker-urls", self.urls["baseline"], self.urls["canary"]], dict(os.environ))
        for url in self.urls.values():
            wait_for(lambda u=url: answers(u), url)

    def router_lists_both(self):
        request = urllib.request.Request(self.router + "/workers", headers={"Authorization": "Bearer " + KEY})
        try:
            with urllib.request.urlopen(request, timeout=2) as resp:
                listed = [w["url"] for w in json.loads(resp.read())["workers"] if w.get("is_healthy")]
        except (OSError, ValueError, KeyError):
            return False
        return sorted(listed) == sorted(self.urls.values())

    def _start(self, argv, env):
        log = tempfile.TemporaryFile()
        self.logs.append(log)
        self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def stop(self):
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        for log in self.logs:
            log.close()


class RouterTraffic(object):
    """Other clients' requests through the router while the analysis runs."""

    def __init__(self, router):
        self.router = router
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        body = json.dumps({"text": "other traffic", "sampling_params": {"max_new_tokens": 4}}).encode()
        while not self.stop.is_set():
            request = urllib.request.Request(self.router + "/generate", data=body, headers={
                "Content-Type": "application/json", "Authorization": "Bearer " + KEY})
            try:
                urllib.request.urlopen(request, timeout=10).read()
                self.sent += 1
            except OSError:
                pass
            self.stop.wait(0.1)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(15)


PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Canary analysis
      gpufleet.inference.sglang_canary_analysis:
        canary: {name: canary-host, url: "{{ canary_url }}", api_key: "{{ key }}"}
        baseline: {name: baseline-host, url: "{{ baseline_url }}", api_key: "{{ key }}"}
        workload: {num_prompts: 16, max_concurrency: 4, input_len: 32, output_len: 64}
        rounds: 6
        router_url: "{{ router_url | default(omit) }}"
        router_api_key: "{{ key }}"
        report_dir: "{{ report_dir }}"
      register: analysis

    - name: Keep the result as data
      ansible.builtin.copy:
        content: "{{ analysis | to_json }}"
        dest: "{{ report_dir }}/task-result.json"
        mode: "0644"
"""


def run_analysis(fleet, tmp_path):
    (tmp_path / "analysis.yml").write_text(PLAYBOOK)
    extra = {"canary_url": fleet.urls["canary"], "baseline_url": fleet.urls["baseline"], "key": KEY,
             "report_dir": str(tmp_path / "report"), "ansible_python_interpreter": sys.executable}
    if fleet.router:
        extra["router_url"] = fleet.router
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_CONFIG", None)  # cwd is tmp_path: no ansible.cfg of the checkout
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local", "-v",
            "analysis.yml", "-e", json.dumps(extra)]
    run = subprocess.run(argv, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "report" / "task-result.json").read_text())
    return result, run.stdout + run.stderr


@pytest.mark.parametrize("fault,verdict", [("", "pass"), ("slow_decode=2", "regression")],
                         ids=["equal settings pass", "2x slower decode is a regression"])
def test_the_analysis_judges_a_real_canary_against_its_baseline(tmp_path, fault, verdict):
    fleet = Fleet(fault)
    try:
        if fleet.router:
            wait_for(fleet.router_lists_both, "the router to list both hosts")
            with RouterTraffic(fleet.router) as traffic:
                result, output = run_analysis(fleet, tmp_path)
            assert traffic.sent > 0
        else:
            result, output = run_analysis(fleet, tmp_path)
    finally:
        fleet.stop()
    assert result["verdict"] == verdict, result["message"]
    rows = dict((row["metric"], row) for row in result["metrics"])
    if verdict == "regression":
        for metric in ("output_throughput", "tpot_p50", "e2e_p99", "accept_length"):
            assert rows[metric]["verdict"] == "regression", rows[metric]["reason"]
        assert rows["tpot_p50"]["change"] > 0.5 and rows["output_throughput"]["change"] < -0.3
        assert rows["ttft_p50"]["verdict"] == "pass"  # prefill is not slowed: TTFT is not where it shows
    assert result["canary"]["figures"]["completed"] == 6 * 16 and result["canary"]["figures"]["failed_requests"] == 0
    assert len(result["canary"]["rounds"]) == len(result["baseline"]["rounds"]) == 6
    if fleet.router:
        for side in ("canary", "baseline"):
            assert result["traffic"][side]["in_router"] is True, result["traffic"]
            assert result["traffic"][side]["requests"] > 0, result["traffic"]  # the router's share is visible
    report = tmp_path / "report"
    assert json.loads((report / "canary-analysis.json").read_text())["verdict"] == verdict
    assert (report / "canary-analysis.md").read_text().startswith("# Canary analysis: canary-host against baseline-host")
    assert (report / "canary-analysis.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert KEY not in output  # no_log: -v shows the task's arguments and result
    for path in report.glob("canary-analysis.*"):
        assert KEY.encode() not in path.read_bytes()
