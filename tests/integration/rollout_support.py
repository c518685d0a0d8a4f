"""Helpers of the fleet and rollout lab tests: inventories, the router, the state of every host
(read through the container, not SSH), the rollout's records, and faults (SSH cut, router paused
or killed, a playbook interrupted).

Hosts are read with nsenter into each container's namespaces (root on the lab's machine): a host
whose sshd a test stopped can still be inspected, and no inspection opens an SSH connection that
could hide a fault. Faults touch only this lab: its containers (by the PID the lab recorded), its
router (by the PID in router.json), and the ansible-playbook processes a test started.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml
from lab_support import BIN, REPO, ansible_playbook
from role_support import generate

LOAD_SECONDS = "2"  # simulated weight loading; the code under test is sized for minutes
# The simulator's SIGTERM watchdog polls every 5 s by default (like SGLang's): 1 s keeps stops short.
SIM_ENV = {"SGLANG_SIM_LOAD_SECONDS": LOAD_SECONDS, "SGLANG_SIM_DRAIN_POLL_SECONDS": "1"}
MIN_READY_SECONDS = 2  # the settle window after /generate answers (default 10 s)
WINDOW_FLAG = "--speculative-dflash-draft-window-size"  # the simulator's default profile is 0.5.11
UNIT_PATH = "/etc/systemd/system/sglang.service"
LAST_GOOD_DIR = "/var/lib/gpufleet-inference/last-good/sglang.service"
FLEET_DIR = "/var/lib/gpufleet-inference/fleet"  # each host's lease and record (sglang_fleet_dir)
ROLLOUT = "playbooks/rollout.yml"
APPLY_PLAY = "Apply the change, batch by batch (only the hosts that must change)"
WAIT_HANDLER = "Wait until the new SGLang process runs the intended settings"
# A line of the wait's progress for a host (the plugin may prefix them with its name).
PROGRESS = r"^(?:[\w.]+ \| )?{host}: \[\s*[\d.]+s\] {text}"
# Statuses after which a host runs the intended settings, verified and in the router.
DONE = ("updated", "recovered", "unchanged (verified)")


# ------------------------------------------------------------------ inventories and deploys

# Parallel first install (no canary needed on clean hosts), optionally joining the router.
DEPLOY = """
- name: Deploy SGLang on clean lab hosts
  hosts: gpu
  gather_facts: false
  tasks:
    - name: Apply the role
      ansible.builtin.include_role:
        name: gpufleet.inference.sglang
    - name: Join the router
      gpufleet.inference.sglang_router_worker:
        router_url: "{{ sglang_router_url }}"
        worker_url: "http://{{ sglang_host }}:{{ sglang_port | default(30000) }}"
        worker_api_key: "{{ sglang_api_key | default(omit, true) }}"
        state: present
      when: join_router | default(false) | bool and sglang_router_url | default('') | length > 0
"""

# The role's rendering of a host's intent, installed without a restart: what a play leaves when
# it dies after "Install the SGLang unit" and before its restart handler (no daemon-reload either).
INSTALL_WITHOUT_RESTART = """
- name: Install the rendered unit, as a play that died before its restart handler
  hosts: gpu
  gather_facts: false
  tasks:
    - name: Render the intent with the role's read-only entry point
      ansible.builtin.include_role:
        name: gpufleet.inference.sglang
        tasks_from: drift
        public: true
    - name: Install the unit the role renders (no handler, no daemon-reload)
      ansible.builtin.copy:
        content: "{{ sglang_drift.prepared.unit_text }}"
        dest: "{{ sglang_drift.prepared.paths.unit }}"
        owner: root
        group: root
        mode: "0644"
"""


class FleetInventory:
    """A copy of the lab inventory in a directory of its own, with group_vars/host_vars files:
    settings go there, not into extra vars (those would override a sweep's per-combination values
    and a host's own variables)."""

    def __init__(self, directory: Path, lab_inventory: Path, server_vars):
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.hosts_yml = directory / "hosts.yml"
        self.hosts_yml.write_text(lab_inventory.read_text())
        self.server_vars = server_vars
        (directory / "deploy.yml").write_text(DEPLOY)
        # SSH masters (ControlPersist) of its own: a master left by a run a test killed or cut off
        # never serves another test's connections. Short: a socket path has at most 107 bytes.
        self.control_dir = Path(tempfile.mkdtemp(prefix="gpf-cp-", dir="/tmp"))
        self.env = {"ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.control_dir)}

    def master_pid(self, address: str, port: int = 22, user: str = "root") -> int | None:
        """The PID of the SSH master (ControlPersist) of this inventory's runs to a host, or None.
        Its socket is named as ansible's ssh plugin names it (_create_control_path)."""
        name = hashlib.sha1(f"{address}-{port}-{user}".encode()).hexdigest()[:10]
        proc = subprocess.run(["ssh", "-O", "check", "-o", f"ControlPath={self.control_dir / name}", "lab-host"],
                              capture_output=True, text=True, timeout=15, check=False)
        match = re.search(r"Master running \(pid=(\d+)\)", proc.stderr)
        return int(match.group(1)) if match else None

    def close(self) -> None:
        """Stop the SSH masters of this inventory's runs."""
        for socket_path in self.control_dir.iterdir():
            subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={socket_path}", "lab-host"], capture_output=True,
                           timeout=15, check=False)
        shutil.rmtree(self.control_dir, ignore_errors=True)

    def _write(self, kind: str, name: str, data: dict) -> None:
        path = self.dir / kind / f"{name}.yml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(data))

    def set_vars(self, **over) -> dict:
        """group_vars/gpu.yml: the lab's fast DFlash server (SIM_ENV, a short settle) plus `over`."""
        # the canary analysis (on by default) only where a test asks for it: it benchmarks for a while
        data = self.server_vars(sglang_environment=SIM_ENV, sglang_ready_timeout=90,
                                sglang_min_ready_seconds=MIN_READY_SECONDS, rollout_analysis=False) | over
        self._write("group_vars", "gpu", data)
        return data

    def set_host_vars(self, name: str, **data) -> None:
        self._write("host_vars", name, data)

    def deploy(self, limit: str | None = None, join_router: bool = False):
        run = ansible_playbook(self.hosts_yml, str(self.dir / "deploy.yml"), {"join_router": join_router},
                               limit=limit, env=self.env)
        if run.rc != 0 and "status=219" in run.out:
            # Lab trap (hybrid cgroups in nspawn): right after a cleanup, systemd may fail to set up
            # the unit's cgroup (219/CGROUP) and the role fails fast on that dead invocation. The
            # deploy is the test's setup, not what it tests: once more.
            print(f"deploy hit 219/CGROUP (lab trap), deploying again:\n{run.out[-1500:]}")
            run = ansible_playbook(self.hosts_yml, str(self.dir / "deploy.yml"), {"join_router": join_router},
                                   limit=limit, env=self.env)
        assert run.rc == 0, run
        return run


@pytest.fixture
def fleet_inv(lab_inventory, server_vars, tmp_path):
    """(hosts.yml, set_vars(**over), set_host_vars(name, **vars), deploy(limit, join_router))."""
    inv = FleetInventory(tmp_path / "inventory", lab_inventory, server_vars)
    yield inv.hosts_yml, inv.set_vars, inv.set_host_vars, inv.deploy
    inv.close()


@pytest.fixture
def make_inventory(lab_inventory, server_vars, tmp_path):
    """make_inventory(name) -> a FleetInventory of its own (two rollouts with different settings)."""
    made = []

    def make(name="inventory"):
        made.append(FleetInventory(tmp_path / name, lab_inventory, server_vars))
        return made[-1]
    yield make
    for inv in made:
        inv.close()


def router_workers(url: str) -> list[dict]:
    return requests.get(f"{url}/workers", timeout=5).json().get("workers", [])


def worker_url(host: dict) -> str:
    return f"http://{host['address']}:30000"


def remove_workers(url: str, hosts: list[dict], timeout: float = 30) -> None:
    """Take the workers of `hosts` out of the router and wait until it no longer lists them."""
    wanted = {worker_url(h) for h in hosts}
    for worker in router_workers(url):
        if worker["url"] in wanted:
            requests.delete(f"{url}/workers/{worker['id']}", timeout=5)
    deadline = time.monotonic() + timeout
    while any(w["url"] in wanted for w in router_workers(url)):
        if time.monotonic() > deadline:
            raise AssertionError(f"router still lists {wanted}: {router_workers(url)}")
        time.sleep(0.3)


def add_workers(url: str, hosts: list[dict], timeout: float = 60) -> None:
    """Put the workers of `hosts` into the router and wait until it lists them healthy."""
    for host in hosts:
        requests.post(f"{url}/workers", json={"url": worker_url(host)}, timeout=5)
    wanted = {worker_url(h) for h in hosts}
    deadline = time.monotonic() + timeout
    while not wanted <= {w["url"] for w in router_workers(url) if w.get("is_healthy")}:
        if time.monotonic() > deadline:
            raise AssertionError(f"router does not list {wanted} healthy: {router_workers(url)}")
        time.sleep(0.5)


@pytest.fixture
def need_router(router_clean):
    """conftest's router_clean (no lab worker in the router before and after), or a skip."""
    if not router_clean:
        pytest.skip("the lab inventory sets no sglang_router_url (lab.py up --router)")
    return router_clean


def invocations(lab_hosts, state_of) -> dict:
    return {h["name"]: state_of(h)["InvocationID"] for h in lab_hosts}


def config_line(sh, host: dict, invocation: str) -> str:
    """The config line logged by one invocation (never the unit's older ones)."""
    return sh(host, f"journalctl _SYSTEMD_INVOCATION_ID={invocation} -o cat --no-pager"
                    " | grep 'Initialized DFLASH draft runner' || true").strip()


def journal_time(sh, host: dict, invocation: str, text: str) -> float | None:
    """Wall-clock time (s) of the first line of an invocation containing text."""
    out = sh(host, f"journalctl _SYSTEMD_INVOCATION_ID={invocation} -o json --no-pager"
                   f" --grep {json.dumps(text)} || true")
    for line in out.splitlines():
        entry = json.loads(line)
        return int(entry["__REALTIME_TIMESTAMP"]) / 1e6
    return None


def play_batches(out: str, play_name: str = APPLY_PLAY) -> list[list[str]]:
    """Hosts of each serial batch of a play, in order, from the play's banners in the output."""
    chunks = re.split(r"^PLAY \[(.*?)\] \*+$", out, flags=re.M)
    batches = []
    for name, body in zip(chunks[1::2], chunks[2::2]):
        if name != play_name:
            continue
        hosts = []
        for host in re.findall(r"^(?:ok|changed|included|fatal|failed): \[?([^\]\s]+?)(?: -> \S+)?\]", body, re.M):
            if host not in hosts and host != "localhost":
                hosts.append(host)
        batches.append(hosts)
    return batches


# ------------------------------------------------------------------ the lab itself

class Lab:
    """The lab behind the inventory: its state directory (/var/lib/gpufleet-lab/<lab>/), its
    containers (entered with nsenter) and its router (router.json)."""

    def __init__(self, inventory: Path, hosts: list[dict]):
        self.inventory = inventory
        data = yaml.safe_load(inventory.read_text())
        key = data["all"]["children"]["gpu"]["vars"]["ansible_ssh_private_key_file"]
        self.state = Path(key).parent
        self.hosts = hosts

    # --- containers

    def init_pid(self, name: str) -> int:
        """The container's systemd (PID 1 inside), a child of the nspawn PID the lab recorded."""
        meta = json.loads((self.state / "hosts" / name / "host.json").read_text())
        children = Path(f"/proc/{meta['pid']}/task/{meta['pid']}/children").read_text().split()
        assert children, f"{name}: nspawn pid {meta['pid']} has no child (container down?)"
        return int(children[0])

    def enter(self, name: str, argv: list[str], stdin: str | None = None, timeout: float = 60,
              check: bool = True) -> str:
        """Run argv inside the container of host `name` (all its namespaces), without SSH."""
        proc = subprocess.run(["nsenter", "-t", str(self.init_pid(name)), "-a", "--", *argv], input=stdin,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"{name}: {argv} rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def cut_ssh(self, name: str) -> None:
        """Stop sshd on the host and end every SSH session to it (ansible's ControlPersist master
        included): sshd's sessions run in ssh.service's cgroup (no logind scopes in the lab), which
        `systemctl stop` leaves alone (KillMode=process)."""
        self.enter(name, ["systemctl", "stop", "ssh.service"])
        namespace = os.readlink(f"/proc/{self.init_pid(name)}/ns/pid")
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if os.readlink(proc / "ns" / "pid") != namespace:
                    continue
                if "/system.slice/ssh.service" not in (proc / "cgroup").read_text():
                    continue
                os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue  # gone meanwhile

    def restore_ssh(self, name: str) -> None:
        self.enter(name, ["systemctl", "start", "ssh.service"])

    # --- the router

    def router(self) -> dict:
        return json.loads((self.state / "router.json").read_text())

    def _router_signal(self, sig: int) -> None:
        # The lab starts it in a session of its own: the group is exactly what the lab started.
        os.killpg(self.router()["pid"], sig)

    def pause_router(self) -> None:
        self._router_signal(signal.SIGSTOP)

    def resume_router(self) -> None:
        self._router_signal(signal.SIGCONT)

    def kill_router(self) -> None:
        pid = self.router()["pid"]
        self._router_signal(signal.SIGKILL)
        deadline = time.monotonic() + 20
        while Path(f"/proc/{pid}").exists() and _state_of_pid(pid) != "Z":
            assert time.monotonic() < deadline, f"router pid {pid} did not die"
            time.sleep(0.2)

    def start_router(self) -> None:
        """The lab's own `up --router` (hosts kept; a new router on the same address and port;
        it adds the hosts whose server answers /health)."""
        first = self.hosts[0]["address"]
        env = dict(os.environ, LAB_NAME=self.state.name, LAB_NET=first.rsplit(".", 1)[0],
                   LAB_FIRST=first.rsplit(".", 1)[1], LAB_INVENTORY=str(self.inventory),
                   LAB_ROUTER_PORT=str(self.router_port))
        proc = subprocess.run([str(BIN / "python"), str(REPO / "tests" / "lab" / "lab.py"), "up", "--hosts",
                               str(len(self.hosts)), "--router"], env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert proc.returncode == 0, f"lab up --router failed:\n{proc.stdout}\n{proc.stderr}"

    @property
    def router_port(self) -> int:
        return int(yaml.safe_load(self.inventory.read_text())["all"]["children"]["gpu"]["vars"]
                   ["sglang_router_url"].rsplit(":", 1)[1])


def _state_of_pid(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@pytest.fixture(scope="session")
def lab(lab_inventory, lab_hosts) -> Lab:
    Records.lab = Lab(lab_inventory, lab_hosts)
    return Records.lab


# ------------------------------------------------------------------ what every host runs

# Run inside a container: the unit, its main process, the config line of its current invocation
# and the last-known-good copy, as one JSON document.
_SNAPSHOT = r"""
import json, os, subprocess
def sh(cmd):
    return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout
def read(path, mode="r"):
    try:
        with open(path, mode) as handle:
            return handle.read()
    except OSError:
        return None
show = dict(line.split("=", 1) for line in sh("systemctl show sglang.service -p InvocationID,ActiveState,"
            "SubState,MainPID,NRestarts,NeedDaemonReload").splitlines() if "=" in line)
pid = show.get("MainPID", "0")
raw = read("/proc/%s/cmdline" % pid, "rb") if pid not in ("", "0") else None
invocation = show.get("InvocationID", "")
lines = sh("journalctl _SYSTEMD_INVOCATION_ID=%s -o cat --no-pager | grep 'Initialized DFLASH draft runner'"
           % invocation).strip().splitlines() if invocation else []
record = read("LAST_GOOD/record.json")
def load(path):
    text = read(path)
    return json.loads(text) if text else None
import time
print(json.dumps({"show": show, "unit": read("UNIT"), "now": time.time(),
                  "lease": load("FLEET/sglang.service.lease.json"), "fleet_record": load("FLEET/sglang.service.record.json"),
                  "cmdline": [a.decode() for a in raw.split(b"\0") if a] if raw else None,
                  "config_lines": lines, "last_good": json.loads(record) if record else None,
                  "last_good_unit": read("LAST_GOOD/file" + "UNIT".replace("/", "__"))}))
""".replace("LAST_GOOD", LAST_GOOD_DIR).replace("UNIT", UNIT_PATH).replace("FLEET", FLEET_DIR)


def unit_window(text: str | None):
    """The draft window in a unit's text: an int, 'none' (no flag), or None (no unit)."""
    if text is None:
        return None
    match = re.search(r'"%s"\s*(?:\\\n)?\s*"(\d+)"' % re.escape(WINDOW_FLAG), text)
    return int(match.group(1)) if match else "none"


def argv_window(argv: list[str] | None):
    if argv is None:
        return None
    return int(argv[argv.index(WINDOW_FLAG) + 1]) if WINDOW_FLAG in argv else "none"


def line_window(lines: list[str]):
    if not lines:
        return None
    match = re.search(r"draft_window_size=(\w+)", lines[-1])
    return int(match.group(1)) if match and match.group(1).isdigit() else (match.group(1) if match else None)


def host_state(lab: Lab, host: dict, router_members: set | None = None) -> dict:
    raw = json.loads(lab.enter(host["name"], ["python3", "-"], stdin=_SNAPSHOT))
    show = raw["show"]
    state = {
        "name": host["name"],
        "invocation": show.get("InvocationID") or None,
        "active": show.get("ActiveState"), "sub": show.get("SubState"),
        "main_pid": int(show.get("MainPID") or 0), "restarts": int(show.get("NRestarts") or 0),
        "need_reload": show.get("NeedDaemonReload") == "yes",
        "unit": raw["unit"], "unit_window": unit_window(raw["unit"]),
        "cmdline": raw["cmdline"], "process_window": argv_window(raw["cmdline"]),
        "config_lines": raw["config_lines"], "logged_window": line_window(raw["config_lines"]),
        "last_good": raw["last_good"], "last_good_window": unit_window(raw["last_good_unit"]),
        "last_good_unit": raw["last_good_unit"],
        "lease": raw["lease"], "fleet_record": raw["fleet_record"],
        "leased": bool(raw["lease"]) and not raw["lease"].get("released")
        and float(raw["lease"].get("expires") or 0) > raw["now"],
        "serving": bool((generate(host["address"], timeout=10) or {}).get("text")),
    }
    if router_members is not None:
        state["in_router"] = worker_url(host) in router_members
    return state


def fleet_state(lab: Lab, hosts: list[dict], router: str | None) -> dict:
    """name -> host_state, with router membership from one GET <router>/workers."""
    members = {w["url"] for w in router_workers(router)} if router else None
    return {h["name"]: host_state(lab, h, members) for h in hosts}


def describe(state: dict) -> str:
    return (f"{state['name']}: invocation {state['invocation']} {state['active']}/{state['sub']}, unit window "
            f"{state['unit_window']}, process {state['process_window']}, logged {state['logged_window']}, "
            f"serving {state['serving']}, in router {state.get('in_router')}, last-good window "
            f"{state['last_good_window']} (invocation {(state['last_good'] or {}).get('invocation_id')})")


def assert_runs(state: dict, window: int, in_router: bool | None = None) -> None:
    """The host runs `window`: unit file, its process's command line and that invocation's config
    line agree, the server answers /generate (and it is, or is not, in the router)."""
    assert state["active"] == "active" and state["sub"] == "running", describe(state)
    assert state["unit_window"] == state["process_window"] == state["logged_window"] == window, describe(state)
    assert len(state["config_lines"]) == 1, describe(state)  # one process, one config line
    assert state["serving"], describe(state)
    if in_router is not None:
        assert state["in_router"] is in_router, describe(state)


# ------------------------------------------------------------------ the rollout's records

class Records:
    """A results root (rollout_results_dir), the controller's copy: <run>/run.json, summary.json,
    summary.md, <host>.json - and what the fleet holds: each lab host's lease and record."""

    lab: "Lab | None" = None  # set by the lab fixture: the hosts whose leases and records are read

    def __init__(self, root: Path):
        self.root = Path(root)

    def run_ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def _fleet(self) -> dict:
        assert Records.lab is not None, "Records needs the lab fixture"
        return {host["name"]: host_state(Records.lab, host) for host in Records.lab.hosts}

    def lock(self) -> dict | None:
        """The leases that bind on the fleet now ({host: lease}), or None when no host is leased."""
        held = {name: state["lease"] for name, state in self._fleet().items() if state["leased"]}
        return held or None

    def ledger(self, host: str) -> dict | None:
        """The host's own record (sglang_fleet_dir/<unit>.record.json)."""
        match = [h for h in Records.lab.hosts if h["name"] == host]
        return host_state(Records.lab, match[0])["fleet_record"] if match else None

    def run(self, run_id: str) -> dict:
        return json.loads((self.root / run_id / "run.json").read_text())

    def summary(self, run_id: str) -> dict:
        return json.loads((self.root / run_id / "summary.json").read_text())

    def hosts(self, run_id: str) -> dict:
        """host -> its record in the run (the host files, not the summary)."""
        out = {}
        for path in sorted((self.root / run_id).glob("*.json")):
            if path.name not in ("run.json", "summary.json"):
                out[path.stem] = json.loads(path.read_text())
        return out

    def only_run(self) -> str:
        runs = self.run_ids()
        assert len(runs) == 1, f"expected one run in {self.root}, found {runs}"
        return runs[0]


def assert_records_consistent(records: Records, run_id: str, last_writer: bool = True) -> dict:
    """The run's files agree with each other: summary.json is exactly the host files (and counts
    them), every record belongs to this run, and - when this run was the last to touch the fleet
    (`last_writer`) and is not a check run - each host's own record says the same about it."""
    hosts = records.hosts(run_id)
    summary = records.summary(run_id)
    meta = records.run(run_id)
    assert summary["hosts"] == [hosts[name] for name in sorted(hosts)], (summary, hosts)
    counts = {}
    for record in hosts.values():
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    assert summary["counts"] == counts, summary
    assert summary["run"] == meta, (summary["run"], meta)
    assert meta["run_id"] == run_id
    for name, record in hosts.items():
        assert record["host"] == name and record["run_id"] == run_id, record
        assert record["steps"] and record["steps"][-1]["status"] == record["status"], record
    if last_writer and not meta.get("check_mode"):
        for name, record in hosts.items():
            if record.get("connection_lost"):
                continue  # what happened after the connection was lost is known only to the controller's copy
            ledger = records.ledger(name)
            assert ledger and ledger["run_id"] == run_id, (name, ledger)
            for key in ("status", "step", "in_router"):
                assert ledger.get(key) == record.get(key), (name, key, ledger, record)
    return hosts


def assert_record_matches_host(record: dict, state: dict) -> None:
    """What a record says about router membership and the running process is what is there."""
    if record.get("in_router") is not None:
        assert record["in_router"] is state["in_router"], (record, describe(state))
    if record["status"] in DONE or record["status"] == "verified, not rejoined":
        current = record.get("new_invocation") or record.get("old_invocation")
        assert current == state["invocation"], (record, describe(state))
        assert record["observed"]["draft_window_size"] == state["logged_window"], (record, describe(state))
    if record["status"] == "reverted":
        assert record["revert"]["invocation_id"] == state["invocation"], (record, describe(state))
        assert record["revert"]["observed"]["draft_window_size"] == state["logged_window"], (record, describe(state))


# ------------------------------------------------------------------ ansible-playbook in the background

def playbook_env(extra: dict | None = None) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=str(REPO / ".build" / "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


class Playbook:
    """ansible-playbook started in a session of its own (so a test can Ctrl-C it as a terminal
    would: SIGINT to its process group), its output read line by line as it comes."""

    def __init__(self, inventory: Path, playbook: str, *args: str, extra_vars: dict | None = None,
                 limit: str | None = None, env: dict | None = None, log: Path | None = None):
        argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook)]
        if extra_vars:
            argv += ["-e", json.dumps(extra_vars)]
        if limit:
            argv += ["--limit", limit]
        argv += list(args)
        self.argv = argv
        self.log = log  # the whole output is written there at the end (a failure shows only its tail)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd=str(REPO), env=playbook_env(env), start_new_session=True)
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self._new = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.rc = None
        self.seconds = None
        self.matched_at = 0  # the line index of the last wait_for match

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._new.put(line)
        self._new.put(None)

    @property
    def out(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 600, after: int = 0) -> re.Match:
        """Block until a line (from line index `after` on) matches the regex `pattern`."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = after
        while True:
            while seen < len(self.lines):
                match = regex.search(self.lines[seen])
                seen += 1
                if match:
                    self.matched_at = seen - 1
                    return match
            if self.proc.poll() is not None and not self._reader.is_alive() and seen >= len(self.lines):
                raise AssertionError(f"ansible-playbook ended (rc {self.proc.returncode}) before a line matched "
                                     f"{pattern!r}:\n{self.out[-6000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no line matched {pattern!r} within {timeout}s:\n{self.out[-6000:]}")
            try:
                self._new.get(timeout=0.5)
            except queue.Empty:
                pass

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the whole process group (ansible-playbook, its workers, their ssh)."""
        os.killpg(self.pid, signal.SIGINT)

    def wait(self, timeout: float = 900) -> "Playbook":
        try:
            self.rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            processes = subprocess.run(["ps", "-o", "pid,ppid,stat,wchan:20,etime,args", "--forest", "-g",
                                        str(self.pid)], capture_output=True, text=True, check=False).stdout
            os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"ansible-playbook ran over {timeout}s; its processes then:\n{processes}\n"
                                 f"{self.out[-6000:]}")
        self._reader.join(30)
        self.seconds = time.monotonic() - self.started
        if self.log:
            Path(self.log).write_text(self.out + "\n")
        return self

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait()

    def __repr__(self):
        return (f"Playbook(rc={self.rc}, {self.seconds or 0:.1f} s: {' '.join(self.argv[3:])}; whole output in "
                f"{self.log})\n{self.out[-8000:]}")


def run_playbook_argv(inventory: Path, playbook: str, *args: str, timeout: float = 900, **kwargs) -> Playbook:
    """Playbook(...) run to its end."""
    run = Playbook(inventory, playbook, *args, **kwargs)
    try:
        return run.wait(timeout)
    finally:
        run.kill()


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (by PPid), found in /proc."""
    parents = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                status = (proc / "status").read_text()
            except OSError:
                continue
            match = re.search(r"^PPid:\s+(\d+)$", status, re.M)
            if match:
                parents.setdefault(int(match.group(1)), []).append(int(proc.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def ssh_clients_to(run: Playbook, address: str) -> list[int]:
    """The ssh client processes a playbook runs to `address` now (not its ControlPersist
    master, which detaches from the playbook's process tree)."""
    out = []
    for pid in descendants(run.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"ssh") and address.encode() in argv:
            out.append(pid)
    return out


def failures(out: str) -> list[tuple[str, str, str]]:
    """(task, host, message) of every `fatal:` result in ansible-playbook's output (yaml callback:
    the message is on the indented lines after the fatal line)."""
    found, task, lines = [], None, out.splitlines()
    for index, line in enumerate(lines):
        header = re.match(r"^(?:TASK|RUNNING HANDLER) \[(.*?)\] \**$", line)
        if header:
            task = header.group(1)
        fatal = re.match(r"^fatal: \[([^\]]+)\]: (?:FAILED|UNREACHABLE)! =>(.*)$", line)
        if fatal:
            body = [fatal.group(2)]
            for follow in lines[index + 1:]:
                if not follow.startswith(" "):
                    break
                body.append(follow)
            found.append((task, fatal.group(1).split(" -> ")[0], " ".join(" ".join(body).split())))
    return found


# ------------------------------------------------------------------ the fleet's leases and records (issue 29)

DEPLOYED_WINDOW = 1024  # what fleet_of deploys


@pytest.fixture
def fleet_of(clean_fleet, need_router, make_inventory, lab, lab_hosts):
    """deploy(hosts, **vars) -> (inventory, state): hosts deployed on window 1024 by the role, in the router."""
    def deploy(hosts, **over):
        inv = make_inventory()
        inv.set_vars(sglang_speculative_draft_window_size=DEPLOYED_WINDOW, **over)
        inv.deploy(limit=",".join(h["name"] for h in hosts), join_router=True)
        state = fleet_state(lab, lab_hosts, need_router)
        for host in hosts:
            assert_runs(state[host["name"]], DEPLOYED_WINDOW, in_router=True)
        return inv, state
    return deploy


def leases(lab: Lab, hosts: list[dict]) -> dict:
    """{host: lease} of the hosts whose lease binds now."""
    states = {h["name"]: host_state(lab, h) for h in hosts}
    return {name: state["lease"] for name, state in states.items() if state["leased"]}


def fleet_record(lab: Lab, host: dict) -> dict:
    """The host's own record (sglang_fleet_dir), {} when it has none."""
    return host_state(lab, host)["fleet_record"] or {}


def kill_group(run: Playbook) -> None:
    """The controller machine dies: SIGKILL to ansible-playbook and every process under it - its workers
    too, which run in sessions of their own and would outlive a kill of its process group (no finish,
    no release, no task goes on)."""
    for pid in descendants(run.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(run.pid, signal.SIGKILL)
    run.proc.wait()


def wait_lease_expired(lab: Lab, host: dict, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while leases(lab, [host]):
        assert time.monotonic() < deadline, f"{host['name']}: lease still binds after {timeout}s"
        time.sleep(1)


def in_router(url: str) -> set:
    return {w["url"] for w in router_workers(url)}
