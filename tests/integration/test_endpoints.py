"""Where the collection probes a server and how a router reaches it, for wildcard and IPv6 binds.

The role derives both once (fact sglang_endpoint); the rollout and the modules use that fact and
never rebuild a URL. A server bound to 0.0.0.0 is probed on 127.0.0.1 and joins the router at
the host's inventory address; one bound to :: is probed on [::1].
"""
from __future__ import annotations

import json

import pytest
import requests
import yaml

from lab_support import ansible_playbook


def free_wildcard_port() -> int:
    """A port nobody on this machine listens on, on any address (lab hosts share its network)."""
    import socket
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return probe.getsockname()[1]


# 0.0.0.0:30000 would collide with the lab hosts' own 127.0.N.M:30000 (one shared network).
PORT = free_wildcard_port()
SIM_ENV = {"SGLANG_SIM_LOAD_SECONDS": "2", "SGLANG_SIM_DRAIN_POLL_SECONDS": "1"}


# The rollout's one task per host (role sglang, tasks/rollout_host.yml).
ROLLOUT_TASK = "Roll out this host (leave the router, install, restart, wait, rejoin; revert on failure)"
WAIT_STEP = "Wait until the new SGLang process runs the intended settings"


def wait_result(out: str, host: str) -> dict:
    """The wait's result inside the rollout's task: `verified` on success, the failed wait's `failure`."""
    from role_support import Results
    result = Results(out).one(ROLLOUT_TASK, host)["result"]
    assert result, f"no JSON result of {ROLLOUT_TASK!r} for {host}:\n{out[-6000:]}"
    if "verified" in result:
        return result["verified"]
    assert result.get("failed_step") == WAIT_STEP, result
    return result["failure"]


@pytest.fixture
def one_host_inventory(lab_inventory_dir, clean_fleet, server_vars):
    hosts_yml, write = lab_inventory_dir
    host = clean_fleet[0]
    data = yaml.safe_load(hosts_yml.read_text())
    gpu = data["all"]["children"]["gpu"]
    gpu["hosts"] = {host["name"]: gpu["hosts"][host["name"]]}
    hosts_yml.write_text(yaml.safe_dump(data))

    def set_vars(sglang_host):
        write("group_vars", "gpu", server_vars(sglang_environment=SIM_ENV, sglang_port=PORT,
                                               sglang_min_ready_seconds=1, sglang_ready_timeout=60))
        write("host_vars", host["name"], {"sglang_host": sglang_host})  # above the inventory's own
    return hosts_yml, host, set_vars


def test_rollout_with_a_wildcard_bind_probes_loopback_and_joins_the_router_at_the_host(
        one_host_inventory, router_clean, tmp_path, state_of):
    hosts_yml, host, set_vars = one_host_inventory
    set_vars("0.0.0.0")
    run = ansible_playbook(hosts_yml, "playbooks/rollout.yml", {"rollout_results_dir": str(tmp_path / "r")},
                           env={"ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_VERBOSITY": "1"})
    assert run.rc == 0, run
    wait = wait_result(run.out, host["name"])
    assert wait["verdict"] == "pass" and wait["listener"]["verdict"] == "inside", wait
    # the socket the wait checked (and sent /generate to) is loopback's, served by the unit
    assert wait["listener"]["message"].startswith(f"127.0.0.1:{PORT} is served by pid"), wait["listener"]
    if router_clean:
        workers = {w["url"] for w in requests.get(f"{router_clean}/workers", timeout=5).json()["workers"]}
        assert f"http://{host['address']}:{PORT}" in workers, workers
    (run_dir,) = [p for p in (tmp_path / "r").iterdir() if p.is_dir() and p.name != "fleet"]
    record = json.loads((run_dir / f"{host['name']}.json").read_text())
    assert record["status"] == "updated" and record["new_invocation"] == state_of(host)["InvocationID"]
    assert record["endpoint"] == {"url": f"http://127.0.0.1:{PORT}", "worker_url": f"http://{host['address']}:{PORT}"}


def test_ipv6_wildcard_is_rolled_out_probed_on_ipv6_loopback_and_joins_the_router(
        one_host_inventory, router_clean, tmp_path, state_of, sh):
    hosts_yml, host, set_vars = one_host_inventory
    set_vars("::")  # bound as SGLang's uvicorn binds it: IPv6, dual-stack; on a port of its own
    run = ansible_playbook(hosts_yml, "playbooks/rollout.yml", {"rollout_results_dir": str(tmp_path / "r")},
                           env={"ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_VERBOSITY": "1"})
    assert run.rc == 0, run
    wait = wait_result(run.out, host["name"])
    assert wait["verdict"] == "pass" and wait["listener"]["verdict"] == "inside", wait
    # the socket the wait checked (and sent /generate to) is IPv6 loopback's, served by the unit
    assert wait["listener"]["message"].startswith(f"[::1]:{PORT} is served by pid"), wait["listener"]
    assert sh(host, f"ss -Hltn -6 'sport = :{PORT}'").strip()  # an IPv6 socket (dual-stack: ss shows '*')
    (run_dir,) = [p for p in (tmp_path / "r").iterdir() if p.is_dir() and p.name != "fleet"]
    record = json.loads((run_dir / f"{host['name']}.json").read_text())
    assert record["status"] == "updated" and record["new_invocation"] == state_of(host)["InvocationID"]
    assert record["endpoint"] == {"url": f"http://[::1]:{PORT}", "worker_url": f"http://{host['address']}:{PORT}"}
    if router_clean:
        workers = {w["url"] for w in requests.get(f"{router_clean}/workers", timeout=5).json()["workers"]}
        assert f"http://{host['address']}:{PORT}" in workers, workers
