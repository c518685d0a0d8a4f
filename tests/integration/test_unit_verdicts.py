"""The verdicts the other lab tests do not meet, each played on the lab as an operator meets it.

A unit that is not installed, a check run, a stopped unit, a restart by someone else during the
wait, a server that stops answering while it settles (a wedged process: SIGSTOP), and a host whose
SSH goes away during the wait. Each test checks the verdict and what its message says, and keeps
the message for the guide's troubleshooting page (record_verdict).
"""
from __future__ import annotations

import threading

import pytest

from lab_support import CLEAN_HOST
from role_support import (BASE_ENV, RUN_ENV, Results, invocation_journal, ready_playbook, role_playbook,
                          verify_records, wait_for)
from rollout_support import lab  # noqa: F401 pylint: disable=unused-import

EXPECT = {"draft_window_size": 2048, "compact_cache": True}
LOAD = {"SGLANG_SIM_LOAD_SECONDS": "6"}  # long enough to act on the new process while it loads


def invocation(sh, host) -> str:
    return sh(host, "systemctl show -p InvocationID --value sglang.service").strip()


def main_pid(sh, host) -> str:
    return sh(host, "systemctl show -p MainPID --value sglang.service").strip()


def following(sh, host, invocation_id: str) -> bool:
    """Whether a wait on the host follows that invocation's journal (its `journalctl --follow`)."""
    return bool(sh(host, f"pgrep -f -- '--follow.*_SYSTEMD_INVOCATION_ID={invocation_id}'", check=False).strip())


def restart_elsewhere(sh, host) -> tuple[str, str]:
    """`systemctl restart` as another operator would run it: (the invocation it replaced, the new one loading)."""
    old = invocation(sh, host)
    sh(host, "systemctl restart --no-block sglang.service")
    return old, wait_for(lambda: (invocation(sh, host) not in ("", old)) and invocation(sh, host), 20,
                         what="the new invocation")


def verify_line(run_playbook, server_vars, results_dir, host, hosts: str, verdict: str) -> tuple[dict, str]:
    """verify.yml over `hosts`: it fails, and `host`'s record has `verdict`; (that record, its report line)."""
    verify = run_playbook("playbooks/verify.yml", env=RUN_ENV, extra_vars=server_vars(
        sglang_environment=BASE_ENV | LOAD, verify_hosts=hosts, verify_results_dir=str(results_dir)))
    assert verify.rc != 0, verify
    record = verify_records(results_dir)[host["name"]]
    assert record["verdict"] == verdict, record
    return record, next(line for line in verify.out.splitlines() if line.startswith(f"{host['name']}: "))


class Background(threading.Thread):
    """A playbook run in a thread, so the test can act on the host while the wait runs."""

    def __init__(self, run_playbook, playbook: str):
        super().__init__(daemon=True)
        self.run_playbook, self.playbook, self.run_ = run_playbook, playbook, None

    def run(self):
        self.run_ = self.run_playbook(self.playbook, env=RUN_ENV)

    def result(self, host) -> dict:
        self.join(120)
        assert self.run_ is not None, "the playbook did not end"
        return Results(self.run_.out).one("sglang_ready", host["name"])["result"]


@pytest.fixture(scope="module")
def served(lab_hosts, run_playbook, server_vars, sh):
    """The first lab host running the lab's settings (loading takes 6 s), cleaned after the module."""
    host = lab_hosts[0]
    sh(host, CLEAN_HOST, check=False)
    run = run_playbook(role_playbook(host["name"]), env=RUN_ENV,
                       extra_vars=server_vars(sglang_environment=BASE_ENV | LOAD, sglang_ready_timeout=60))
    assert run.rc == 0, run
    yield host
    sh(host, CLEAN_HOST, check=False)


def test_a_unit_that_is_not_installed_is_not_found(clean_fleet, run_playbook, record_verdict):
    host = clean_fleet[0]
    run = run_playbook(ready_playbook(host["name"], expect=EXPECT, timeout=20), env=RUN_ENV)
    assert run.rc != 0, run
    result = Results(run.out).one("sglang_ready", host["name"])["result"]
    assert result["verdict"] == "not_found", result
    assert "unit sglang.service not found (LoadState=not-found)" in result["msg"], result["msg"]
    record_verdict(result)


def test_a_check_run_waits_for_nothing_and_says_so(served, run_playbook, sh, record_verdict):
    # as the role's handler calls it after a restart, which a check run did not make
    before = invocation(sh, served)
    run = run_playbook(ready_playbook(served["name"], expect=EXPECT, timeout=20, after_invocation=before),
                       check=True, env=RUN_ENV)
    assert run.rc == 0, run
    result = Results(run.out).one("sglang_ready", served["name"])["result"]
    assert result["verdict"] == "check_mode" and result["verified"] is False, result
    assert "nothing was restarted, so there is no new invocation of sglang.service" in result["msg"], result["msg"]
    assert invocation(sh, served) == before
    record_verdict(result)


def test_a_stopped_unit_is_not_active_and_verify_says_not_running(
        served, run_playbook, server_vars, sh, tmp_path, record_verdict):
    sh(served, "systemctl stop sglang.service")
    try:
        run = run_playbook(ready_playbook(served["name"], expect=EXPECT, timeout=20), env=RUN_ENV)
        assert run.rc != 0, run
        result = Results(run.out).one("sglang_ready", served["name"])["result"]
        # SGLang 0.5.11 SIGKILLs itself after draining (systemd: failed, signal); still a stop, not a death
        assert result["verdict"] == "not_active", result
        assert result["msg"].startswith("sglang.service is not running: stopped by a stop job of systemd"), \
            result["msg"]
        record_verdict(result)

        record, line = verify_line(run_playbook, server_vars, tmp_path / "verify", served, served["name"],
                                   "not_running")
        assert line.startswith(f"{served['name']}: NOT RUNNING"), line
        record_verdict(record, source="verify", message=line)
    finally:
        sh(served, "systemctl start --no-block sglang.service")


def test_a_restart_by_someone_else_during_the_wait_is_replaced(served, run_playbook, sh, record_verdict):
    old, loading = restart_elsewhere(sh, served)
    wait = Background(run_playbook, ready_playbook(served["name"], expect=EXPECT, timeout=60, after_invocation=old,
                                                   poll_interval=0.25))
    wait.start()
    wait_for(lambda: following(sh, served, loading), 20, what="the wait following the new invocation")
    sh(served, "systemctl restart --no-block sglang.service")  # a second operator, while it loads
    result = wait.result(served)
    assert result["verdict"] == "replaced", result
    assert result["invocation_id"] == loading, result
    assert f"invocation {loading}" in result["msg"] and "someone or something else restarted" in result["msg"], \
        result["msg"]
    record_verdict(result)


def test_a_server_that_stops_answering_while_it_settles_is_unstable(served, run_playbook, sh, record_verdict):
    old, loading = restart_elsewhere(sh, served)
    wait = Background(run_playbook, ready_playbook(served["name"], expect=EXPECT, timeout=60, after_invocation=old,
                                                   poll_interval=0.25, min_ready_seconds=4, request_timeout=2))
    wait.start()
    # the wait's first good /generate (the server's access line), then the process wedges
    wait_for(lambda: "POST /generate HTTP/1.1\" 200" in invocation_journal(sh, served, loading), 30,
             interval=0.2, what="the wait's first /generate")
    pid = main_pid(sh, served)
    sh(served, f"kill -STOP {pid}")
    try:
        result = wait.result(served)
    finally:
        sh(served, f"kill -CONT {pid}", check=False)
    assert result["verdict"] == "unstable", result
    assert f"invocation {loading} answered /generate, but no longer after" in result["msg"], result["msg"]
    assert result["invocation_id"] == loading and invocation(sh, served) == loading  # alive, the same process
    record_verdict(result)


def test_ssh_lost_during_the_wait_is_connection_lost_and_verify_cannot_check_the_host(
        served, lab, lab_hosts, run_playbook, server_vars, sh, tmp_path, record_verdict):  # noqa: F811
    old, loading = restart_elsewhere(sh, served)
    wait = Background(run_playbook, ready_playbook(served["name"], expect=EXPECT, timeout=60, after_invocation=old,
                                                   poll_interval=0.25, connection_retry_seconds=3))
    wait.start()
    wait_for(lambda: following(sh, served, loading), 20, what="the wait following the new invocation")
    lab.cut_ssh(served["name"])
    try:
        result = wait.result(served)
        assert result["verdict"] == "connection_lost", result
        assert result["msg"].startswith(f"connection to {served['name']} lost during the wait"), result["msg"]
        assert "no verdict" in result["msg"], result["msg"]
        record_verdict(result)
        # verify.yml over the host and a reachable one: the report names the host it could not read
        record, line = verify_line(run_playbook, server_vars, tmp_path / "verify", served,
                                   f"{served['name']}:{lab_hosts[1]['name']}", "unchecked")
        assert line.startswith(f"{served['name']}: NOT CHECKED"), line
        record_verdict(record, source="verify", message=line)
    finally:
        lab.restore_ssh(served["name"])
