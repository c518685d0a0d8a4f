"""The lab judges its containers by process object and /proc/PID/stat, never by command line.

No root needed: real child processes stand in for systemd-nspawn, a fake /proc tree for the
states that cannot be staged on demand (a child inside exec, a reused PID).
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("lab", REPO / "tests" / "lab" / "lab.py")
lab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab)


def fake_process(proc_root: Path, pid: int, state: str = "R", start: str = "777",
                 name: str = "python3", cmdline: bytes = b"") -> None:
    """A /proc/PID entry; the defaults are a child inside exec: parent's name, no cmdline."""
    entry = proc_root / str(pid)
    entry.mkdir(parents=True, exist_ok=True)
    # Fields after "(comm)": state, ppid, ... field 22 (index 19 here) is the start time.
    rest = [state, "1"] + ["0"] * 17 + [start, "0", "0"]
    (entry / "stat").write_text(f"{pid} ({name}) " + " ".join(rest) + "\n")
    (entry / "cmdline").write_bytes(cmdline)


@pytest.fixture
def fake_proc(tmp_path, monkeypatch):
    root = tmp_path / "proc"
    root.mkdir()
    monkeypatch.setattr(lab, "PROC", root)
    return root


def test_a_child_inside_exec_is_alive(fake_proc):
    # The state the issue saw: Name still the parent's, /proc/PID/cmdline empty.
    fake_process(fake_proc, 4242, state="D", start="777")
    assert lab.nspawn_alive({"pid": 4242, "started": "777"})
    fake_process(fake_proc, 4243, state="R", start="778", name="systemd-nspawn",
                 cmdline=b"systemd-nspawn\0--boot\0")
    assert lab.nspawn_alive({"pid": 4243, "started": "778"})


def test_a_reused_pid_a_zombie_or_no_process_is_not_alive(fake_proc):
    fake_process(fake_proc, 4242, start="999", name="systemd-nspawn", cmdline=b"systemd-nspawn\0")
    assert not lab.nspawn_alive({"pid": 4242, "started": "777"})  # same PID, another process
    fake_process(fake_proc, 4244, state="Z", start="777")
    assert not lab.nspawn_alive({"pid": 4244, "started": "777"})
    assert not lab.nspawn_alive({"pid": 4245, "started": "777"})
    assert not lab.nspawn_alive({"pid": -1, "started": "777"})


def test_a_command_name_with_spaces_and_parens_parses(fake_proc):
    fake_process(fake_proc, 4246, start="31337", name="(sd-pam) x)")
    assert lab.proc_stat(4246) == ("R", 1, "31337")


def test_records_without_a_start_time_still_work(fake_proc):
    # host.json written before start times were kept: judged by the command line as before.
    fake_process(fake_proc, 4247, name="systemd-nspawn", cmdline=b"/usr/bin/systemd-nspawn\0-D\0")
    fake_process(fake_proc, 4248, name="bash", cmdline=b"bash\0")
    assert lab.nspawn_alive({"pid": 4247})
    assert not lab.nspawn_alive({"pid": 4248})


def test_a_real_child_blocked_before_exec_is_alive():
    """A forked child that has not exec'd yet: its command line is its parent's, not nspawn's."""
    gate_r, gate_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait for the gate, then become `sleep`
        os.close(gate_w)
        os.read(gate_r, 1)
        os.execvp("sleep", ["sleep", "30"])
    os.close(gate_r)
    try:
        meta = {"pid": pid, "started": lab.process_start(pid)}
        assert meta["started"] is not None
        assert not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"systemd-nspawn")
        assert lab.nspawn_alive(meta)
        os.write(gate_w, b"x")
        deadline = time.monotonic() + 10
        while b"sleep" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert lab.nspawn_alive(meta)  # exec keeps the start time
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while lab.proc_stat(pid)[0] != "Z":  # not reaped yet: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not lab.nspawn_alive(meta)
    finally:
        os.close(gate_w)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
    assert not lab.nspawn_alive(meta)


@pytest.fixture
def child():
    procs = []

    def start(argv):
        proc = subprocess.Popen(argv, start_new_session=True)
        procs.append(proc)
        return proc
    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def host_meta(tmp_path, proc, started=None) -> dict:
    hdir = tmp_path / "hosts" / "gpfu-1"
    hdir.mkdir(parents=True)
    (hdir / "console.log").write_text("Spawning container gpfu-1\n")
    return {"index": 1, "name": "gpfu-1", "address": "127.0.9.11", "pid": proc.pid,
            "started": started or lab.process_start(proc.pid), "dir": str(hdir)}


def test_wait_booted_keeps_waiting_while_the_child_lives(tmp_path, child, monkeypatch):
    proc = child(["sleep", "30"])
    meta = host_meta(tmp_path, proc)
    answers = iter(["", "starting", "running"])
    monkeypatch.setattr(lab, "ssh", lambda *a, **k: subprocess.CompletedProcess(a, 0, next(answers), ""))
    monkeypatch.setattr(lab.time, "sleep", lambda s: None)
    assert lab.wait_booted(lab.Lab("gpfu", "127.0.9", 11, 22), meta, proc, timeout=30) == "running"


def test_wait_booted_reports_a_child_that_exited(tmp_path, child, monkeypatch):
    proc = child([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    meta = host_meta(tmp_path, proc, started="1")
    monkeypatch.setattr(lab, "ssh", lambda *a, **k: pytest.fail("no ssh to a dead host"))
    with pytest.raises(lab.LabError, match=r"gpfu-1: systemd-nspawn exited during boot \(rc=3\)"):
        lab.wait_booted(lab.Lab("gpfu", "127.0.9", 11, 22), meta, proc, timeout=30)


def test_stop_host_stops_its_own_child_and_removes_the_host(tmp_path, child):
    proc = child(["sleep", "30"])
    meta = host_meta(tmp_path, proc)
    lab.stop_host(meta, proc, timeout=5)
    assert proc.poll() == -signal.SIGTERM
    assert not Path(meta["dir"]).exists()


def test_stop_host_never_signals_a_reused_pid(tmp_path, child):
    stranger = child(["sleep", "30"])
    meta = host_meta(tmp_path, stranger, started="1")  # recorded start time: another process
    lab.stop_host(meta, timeout=1)
    assert stranger.poll() is None
    assert not Path(meta["dir"]).exists()


def test_a_failed_up_stops_exactly_the_hosts_it_started(tmp_path, child, monkeypatch):
    monkeypatch.setattr(lab, "STATE_ROOT", tmp_path / "state")
    monkeypatch.setenv("LAB_INVENTORY", str(tmp_path / "hosts.yml"))
    for name in ("require_root_and_tools", "ensure_key", "ensure_inotify_instances"):
        monkeypatch.setattr(lab, name, lambda *a: None)
    monkeypatch.setattr(lab, "build_rootfs", lambda: tmp_path / "rootfs")
    monkeypatch.setattr(lab, "port_free", lambda *a: True)

    booted = []

    def boot_host(_lab, _rootfs, index):
        if index == 3:
            raise lab.LabError("gpfu-3: cannot create")
        proc = child(["sleep", "30"])
        booted.append(f"gpfu-{index}")
        return {"name": f"gpfu-{index}", "pid": proc.pid, "dir": str(tmp_path)}, proc
    stopped, procs = [], []

    def stop_host(meta, proc=None, timeout=0):
        stopped.append(meta["name"])
        procs.append(proc)
    monkeypatch.setattr(lab, "boot_host", boot_host)
    monkeypatch.setattr(lab, "stop_host", stop_host)
    with pytest.raises(lab.LabError, match="gpfu-3"):
        lab.cmd_up(lab.Lab("gpfu", "127.0.9", 11, 22), 4)
    # gpfu-4 may have started alongside gpfu-3 or been cancelled by its failure.
    assert sorted(stopped) == sorted(booted)
    assert {"gpfu-1", "gpfu-2"} <= set(booted)
    assert None not in procs  # stopped through their Popen objects

    # Interrupted while waiting (Ctrl-C, or SIGTERM turned into KeyboardInterrupt): the same.
    stopped.clear()
    monkeypatch.setattr(lab, "boot_host", lambda _l, _r, index: (
        {"name": f"gpfu-{index}", "pid": 0, "dir": str(tmp_path)}, child(["sleep", "30"])))

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt
    monkeypatch.setattr(lab, "wait_booted", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lab.cmd_up(lab.Lab("gpfu", "127.0.9", 11, 22), 2)
    assert sorted(stopped) == ["gpfu-1", "gpfu-2"]


def test_sigterm_unwinds_like_ctrl_c_once():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt):
            lab.raise_interrupt(signal.SIGTERM, None)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # the cleanup is not cut short
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_hosts_up_to_64(monkeypatch, capsys):
    assert lab.main(["up", "--hosts", "65", "--name", "gpfu"]) == 1
    assert "HOSTS must be between 1 and 64" in capsys.readouterr().err


def test_a_killed_hosts_namespace_counts_until_its_last_live_process_is_gone(fake_proc):
    # After its PID 1 is killed the kernel kills the rest of the namespace asynchronously: an sshd
    # still alive holds the host's address and port, so a stop waits for it.
    for pid, state, ns in ((10, "S", "pid:[4026531001]"), (11, "Z", "pid:[4026531001]"), (12, "S", "pid:[4026531002]")):
        fake_process(fake_proc, pid, state=state)
        (fake_proc / str(pid) / "ns").mkdir()
        os.symlink(ns, fake_proc / str(pid) / "ns" / "pid")
    assert lab.namespace_members({"pid:[4026531001]"}) == [10]  # the zombie is not counted
    assert sorted(lab.namespace_members({"pid:[4026531001]", "pid:[4026531002]"})) == [10, 12]
    assert lab.namespace_members(set()) == [] and lab.namespace_members({"pid:[1]"}) == []
