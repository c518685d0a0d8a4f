"""`lab.py up` / `down` several times in a row, with a lab of its own (gpfcyc on 127.0.5).

Each up must boot every host, right after the previous down (the race of issue 12: nspawn
judged dead while still inside exec); each down, and each failed up, must leave no container,
process, mount or host directory of this lab. Needs root; `tests/run_layers.py lab-cycle` runs it.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB = [sys.executable, str(REPO / "tests" / "lab" / "lab.py")]
NAME = os.environ.get("LAB_NAME", "gpfcyc")
NET = os.environ.get("LAB_NET", "127.0.5")
HOSTS = int(os.environ.get("HOSTS", "2"))
STATE = Path(os.environ.get("LAB_STATE_DIR", "/var/lib/gpufleet-lab")) / NAME
CYCLES = 3

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = dict(os.environ, LAB_NAME=NAME, LAB_NET=NET, HOSTS=str(HOSTS),
               LAB_INVENTORY=str(tmp_path_factory.mktemp("cycle") / "hosts.yml"))
    for setting in ("LAB_ROUTER", "LAB_BOOT_TIMEOUT", "LAB_FIRST", "LAB_SSH_PORT"):
        env.pop(setting, None)
    yield env
    subprocess.run([*LAB, "down"], env=env, check=False)  # whatever a failing test left


def lab(env, command, **extra) -> subprocess.CompletedProcess:
    proc = subprocess.run([*LAB, command], env=dict(env, **extra), capture_output=True,
                          text=True, timeout=600, check=False)
    print(proc.stdout, proc.stderr)
    return proc


def host_ssh(address: str, command: str) -> str:
    return subprocess.run(
        ["ssh", "-i", str(STATE / "id_ed25519"), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5", f"root@{address}", command],
        capture_output=True, text=True, timeout=60, check=False).stdout.strip()


def stat_of(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def snapshot() -> list[dict]:
    """What this lab runs now, read from /proc: each nspawn and its container's PID namespace."""
    found = []
    for meta_file in sorted((STATE / "hosts").glob("*/host.json")):
        meta = json.loads(meta_file.read_text())
        stat = stat_of(meta["pid"])
        assert stat and stat[19] == meta["started"], f"{meta['name']}: recorded nspawn not running"
        namespaces = set()
        for entry in Path("/proc").iterdir():
            child = stat_of(int(entry.name)) if entry.name.isdigit() else None
            if child and int(child[1]) == meta["pid"]:
                namespaces.add(os.readlink(f"/proc/{entry.name}/ns/pid"))
        namespaces.discard(os.readlink("/proc/self/ns/pid"))
        assert namespaces, f"{meta['name']}: no container PID namespace under nspawn"
        found.append({"name": meta["name"], "pid": meta["pid"], "started": meta["started"],
                      "address": meta["address"], "pidns": namespaces})
    return found


def assert_nothing_left(before: list[dict]) -> None:
    """No process in the PID namespaces of `before`, no nspawn of this lab, sshd ports free."""
    pidns = set().union(set(), *(h["pidns"] for h in before))
    leftovers = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ns = os.readlink(entry / "ns" / "pid")
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        stat = stat_of(int(entry.name))
        if stat is None or stat[0] == "Z":
            continue
        if ns in pidns or f"--machine\0{NAME}-".encode() in b"\0".join(argv):
            leftovers.append((entry.name, argv[:3]))
    assert not leftovers, f"processes of lab {NAME} left running: {leftovers}"
    for host in before:
        stat = stat_of(host["pid"])
        assert stat is None or stat[0] == "Z" or stat[19] != host["started"], host
    for index in range(HOSTS):
        with socket.socket() as sock:  # no sshd of this lab: its addresses' port 22 is free
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((f"{NET}.{11 + index}", 22))
    mounts = [line for line in Path("/proc/mounts").read_text().splitlines()
              if f" {STATE}/" in line]
    assert not mounts, mounts
    assert not list((STATE / "hosts").glob("*")), "host directories left"


def test_up_and_down_several_times_in_a_row(env):
    assert lab(env, "down").returncode == 0  # start clean (this lab only)
    for cycle in range(1, CYCLES + 1):
        up = lab(env, "up")
        assert up.returncode == 0, f"cycle {cycle}: up failed:\n{up.stdout}\n{up.stderr}"
        assert f"{HOSTS} host(s) up" in up.stdout
        running = snapshot()
        assert [h["name"] for h in running] == [f"{NAME}-{i}" for i in range(1, HOSTS + 1)]
        for host in running:
            assert host_ssh(host["address"], "systemctl is-system-running") in ("running", "degraded")
        if cycle == 1:
            # The simulator's package metadata answers without importing sglang.
            probe = ("/opt/sglang/venv/bin/python -c \"import importlib.metadata as m, sys; "
                     "print(m.version('sglang'), 'sglang' in sys.modules)\"")
            assert host_ssh(running[0]["address"], probe) == "0.5.11 False"
        down = lab(env, "down")
        assert down.returncode == 0, f"cycle {cycle}: down failed:\n{down.stdout}\n{down.stderr}"
        assert f"{HOSTS} host(s) stopped and removed" in down.stdout
        assert_nothing_left(running)


def test_a_failed_up_stops_what_it_started(env):
    # No time to boot: up starts every host, gives up at once, and must stop them all again.
    up = lab(env, "up", LAB_BOOT_TIMEOUT="0")
    assert up.returncode == 1
    assert "not booted after 0 s" in up.stderr
    assert f"stopping the {HOSTS} host(s) it started" in up.stdout
    started = [line for line in up.stdout.splitlines() if "booting at" in line]
    assert len(started) == HOSTS
    assert not list((STATE / "hosts").glob("*/host.json"))
    assert_nothing_left([])
    # ... and the next up works.
    up = lab(env, "up")
    assert up.returncode == 0, up.stderr
    running = snapshot()
    assert lab(env, "down").returncode == 0
    assert_nothing_left(running)
