"""The lab fleet: systemd-nspawn containers booted from a debootstrapped Debian rootfs.

Each host is a real systemd (PID 1 in its container) with journald, sshd on its own loopback
address and the SGLang simulator in /opt/sglang/venv. The containers share the machine's network
namespace, so every service in a host binds that host's own 127.0.1.N address.

Commands: build-rootfs, up, down, status, inventory, sim-version. Run as root. Stdlib only.
Everything a lab starts is recorded in its state directory (PIDs with their start times, machine
names); `down` stops exactly those, never by pattern, and a failed `up` stops what it started.
Each host's root is an overlay on the cached rootfs (a copy where overlayfs is not available), so
creating a host costs no copy and the hosts share the page cache of their binaries. Hosts are
created a few at a time and boot in parallel; LAB_BOOT_TIMEOUT (seconds, default 90 + 3 per
host) bounds the wait for all of them. `sim-version X` pins every host's simulator to release X
(its SIM_VERSION file and its sglang-X.dist-info, which lab.py writes with the package).

`up --groups GxN` (or LAB_GROUPS=GxN) makes the first G*N hosts G serving groups of N nodes each
(one SGLang server across N hosts, issue 32): the inventory lists each as an inventory group
`serving_<g>` named in `sglang_serving_groups`, its hosts with `sglang_node_rank` 0..N-1 and the
group's settings (tp = N, a short `sglang_dist_timeout`); the other hosts stay single-node. A
head's followers rendezvous at the head's own loopback address. The layout is recorded with the
lab, so `inventory` writes it again.

`up --router` (or LAB_ROUTER=1) also starts a real `sglang-router` from the controller's venv on
`<LAB_NET>.2:<LAB_ROUTER_PORT>` (an address no host uses), with its Prometheus exporter on a free
port of the same address. It starts with no workers: sglang-router 0.3.2 retries a worker that does
not answer yet only until --worker-startup-timeout-secs and then drops it for good, so workers
join through the API (gpufleet.inference.sglang_router_worker) once their server answers; `up`
itself registers the hosts whose server already answers /health, a group's head only (a follower
answers /health from its stand-in server but serves nothing).
"""
from __future__ import annotations

import argparse
import base64
import csv
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIM_PACKAGE = REPO / "tests" / "sglang_sim" / "sglang"
CACHE_DIR = Path(os.environ.get("LAB_CACHE_DIR", "/var/cache/gpufleet-lab"))
STATE_ROOT = Path(os.environ.get("LAB_STATE_DIR", "/var/lib/gpufleet-lab"))
SUITE = "bookworm"
PACKAGES = ["systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "iproute2"]
# Bump when the way the rootfs is made changes: the cache key follows the recipe.
RECIPE = {"suite": SUITE, "variant": "minbase", "packages": PACKAGES, "revision": 2}
SIM_SITE = "opt/sglang/venv/lib/python3.11/site-packages"
SGLANG_PORT = 30000  # the port the role gives every host's server (sglang_port default)
ROUTER_HOST_OCTET = 2  # <LAB_NET>.2: inside the lab's net, below LAB_FIRST, used by no host
MAX_HOSTS = 64
# Hosts created (overlay mount, host keys, simulator) and started at the same time: host keys
# are CPU-bound and the machines have 2 cores; the boots themselves all run in parallel.
CREATE_WORKERS = 4
WAIT_WORKERS = 16  # stops and health probes: mostly waiting for a poweroff or an ssh answer
# Each host's systemd, logind, dbus and getty hold ~8 inotify instances, all as root (no user
# namespace), so every lab on the machine shares root's budget: the default 128 fits ~15 hosts.
INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_INSTANCES_MIN = 1024
PROC = Path("/proc")  # unit tests point this at a fake tree
SIM_DEFAULT_VERSION = "0.5.11"  # the simulator's own default when _sim_profile.py says nothing
# A lab group's rendezvous timeout (--dist-timeout): a missing node fails the head in a test's
# time, not after SGLang's 10 minutes.
GROUP_DIST_TIMEOUT = 60


class LabError(Exception):
    """A condition the operator can fix; printed without a traceback."""


def log(msg: str) -> None:
    # One write per line: hosts are created and stopped from several threads at once.
    sys.stdout.write(f"lab: {msg}\n")
    sys.stdout.flush()


def run(argv, check=True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, text=True, **kw)


# ---------------------------------------------------------------- settings

class Lab:
    def __init__(self, name: str, net: str, first: int, ssh_port: int):
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", name):
            raise LabError(f"lab name {name!r} must be lowercase letters, digits and '-'")
        if not re.fullmatch(r"127\.\d{1,3}\.\d{1,3}", net):
            raise LabError(f"LAB_NET {net!r} must be the first three octets of a 127/8 address")
        self.name, self.net, self.first, self.ssh_port = name, net, first, ssh_port
        self.state = STATE_ROOT / name
        self.key = self.state / "id_ed25519"
        self.router_file = self.state / "router.json"
        self.groups_file = self.state / "groups.json"
        self.router_address = f"{net}.{ROUTER_HOST_OCTET}"

    def host(self, index: int) -> dict:
        return {
            "name": f"{self.name}-{index}",
            "address": f"{self.net}.{self.first + index - 1}",
            "dir": self.state / "hosts" / f"{self.name}-{index}",
        }

    def recorded_groups(self) -> list[list[int]]:
        """Host indexes of each serving group, rank order, as the last `up` laid them out."""
        try:
            return json.loads(self.groups_file.read_text())
        except (OSError, ValueError):
            return []

    def recorded_hosts(self) -> list[dict]:
        hosts_dir = self.state / "hosts"
        if not hosts_dir.is_dir():
            return []
        found = []
        for meta in sorted(hosts_dir.glob("*/host.json")):
            found.append(json.loads(meta.read_text()))
        return sorted(found, key=lambda h: h["index"])


# ---------------------------------------------------------------- preflight

def require_root_and_tools() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (systemd-nspawn and debootstrap); run it with sudo")
    missing = {tool: pkg for tool, pkg in (("systemd-nspawn", "systemd-container"),
                                           ("debootstrap", "debootstrap"),
                                           ("ssh", "openssh-client"),
                                           ("ssh-keygen", "openssh-client"))
               if shutil.which(tool) is None}
    if missing:
        raise LabError("missing tools: " + ", ".join(missing) +
                       "; install them with: apt-get install -y " +
                       " ".join(sorted(set(missing.values()))) +
                       " (or tests/lab/system_deps.sh, which make runs first)")


def apt_mirror() -> str:
    """The Debian mirror this machine's apt already uses (the lab adds no source of its own)."""
    override = os.environ.get("LAB_DEBIAN_MIRROR")
    if override:
        return override
    candidates = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if not path.is_file() or "disabled" in path.name:
            continue
        text = path.read_text(errors="replace")
        candidates += re.findall(r"^\s*URIs:\s*(\S+)", text, re.M)
        candidates += re.findall(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M)
    for uri in candidates:
        if "security" not in uri and uri.startswith(("http://", "https://")):
            return uri
    raise LabError("no Debian mirror found in /etc/apt; set LAB_DEBIAN_MIRROR")


def port_free(address: str, port: int) -> bool:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As sshd does: a just-stopped host's TIME_WAIT connections must not count as "in use".
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
        return True
    except OSError:
        return False
    finally:
        sock.close()


# ---------------------------------------------------------------- rootfs

def rootfs_path() -> Path:
    digest = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:12]
    return CACHE_DIR / f"rootfs-{SUITE}-{digest}"


def build_rootfs() -> Path:
    require_root_and_tools()
    target = rootfs_path()
    if (target / ".complete").exists():
        log(f"rootfs cached at {target}")
        return target
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # Two labs coming up at once (make test's integration shards) build it once: the second waits.
    with open(CACHE_DIR / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            log(f"rootfs built meanwhile by another lab, at {target}")
            return target
        return _debootstrap(target)


def _debootstrap(target: Path) -> Path:
    work = target.with_name(target.name + ".partial")
    if work.exists():
        shutil.rmtree(work)
    mirror = apt_mirror()
    log(f"debootstrap {SUITE} into {work} (one time, ~80 s)")
    started = time.monotonic()
    proc = run(["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES),
                SUITE, str(work), mirror], check=False, capture_output=True)
    if proc.returncode != 0:
        raise LabError(f"debootstrap failed (rc={proc.returncode}):\n{proc.stdout[-2000:]}"
                       f"\n{proc.stderr[-2000:]}")
    # Per-host identity is made at host creation: no shared machine-id or ssh host keys.
    for key in (work / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (work / "etc/machine-id").write_text("")
    # Units that make no sense in a container sharing the machine's network namespace.
    for unit in ("systemd-networkd.service", "systemd-resolved.service",
                 "systemd-timesyncd.service", "apt-daily.timer", "apt-daily-upgrade.timer",
                 "e2scrub_all.timer", "fstrim.timer", "man-db.timer", "dpkg-db-backup.timer",
                 "systemd-networkd-wait-online.service"):
        (work / "etc/systemd/system" / unit).unlink(missing_ok=True)
        os.symlink("/dev/null", work / "etc/systemd/system" / unit)
    # The simulator's venv: no pip needed, it is stdlib only.
    run(["chroot", str(work), "python3", "-m", "venv", "--without-pip", "/opt/sglang/venv"])
    (work / ".complete").write_text(json.dumps(RECIPE))
    if target.exists():
        shutil.rmtree(target)
    work.rename(target)
    log(f"rootfs built in {time.monotonic() - started:.0f} s at {target}")
    return target


# ---------------------------------------------------------------- hosts

def proc_stat(pid: int) -> tuple[str, int, str] | None:
    """(state, parent PID, start time) from /proc/PID/stat; None when there is no such process.

    The start time (field 22, clock ticks since boot) is fixed at fork and survives exec, so
    together with the PID it names one process for good: a reused PID has another start time.
    """
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text.rsplit(")", 1)[1].split()  # the command name in (...) may hold spaces
    return fields[0], int(fields[1]), fields[19]


def process_start(pid: int) -> str | None:
    """The start time of a running process; None for no process, a zombie or a dead one."""
    stat = proc_stat(pid) if pid > 0 else None
    return None if stat is None or stat[0] in ("Z", "X", "x") else stat[2]


def nspawn_alive(meta: dict, proc: subprocess.Popen | None = None) -> bool:
    """Is the systemd-nspawn recorded in `meta` still running?

    By its Popen object while we are its parent, else by PID plus the start time recorded when
    it was started. Never by its command line: on a machine with a small page cache a
    just-forked child sits inside exec for seconds with an empty /proc/PID/cmdline and its
    parent's name, and is alive all the same.
    """
    if proc is not None:
        return proc.poll() is None
    pid = meta.get("pid", -1)
    started = process_start(pid)
    if started is None:
        return False
    if "started" in meta:
        return started == meta["started"]
    # A record written before start times were kept: that nspawn is long past its exec.
    try:
        argv0 = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return argv0.endswith(b"systemd-nspawn")


def namespace_members(namespaces: set[str]) -> list[int]:
    """Live processes (not zombies) in any of the PID namespaces `namespaces` (/proc/PID/ns/pid links)."""
    found = []
    if not namespaces:
        return found
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") not in namespaces:
                continue
        except OSError:
            continue
        if process_start(int(entry.name)) is not None:
            found.append(int(entry.name))
    return found


def children(pid: int) -> list[int]:
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat and stat[1] == pid:
                found.append(int(entry.name))
    return found


def ssh_base(lab: Lab, address: str) -> list[str]:
    return ["ssh", "-i", str(lab.key), "-p", str(lab.ssh_port), "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=3", f"root@{address}"]


def ssh(lab: Lab, address: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return run(ssh_base(lab, address) + [command], check=False, capture_output=True,
               timeout=timeout)


def host_healthy(lab: Lab, meta: dict) -> bool:
    if not nspawn_alive(meta):
        return False
    try:
        proc = ssh(lab, meta["address"], "systemctl is-system-running", timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return proc.stdout.strip() in ("running", "degraded")


def ensure_key(lab: Lab) -> None:
    lab.state.mkdir(parents=True, exist_ok=True)
    if not lab.key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{lab.name}-lab-only",
             "-f", str(lab.key)])


def ensure_inotify_instances() -> None:
    try:
        current = int(INOTIFY_INSTANCES.read_text())
    except (OSError, ValueError):
        return
    if current >= INOTIFY_INSTANCES_MIN:
        return
    try:
        INOTIFY_INSTANCES.write_text(f"{INOTIFY_INSTANCES_MIN}\n")
        log(f"fs.inotify.max_user_instances raised from {current} to {INOTIFY_INSTANCES_MIN} "
            "(each host's systemd needs ~8; all containers share root's budget)")
    except OSError as exc:
        log(f"warning: fs.inotify.max_user_instances is {current} (~{current // 8} hosts on the "
            f"whole machine) and could not be raised: {exc}")


def configure_host(lab: Lab, root: Path, host: dict) -> None:
    (root / "etc/hostname").write_text(host["name"] + "\n")
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n{host['address']} {host['name']}\n")
    sshd_conf = root / "etc/ssh/sshd_config.d/lab.conf"
    # Ed25519 and ECDSA host keys only: an RSA key costs ~0.3 s of CPU per host (minutes
    # of a 2-core machine for 64 hosts) and no client of the lab needs it.
    sshd_conf.write_text(
        f"ListenAddress {host['address']}\nPort {lab.ssh_port}\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\nHostKey /etc/ssh/ssh_host_ecdsa_key\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n")
    for kind in ("ed25519", "ecdsa"):
        run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"root@{host['name']}",
             "-f", str(root / f"etc/ssh/ssh_host_{kind}_key")])
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(Path(str(lab.key) + ".pub").read_text())
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    install_simulator(root)


def install_simulator(root: Path) -> bool:
    """Copy tests/sglang_sim into the host's venv; the lab says so when it does not exist yet."""
    if not SIM_PACKAGE.is_dir():
        log(f"{SIM_PACKAGE} does not exist yet: skipping the SGLang simulator install")
        return False
    site = root / SIM_SITE
    dest = site / "sglang"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(SIM_PACKAGE, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    write_dist_info(site, sim_version(dest))
    return True


def sim_version(package: Path) -> str:
    """The version an installed simulator reports: its SIM_VERSION file, else its default.

    As tests/sglang_sim/sglang/_sim_profile.py selects it, minus the SGLANG_SIM_VERSION
    environment variable, which only the server's own environment can set.
    """
    pinned = package / "SIM_VERSION"
    if pinned.is_file() and pinned.read_text().strip():
        return pinned.read_text().strip()
    try:
        profile = (package / "_sim_profile.py").read_text()
    except OSError:
        return SIM_DEFAULT_VERSION
    match = re.search(r"^DEFAULT_VERSION\s*=\s*[\"']([^\"']+)[\"']", profile, re.M)
    return match.group(1) if match else SIM_DEFAULT_VERSION


def write_dist_info(site: Path, version: str) -> Path:
    """Write pip's record of an installed `sglang` next to the package, for `version`.

    So `importlib.metadata.version("sglang")` answers on a lab host without importing sglang,
    as it does where the real wheel is installed. RECORD as pip writes it: path, sha256 in
    urlsafe base64 without padding, size; RECORD lists itself with no hash.
    """
    for old in site.glob("sglang-*.dist-info"):
        shutil.rmtree(old)
    info = site / f"sglang-{version}.dist-info"
    info.mkdir()
    files = {
        "METADATA": ("Metadata-Version: 2.1\nName: sglang\nVersion: " + version + "\n"
                     "Summary: SGLang simulator of the gpufleet lab (tests/sglang_sim), "
                     "not the real SGLang\nRequires-Python: >=3.10\n"),
        "WHEEL": "Wheel-Version: 1.0\nGenerator: gpufleet-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "top_level.txt": "sglang\n",
        "INSTALLER": "pip\n",
        "REQUESTED": "",
    }
    for name, text in files.items():
        (info / name).write_text(text)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for path in sorted([*(site / "sglang").rglob("*"), *info.iterdir()]):
        if path.is_file():
            data = path.read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            writer.writerow([path.relative_to(site).as_posix(), f"sha256={digest}", len(data)])
    writer.writerow([f"{info.name}/RECORD", "", ""])
    (info / "RECORD").write_text(out.getvalue())
    return info


def pin_sim_version(root: Path, version: str) -> None:
    """Make a host's simulator report `version`: its SIM_VERSION file and its dist-info agree."""
    site = root / SIM_SITE
    (site / "sglang" / "SIM_VERSION").write_text(version + "\n")
    write_dist_info(site, version)


def make_host_root(rootfs: Path, hdir: Path) -> str:
    """The host's root: an overlay on the cached rootfs, or a full copy where overlayfs fails.

    The overlay is instant and keeps the hosts' binaries in one page cache; a copy of the
    309 MB rootfs takes 2-9 s per host here, and 64 copies 20 GB.
    """
    root = hdir / "root"
    upper, work = hdir / "upper", hdir / "work"
    for path in (root, upper, work):
        path.mkdir()
    mount = run(["mount", "-t", "overlay", "overlay", "-o",
                 f"lowerdir={rootfs},upperdir={upper},workdir={work}", str(root)],
                check=False, capture_output=True)
    if mount.returncode == 0:
        (root / ".complete").unlink(missing_ok=True)
        return "overlay"
    log(f"overlayfs not available ({mount.stderr.strip()}): copying the rootfs instead")
    for path in (root, upper, work):
        path.rmdir()
    run(["cp", "-a", "--reflink=auto", str(rootfs), str(root)])
    (root / ".complete").unlink(missing_ok=True)
    return "copy"


# Each container gets a cgroup of its own in the hierarchies systemd uses. Without one, every
# nspawn started from the same cgroup puts its container at the same `/payload`: the containers'
# systemds then share their units' cgroups (sglang.service of every host in one cgroup), so a
# unit is never "empty" while another host runs it - the trap that kept units "deactivating".
CGROUP_HIERARCHIES = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
CGROUP_PARENT = "gpufleet-lab"


def host_cgroups(name: str) -> list[Path]:
    """The host's own cgroup directory in each mounted hierarchy systemd uses (v1 name=systemd, v2)."""
    found = []
    for root in CGROUP_HIERARCHIES:
        if (root / "cgroup.procs").exists() and (root == Path("/sys/fs/cgroup/systemd")
                                                 or (root / "cgroup.controllers").exists()):
            found.append(root / CGROUP_PARENT / name)
    return found


def remove_host_cgroups(name: str) -> None:
    """Remove the host's cgroups (empty once its processes are gone; nspawn's sub-groups first)."""
    for group in host_cgroups(name):
        if not group.exists():
            continue
        for path in sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                           reverse=True) + [group]:
            try:
                path.rmdir()
            except OSError:
                pass


def nspawn_argv(name: str, root: Path) -> list[str]:
    """systemd-nspawn, started by a shell that first moves itself into the host's own cgroups
    (thread-safe: no preexec_fn; `exec` keeps the PID the lab records)."""
    nspawn = ["systemd-nspawn", "--register=no", "--keep-unit", "--quiet", "--console=read-only",
              "--machine", name, "-D", str(root), "--boot"]
    groups = host_cgroups(name)
    if not groups:
        return nspawn
    for group in groups:
        group.mkdir(parents=True, exist_ok=True)
    moves = "; ".join('echo $$ > "%s"' % (group / "cgroup.procs") for group in groups)
    return ["/bin/sh", "-c", moves + '; exec "$@"', "gpufleet-lab-boot"] + nspawn


def boot_host(lab: Lab, rootfs: Path, index: int) -> tuple[dict, subprocess.Popen]:
    """Create host `index` and start its systemd-nspawn; the caller waits for the boot."""
    host = lab.host(index)
    hdir: Path = host["dir"]
    if hdir.exists():
        remove_host_dir(hdir)
    hdir.mkdir(parents=True)
    t0 = time.monotonic()
    try:
        kind = make_host_root(rootfs, hdir)
        configure_host(lab, hdir / "root", host)
        with open(hdir / "console.log", "w") as console:
            proc = subprocess.Popen(
                nspawn_argv(host["name"], hdir / "root"),
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                start_new_session=True)
    except BaseException:
        remove_host_dir(hdir)
        raise
    # Read now, while the child is certainly ours (it may still be inside exec: that is fine,
    # the start time is set at fork).
    meta = {"index": index, "name": host["name"], "address": host["address"],
            "pid": proc.pid, "started": process_start(proc.pid), "dir": str(hdir)}
    (hdir / "host.json").write_text(json.dumps(meta))
    log(f"{host['name']}: booting at {host['address']} (nspawn pid {proc.pid}, "
        f"{kind} {time.monotonic() - t0:.1f} s)")
    return meta, proc


def boot_hosts(lab: Lab, rootfs: Path, indexes: list[int],
               started: list[tuple[dict, subprocess.Popen]]) -> None:
    """Create and start hosts a few at a time; append each (meta, proc) that started.

    On the first failure no further host starts, and `started` still lists every host that
    did, so the caller can stop exactly those.
    """
    pool = ThreadPoolExecutor(max_workers=CREATE_WORKERS)
    futures = [pool.submit(boot_host, lab, rootfs, index) for index in indexes]
    try:
        for future in futures:
            future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        started += [f.result() for f in futures
                    if f.done() and not f.cancelled() and f.exception() is None]


def boot_timeout(count: int) -> float:
    """Seconds for `count` hosts booting at once on 2 cores (env LAB_BOOT_TIMEOUT overrides)."""
    override = os.environ.get("LAB_BOOT_TIMEOUT")
    return float(override) if override else 90 + 3 * count


def wait_booted(lab: Lab, meta: dict, proc: subprocess.Popen | None = None,
                timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    state = "unreachable"
    while time.monotonic() < deadline:
        if not nspawn_alive(meta, proc):
            rc = f" (rc={proc.returncode})" if proc is not None else ""
            tail = Path(meta["dir"], "console.log").read_text(errors="replace")[-1500:]
            raise LabError(f"{meta['name']}: systemd-nspawn exited during boot{rc}:\n{tail}")
        try:
            left = max(5.0, min(60.0, deadline - time.monotonic()))
            result = ssh(lab, meta["address"], "systemctl is-system-running --wait", timeout=left)
            state = result.stdout.strip() or state
        except subprocess.TimeoutExpired:
            state = "starting"
        if state in ("running", "degraded"):
            return state
        time.sleep(0.5)
    raise LabError(f"{meta['name']}: not booted after {timeout:.0f} s (last state: {state})")


def signal_pid(pid: int, sig: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except ProcessLookupError:
        pass


def stop_host(meta: dict, proc: subprocess.Popen | None = None, timeout: float = 20) -> None:
    """Stop the host's recorded systemd-nspawn (if it still runs) and remove the host."""
    pid = meta.get("pid", -1)
    if nspawn_alive(meta, proc):
        # SIGTERM makes nspawn ask the container's systemd for an orderly poweroff.
        signal_pid(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while nspawn_alive(meta, proc) and time.monotonic() < deadline:
            time.sleep(0.2)
        if nspawn_alive(meta, proc):
            log(f"{meta['name']}: no poweroff after {timeout:.0f} s, killing it")
            # nspawn's child is the container's PID 1: killing it ends its whole PID namespace,
            # which nspawn's own process group does not hold.
            namespaces = set()
            for child in children(pid):
                try:
                    namespaces.add(os.readlink(PROC / str(child) / "ns" / "pid"))
                except OSError:
                    pass
                signal_pid(child, signal.SIGKILL)
            signal_pid(pid, signal.SIGKILL, group=True)
            # The kernel kills the rest of the namespace after its PID 1 (sshd, the server...): wait until
            # none is left, or the host's address and port are still held when this returns.
            deadline = time.monotonic() + 10
            while (nspawn_alive(meta, proc) or namespace_members(namespaces)) and time.monotonic() < deadline:
                time.sleep(0.2)
    remove_host_dir(Path(meta["dir"]))
    remove_host_cgroups(meta["name"])


def stop_hosts(hosts: list[tuple[dict, subprocess.Popen | None]], timeout: float = 20) -> int:
    """Stop hosts in parallel (each poweroff takes ~1-10 s); returns how many failed to stop."""
    def stop(item) -> bool:
        meta, proc = item
        try:
            stop_host(meta, proc, timeout=timeout)
            return True
        except Exception as exc:  # go on: stop every other host
            log(f"{meta['name']}: stopping failed: {exc}")
            return False
    with ThreadPoolExecutor(max_workers=WAIT_WORKERS) as pool:
        return list(pool.map(stop, hosts)).count(False)


def remove_host_dir(hdir: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
              if line.split()[1].startswith(str(hdir) + "/")]
    for mount in sorted(mounts, reverse=True):
        run(["umount", "-l", mount], check=False)
    run(["rm", "-rf", "--one-file-system", str(hdir)])


# ---------------------------------------------------------------- router

def router_command() -> list[str]:
    """sglang-router from the venv of the Python running the lab (make uses .venv)."""
    exe = Path(sys.executable).parent / "sglang-router"
    if exe.exists():
        return [str(exe), "launch"]
    probe = run([sys.executable, "-c", "import sglang_router.launch_router"], check=False,
                capture_output=True)
    if probe.returncode == 0:
        return [sys.executable, "-m", "sglang_router.launch_router"]
    raise LabError(f"sglang-router is not installed for {sys.executable}; run `make venv` "
                   "(tests/requirements.txt pins it) or start the lab with .venv/bin/python")


def router_alive(meta: dict) -> bool:
    """Our router: the recorded PID is alive with the recorded start time (no reused PID).

    sglang-router renames its process (``sglang::router``), so the command line says little.
    """
    started = process_start(meta["pid"])
    return started is not None and started == meta.get("started")


def recorded_router(lab: Lab) -> dict | None:
    if not lab.router_file.exists():
        return None
    return json.loads(lab.router_file.read_text())


def http_get(url: str, timeout: float = 3) -> tuple[int | None, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError:
        return None, ""


def router_answers(meta: dict) -> bool:
    status, body = http_get(meta["url"] + "/workers")
    return status == 200 and '"workers"' in body


def free_port_on(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def start_router(lab: Lab, port: int, count: int) -> dict:
    meta = recorded_router(lab)
    url = f"http://{lab.router_address}:{port}"
    if meta and router_alive(meta) and meta["url"] == url and router_answers(meta):
        log(f"router: running at {url} (pid {meta['pid']}), kept")
        register_answering_workers(lab, meta, count)
        return meta
    if meta:
        stop_router(lab)
    if lab.first <= ROUTER_HOST_OCTET <= lab.first + count - 1:
        raise LabError(f"the router's address {lab.router_address} is a host address; "
                       f"LAB_FIRST must be above {ROUTER_HOST_OCTET}")
    if not port_free(lab.router_address, port):
        raise LabError(f"{lab.router_address}:{port} is already in use by another process; "
                       "choose another LAB_ROUTER_PORT or LAB_NET")
    metrics_port = free_port_on(lab.router_address)
    argv = router_command() + [
        "--host", lab.router_address, "--port", str(port),
        # Its exporter defaults to 0.0.0.0:29000, which two routers (or labs) would share.
        "--prometheus-host", lab.router_address, "--prometheus-port", str(metrics_port),
        "--policy", "round_robin"]
    lab.state.mkdir(parents=True, exist_ok=True)
    log_path = lab.state / "router.log"
    with open(log_path, "w") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    meta = {"pid": proc.pid, "started": process_start(proc.pid), "url": url,
            "address": lab.router_address, "port": port, "metrics_port": metrics_port,
            "log": str(log_path), "argv": argv}
    lab.router_file.write_text(json.dumps(meta))
    deadline = time.monotonic() + 30
    while not router_answers(meta):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-1500:]
            stop_router(lab)
            raise LabError(f"sglang-router did not answer {url}/workers "
                           f"({'exited rc=%s' % proc.returncode if proc.poll() is not None else 'timeout'}):"
                           f"\n{tail}")
        time.sleep(0.2)
    log(f"router: sglang-router at {url} (pid {proc.pid}, metrics :{metrics_port}, no workers yet)")
    register_answering_workers(lab, meta, count)
    return meta


def register_answering_workers(lab: Lab, meta: dict, count: int) -> None:
    """Add the hosts whose SGLang server answers /health now; the others join via the module.

    A group's followers never: only its head serves.
    """
    followers = {index for group in lab.recorded_groups() for index in group[1:]}
    for index in range(1, count + 1):
        if index in followers:
            continue
        worker = f"http://{lab.host(index)['address']}:{SGLANG_PORT}"
        if http_get(worker + "/health", timeout=2)[0] != 200:
            continue
        req = urllib.request.Request(meta["url"] + "/workers", method="POST",
                                     data=json.dumps({"url": worker}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5):
                log(f"router: {worker} answers, added")
        except OSError as exc:
            log(f"router: adding {worker} failed: {exc}")


def stop_router(lab: Lab, timeout: float = 10) -> None:
    meta = recorded_router(lab)
    if not meta:
        return
    pid = meta["pid"]
    if router_alive(meta):
        log(f"router: stopping sglang-router pid {pid}")
        # Its own session (start_new_session): the group is exactly what we started.
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while router_alive(meta) and time.monotonic() < deadline:
            time.sleep(0.2)
        if router_alive(meta):
            os.killpg(pid, signal.SIGKILL)
    lab.router_file.unlink(missing_ok=True)


# ---------------------------------------------------------------- commands

def parse_groups(text: str | None, count: int) -> list[list[int]]:
    """'GxN' -> the host indexes of G serving groups of N nodes: the first G*N hosts, in order."""
    if not text:
        return []
    match = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", text)
    if not match:
        raise LabError(f"--groups/LAB_GROUPS {text!r} must look like 2x2 (groups x nodes per group)")
    groups, nodes = int(match.group(1)), int(match.group(2))
    if groups < 1 or nodes < 2:
        raise LabError(f"--groups {text!r}: at least one group of at least 2 nodes")
    if groups * nodes > count:
        raise LabError(f"--groups {text!r} needs {groups * nodes} hosts, HOSTS is {count}")
    return [list(range(g * nodes + 1, (g + 1) * nodes + 1)) for g in range(groups)]


def cmd_up(lab: Lab, count: int, router: bool = False, router_port: int = 30080,
           groups: list[list[int]] | None = None) -> None:
    require_root_and_tools()
    if router:
        router_command()  # fail before booting anything when the router is not installed
    rootfs = build_rootfs()
    ensure_key(lab)
    t0 = time.monotonic()
    existing = {m["index"]: m for m in lab.recorded_hosts()}
    # Hosts beyond the requested count are stopped: the inventory is exactly 1..count.
    beyond = [existing.pop(index) for index in sorted(existing) if index > count]
    for meta in beyond:
        log(f"{meta['name']}: beyond HOSTS={count}, stopping")
    if stop_hosts([(meta, None) for meta in beyond]):
        raise LabError("hosts beyond HOSTS could not be stopped (see above)")
    with ThreadPoolExecutor(max_workers=WAIT_WORKERS) as pool:
        healthy = dict(zip(existing, pool.map(lambda meta: host_healthy(lab, meta),
                                              existing.values())))
    to_boot = []
    for index in range(1, count + 1):
        meta = existing.get(index)
        if meta and healthy[index]:
            install_simulator(Path(meta["dir"]) / "root")
            log(f"{meta['name']}: healthy, kept (simulator refreshed)")
            continue
        if meta:
            log(f"{meta['name']}: unhealthy, recreating")
            stop_host(meta)
        host = lab.host(index)
        if not port_free(host["address"], lab.ssh_port):
            raise LabError(f"{host['address']}:{lab.ssh_port} is already in use by another "
                           "process; choose another LAB_SSH_PORT or LAB_NET")
        to_boot.append(index)
    # What this run started, by Popen object: on any failure (or Ctrl-C, SIGTERM) exactly
    # these are stopped again; hosts that were kept stay as they were.
    started: list[tuple[dict, subprocess.Popen]] = []
    try:
        lab.state.mkdir(parents=True, exist_ok=True)
        lab.groups_file.write_text(json.dumps(groups or []))
        if to_boot:
            ensure_inotify_instances()
            boot_hosts(lab, rootfs, to_boot, started)
            deadline = time.monotonic() + boot_timeout(len(to_boot))
            for meta, proc in started:
                state = wait_booted(lab, meta, proc, timeout=max(0.0, deadline - time.monotonic()))
                log(f"{meta['name']}: systemd {state}")
        if router:
            start_router(lab, router_port, count)  # stops its own router when it fails
        elif recorded_router(lab):
            log("router: not requested (no --router / LAB_ROUTER=1), stopping it")
            stop_router(lab)
        write_inventory(lab, count)
    except BaseException as exc:
        if started:
            log(f"up failed ({type(exc).__name__}): stopping the {len(started)} host(s) it started")
            # Short: a container still early in its boot may miss the poweroff request, and
            # these hosts are removed anyway.
            stop_hosts(started, timeout=5)
        raise
    log(f"{count} host(s) up in {time.monotonic() - t0:.1f} s; inventory "
        f"{inventory_path(lab)}")


def cmd_down(lab: Lab) -> None:
    stop_router(lab)
    hosts = lab.recorded_hosts()
    for meta in hosts:
        log(f"{meta['name']}: stopping nspawn pid {meta['pid']}")
    failed = stop_hosts([(meta, None) for meta in hosts])
    inv = inventory_path(lab)
    if inv.exists():
        inv.unlink()
    lab.groups_file.unlink(missing_ok=True)
    if failed:
        raise LabError(f"{failed} of {len(hosts)} host(s) could not be stopped (see above)")
    log(f"{len(hosts)} host(s) stopped and removed")


def cmd_status(lab: Lab) -> int:
    hosts = lab.recorded_hosts()
    bad = 0
    router = recorded_router(lab)
    if router:
        healthy = router_alive(router) and router_answers(router)
        bad += not healthy
        _status, body = http_get(router["url"] + "/workers")
        try:
            workers = [w["url"] for w in json.loads(body)["workers"]]
        except (ValueError, KeyError, TypeError):
            workers = []
        print(f"{'router':<16} {router['address'] + ':' + str(router['port']):<14} pid {router['pid']:<8} "
              f"{'healthy' if healthy else 'UNHEALTHY'} workers: {', '.join(workers) or 'none'}")
    if not hosts:
        log("no hosts")
        return 1 if bad else 0
    for meta in hosts:
        healthy = host_healthy(lab, meta)
        bad += not healthy
        print(f"{meta['name']:<16} {meta['address']:<14} pid {meta['pid']:<8} "
              f"{'healthy' if healthy else 'UNHEALTHY'}")
    return 1 if bad else 0


def cmd_sim_version(lab: Lab, version: str | None) -> None:
    """Pin every host's simulator to `version` (SIM_VERSION and its dist-info, kept in step)."""
    if not version or not re.fullmatch(r"\d+\.\d+\.\d+\S*", version):
        raise LabError("sim-version needs a version like 0.5.23")
    hosts = lab.recorded_hosts()
    if not hosts:
        raise LabError(f"lab {lab.name} has no hosts")
    for meta in hosts:
        pin_sim_version(Path(meta["dir"]) / "root", version)
    log(f"simulator pinned to {version} on {len(hosts)} host(s); restart their servers to apply")


def raise_interrupt(signum, _frame):
    # Once: a second SIGTERM must not cut short the stopping of what was started.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def inventory_path(lab: Lab) -> Path:
    override = os.environ.get("LAB_INVENTORY")
    return Path(override) if override else REPO / "inventories" / "lab" / "hosts.yml"


def write_inventory(lab: Lab, count: int) -> None:
    groups = [group for group in lab.recorded_groups() if max(group) <= count]
    rank = {index: position for group in groups for position, index in enumerate(group)}
    lines = ["# Generated by tests/lab/lab.py; do not edit.", "---", "all:", "  children:",
             "    gpu:", "      hosts:"]
    for index in range(1, count + 1):
        host = lab.host(index)
        lines += [f"        {host['name']}:", f"          ansible_host: {host['address']}",
                  f"          sglang_host: {host['address']}"]
        if index in rank:
            lines.append(f"          sglang_node_rank: {rank[index]}")
    if groups:
        # One SGLang server per group: tp = its nodes (one rank each); the rest as every host.
        lines.append("      children:")
        for number, group in enumerate(groups, 1):
            lines += [f"        serving_{number}:", "          hosts:"]
            lines += [f"            {lab.host(index)['name']}:" for index in group]
            lines += ["          vars:", f"            sglang_tp_size: {len(group)}",
                      f"            sglang_dist_timeout: {GROUP_DIST_TIMEOUT}"]
    lines += ["      vars:", "        ansible_user: root", f"        ansible_port: {lab.ssh_port}",
              f"        ansible_ssh_private_key_file: {lab.key}",
              "        ansible_ssh_common_args: >-",
              "          -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
              "        ansible_python_interpreter: /usr/bin/python3",
              "        sglang_python: /opt/sglang/venv/bin/python"]
    router = recorded_router(lab)
    if router:
        lines.append(f"        sglang_router_url: {router['url']}")
    if groups:
        names = ", ".join(f"serving_{number}" for number in range(1, len(groups) + 1))
        lines.append(f"        sglang_serving_groups: [{names}]")
    path = inventory_path(lab)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build-rootfs", "up", "down", "status", "inventory",
                                            "sim-version"])
    parser.add_argument("version", nargs="?",
                        help="sim-version: the SGLang version every host's simulator reports")
    parser.add_argument("--hosts", type=int, default=int(os.environ.get("HOSTS", 3)))
    parser.add_argument("--name", default=os.environ.get("LAB_NAME", "gpflab"))
    parser.add_argument("--net", default=os.environ.get("LAB_NET", "127.0.1"))
    parser.add_argument("--first", type=int, default=int(os.environ.get("LAB_FIRST", 11)))
    parser.add_argument("--ssh-port", type=int, default=int(os.environ.get("LAB_SSH_PORT", 22)))
    parser.add_argument("--router", action="store_true",
                        default=os.environ.get("LAB_ROUTER", "") not in ("", "0"),
                        help="also run a real sglang-router (env LAB_ROUTER=1)")
    parser.add_argument("--router-port", type=int,
                        default=int(os.environ.get("LAB_ROUTER_PORT", 30080)))
    parser.add_argument("--groups", default=os.environ.get("LAB_GROUPS", ""),
                        help="up: the first GxN hosts as G serving groups of N nodes, e.g. 2x2 "
                             "(env LAB_GROUPS)")
    args = parser.parse_args(argv)
    try:
        if not 1 <= args.hosts <= MAX_HOSTS:
            raise LabError(f"HOSTS must be between 1 and {MAX_HOSTS}")
        if args.first + args.hosts - 1 > 254:
            raise LabError("LAB_FIRST + HOSTS runs past .254")
        lab = Lab(args.name, args.net, args.first, args.ssh_port)
        if args.command == "build-rootfs":
            build_rootfs()
        elif args.command == "up":
            # A stopped `make` or CI job sends SIGTERM: unwind like Ctrl-C, so a failed up stops
            # the hosts it started.
            signal.signal(signal.SIGTERM, raise_interrupt)
            cmd_up(lab, args.hosts, args.router, args.router_port, parse_groups(args.groups, args.hosts))
        elif args.command == "down":
            cmd_down(lab)
        elif args.command == "status":
            return cmd_status(lab)
        elif args.command == "inventory":
            write_inventory(lab, len(lab.recorded_hosts()))
        elif args.command == "sim-version":
            cmd_sim_version(lab, args.version)
    except LabError as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lab: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
