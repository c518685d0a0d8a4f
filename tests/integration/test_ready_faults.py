"""sglang_ready's verdicts against real faults: real systemd, real journald, the real simulator.

The role deploys a server with a simulator fault in the unit's environment; each test checks the
verdict, its message and how fast it came (a crash must not cost the whole timeout). The four
wait-phase faults run once, in parallel on as many lab hosts as there are (batches when fewer);
the stray-server and journald tests use the first host.
"""
from __future__ import annotations

import json
import time

import pytest

from lab_support import CLEAN_HOST
from role_support import (BASE_ENV, EXPECT_2048, RUN_ENV, WAIT_TASK, WINDOW_FLAG, Results,
                          generate, invocation_journal, per_host_role_playbook, ready_playbook,
                          role_playbook, wait_for)

TIMEOUT = 60

# scenario -> the per-host settings of its deploy (a first install on a clean host)
FAULTS = {
    "ignore_window": {"env": {"SGLANG_SIM_FAULT": "ignore_window"}},
    # Restart=no: the crash ends the invocation (died).
    "crash_during_load": {"env": {"SGLANG_SIM_FAULT": "crash_during_load",
                                  "SGLANG_SIM_LOAD_SECONDS": "3"}, "sglang_restart": "no"},
    # Loading takes 20 s and rank 0 crashes at 30 % of it (6 s); systemd restarts it 1 s later, again
    # and again (Restart=always). Whichever invocation the wait first sees (loading, or already
    # dead and waiting for its restart), it is a crash loop.
    "crash_loop": {"env": {"SGLANG_SIM_FAULT": "crash_during_load", "SGLANG_SIM_LOAD_SECONDS": "20"},
                   "sglang_restart": "always", "sglang_restart_sec": 1},
    "hang_during_load": {"env": {"SGLANG_SIM_FAULT": "hang_during_load"}, "sglang_ready_timeout": 15},
}
PER_HOST = ("sglang_environment", "sglang_restart", "sglang_restart_sec", "sglang_ready_timeout")


def _per_host_vars(spec: dict) -> dict:
    return {"sglang_environment": BASE_ENV | spec["env"],
            "sglang_restart": spec.get("sglang_restart", "on-failure"),
            "sglang_restart_sec": spec.get("sglang_restart_sec", 10),
            "sglang_ready_timeout": spec.get("sglang_ready_timeout", TIMEOUT)}


@pytest.fixture(scope="module")
def fault_runs(lab_hosts, run_playbook, server_vars, sh, state_of):
    """scenario -> {host, rc, result (of the wait handler), state (right after), journal}."""
    common = {k: v for k, v in server_vars().items() if k not in PER_HOST}
    names = list(FAULTS)
    runs = {}
    for first in range(0, len(names), len(lab_hosts)):
        batch = dict(zip(names[first:first + len(lab_hosts)], lab_hosts))
        hosts = list(batch.values())
        for host in hosts:
            sh(host, CLEAN_HOST, check=False)
        table = {host["name"]: _per_host_vars(FAULTS[name]) for name, host in batch.items()}
        started = time.monotonic()
        run = run_playbook(per_host_role_playbook(":".join(h["name"] for h in hosts), PER_HOST),
                           extra_vars=common | {"gpf_per_host": table}, env=RUN_ENV)
        seconds = time.monotonic() - started
        results = Results(run.out)
        for name, host in batch.items():
            found = results.of(WAIT_TASK, host["name"])
            state = state_of(host)
            runs[name] = {"host": host, "rc": run.rc, "run": run, "seconds": seconds,
                          "status": found[0]["status"] if found else None,
                          "result": found[0]["result"] if found else {}, "state": state,
                          "journal": invocation_journal(sh, host, state["InvocationID"])
                          if state.get("InvocationID") else ""}
        for host in hosts:
            sh(host, CLEAN_HOST, check=False)
    return runs


def fault(fault_runs, name, record_property) -> dict:
    run = fault_runs[name]
    record_property("verdict", run["result"].get("verdict"))
    record_property("time_to_verdict", run["result"].get("elapsed"))
    assert run["status"] == "fatal", (name, run["run"])
    return run["result"]


@pytest.fixture
def host(clean_fleet):
    return clean_fleet[0]


@pytest.fixture
def apply_role(run_playbook, server_vars):
    """apply_role(host, fault=None, **vars) -> (run, results, seconds) on one host."""
    def _apply(host, fault=None, extra_env=None, **over):
        env = dict(BASE_ENV)
        if fault:
            env["SGLANG_SIM_FAULT"] = fault
        env.update(extra_env or {})
        over.setdefault("sglang_ready_timeout", TIMEOUT)
        started = time.monotonic()
        run = run_playbook(role_playbook(host["name"]), extra_vars=server_vars(sglang_environment=env, **over),
                           env=RUN_ENV)
        return run, Results(run.out), time.monotonic() - started
    return _apply


def failed_wait(results, host, record_property):
    item = results.one(WAIT_TASK, host["name"])
    record_property("verdict", item["result"].get("verdict"))
    record_property("time_to_verdict", item["result"].get("elapsed"))
    assert item["status"] == "fatal", item
    return item["result"]


def test_ignore_window_fails_naming_the_flag(fault_runs, record_property, record_verdict):
    """The original incident: the unit says 2048, the process runs without a window."""
    result = fault(fault_runs, "ignore_window", record_property)
    assert result["verdict"] == "mismatch", result
    record_verdict(result)
    msg = result["msg"]
    assert "draft_window_size" in msg and "2048" in msg and "None" in msg, msg
    assert f"{WINDOW_FLAG} 2048" in msg, msg
    assert result["observed"]["draft_window_size"] is None
    assert result["observed"]["compact_cache"] is False
    # The verdict is about the process that runs now, and its own journal says so.
    run = fault_runs["ignore_window"]
    assert result["invocation_id"] == run["state"]["InvocationID"]
    assert "draft_window_size=None, compact_cache=False" in run["journal"]
    assert result["elapsed"] < TIMEOUT / 2, result["elapsed"]


def test_crash_during_load_fails_fast_with_the_journal_tail(fault_runs, record_property, record_verdict):
    result = fault(fault_runs, "crash_during_load", record_property)
    assert result["verdict"] == "died", result
    record_verdict(result)
    assert "Scheduler hit an exception" in result["msg"], result["msg"]
    assert "Received sigquit from a child process" in result["msg"], result["msg"]
    assert any("Scheduler hit an exception" in line for line in result["journal_tail"])
    assert "code=killed, status=9/KILL, Result signal" in result["msg"], result["msg"]  # systemd's words
    assert result["invocation_id"] == fault_runs["crash_during_load"]["state"]["InvocationID"]
    assert result["elapsed"] < 15, result["elapsed"]  # seconds, not the 60 s timeout


def test_crash_loop_fails_as_a_crash_loop_not_a_timeout(fault_runs, record_property, record_verdict):
    result = fault(fault_runs, "crash_loop", record_property)
    assert result["verdict"] == "crash_loop", result
    record_verdict(result)
    assert "crash loop" in result["msg"], result["msg"]
    assert "Scheduler hit an exception" in result["msg"], result["msg"]
    assert "status=9/KILL" in result["msg"] and "Result signal" in result["msg"], result["msg"]
    assert result["elapsed"] < 25, result["elapsed"]  # well below the 60 s timeout
    # systemd really restarted it: the unit has moved on to another invocation or is about to.
    state = fault_runs["crash_loop"]["state"]
    assert state["InvocationID"] != result["invocation_id"] or int(state["NRestarts"]) >= 1 \
        or state["SubState"].startswith("auto-restart"), state


def test_hang_during_load_times_out_with_last_phase_and_line(fault_runs, record_property, record_verdict):
    result = fault(fault_runs, "hang_during_load", record_property)
    assert result["verdict"] == "timeout", result
    record_verdict(result)
    msg = result["msg"]
    # the phase its journal shows (the hang comes after the config line, before the port opens)
    assert "timed out after" in msg, msg
    assert "last phase: draft runner initialised: block_size=16, draft_window_size=2048, compact_cache=True; " \
           "port not open yet" in msg, msg
    # the last line the hung process logged, quoted
    assert "last journal line: '" in msg and "max_total_num_tokens=" in msg, msg
    assert 15 <= result["elapsed"] < 25, result["elapsed"]


def test_stray_server_on_the_port_is_a_foreign_listener(host, apply_role, sh, record_property, record_verdict):
    address = host["address"]
    stray = ("systemd-run --unit gpf-stray.service -E SGLANG_SIM_LOAD_SECONDS=1 "
             "/opt/sglang/venv/bin/python -m sglang.launch_server --model-path /models/stray "
             f"--host {address} --port 30000")
    try:
        sh(host, stray)
        wait_for(lambda: generate(address), 30, what="the stray server to answer")
        run, results, seconds = apply_role(host)
        assert run.rc != 0, run
        result = failed_wait(results, host, record_property)
        assert result["verdict"] == "foreign_listener", result
        record_verdict(result)
        assert "gpf-stray.service" in result["msg"], result["msg"]
        assert f"a process outside sglang.service answers on {address}:30000" in result["msg"]
        assert result["listener"]["verdict"] == "outside"
        assert result["elapsed"] < 15, result["elapsed"]
    finally:
        sh(host, "systemctl stop gpf-stray.service; systemctl reset-failed gpf-stray.service; true",
           check=False)


# --- journald rate limiting ------------------------------------------------------------------
# A flood journald cuts (burst 100) loses the config line. /server_info echoes the parsed
# arguments: it never stands in for the line, so the verdict is `unverified` (never pass) unless
# accept_unverified says otherwise. (The seed incident, ignore_window under the same flood, is in
# test_verdicts.py; here the process is healthy: even then there is no pass without evidence.)

JOURNAL_DROPPED = "a596d6fe7bfa4994828e72309e95d61e"  # SD_MESSAGE_JOURNAL_DROPPED (systemd's sd-messages.h)
FLOOD = "log_flood=5000"
LOW_LIMIT = {"sglang_journal_rate_limit_burst": 100}
NOT_EVIDENCE = "/server_info only echoes the parsed arguments and does not count"


def suppression_notices(sh, host, invocation):
    out = sh(host, f"journalctl SYSLOG_IDENTIFIER=systemd-journald -o json --no-pager "
                   f"OBJECT_SYSTEMD_INVOCATION_ID={invocation}", check=False)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_flood_with_low_journald_limit_is_unverified_never_a_pass(host, apply_role, sh, record_property):
    run, results, seconds = apply_role(host, fault=FLOOD, sglang_journal_rate_limit_interval="30s",
                                       **LOW_LIMIT)
    assert run.rc != 0, run
    record_property("deploy_seconds", seconds)
    wait = failed_wait(results, host, record_property)
    assert wait["verdict"] == "unverified", wait.get("msg")
    assert "journald's rate limit dropped" in wait["msg"] and NOT_EVIDENCE in wait["msg"], wait["msg"]
    assert wait["source"] is None and wait["observed"] is None and wait["verified"] is False
    assert wait["suppression"]["messages_dropped"] > 1000, wait["suppression"]
    assert wait["receipt"] is None
    assert sh(host, "ls /var/lib/gpufleet-inference/receipts 2>/dev/null || true").strip() == ""
    # it waited for journald's late notice (its 30 s interval), not for the timeout
    assert wait["elapsed"] < TIMEOUT - 10, wait["elapsed"]


@pytest.fixture(scope="module")
def flooded(lab_hosts, run_playbook, server_vars, sh, state_of):
    """The first host running a flood its journald cut (burst 100 per 5 s), deployed WITHOUT the
    role's wait, after journald wrote its "Suppressed" notice (needs the interval over and a line)."""
    host = lab_hosts[0]
    sh(host, CLEAN_HOST, check=False)
    env = dict(BASE_ENV, SGLANG_SIM_FAULT=FLOOD)
    run = run_playbook(role_playbook(host["name"]), env=RUN_ENV, extra_vars=server_vars(
        sglang_environment=env, sglang_verify=False, sglang_journal_rate_limit_interval="5s",
        sglang_ready_timeout=TIMEOUT, **LOW_LIMIT))
    assert run.rc == 0, run
    invocation = state_of(host)["InvocationID"]
    wait_for(lambda: generate(host["address"]), 30, what="the flooding server to answer")
    time.sleep(5)
    assert generate(host["address"])  # journald writes its notice once the unit logs again: this line
    notices = wait_for(lambda: suppression_notices(sh, host, invocation), 10, what="journald's suppression notice")
    yield {"host": host, "invocation": invocation, "notices": notices}
    sh(host, CLEAN_HOST, check=False)


def test_flood_really_loses_the_config_line_on_this_journald(flooded, sh):
    """What the lab's journald does with a flood (the ground truth for the tests around)."""
    host = flooded["host"]
    journal = invocation_journal(sh, host, flooded["invocation"])
    assert "Initialized DFLASH draft runner" not in journal  # lost to the rate limit
    notice = flooded["notices"][0]
    assert notice["MESSAGE"].startswith("Suppressed ") and notice["MESSAGE"].endswith(
        " messages from sglang.service")
    assert notice["MESSAGE_ID"] == JOURNAL_DROPPED
    assert notice["OBJECT_SYSTEMD_UNIT"] == "sglang.service"
    assert int(notice["N_DROPPED"]) > 1000


def test_verify_only_after_the_notice_is_unverified_naming_the_rate_limit(flooded, run_playbook, sh,
                                                                          record_property):
    host = flooded["host"]
    run = run_playbook(ready_playbook(host["name"], expect=EXPECT_2048, timeout=30), env=RUN_ENV)
    assert run.rc != 0, run
    result = Results(run.out).one("sglang_ready", host["name"])["result"]
    record_property("verdict", result.get("verdict"))
    record_property("time_to_verdict", result.get("elapsed"))
    assert result["verdict"] == "unverified", result.get("msg")
    assert "journald's rate limit dropped" in result["msg"] and NOT_EVIDENCE in result["msg"], result["msg"]
    assert result["invocation_id"] == flooded["invocation"]
    assert result["source"] is None and result["observed"] is None
    assert result["suppression"]["messages_dropped"] > 1000
    assert result["elapsed"] < 10  # the notice is there already: no waiting
    assert sh(host, "ls /var/lib/gpufleet-inference/receipts 2>/dev/null || true").strip() == ""


def test_verify_only_accepting_unverified_passes_with_a_warning(flooded, run_playbook, sh, record_property):
    host = flooded["host"]
    run = run_playbook(ready_playbook(host["name"], expect=EXPECT_2048, timeout=30, accept_unverified=True),
                       env=RUN_ENV)
    assert run.rc == 0, run
    result = Results(run.out).one("sglang_ready", host["name"])["result"]
    record_property("verdict", result.get("verdict"))
    assert result["verdict"] == "pass" and result["verified"] is False, result["msg"]
    assert "UNVERIFIED (accepted by accept_unverified)" in result["msg"], result["msg"]
    assert f"[WARNING]: {result['msg']}" in run.out  # the module's warning, as Ansible shows it
    assert result["source"] is None and result["observed"] is None and result["receipt"] is None
    assert sh(host, "ls /var/lib/gpufleet-inference/receipts 2>/dev/null || true").strip() == ""
