"""`lab.py up --groups GxN`: the lab's serving groups, as Ansible reads the inventory it writes."""
from __future__ import annotations

import importlib.util
import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager

from ansible_collections.gpufleet.inference.plugins.module_utils import _groups

REPO = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("lab", REPO / "tests" / "lab" / "lab.py")
lab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab)


@pytest.fixture
def lab_with(tmp_path, monkeypatch):
    """A lab whose state lives in tmp_path; returns (lab, inventory path) after laying out groups."""
    monkeypatch.setattr(lab, "STATE_ROOT", tmp_path / "state")
    inventory = tmp_path / "hosts.yml"
    monkeypatch.setenv("LAB_INVENTORY", str(inventory))

    def make(count, groups_text):
        the_lab = lab.Lab("gpfx", "127.0.77", 11, 22)
        the_lab.state.mkdir(parents=True)
        the_lab.groups_file.write_text(json.dumps(lab.parse_groups(groups_text, count)))
        lab.write_inventory(the_lab, count)
        return the_lab, inventory

    return make


def hostvars_of(inventory):
    """Every host's variables as a play sees them (group_names included), from real Ansible."""
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(inventory)])
    variables = VariableManager(loader=loader, inventory=manager)
    out = {}
    for host in manager.get_hosts():
        values = variables.get_vars(host=host)
        out[host.name] = {key: values[key] for key in values
                          if key.startswith(("sglang_", "ansible_host")) or key == "group_names"}
    return out


def test_two_groups_of_two_and_single_hosts_behind_the_groups_module(lab_with):
    _lab, inventory = lab_with(5, "2x2")
    groups = _groups.serving_groups(hostvars_of(inventory))
    assert sorted(groups) == ["serving_1", "serving_2"]
    first, second = groups["serving_1"], groups["serving_2"]
    assert (first.hosts, first.dist_init_addr) == (["gpfx-1", "gpfx-2"], "127.0.77.11:50000")
    assert (second.hosts, second.dist_init_addr) == (["gpfx-3", "gpfx-4"], "127.0.77.13:50000")
    assert first.node_args("gpfx-2") == [
        "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "127.0.77.11:50000",
        "--dist-timeout", str(lab.GROUP_DIST_TIMEOUT)]
    assert _groups.group_of(groups, "gpfx-5") is None
    assert hostvars_of(inventory)["gpfx-1"]["sglang_tp_size"] == 2
    assert "sglang_tp_size" not in hostvars_of(inventory)["gpfx-5"]


def test_without_groups_the_inventory_is_as_before(lab_with):
    _lab, inventory = lab_with(3, "")
    text = inventory.read_text()
    assert "sglang_node_rank" not in text and "serving_" not in text
    assert _groups.serving_groups(hostvars_of(inventory)) == {}


def test_three_nodes_per_group(lab_with):
    _lab, inventory = lab_with(3, "1x3")
    group = _groups.serving_groups(hostvars_of(inventory))["serving_1"]
    assert group.hosts == ["gpfx-1", "gpfx-2", "gpfx-3"] and group.start_order()[-1] == "gpfx-1"


@pytest.mark.parametrize("text,count,error", [
    ("2x2", 3, "--groups '2x2' needs 4 hosts, HOSTS is 3"),
    ("2*2", 4, "--groups/LAB_GROUPS '2*2' must look like 2x2 (groups x nodes per group)"),
    ("1x1", 4, "--groups '1x1': at least one group of at least 2 nodes"),
    ("0x2", 4, "--groups '0x2': at least one group of at least 2 nodes"),
])
def test_a_layout_that_does_not_fit_is_refused(text, count, error):
    with pytest.raises(lab.LabError) as caught:
        lab.parse_groups(text, count)
    assert str(caught.value) == error


class Answering(ThreadingHTTPServer):
    """An HTTP server that answers every GET 200 and records each POST body (a host or a router)."""

    def __init__(self, address):
        self.posted = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                self.server.posted.append(json.loads(body))
                self.do_GET()

        super().__init__(address, Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_the_router_gets_heads_and_single_hosts_only(tmp_path, monkeypatch):
    net = f"127.{random.randint(150, 250)}.{random.randint(0, 250)}"
    monkeypatch.setattr(lab, "STATE_ROOT", tmp_path / "state")
    the_lab = lab.Lab("gpfx", net, 11, 22)
    the_lab.state.mkdir(parents=True)
    the_lab.groups_file.write_text(json.dumps(lab.parse_groups("2x2", 5)))
    servers = []
    try:
        # Every host answers /health, followers too (their stand-in server does).
        servers = [Answering((the_lab.host(index)["address"], lab.SGLANG_PORT)) for index in range(1, 6)]
        router = Answering((the_lab.router_address, 0))
        servers.append(router)
        lab.register_answering_workers(the_lab, {"url": f"http://{the_lab.router_address}:{router.server_port}"}, 5)
        assert [body["url"] for body in router.posted] == [
            f"http://{net}.{octet}:{lab.SGLANG_PORT}" for octet in (11, 13, 15)]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
