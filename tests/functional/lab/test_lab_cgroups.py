"""Each lab container gets cgroups of its own: without them every container's systemd shares its
units' cgroups (all hosts' sglang.service in one), and a unit never empties while another host
runs it. A fake cgroup tree under tmp_path stands in for /sys/fs/cgroup (no root needed)."""
from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("lab", REPO / "tests" / "lab" / "lab.py")
lab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab)


def fake_hierarchies(tmp_path, monkeypatch):
    v1, v2, tmpfs = tmp_path / "systemd", tmp_path / "unified", tmp_path / "root"
    for path in (v1, v2, tmpfs):
        path.mkdir()
    (v1 / "cgroup.procs").write_text("")
    (v2 / "cgroup.procs").write_text("")
    (v2 / "cgroup.controllers").write_text("")
    monkeypatch.setattr(lab, "CGROUP_HIERARCHIES", (v1, v2, tmpfs))
    # the v1 name=systemd check compares with the real path: stand the fake one in for it
    monkeypatch.setattr(lab, "Path", lambda p: v1 if str(p) == "/sys/fs/cgroup/systemd" else Path(p))
    return v1, v2


def test_nspawn_starts_in_the_hosts_own_cgroups(tmp_path, monkeypatch):
    v1, v2 = fake_hierarchies(tmp_path, monkeypatch)
    argv = lab.nspawn_argv("gpfx-1", Path("/r"))
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3] == "gpufleet-lab-boot"
    assert argv[4:6] == ["systemd-nspawn", "--register=no"] and argv[-1] == "--boot"
    for root in (v1, v2):
        group = root / "gpufleet-lab" / "gpfx-1"
        assert group.is_dir() and f'echo $$ > "{group / "cgroup.procs"}"' in argv[2]
    # the shell writes its own PID and execs nspawn: the PID the lab records stays nspawn's
    (v1 / "gpufleet-lab" / "gpfx-1" / "cgroup.procs").write_text("")
    (v2 / "gpufleet-lab" / "gpfx-1" / "cgroup.procs").write_text("")
    shell = ["/bin/sh", "-c", argv[2], argv[3], "sh", "-c", "echo $$"]
    proc = subprocess.run(shell, capture_output=True, text=True, check=True)
    written = (v1 / "gpufleet-lab" / "gpfx-1" / "cgroup.procs").read_text().strip()
    assert written == proc.stdout.strip()


def test_no_cgroup_hierarchy_means_plain_nspawn(tmp_path, monkeypatch):
    monkeypatch.setattr(lab, "CGROUP_HIERARCHIES", (tmp_path / "none",))
    assert lab.nspawn_argv("gpfx-1", Path("/r"))[0] == "systemd-nspawn"


def test_stopping_a_host_removes_its_cgroups(tmp_path, monkeypatch):
    v1, v2 = fake_hierarchies(tmp_path, monkeypatch)
    for root in (v1, v2):
        (root / "gpufleet-lab" / "gpfx-1" / "payload" / "system.slice").mkdir(parents=True)
        (root / "gpufleet-lab" / "gpfx-1" / "supervisor").mkdir()
        (root / "gpufleet-lab" / "gpfx-2").mkdir(parents=True)
    lab.remove_host_cgroups("gpfx-1")
    for root in (v1, v2):
        assert not (root / "gpufleet-lab" / "gpfx-1").exists()
        assert (root / "gpufleet-lab" / "gpfx-2").exists()  # another host's stay
