"""Multi-node serving groups in the simulator: real processes rendezvous over TCP on loopback.

What each test holds the simulator to is in tests/sglang_sim/README.md ("Multi-node serving"),
read in the 0.5.11-0.5.23 wheels and, for torch's texts, run with the real torch 2.13.
"""
import os
import random
import re
import signal
import socket
import time

import pytest

from conftest import Sim, free_port, http, run_launch, run_python, sim_env

TS = r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}"
MODEL = ["--model-path", "/models/kimi-k2.6"]
DFLASH = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/models/k2.6-dflash",
          "--speculative-dflash-block-size", "16"]
SIGQUIT_LINE = "Received sigquit from a child process. It usually means the child failed."
RUNNING_SIGQUIT_LINE = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."


class Node(Sim):
    def __init__(self, args, env, host, port):
        super().__init__(args, env, port)
        self.url = f"http://{host}:{port}"

    def scheduler_pids(self, count):
        """The scheduler children (forked by the main process), once all exist."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as handle:
                    pids = [int(pid) for pid in handle.read().split()]
            except OSError:
                pids = []
            if len(pids) >= count:
                return pids
            time.sleep(0.05)
        raise AssertionError(f"{count} schedulers never appeared: {self.output()}")

    def wait_for(self, text, timeout=10):
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never logged: {self.output()}")
            time.sleep(0.05)

    def wait_stand_in(self, timeout=15):
        self.wait_for("Dummy health check server started", timeout)
        deadline = time.monotonic() + 5
        while http("GET", self.url + "/ping", timeout=2)[0] != 200:
            if time.monotonic() > deadline:
                raise AssertionError("the stand-in never answered: " + self.output())
            time.sleep(0.05)
        return self


@pytest.fixture
def group():
    """start(n, ...) -> [head, follower, ...]: one serving group on 127.0.0.1, all killed afterwards."""
    started = []

    def start(nnodes=2, tp=2, version="0.5.23", extra=(), timeout=10, load=0.3, only=None, node_env=None,
              dist_addr=None, hosts=None, **env):
        """hosts: one loopback address per node, all serving on one port (the lab's shape)."""
        shared_port = free_port_on(hosts) if hosts else None
        dist_addr = dist_addr or (f"{hosts[0]}:{free_port_on(hosts[:1])}" if hosts else f"127.0.0.1:{free_port()}")
        nodes = []
        for node_rank in range(nnodes):
            if only is not None and node_rank not in only:
                nodes.append(None)
                continue
            host = hosts[node_rank] if hosts else "127.0.0.1"
            port = shared_port or free_port()
            args = [*MODEL, "--tp-size", str(tp), "--host", host, "--port", str(port),
                    "--nnodes", str(nnodes), "--node-rank", str(node_rank), "--dist-init-addr", dist_addr,
                    *(["--dist-timeout", str(timeout)] if timeout is not None else []), *extra]
            environment = dict(env, **((node_env or {}).get(node_rank, {})))
            node = Node(args, sim_env(version, load=load, **environment), host, port)
            started.append(node)
            nodes.append(node)
        return nodes

    try:
        yield start
    finally:
        for node in started:
            node.kill()
            node._log.close()


def free_port_on(hosts):
    """A port free on every one of `hosts`."""
    for _attempt in range(50):
        port = free_port()
        try:
            for host in hosts:
                with socket.socket() as probe:
                    probe.bind((host, port))
        except OSError:
            continue
        return port
    raise AssertionError(f"no port free on all of {hosts}")


def lab_like_hosts(count):
    """Distinct loopback addresses, like lab hosts sharing one network namespace."""
    base = f"127.{random.randint(100, 250)}.{random.randint(0, 250)}"
    return [f"{base}.{index + 1}" for index in range(count)]


def tags(out, message):
    return sorted(re.findall(TS + r"((?: [A-Z_]+\d+)*)\] " + re.escape(message), out))


def test_the_head_serves_and_the_follower_runs_schedulers_and_the_stand_in_only(group):
    head, follower = group()
    head.wait_ready()
    follower.wait_stand_in()
    probe = {"text": "hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    status, _h, body = head.post("/generate", probe)
    assert status == 200 and b'"text"' in body
    for path in ("/health", "/health_generate", "/ping"):
        assert follower.get(path)[0] == 200
        assert http("HEAD", follower.url + path)[0] == 200
    for path in ("/generate", "/v1/models", "/model_info", "/server_info", "/metrics"):
        status, _h, body = follower.get(path)
        assert (status, body) == (404, b'{"detail": "Not Found"}')
    assert follower.post("/health", {})[0] == 405
    out = follower.output()
    assert "'nnodes': 2, 'node_rank': 1" in out.splitlines()[0]
    for message in ("Init parallel begin.", "Init parallel ends.", "Load weight begin.", "KV Cache is allocated."):
        assert tags(out, message) == [" TP1"], message
    assert f"] Dummy health check server started in background thread at 127.0.0.1:{follower.port}" in out
    for absent in ("Uvicorn running", "fired up", "checkpoint shards", "max_total_num_tokens=", "TP0]"):
        assert absent not in out
    assert "TP1]" not in head.output()
    # the head's port opened only after the follower had loaded
    assert head.output().index("Uvicorn running") > 0


def test_nodes_on_their_own_loopback_addresses_share_one_port_and_name_each_other(group):
    hosts = lab_like_hosts(2)
    head, follower = group(hosts=hosts, SGLANG_SIM_GROUP_EXIT_SECONDS=0.5)
    head.wait_ready()
    follower.wait_stand_in()
    assert head.port == follower.port
    assert f"at {hosts[1]}:{follower.port}" in follower.output()
    os.kill(follower.scheduler_pids(1)[0], signal.SIGKILL)
    assert head.wait_exit(timeout=10) == -signal.SIGKILL
    assert re.search(r"Connection closed by peer \[%s\]:\d+\." % re.escape(hosts[1]), head.output())


def test_tp16_on_two_nodes_puts_tp8_to_tp15_on_the_follower_and_the_config_line_on_the_head(group):
    head, follower = group(tp=16, extra=DFLASH)
    head.wait_ready()
    follower.wait_stand_in()
    out = follower.output()
    assert tags(out, "Init parallel begin.") == sorted(f" TP{n}" for n in range(8, 16))
    assert "Initialized DFLASH draft runner" not in out and "DFLASH draft runner ready" not in out
    assert tags(head.output(), "Initialized DFLASH draft runner.") == [" TP0"]
    assert tags(head.output(), "Init parallel begin.") == sorted(f" TP{n}" for n in range(8))


def test_a_follower_on_0_5_20_logs_the_old_init_line(group):
    head, follower = group(version="0.5.20")
    head.wait_ready()
    follower.wait_stand_in()
    assert tags(follower.output(), "Init torch distributed begin.") == [" TP1"]
    assert re.search(r"TP1\] Init torch distributed ends\. elapsed=\d+\.\d\d s, mem usage=0\.31 GB",
                     follower.output())


def test_rank_ranges_follow_the_real_layout():
    code = ("from sglang.srt.entrypoints.http_server import node_rank_ranges as r\n"
            "print([(list(a), list(b)) for a, b in (r(16, 1, 2, 1), r(8, 2, 2, 1), r(8, 2, 4, 3), r(2, 4, 2, 1))])")
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str([([0], list(range(8, 16))), ([1], list(range(8))), ([1], [4, 5, 6, 7]),
                                         ([2, 3], [0, 1])])


def test_a_missing_follower_leaves_the_head_in_init_until_the_dist_timeout(group):
    head, _absent = group(only={0}, timeout=2)
    time.sleep(1.0)
    assert head.proc.poll() is None and head.get("/health")[0] == 0
    assert tags(head.output(), "Init parallel begin.") == [" TP0"]
    assert "Init parallel ends" not in head.output()
    assert head.wait_exit(timeout=10) == -signal.SIGKILL
    out = head.output()
    assert ("TP0] Scheduler hit an exception: Traceback (most recent call last):" in out)
    assert "\ntorch.distributed.DistStoreError: Timed out after 3 seconds waiting for clients. 1/2 clients joined.\n" in out
    assert out.index("DistStoreError") < out.index(SIGQUIT_LINE)


def test_without_a_dist_timeout_the_head_keeps_waiting(group):
    head, _absent = group(only={0}, timeout=None)
    time.sleep(3.0)
    assert head.proc.poll() is None and head.get("/health")[0] == 0
    assert "Scheduler hit an exception" not in head.output()


def test_the_store_counts_every_rank_of_the_world(group):
    head, _absent = group(only={0}, tp=4, timeout=1)
    assert head.wait_exit(timeout=10) == -signal.SIGKILL
    assert "Timed out after 2 seconds waiting for clients. 2/4 clients joined." in head.output()


def test_a_follower_without_a_head_fails_after_its_timeout(group):
    port = free_port()
    _absent, follower = group(only={1}, timeout=1, dist_addr=f"127.0.0.1:{port}")
    assert follower.wait_exit(timeout=10) == -signal.SIGKILL
    out = follower.output()
    assert (f"\ntorch.distributed.DistNetworkError: The client socket has timed out after 1000ms while trying to "
            f"connect to (127.0.0.1, {port}).\n") in out
    assert tags(out, "Init parallel begin.") == [" TP1"] and SIGQUIT_LINE in out
    assert "Dummy health check server" not in out


def test_the_head_may_start_after_its_followers(group):
    dist = f"127.0.0.1:{free_port()}"
    follower = group(dist_addr=dist, only={1})[1]
    time.sleep(1.0)
    head = group(dist_addr=dist, only={0})[0]
    head.wait_ready()
    follower.wait_stand_in()


def _serving_group(group, **kwargs):
    head, follower = group(**kwargs)
    head.wait_ready()
    follower.wait_stand_in()
    return head, follower


def test_a_follower_scheduler_killed_ends_the_group_and_the_follower_exits_0(group):
    head, follower = _serving_group(group, SGLANG_SIM_GROUP_EXIT_SECONDS=1.5)
    scheduler = follower.scheduler_pids(1)[0]
    os.kill(scheduler, signal.SIGKILL)
    assert follower.wait_exit(timeout=5) == 0
    assert f"] Scheduler or DataParallelController {scheduler} terminated with -9" in follower.output()
    head.wait_for(RUNNING_SIGQUIT_LINE, timeout=2)
    killed = time.monotonic()
    out = head.output()
    assert "TP0] Scheduler hit an exception:" in out
    assert re.search(r"\nRuntimeError: \[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair\.cc:5\d\d\] "
                     r"(Connection closed by peer|Read error) \[127\.0\.0\.1\]:\d+", out)
    assert out.index("Scheduler hit an exception") < out.index(RUNNING_SIGQUIT_LINE)
    with pytest.raises(Exception):  # serving has stopped while the head is still there
        head.post("/generate", {"text": "x"}, timeout=0.5)
    assert head.proc.poll() is None
    assert head.wait_exit(timeout=10) == -signal.SIGKILL
    assert time.monotonic() - killed >= 1.0


def test_a_unit_stop_of_a_follower_logs_its_wait_and_its_schedulers_end_with_minus_15(group):
    head, follower = _serving_group(group, SGLANG_SIM_GROUP_EXIT_SECONDS=0.5)
    scheduler = follower.scheduler_pids(1)[0]
    # KillMode=control-group: every process of the unit gets SIGTERM
    follower.proc.send_signal(signal.SIGTERM)
    os.kill(scheduler, signal.SIGTERM)
    assert follower.wait_exit(timeout=5) == 0
    out = follower.output()
    assert ("] SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast to stop the "
            "schedulers.") in out
    assert f"] Scheduler or DataParallelController {scheduler} terminated with -15" in out
    assert head.wait_exit(timeout=10) == -signal.SIGKILL


def test_sigterm_to_the_follower_main_alone_changes_nothing(group):
    head, follower = _serving_group(group)
    follower.proc.send_signal(signal.SIGTERM)
    follower.wait_for("SIGTERM received on node_rank 1")
    time.sleep(1.0)
    assert follower.proc.poll() is None and head.proc.poll() is None
    assert follower.get("/health")[0] == 200
    assert head.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}})[0] == 200
    after = follower.output().split("SIGTERM received on node_rank 1", 1)[1]
    assert after.strip().endswith("waiting for the rank-0 ShutdownReq broadcast to stop the schedulers.")


def test_before_0_5_21_sigterm_kills_the_follower_and_so_the_head(group):
    head, follower = _serving_group(group, version="0.5.19", SGLANG_SIM_GROUP_EXIT_SECONDS=0.5)
    follower.proc.send_signal(signal.SIGTERM)
    assert follower.wait_exit(timeout=5) == -signal.SIGTERM
    assert "SIGTERM received on node_rank" not in follower.output()
    assert head.wait_exit(timeout=10) == -signal.SIGKILL
    assert RUNNING_SIGQUIT_LINE in head.output()


def test_sigterm_to_the_head_drains_and_every_follower_exits_0(group):
    head, follower, third = group(nnodes=3, tp=3, SGLANG_SIM_DRAIN_POLL_SECONDS=0.2)
    head.wait_ready()
    follower.wait_stand_in()
    third.wait_stand_in()
    pids = {node: node.scheduler_pids(1)[0] for node in (follower, third)}
    head.proc.send_signal(signal.SIGTERM)
    assert head.wait_exit(timeout=10) == 0
    stopped = time.monotonic()
    for node in (follower, third):
        assert node.wait_exit(timeout=5) == 0
        assert f"] Scheduler or DataParallelController {pids[node]} terminated with 0" in node.output()
        assert "Scheduler hit an exception" not in node.output()
    assert time.monotonic() - stopped < 2.0
    assert "Draining requests and shutting down" in head.output()


def test_before_0_5_19_the_head_kills_its_tree_and_the_followers_fail(group):
    head, follower = _serving_group(group, version="0.5.11", SGLANG_SIM_DRAIN_POLL_SECONDS=0.2)
    head.proc.send_signal(signal.SIGTERM)
    assert head.wait_exit(timeout=10) == -signal.SIGKILL
    assert follower.wait_exit(timeout=5) == -signal.SIGKILL
    out = follower.output()
    assert "TP1] Scheduler hit an exception:" in out and SIGQUIT_LINE in out


def test_the_head_dying_kills_its_followers(group):
    head, follower = _serving_group(group)
    os.killpg(head.proc.pid, signal.SIGKILL)
    assert follower.wait_exit(timeout=5) == -signal.SIGKILL
    out = follower.output()
    assert re.search(r"TP1\] Scheduler hit an exception: (.|\n)*\nRuntimeError: \[/__w/pytorch/pytorch/third_party/"
                     r"gloo/gloo/transport/tcp/pair\.cc:5\d\d\] (Connection closed by peer|Read error) "
                     r"\[127\.0\.0\.1\]:\d+", out)
    assert out.index("Scheduler hit an exception") < out.index(SIGQUIT_LINE)
    assert "terminated with" not in out


def test_a_hung_follower_stalls_the_head_until_it_continues(group):
    head, follower = _serving_group(group, SGLANG_HEALTH_CHECK_TIMEOUT=2)
    scheduler = follower.scheduler_pids(1)[0]
    os.kill(scheduler, signal.SIGSTOP)
    try:
        time.sleep(1.5)
        tic = time.monotonic()
        assert head.get("/health", timeout=10)[0] == 503
        assert time.monotonic() - tic >= 1.5
        assert re.search(r"\] Health check failed\. Server couldn't get a response from detokenizer for last 2 "
                         r"seconds\. tic start time: \d\d:\d\d:\d\d\. last_heartbeat time: \d\d:\d\d:\d\d",
                         head.output())
        with pytest.raises(Exception):
            head.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}, timeout=1.0)
        assert head.get("/model_info")[0] == 200
        assert follower.get("/health")[0] == 200
    finally:
        os.kill(scheduler, signal.SIGCONT)
    time.sleep(1.0)
    assert head.get("/health", timeout=5)[0] == 200
    assert head.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}, timeout=5)[0] == 200
    assert head.proc.poll() is None and follower.proc.poll() is None


def test_a_follower_that_crashes_during_load_takes_the_head_with_it(group):
    head, follower = group(load=1.0, node_env={1: {"SGLANG_SIM_FAULT": "crash_during_load"}})
    assert follower.wait_exit(timeout=10) == -signal.SIGKILL
    out = follower.output()
    assert "TP1] Scheduler hit an exception:" in out and "simulated crash_during_load" in out
    assert out.index("Scheduler hit an exception") < out.index(SIGQUIT_LINE)
    assert head.wait_exit(timeout=10) == -signal.SIGKILL
    assert "Uvicorn running" not in head.output() and SIGQUIT_LINE in head.output()
    assert "Connection closed by peer" in head.output() or "Connection reset by peer" in head.output()


def test_a_follower_that_crashes_after_ready_takes_the_head_with_it(group):
    head, follower = group(node_env={1: {"SGLANG_SIM_FAULT": "crash_after_ready=0.5"}},
                           SGLANG_SIM_GROUP_EXIT_SECONDS=0.5)
    head.wait_ready()
    assert follower.wait_exit(timeout=10) == -signal.SIGKILL
    assert "simulated crash_after_ready" in follower.output()
    assert head.wait_exit(timeout=10) == -signal.SIGKILL
    assert RUNNING_SIGQUIT_LINE in head.output()


def test_a_follower_hanging_in_load_keeps_the_head_port_closed(group):
    head, follower = group(node_env={1: {"SGLANG_SIM_FAULT": "hang_during_load"}})
    follower.wait_for("Capture cuda graph end")
    time.sleep(1.0)
    assert head.get("/health")[0] == 0 and head.proc.poll() is None
    assert "Dummy health check server" not in follower.output()


@pytest.mark.parametrize("version,args,error", [
    ("0.5.23", ["--tp-size", "3", "--nnodes", "2"], "AssertionError: tp_size must be divisible by number of nodes"),
    ("0.5.11", ["--tp-size", "2", "--pp-size", "3", "--nnodes", "4"],
     "AssertionError: tp_size must be divisible by number of nodes"),
    ("0.5.23", ["--tp-size", "2", "--dp-size", "2", "--nnodes", "2"],
     "AssertionError: multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) "
     "across nodes"),
    ("0.5.21", ["--tp-size", "2", "--dp-size", "2", "--nnodes", "2"],
     "AssertionError: multi-node data parallel is not supported unless dp attention!"),
])
def test_launch_checks_refuse_before_anything_starts(version, args, error):
    result = run_launch([*MODEL, *args, "--node-rank", "1", "--port", str(free_port())], version=version)
    assert result.returncode == 1
    assert result.stderr.rstrip().endswith(error)
    assert "server_args=" not in result.stderr and "Init " not in result.stderr


@pytest.mark.parametrize("version,args", [
    ("0.5.21", ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--nnodes", "2"]),
    ("0.5.23", ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--nnodes", "2"]),
    ("0.5.23", ["--tp-size", "2", "--nnodes", "2", "--node-rank", "5"]),  # not checked, as in SGLang
    ("0.5.23", ["--tp-size", "2", "--nnodes", "2"]),  # no --dist-init-addr: not checked either
])
def test_launch_checks_accept(version, args):
    code = ("import sys\nfrom sglang.srt.server_args import prepare_server_args\n"
            "a = prepare_server_args(sys.argv[1:])\n"
            "a.resolve_once() if hasattr(a, 'resolve_once') else None\na.check_server_args()\nprint('ok')")
    result = run_python(code, [*MODEL, *args], version=version)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("address,error", [
    ("nohost", "ValueError: Missing port in address (expected host:port): 'nohost'"),
    ("127.0.0.1:http", "ValueError: Invalid port number: 'http'"),
    ("[::1:5000", "ValueError: Missing closing bracket in IPv6 address: '[::1:5000'"),
    ("::1:5000", "ValueError: Bare IPv6 address without brackets is ambiguous: '::1:5000'. Use [::1]:5000 instead."),
])
def test_a_bad_dist_init_addr_fails_in_the_scheduler(address, error):
    result = run_launch([*MODEL, "--tp-size", "2", "--nnodes", "2", "--dist-init-addr", address,
                         "--port", str(free_port())], version="0.5.23")
    assert result.returncode == -signal.SIGKILL
    assert "server_args=" in result.stderr  # parsed, checked and launched: the scheduler fails
    assert "TP0] Init parallel begin." in result.stderr
    assert f"\n{error}\n" in result.stderr and SIGQUIT_LINE in result.stderr


def test_a_dist_init_port_in_use_fails_the_head(group):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        head, _absent = group(only={0}, dist_addr=f"127.0.0.1:{port}")
        assert head.wait_exit(timeout=10) == -signal.SIGKILL
    assert (f"torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            f"address. port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
            ) in head.output()
