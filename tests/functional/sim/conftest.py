"""Fixtures for the SGLang simulator tests: start simulator processes on free
loopback ports and always kill them (by PID) afterwards."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

SIM_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "sglang_sim"))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sim_env(version="0.5.11", faults="", load=0.3, **extra):
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": SIM_DIR,
        "SGLANG_SIM_VERSION": version,
        "SGLANG_SIM_LOAD_SECONDS": str(load),
        "SGLANG_SIM_FAULT": faults,
        "SGLANG_SIM_NUM_SHARDS": "4",
        "SGLANG_SIM_DRAIN_POLL_SECONDS": "0.2",
        "PYTHONWARNINGS": "ignore",
    })
    env.update({k: str(v) for k, v in extra.items()})
    return env


def http(method, url, body=None, headers=None, timeout=10):
    """(status, headers, body bytes); status 0 = connection refused."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()
    except (ConnectionRefusedError, urllib.error.URLError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, ConnectionRefusedError) or isinstance(err, ConnectionRefusedError):
            return 0, {}, b""
        raise


def run_python(code, args=(), version="0.5.11", timeout=30, **extra_env):
    """Run ``python -c code args...`` against the simulator package (a fresh process per call)."""
    env = sim_env(version, **extra_env)
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def run_launch(args, version="0.5.11", timeout=30, **extra_env):
    """``python -m sglang.launch_server args...`` run to completion (for launches that must fail)."""
    env = sim_env(version, **extra_env)
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # it started serving: stop the whole tree we started
        out, err = proc.communicate()
        raise AssertionError(f"launch did not end within {timeout}s: {err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class Sim:
    def __init__(self, args, env, port):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        # a file, not a pipe: a full pipe would block the simulator's log writes
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", *args],
            env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"simulator exited rc={self.proc.returncode}: {self.output()}")
            try:
                status, _headers, _body = http("GET", self.url + "/health", timeout=2)
            except Exception:
                status = -1
            if status == 200:
                return self
            time.sleep(0.05)
        raise AssertionError("simulator not ready: " + self.output())

    def get(self, path, **kw):
        return http("GET", self.url + path, **kw)

    def post(self, path, body, **kw):
        return http("POST", self.url + path, body, **kw)

    def output(self):
        """Everything the process (and its children) printed so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def wait_exit(self, timeout=15):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return self.proc.returncode

    def kill(self):
        # the whole session (scheduler children too), by the PID we started
        for sig in (signal.SIGKILL,):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


DFLASH_ARGS = [
    "--model-path", "/models/kimi-k2.6", "--speculative-algorithm", "DFLASH",
    "--speculative-draft-model-path", "/models/k2.6-dflash", "--speculative-dflash-block-size", "16",
]


@pytest.fixture
def start_sim():
    started = []

    def start(extra_args=(), version="0.5.11", faults="", load=0.3, port=None, base=None, **env):
        port = port or free_port()
        args = list(DFLASH_ARGS if base is None else base) + ["--host", "127.0.0.1", "--port", str(port)]
        args += list(extra_args)
        sim = Sim(args, sim_env(version, faults, load, **env), port)
        started.append(sim)
        return sim

    try:
        yield start
    finally:
        for sim in started:
            sim.kill()
            sim._log.close()
