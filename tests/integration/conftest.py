"""Fixtures for tests against the lab fleet (systemd-nspawn hosts reached over SSH).

`make test-integration` (tests/run_layers.py) brings a lab up for the run, exports its inventory
as GPUFLEET_LAB_INVENTORY (and ANSIBLE_INVENTORY for pytest-ansible), and takes it down after.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from lab_support import CLEAN_HOST, REPO, PlaybookRun, ansible_playbook


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.lab)


@pytest.fixture(scope="session")
def lab_inventory() -> Path:
    path = os.environ.get("GPUFLEET_LAB_INVENTORY") or os.environ.get("ANSIBLE_INVENTORY")
    if not path or not Path(path).is_file():
        pytest.skip("no lab inventory: run `make test-integration`, which brings a lab up")
    return Path(path)


@pytest.fixture(scope="session")
def lab_hosts(lab_inventory) -> list[dict]:
    """[{name, address, ssh}] of the lab's `gpu` group, in order."""
    data = yaml.safe_load(lab_inventory.read_text())
    group = data["all"]["children"]["gpu"]
    gvars = group["vars"]
    hosts = []
    for name, hvars in group["hosts"].items():
        hosts.append({
            "name": name,
            "address": hvars["ansible_host"],
            "ssh": ["ssh", "-i", gvars["ansible_ssh_private_key_file"], "-p",
                    str(gvars["ansible_port"]), "-o", "BatchMode=yes",
                    "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                    "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=10",
                    "-o", "ServerAliveCountMax=6", f"root@{hvars['ansible_host']}"],
        })
    return hosts


@pytest.fixture
def fleet(ansible_adhoc, lab_inventory):
    """pytest-ansible host manager for the lab's `gpu` group."""
    return ansible_adhoc(inventory=str(lab_inventory), host_pattern="gpu")


def host_sh(host: dict, command: str, timeout: float = 60, check: bool = True) -> str:
    """Run a shell command on a lab host over SSH; return stdout."""
    proc = subprocess.run(host["ssh"] + [command], check=False, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{host['name']}: `{command}` failed rc={proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc.stdout


@pytest.fixture(scope="session")
def sh():
    return host_sh


@pytest.fixture(scope="session")
def run_playbook(lab_inventory, tmp_path_factory):
    """Run a playbook (a path, or YAML text) against the lab; returns PlaybookRun(rc, out)."""
    def _run(playbook, *args, **kwargs) -> PlaybookRun:
        if isinstance(playbook, str) and "\n" in playbook:
            path = tmp_path_factory.mktemp("pb") / "playbook.yml"
            path.write_text(playbook)
            playbook = path
        elif not Path(playbook).is_absolute():
            playbook = REPO / playbook
        return ansible_playbook(lab_inventory, playbook, *args, **kwargs)
    return _run


@pytest.fixture
def clean_fleet(lab_hosts):
    """Every lab host without SGLang, before and after the test."""
    def clean():
        for host in lab_hosts:
            host_sh(host, CLEAN_HOST, check=False)
    clean()
    yield lab_hosts
    clean()


def unit_state(host: dict) -> dict:
    """systemctl show of sglang.service on a host, as a dict."""
    out = host_sh(host, "systemctl show sglang.service -p InvocationID,ActiveState,SubState,"
                        "MainPID,NRestarts", check=False)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.fixture(scope="session")
def state_of():
    return unit_state


@pytest.fixture
def lab_inventory_dir(lab_inventory, tmp_path):
    """A copy of the lab inventory in a directory of its own, for host_vars/group_vars files.

    Returns (path_of_hosts_yml, write) where write(kind, name, mapping) writes
    host_vars/NAME.yml or group_vars/NAME.yml.
    """
    inv = tmp_path / "inventory"
    inv.mkdir()
    hosts = inv / "hosts.yml"
    hosts.write_text(lab_inventory.read_text())

    def write(kind: str, name: str, data: dict) -> Path:
        assert kind in ("host_vars", "group_vars")
        path = inv / kind / f"{name}.yml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(data))
        return path
    return hosts, write


# Settings of a fast DFlash server on the simulator: what most lab tests deploy.
LAB_SERVER_VARS = {
    "sglang_model_path": "/models/moonshotai/Kimi-K2.6",
    "sglang_served_model_name": "kimi-k2.6",
    "sglang_tp_size": 8,
    "sglang_speculative_algorithm": "DFLASH",
    "sglang_speculative_draft_model_path": "/models/dflash/Kimi-K2.6-DFlash",
    "sglang_speculative_num_draft_tokens": 16,
    "sglang_speculative_draft_window_size": 2048,
    "sglang_environment": {"SGLANG_SIM_LOAD_SECONDS": "3"},
    "sglang_ready_timeout": 120,
}


@pytest.fixture(scope="session")
def server_vars():
    """A fresh copy of LAB_SERVER_VARS (host addresses come from the inventory's sglang_host)."""
    return lambda **over: json.loads(json.dumps(LAB_SERVER_VARS)) | over


# --- the lab's real sglang-router --------------------------------------------------------------

@pytest.fixture(scope="session")
def router_url(lab_inventory):
    data = yaml.safe_load(lab_inventory.read_text())
    return (data["all"]["children"]["gpu"].get("vars") or {}).get("sglang_router_url") or ""


def router_workers(url: str) -> list[dict]:
    import requests
    return requests.get(f"{url}/workers", timeout=5).json().get("workers", [])


@pytest.fixture
def router_clean(router_url, lab_hosts):
    """No worker of a lab host in the router before and after the test (only this lab's hosts)."""
    import time

    import requests
    addresses = {h["address"] for h in lab_hosts}

    def ours(worker):
        return any(f"//{a}:" in worker["url"] for a in addresses)

    def clean():
        if not router_url:
            return
        for worker in router_workers(router_url):
            if ours(worker):
                requests.delete(f"{router_url}/workers/{worker['id']}", timeout=5)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not any(ours(w) for w in router_workers(router_url)):
                return
            time.sleep(0.3)
        raise AssertionError(f"router still lists lab workers: {router_workers(router_url)}")
    clean()
    yield router_url
    clean()


# ------------------------------------------------------------------ verdict examples for the guide

VERDICT_EXAMPLES = REPO / ".build" / "results" / "verdict-examples"


@pytest.fixture
def record_verdict(request):
    """Keep the message a lab test saw for a verdict, for the guide's troubleshooting page.

        record_verdict(result)                       # a sglang_ready result: its verdict and msg
        record_verdict(record, source="verify", message=line)   # a verify record and its report line

    Writes .build/results/verdict-examples/<source>-<verdict>.json (the last test to see a verdict wins);
    `python docs/tools/generate.py --take-captured` merges them into docs/verdict-examples.json and the page.
    """
    def record(result: dict, source: str = "sglang_ready", message: str | None = None) -> None:
        verdict, text = result.get("verdict"), message if message is not None else result.get("msg")
        assert verdict and text, f"nothing to record: {result!r}"
        VERDICT_EXAMPLES.mkdir(parents=True, exist_ok=True)
        captured = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # Written whole, then renamed: the other integration shard may record the same verdict meanwhile.
        target = VERDICT_EXAMPLES / f"{source}-{verdict}.json"
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        partial.write_text(json.dumps({
            "source": source, "verdict": verdict, "message": text, "test": request.node.nodeid,
            "captured": captured}, indent=2) + "\n")
        os.replace(partial, target)
    return record
