"""Shared pieces of the benchmark scripts: the benchmark lab, playbook runs with task timestamps, stats.

The benchmarks use a lab of their own (LAB_NAME gpfbench on 127.0.8, inventory
.build/bench/hosts.yml), so a demo or test lab is never touched. Every playbook run enables the
callback plugin tests/benchmarks/callback_plugins/bench_times.py, which writes task starts and
host results with timestamps, so a figure can be taken between two task ends instead of around
ansible-playbook's own start-up.

Benchmarks print figures; they never fail on a figure. A missed target is printed as VIOLATED.
"""
from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
LAB_PY = REPO / "tests" / "lab" / "lab.py"
BUILD = REPO / ".build" / "bench"
# Ansible's home and remote tmp for the benchmarks' plays (lab hosts and localhost), outside the user's home.
BENCH_TMP = Path("/var/tmp/gpufleet-bench/.ansible/tmp")
LAB = {
    "LAB_NAME": os.environ.get("BENCH_LAB_NAME", "gpfbench"),
    "LAB_NET": os.environ.get("BENCH_LAB_NET", "127.0.8"),
    "LAB_INVENTORY": str(BUILD / "hosts.yml"),
}
LAB_STATE = Path(os.environ.get("LAB_STATE_DIR", "/var/lib/gpufleet-lab")) / LAB["LAB_NAME"]
INVENTORY = BUILD / "hosts.yml"
RESULTS_DIR = BUILD / "results"  # the rollouts' records and lock: never the repo's results/


def log(msg: str) -> None:
    """Progress on stderr (the figures go to stdout)."""
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


# ------------------------------------------------------------------------------ the lab

def lab_hosts() -> list[dict]:
    """The benchmark lab's hosts as the inventory lists them (name, address)."""
    if not INVENTORY.is_file():
        return []
    group = yaml.safe_load(INVENTORY.read_text())["all"]["children"]["gpu"]
    return [{"name": name, "address": hv["ansible_host"]} for name, hv in (group.get("hosts") or {}).items()]


def lab_up(hosts: int, exact: bool = False) -> tuple[bool, str]:
    """Boot the benchmark lab (with its router) to `hosts` hosts, or more when it has more
    (unless exact). Returns (ok, the lab's output): a lab that cannot boot is a result too."""
    if not exact:
        hosts = max(hosts, len(lab_hosts()))
    env = dict(os.environ, **LAB)
    env.setdefault("LAB_BOOT_TIMEOUT", str(120 + 4 * hosts))
    started = time.monotonic()
    log(f"lab {LAB['LAB_NAME']}: up --hosts {hosts} --router")
    proc = subprocess.run([sys.executable, str(LAB_PY), "up", "--hosts", str(hosts), "--router"],
                          env=env, capture_output=True, text=True, check=False)
    out = proc.stdout + proc.stderr
    log(f"lab {LAB['LAB_NAME']}: {'up' if proc.returncode == 0 else 'FAILED'} in "
        f"{time.monotonic() - started:.0f} s")
    return proc.returncode == 0, out


def lab_down() -> str:
    proc = subprocess.run([sys.executable, str(LAB_PY), "down"], env=dict(os.environ, **LAB),
                          capture_output=True, text=True, check=False)
    return proc.stdout + proc.stderr


def write_group_vars(settings: dict) -> None:
    """The benchmark inventory's group_vars/gpu.yml (next to the lab's generated hosts.yml)."""
    path = BUILD / "group_vars" / "gpu.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by tests/benchmarks (the run in progress).\n---\n" + yaml.safe_dump(settings))


def lab_vars() -> dict:
    group = yaml.safe_load(INVENTORY.read_text())["all"]["children"]["gpu"]
    return group["vars"]


def ssh_argv(address: str) -> list[str]:
    gvars = lab_vars()
    return ["ssh", "-i", gvars["ansible_ssh_private_key_file"], "-p", str(gvars["ansible_port"]),
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=20", f"root@{address}"]


def sh(address: str, command: str, timeout: float = 300, check: bool = True) -> str:
    proc = subprocess.run(ssh_argv(address) + [command], check=False, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{address}: `{command[:120]}` failed (rc {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def host_pidns(name: str) -> str | None:
    """The PID namespace of a lab host ("pid:[inode]"): its init is the child of its nspawn."""
    meta_path = LAB_STATE / "hosts" / name / "host.json"
    try:
        nspawn = json.loads(meta_path.read_text())["pid"]
        children = Path(f"/proc/{nspawn}/task/{nspawn}/children").read_text().split()
        return os.readlink(f"/proc/{children[0]}/ns/pid") if children else None
    except (OSError, ValueError, KeyError, IndexError):
        return None


def sim_version(address: str) -> str:
    return sh(address, "/opt/sglang/venv/bin/python -c 'import importlib.metadata as m; "
                       "print(m.version(\"sglang\"))'").strip()


def window_flag(version: str) -> str:
    """The draft-window flag the host's simulator release accepts without a warning."""
    parts = tuple(int(x) for x in re.findall(r"\d+", version)[:3])
    return "--speculative-draft-window-size" if parts >= (0, 5, 12) else "--speculative-dflash-draft-window-size"


def invocation_ids(hosts: list[dict], unit: str = "sglang.service") -> dict:
    out = {}
    for host in hosts:
        out[host["name"]] = sh(host["address"], f"systemctl show -p InvocationID --value {unit}",
                               check=False).strip()
    return out


def journal(address: str, *match: str, since: float | None = None, grep: str | None = None,
            last: int | None = None, fields=("MESSAGE",)) -> list[dict]:
    """Journal entries (JSON) of a lab host, with __REALTIME_TIMESTAMP as seconds in `t`."""
    argv = ["journalctl", "-o", "json", "--no-pager", "-q", "--output-fields=" + ",".join(fields)]
    if since is not None:
        argv.append("--since=@%.6f" % since)
    if grep:
        argv += ["-g", grep]
    if last:
        argv += ["-n", str(last)]
    argv += list(match)
    out = sh(address, " ".join("'%s'" % a.replace("'", "'\\''") for a in argv), check=False)
    entries = []
    for line in out.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        entry["t"] = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
        entries.append(entry)
    return entries


# ------------------------------------------------------------------------------ playbooks

class Run:
    """One ansible-playbook run: exit code, output, wall time, controller CPU, timed events."""

    def __init__(self, rc, out, wall, cpu_user, cpu_sys, events, started, ended):
        self.rc, self.out, self.wall = rc, out, wall
        self.cpu_user, self.cpu_sys = cpu_user, cpu_sys
        self.events, self.started, self.ended = events, started, ended

    @property
    def cpu(self) -> float:
        return self.cpu_user + self.cpu_sys

    def recap(self) -> dict:
        """PLAY RECAP per host: {host: {ok, changed, unreachable, failed, skipped, rescued, ignored}}."""
        recap = {}
        for match in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", self.out, re.M):
            recap[match.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(2))}
        return recap

    def results(self, task: str | None = None, host: str | None = None,
                kinds=("ok", "failed", "skipped", "unreachable")) -> list[dict]:
        return [e for e in self.events if e["kind"] in kinds and (task is None or e.get("task") == task)
                and (host is None or e.get("host") == host)]

    def task_starts(self, task: str) -> list[dict]:
        return [e for e in self.events if e["kind"] == "task" and e.get("task") == task]

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.out.splitlines()[-lines:])


def ansible_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".build" / "collections"),
        "ANSIBLE_CALLBACK_PLUGINS": str(HERE / "callback_plugins"),
        "ANSIBLE_CALLBACKS_ENABLED": "bench_times",
        "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        # Not the user's ~/.ansible: Ansible's home (it creates it at start) and a local task's remote tmp
        # (ansible-core 2.19 puts that in the passwd home, whatever HOME says).
        "ANSIBLE_HOME": str(BENCH_TMP.parent),
        "ANSIBLE_REMOTE_TMP": str(BENCH_TMP),
    })
    env.update(extra or {})
    return env


def ensure_collection_link() -> None:
    link = REPO / ".build" / "collections" / "ansible_collections" / "gpufleet" / "inference"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(REPO)


def playbook(path, inventory: Path = INVENTORY, extra_vars: dict | None = None, limit: str | None = None,
             env: dict | None = None, timeout: float = 3600, args: list[str] | None = None) -> Run:
    """Run ansible-playbook; CPU is its user+sys including every child it waited for (os.wait4)."""
    ensure_collection_link()
    fd, events_path = tempfile.mkstemp(prefix="events-", suffix=".jsonl", dir=str(BUILD))
    os.close(fd)
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(path)]
    if extra_vars:
        argv += ["-e", json.dumps(extra_vars)]
    if limit:
        argv += ["--limit", limit]
    argv += args or []
    run_env = ansible_env(dict(env or {}, GPF_BENCH_EVENTS=events_path))
    out_path = events_path.replace(".jsonl", ".out")
    started = time.time()
    t0 = time.monotonic()
    with open(out_path, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=run_env, cwd=str(REPO))
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.05)
    wall = time.monotonic() - t0
    ended = time.time()
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = Path(out_path).read_text(errors="replace")
    events = [json.loads(line) for line in Path(events_path).read_text().splitlines() if line.strip()]
    os.unlink(events_path)
    os.unlink(out_path)
    return Run(proc.returncode, text, wall, usage.ru_utime, usage.ru_stime, events, started, ended)


def ssh_master_cpu(addresses: set[str], port: int = 22, user: str = "root") -> dict:
    """CPU seconds of the controller's ssh ControlPersist masters for these addresses, by (pid, start).

    ansible's ssh masters detach from ansible-playbook (ControlPersist), so their CPU is not in its
    rusage; compare two snapshots to get what a run cost in them. A master renames itself
    "ssh: <control path> [mux]"; ansible names the path sha1("host-port-user")[:10]."""
    import hashlib
    paths = {hashlib.sha1(f"{a}-{port}-{user}".encode()).hexdigest()[:10] for a in addresses}
    found = {}
    tck = os.sysconf("SC_CLK_TCK")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        match = re.match(r"ssh: \S*/([0-9a-f]{10}) \[mux\]", cmd)
        if not match or match.group(1) not in paths:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        found[(name, fields[19])] = (int(fields[11]) + int(fields[12])) / tck
    return found


def master_delta(before: dict, after: dict) -> float:
    return sum(cpu - before.get(key, 0.0) for key, cpu in after.items())


# ------------------------------------------------------------------------------ figures

def pct(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def median(values):
    return statistics.median(values) if values else float("nan")


def fmt(value, digits=2, unit=""):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}{unit}"


def table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table (printed as is, and kept in RESULTS.md)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _h in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def verdict(ok: bool | None) -> str:
    if ok is None:
        return "n/a"
    return "met" if ok else "**VIOLATED**"


def machine() -> dict:
    """What the figures were measured on."""
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    return {"nproc": os.cpu_count(), "ram_gib": round(mem_kb / 1048576, 1), "kernel": os.uname().release,
            "loadavg": Path("/proc/loadavg").read_text().split()[:3]}


# ------------------------------------------------------------------------------ rollouts

ROLLOUT = REPO / "playbooks" / "rollout.yml"
STATE_FILE = BUILD / "state.json"
WINDOWS = (2048, 1024)  # the measured change: the draft window flips between these


def server_settings(window: int, load: float, settle: float, import_seconds: float = 0.0,
                    import_mb: int = 0, tp: int = 8, drain_poll: float | None = None) -> dict:
    """The lab fleet's group_vars (the simulator plays Kimi K2.6 + DFlash)."""
    env = {"SGLANG_SIM_LOAD_SECONDS": str(load)}
    if import_seconds:
        env["SGLANG_SIM_IMPORT_SECONDS"] = str(import_seconds)
    if import_mb:
        env["SGLANG_SIM_IMPORT_MB"] = str(import_mb)
    if drain_poll is not None:
        env["SGLANG_SIM_DRAIN_POLL_SECONDS"] = str(drain_poll)
    return {
        "sglang_model_path": "/models/moonshotai/Kimi-K2.6",
        "sglang_served_model_name": "kimi-k2.6",
        "sglang_tp_size": tp,
        "sglang_speculative_algorithm": "DFLASH",
        "sglang_speculative_draft_model_path": "/models/dflash/Kimi-K2.6-DFlash",
        "sglang_speculative_num_draft_tokens": 16,
        "sglang_speculative_draft_window_size": window,
        "sglang_environment": env,
        "sglang_ready_timeout": 600,
        "sglang_min_ready_seconds": settle,
    }


def rollout(extra: dict | None = None, **kw) -> Run:
    """gpufleet.inference.rollout on the benchmark lab, its records under .build/bench/results."""
    # P3-P5 measure the rollout's own cost; the canary analysis benchmarks on purpose (bench_canary.py measures it)
    extra_vars = {"rollout_results_dir": str(RESULTS_DIR), "rollout_analysis": False}
    extra_vars.update(extra or {})
    return playbook(ROLLOUT, extra_vars=extra_vars, **kw)


def fleet_window() -> int | None:
    try:
        return json.loads(STATE_FILE.read_text()).get("window")
    except (OSError, ValueError):
        return None


def set_fleet_window(window: int | None) -> None:
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    STATE_FILE.write_text(json.dumps({"window": window}))


def deploy(settings: dict) -> Run:
    """Bring every lab host to `settings` quickly (one batch, no settle): the starting point of a figure."""
    write_group_vars(settings)
    run = rollout({"rollout_batches": ["100%"], "sglang_min_ready_seconds": 0})
    set_fleet_window(settings["sglang_speculative_draft_window_size"] if run.rc == 0 else None)
    return run


def next_window() -> int:
    """The window a measured rollout changes to (the other one than the fleet runs)."""
    current = fleet_window()
    return WINDOWS[1] if current == WINDOWS[0] else WINDOWS[0]


def run_id(run: Run) -> str | None:
    """The rollout run this playbook run wrote (the newest run directory written during it)."""
    found = [p for p in RESULTS_DIR.glob("*/run.json") if p.stat().st_mtime >= run.started - 1]
    return max(found, key=lambda p: p.stat().st_mtime).parent.name if found else None


def records(run_id_: str) -> dict:
    """The rollout's per-host records ({host: record})."""
    out = {}
    for path in (RESULTS_DIR / run_id_).glob("*.json"):
        if path.stem in ("run", "summary"):
            continue
        out[path.stem] = json.loads(path.read_text())
    return out


def iso_seconds(text: str) -> float:
    """A record's UTC timestamp ('2026-01-01T00:00:00Z', optionally with a fraction) as epoch seconds."""
    import calendar
    base, _dot, frac = text.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + (float("0." + frac) if frac else 0.0)


def batches(run: Run, play_prefix: str = "Apply the change") -> list[dict]:
    """The apply phase's serial batches: start, end (the next play's start), hosts, events."""
    plays = [i for i, e in enumerate(run.events) if e["kind"] == "play"]
    out = []
    for n, index in enumerate(plays):
        event = run.events[index]
        if not str(event.get("play", "")).startswith(play_prefix):
            continue
        end_index = plays[n + 1] if n + 1 < len(plays) else len(run.events) - 1
        inside = run.events[index:end_index]
        kinds = ("ok", "failed", "skipped", "unreachable")
        hosts = sorted({e["host"] for e in inside if e.get("host") and e["kind"] in kinds})
        out.append({"start": event["t"], "end": run.events[end_index]["t"], "hosts": hosts, "events": inside})
    return out


def task_times(events: list[dict], end: float) -> list[tuple[str, float]]:
    """(task, seconds from its start to the next task's start, or `end`) in order: where the time goes."""
    starts = [e for e in events if e["kind"] == "task"]
    out = []
    for a, b in zip(starts, starts[1:] + [None]):
        out.append((a["task"], (b["t"] if b else end) - a["t"]))
    return out


def summary(part: str, what: str, figure: str, target: str, ok: bool | None) -> None:
    """A figure against its target, for RESULTS.md's closing table (an HTML comment: invisible in Markdown)."""
    print("<!-- summary " + json.dumps({"part": part, "what": what, "figure": figure, "target": target,
                                        "verdict": verdict(ok)}) + " -->")
