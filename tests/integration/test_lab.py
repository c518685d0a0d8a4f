"""The lab itself: real systemd as PID 1, journald by invocation, Ansible over SSH."""
from __future__ import annotations


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
    unit = "gpf-lab-probe.service"
    try:
        ids = []
        for run in ("first", "second"):
            # RemainAfterExit keeps the unit (and its InvocationID) loaded after sh exits.
            sh(host, f"systemd-run --unit {unit} -p RemainAfterExit=yes sh -c 'echo probe-{run}'"
                     f" && sleep 0.5")
            ids.append(sh(host, f"systemctl show -p InvocationID --value {unit}").strip())
            sh(host, f"systemctl stop {unit}")
        assert ids[0] and ids[1] and ids[0] != ids[1]
        second = sh(host, f"journalctl _SYSTEMD_INVOCATION_ID={ids[1]} -o cat --no-pager")
        assert "probe-second" in second and "probe-first" not in second
        whole = sh(host, f"journalctl -u {unit} -o cat --no-pager")
        assert "probe-first" in whole and "probe-second" in whole  # the naive read mixes both
    finally:
        sh(host, f"systemctl stop {unit}; systemctl reset-failed {unit}; true", check=False)


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
