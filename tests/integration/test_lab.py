"""The lab itself: real systemd as PID 1, journald by invocation, Ansible over SSH."""
from __future__ import annotations

import time


def test_ansible_pings_every_lab_host(fleet, lab_hosts):
    results = fleet.all.ping()
    assert sorted(results.contacted) == sorted(h["name"] for h in lab_hosts)
    for name, result in results.contacted.items():
        assert result["ping"] == "pong", (name, result)


def test_systemd_is_pid1_and_running(lab_hosts, sh):
    for host in lab_hosts:
        assert sh(host, "cat /proc/1/comm").strip() == "systemd"
        assert sh(host, "systemctl is-system-running", check=False).strip() in (
            "running", "degraded")


def test_each_host_has_its_own_identity(lab_hosts, sh):
    seen = set()
    for host in lab_hosts:
        hostname = sh(host, "hostname").strip()
        machine_id = sh(host, "cat /etc/machine-id").strip()
        assert hostname == host["name"]
        assert machine_id and machine_id not in seen
        seen.add(machine_id)


def test_journal_by_invocation_id_returns_only_that_invocation(lab_hosts, sh):
    host = lab_hosts[0]
    unit = "gpf-lab-probe"
    sh(host, f"systemctl reset-failed {unit} 2>/dev/null; true", check=False)
    try:
        ids = []
        for run in ("first", "second"):
            sh(host, f"systemd-run --unit {unit} --collect --wait sh -c 'echo probe-{run}'")
            # --collect unloads the unit: read the id from the journal of the exact run.
            ids.append(sh(host, f"journalctl -u {unit} -o json --output-fields=_SYSTEMD_INVOCATION_ID "
                                f"-g probe-{run} -n 1 | python3 -c "
                                "'import json,sys; print(json.loads(sys.stdin.readline())[\"_SYSTEMD_INVOCATION_ID\"])'").strip())
        assert ids[0] != ids[1]
        second = sh(host, f"journalctl _SYSTEMD_INVOCATION_ID={ids[1]} -o cat --no-pager")
        assert "probe-second" in second and "probe-first" not in second
    finally:
        sh(host, f"systemctl stop {unit} 2>/dev/null; systemctl reset-failed {unit} 2>/dev/null; true",
           check=False)


def test_simulator_is_installed_in_the_host_venv(lab_hosts, sh):
    host = lab_hosts[0]
    out = sh(host, "/opt/sglang/venv/bin/python -c 'import sglang, sys; print(sglang.__file__)'")
    assert out.strip().startswith("/opt/sglang/venv/lib/python3.11/site-packages/sglang/")


def test_lab_hosts_bind_only_their_own_address(lab_hosts, sh):
    # Containers share the machine's network namespace: sshd must listen on the host's address.
    for host in lab_hosts:
        listeners = sh(host, "ss -Hltnp 'sport = :22' || true")
        assert host["address"] in listeners, listeners
        assert "0.0.0.0:22" not in listeners and "[::]:22" not in listeners
    time.sleep(0)
