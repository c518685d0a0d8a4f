"""How a multi-node serving group stops and starts, per order and KillMode, on real systemd units.

    GPUFLEET_LAB_INVENTORY=/path/hosts.yml .venv/bin/python tests/benchmarks/bench_group_order.py \
        [--group serving_1] [--versions 0.5.23,0.5.11] [--load 3] [--stop-timeout 15]

Needs a lab with serving groups (`lab.py up --groups 2x2`). On the group's hosts it installs a
unit `gpfgroup.service` per node (the simulator with the group's own argv from
plugins/module_utils/_groups.py, Restart=on-failure, RestartSec=2) and for each SGLang release,
KillMode (mixed, control-group) and stop order (head first, follower first) measures:
how long `systemctl stop` of the first node takes, what the other node does within 15 s (its
exit status, whether systemd restarts it), and how long `systemctl stop` of the second takes.
Then the start orders: head first, followers first, and a follower 5 s late: the time from the
first `systemctl start` to the head's /health 200. Prints the tables (figures, no verdicts) and
removes its units. Also the lab smoke of issue 32: the head serves /generate, the follower logs
the stand-in line and its /health answers.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / ".build" / "collections"))

from ansible.inventory.manager import InventoryManager  # noqa: E402
from ansible.parsing.dataloader import DataLoader  # noqa: E402
from ansible.vars.manager import VariableManager  # noqa: E402

from ansible_collections.gpufleet.inference.plugins.module_utils import _groups  # noqa: E402

UNIT = "gpfgroup.service"
PORT = 30000


def log(msg):
    sys.stderr.write(f"[group-order {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def inventory_hostvars(path):
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[path])
    manager = VariableManager(loader=loader, inventory=inventory)
    return {host.name: dict(manager.get_vars(host=host)) for host in inventory.get_hosts()}


class Host:
    def __init__(self, name, variables):
        self.name = name
        self.address = variables["ansible_host"]
        self.bind = variables.get("sglang_host") or self.address
        self.key = variables.get("ansible_ssh_private_key_file")
        self.python = variables.get("sglang_python") or "/opt/sglang/venv/bin/python"

    def sh(self, command, timeout=120, check=True):
        argv = ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "-o", "BatchMode=yes", *(["-i", self.key] if self.key else []), f"root@{self.address}", command]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{self.name}: {command!r} failed rc={proc.returncode}: {proc.stderr[-500:]}")
        return proc.stdout

    def show(self):
        out = self.sh(f"systemctl show {UNIT} -p ActiveState -p SubState -p ExecMainStatus -p ExecMainCode "
                      "-p NRestarts -p InvocationID", check=False)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, since):
        return self.sh(f"journalctl -u {UNIT} --since @{since:.0f} -o cat --no-pager", check=False)


def unit_text(host, argv, version, kill_mode, load, stop_timeout):
    command = " ".join(shlex.quote(a) for a in [host.python, "-m", "sglang.launch_server", *argv])
    return "\n".join([
        "[Unit]", "Description=gpufleet group-order measurement node", "[Service]", "Type=simple",
        f"ExecStart={command}", f"Environment=SGLANG_SIM_VERSION={version}",
        f"Environment=SGLANG_SIM_LOAD_SECONDS={load}", "Environment=SGLANG_SIM_DRAIN_POLL_SECONDS=1",
        f"KillMode={kill_mode}", "Restart=on-failure", "RestartSec=2", f"TimeoutStopSec={stop_timeout}", ""])


def install(group, hosts, version, kill_mode, load, stop_timeout):
    for name in group.hosts:
        host = hosts[name]
        argv = ["--model-path", "/models/group-order", "--tp-size", str(group.nnodes), "--host", host.bind,
                "--port", str(PORT), *group.node_args(name)]
        text = unit_text(host, argv, version, kill_mode, load, stop_timeout)
        host.sh(f"systemctl stop {UNIT} >/dev/null 2>&1; cat > /etc/systemd/system/{UNIT} <<'EOF'\n{text}EOF\n"
                f"systemctl daemon-reload; systemctl reset-failed {UNIT} >/dev/null 2>&1; true")


def http_status(url, body=None, timeout=3):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, urllib.error.URLError):
        return 0


def start(hosts, names, gap=0.0):
    began = time.monotonic()
    for position, name in enumerate(names):
        if position and gap:
            time.sleep(gap)
        hosts[name].sh(f"systemctl start {UNIT}")
    return began


def wait_head(head, began, timeout=120):
    while time.monotonic() - began < timeout:
        if http_status(f"http://{head.bind}:{PORT}/health", timeout=2) == 200:
            return time.monotonic() - began
        time.sleep(0.1)
    return None


def wait_inactive(host, timeout):
    """(seconds until inactive with no restart pending, or None; the last show)."""
    began = time.monotonic()
    state = host.show()
    while time.monotonic() - began < timeout:
        state = host.show()
        if state.get("ActiveState") in ("inactive", "failed") and state.get("SubState") != "auto-restart":
            return time.monotonic() - began, state
        time.sleep(0.2)
    return None, state


def stop_scenario(group, hosts, version, kill_mode, first_is_head, load, stop_timeout):
    install(group, hosts, version, kill_mode, load, stop_timeout)
    head, follower = hosts[group.head], hosts[group.followers[0]]
    began = start(hosts, group.start_order())
    ready = wait_head(head, began)
    if ready is None:
        return {"error": "the group never served"}
    time.sleep(1.0)
    first, second = (head, follower) if first_is_head else (follower, head)
    before = second.show()
    since = time.time()
    tic = time.monotonic()
    first.sh(f"systemctl stop {UNIT}", timeout=stop_timeout + 60)
    first_stop = time.monotonic() - tic
    # What the other node does by itself meanwhile (up to 15 s): exits? fails? restarted?
    watch = time.monotonic()
    exited_after, status, restarted = None, "still running", False
    while time.monotonic() - watch < 15:
        state = second.show()
        invocation = state.get("InvocationID")
        if int(state.get("NRestarts") or 0) > int(before.get("NRestarts") or 0) or (
                invocation and invocation != before.get("InvocationID")):
            restarted = True
        if exited_after is None and (state.get("ActiveState") != "active" or restarted):
            exited_after = time.monotonic() - tic
            # ExecMainCode 1 = exited (status: the exit code), 2 = killed (status: the signal)
            code = {"1": "exit", "2": "killed by signal"}.get(state.get("ExecMainCode"), state.get("ExecMainCode"))
            status = f"{code} {state.get('ExecMainStatus')}"
        time.sleep(0.1)
    journal = second.journal(since)
    tic = time.monotonic()
    second.sh(f"systemctl stop {UNIT}", timeout=stop_timeout + 60)
    second_stop = time.monotonic() - tic
    return {"first_stop": first_stop, "other_exited": exited_after, "other_status": status,
            "other_restarted": restarted,
            "second_stop": second_stop, "other_lines": [line for line in journal.splitlines()
                                                        if any(k in line for k in ("terminated with", "SIGTERM received",
                                                                                   "SIGQUIT received", "Received sigquit",
                                                                                   "Connection closed", "Read error"))]}


def smoke(group, hosts, load):
    install(group, hosts, "0.5.23", "mixed", load, 15)
    head, follower = hosts[group.head], hosts[group.followers[0]]
    since = time.time()
    began = start(hosts, group.start_order())
    ready = wait_head(head, began)
    generate = http_status(f"http://{head.bind}:{PORT}/generate",
                           {"text": "hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    time.sleep(0.5)
    stand_in = [line for line in follower.journal(since).splitlines() if "Dummy health check server" in line]
    result = {"head_ready_s": ready, "generate": generate, "follower_stand_in_line": stand_in,
              "follower_health": http_status(f"http://{follower.bind}:{PORT}/health"),
              "follower_generate": http_status(f"http://{follower.bind}:{PORT}/generate", {"text": "x"})}
    for name in group.stop_order():
        hosts[name].sh(f"systemctl stop {UNIT}")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", default=os.environ.get("GPUFLEET_LAB_INVENTORY"))
    parser.add_argument("--group", default=None)
    parser.add_argument("--versions", default="0.5.23,0.5.11")
    parser.add_argument("--load", type=float, default=3.0)
    parser.add_argument("--stop-timeout", type=int, default=15)
    args = parser.parse_args()
    if not args.inventory:
        parser.error("--inventory or GPUFLEET_LAB_INVENTORY is required")
    hostvars = inventory_hostvars(args.inventory)
    groups = _groups.serving_groups(hostvars)
    if not groups:
        parser.error(f"{args.inventory} has no serving group (lab.py up --groups 2x2)")
    group = groups[args.group or sorted(groups)[0]]
    hosts = {name: Host(name, hostvars[name]) for name in group.hosts}
    log(f"group {group.name}: head {group.head}, followers {group.followers}, {group.dist_init_addr}")
    try:
        print("## Smoke (0.5.23, KillMode=mixed)")
        print(json.dumps(smoke(group, hosts, args.load), indent=1))
        print("\n## Stop order (the other node watched for 15 s; TimeoutStopSec=%d)" % args.stop_timeout)
        print("| release | KillMode | stopped first | its stop | other exited after | other's status | "
              "other restarted | other's stop |")
        print("|---|---|---|---|---|---|---|---|")
        lines = {}
        for version in args.versions.split(","):
            for kill_mode in ("mixed", "control-group"):
                for first_is_head in (True, False):
                    log(f"{version} {kill_mode} {'head' if first_is_head else 'follower'} first")
                    r = stop_scenario(group, hosts, version, kill_mode, first_is_head, args.load, args.stop_timeout)
                    if "error" in r:
                        print(f"| {version} | {kill_mode} | {'head' if first_is_head else 'follower'} | "
                              f"{r['error']} | | | | |")
                        continue
                    other = "—" if r["other_exited"] is None else f"{r['other_exited']:.1f} s"
                    print(f"| {version} | {kill_mode} | {'head' if first_is_head else 'follower'} | "
                          f"{r['first_stop']:.1f} s | {other} | {r['other_status']} | "
                          f"{'yes' if r['other_restarted'] else 'no'} | {r['second_stop']:.1f} s |")
                    lines[(version, kill_mode, first_is_head)] = r["other_lines"]
        print("\n## Start order (0.5.23, KillMode=mixed): first `systemctl start` to the head's /health 200")
        print("| order | head ready after |")
        print("|---|---|")
        for label, names, gap in (("head first", [group.head, *group.followers], 0.0),
                                  ("followers first", group.start_order(), 0.0),
                                  ("head, then a follower 5 s later", [group.head, *group.followers], 5.0)):
            install(group, hosts, "0.5.23", "mixed", args.load, args.stop_timeout)
            began = start(hosts, names, gap)
            ready = wait_head(hosts[group.head], began)
            print(f"| {label} | {'never' if ready is None else f'{ready:.1f} s'} |")
            for name in group.stop_order():
                hosts[name].sh(f"systemctl stop {UNIT}")
        print("\n## What the other node logged")
        for (version, kill_mode, first_is_head), found in lines.items():
            print(f"- {version} {kill_mode} {'head' if first_is_head else 'follower'} first: "
                  + " / ".join(line.split("] ", 1)[-1][:110] for line in found[:4]))
    finally:
        for host in hosts.values():
            host.sh(f"systemctl stop {UNIT} >/dev/null 2>&1; rm -f /etc/systemd/system/{UNIT}; "
                    f"systemctl daemon-reload; systemctl reset-failed {UNIT} >/dev/null 2>&1; true", check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
