"""Evidence only the server can write: each case of the adversarial round, reproduced on the lab.

What the wait and the drift check accept as "the running process said so" must come from fields
journald sets itself, from the unit's own processes, in SGLang's logging shape - and a receipt may
only stand in for journal lines that are gone. Every case here was a false pass, a false failure or
a hidden crash before; each test plays it as an operator (or a hostile local user) would.
"""
from __future__ import annotations

import json
import shlex
import threading
import time

import pytest

from role_support import (BASE_ENV, RECEIPT, RUN_ENV, VERIFY_TASK, WAIT_TASK, Results, host_json, invocation_journal,
                          ready_playbook, role_playbook, verify_records, wait_for)

TIMEOUT = 60
CONFIG_MARK = "Initialized DFLASH draft runner."
# An old process's line, as an operator would paste it into a prompt ("why did my server log this?").
OLD_LINE = ("[2026-11-29 09:00:00 TP0] Initialized DFLASH draft runner. attention_backend=flashinfer, "
            "model=DFlashDraftModel, block_size=16, draft_window_size=None, compact_cache=False")


@pytest.fixture
def host(clean_fleet):
    return clean_fleet[0]


@pytest.fixture
def deploy(run_playbook, server_vars):
    """deploy(host, fault=None, extra_env=None, **role vars) -> (run, Results) on one host."""
    def _deploy(host, fault=None, extra_env=None, **over):
        env = dict(BASE_ENV, **(extra_env or {}))
        if fault:
            env["SGLANG_SIM_FAULT"] = fault
        over.setdefault("sglang_ready_timeout", TIMEOUT)
        run = run_playbook(role_playbook(host["name"]), extra_vars=server_vars(sglang_environment=env, **over),
                           env=RUN_ENV)
        return run, Results(run.out)
    return _deploy


def current_invocation(sh, host) -> str:
    return sh(host, "systemctl show -p InvocationID --value sglang.service").strip()


def verify(run_playbook, server_vars, host, tmp_path, fault=None, **over) -> dict:
    """verify.yml on one host with the deploy's settings; that host's record of the report."""
    env = dict(BASE_ENV)
    if fault:
        env["SGLANG_SIM_FAULT"] = fault
    results_dir = tmp_path / "verify"
    run_playbook("playbooks/verify.yml", env=RUN_ENV, extra_vars=server_vars(
        sglang_environment=env, verify_hosts=host["name"], verify_results_dir=str(results_dir), **over))
    return verify_records(results_dir)[host["name"]]


def verify_only(run_playbook, host, **module_args) -> dict:
    """sglang_ready on the running invocation (no after_invocation): its result."""
    run = run_playbook(ready_playbook(host["name"], timeout=30, **module_args), env=RUN_ENV)
    return Results(run.out).one("sglang_ready", host["name"])["result"]


# --- 1. a receipt never hides a later journal line ------------------------------------------------

def test_a_config_line_logged_after_the_pass_is_judged_by_every_later_check(
        host, deploy, sh, run_playbook, server_vars, tmp_path):
    # The draft worker re-initialises without a window 8 s after ready: after the settle, after the pass.
    fault = "reinit_draft_after_ready=8:none"
    run, results = deploy(host, fault=fault, sglang_min_ready_seconds=1)
    assert run.rc == 0, run
    invocation = current_invocation(sh, host)
    receipt = host_json(sh, host, RECEIPT)
    assert receipt and receipt["invocation_id"] == invocation and len(receipt["config_lines"]) == 1
    wait_for(lambda: invocation_journal(sh, host, invocation).count(CONFIG_MARK) >= 2, 30,
             what="the second config line")

    record = verify(run_playbook, server_vars, host, tmp_path, fault=fault, sglang_min_ready_seconds=1)
    assert record["verdict"] == "drifted", record
    assert any(d["key"] == "draft_window_size" and d["observed"] is None for d in record["differences"]), record

    again, again_results = deploy(host, fault=fault, sglang_min_ready_seconds=1)
    assert again.rc != 0, again
    verified = again_results.one(VERIFY_TASK, host["name"])["result"]
    assert verified["verdict"] == "mismatch" and "second config line" in verified["msg"], verified["msg"]
    assert current_invocation(sh, host) == invocation  # a check, not a restart

    result = verify_only(run_playbook, host, expect={"draft_window_size": 2048, "compact_cache": True})
    assert result["verdict"] == "mismatch", result
    assert result["source"] == "receipt+journal" and len(result["config_lines"]) == 2, result


# --- 2. forged evidence ----------------------------------------------------------------------------

def forge(sh, host, invocation: str, message: str) -> None:
    """What any unprivileged local user can do: a journal entry whose client field names the invocation."""
    sh(host, "printf 'MESSAGE=%%s\\nINVOCATION_ID=%%s\\nSYSLOG_IDENTIFIER=sglang\\n' %s %s | runuser -u nobody "
             "-- logger --journald" % (shlex.quote(message), shlex.quote(invocation)))


def test_a_config_line_written_by_another_user_is_no_evidence(host, deploy, sh, record_verdict):
    # The server never logs its config line (expected: missing_config_line). While it loads, a hostile
    # user writes one in the new invocation's name.
    forged = []

    def hostile():
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not forged:
            state = sh(host, "systemctl show -p ActiveState -p InvocationID --value sglang.service", check=False)
            parts = state.split()
            if len(parts) == 2 and parts[0] == "active":
                forge(sh, host, parts[1], "[2026-11-29 10:00:00 TP0] " + CONFIG_MARK + " attention_backend=fa3, "
                      "model=DFlashDraftModel, block_size=16, draft_window_size=2048, compact_cache=True")
                forged.append(parts[1])
            time.sleep(0.2)

    writer = threading.Thread(target=hostile, daemon=True)
    writer.start()
    run, results = deploy(host, fault="no_config_line", extra_env={"SGLANG_SIM_LOAD_SECONDS": "6"})
    writer.join(5)
    assert forged, "the forged entry was never written"
    # the forged entry is in the journal, under the new invocation's name
    assert CONFIG_MARK in sh(host, f"journalctl INVOCATION_ID={forged[0]} -o cat --no-pager")
    assert run.rc != 0, run
    wait = results.one(WAIT_TASK, host["name"])["result"]
    assert wait["verdict"] == "missing_config_line", wait["msg"]
    assert wait["config_lines"] == [] and wait["receipt"] is None
    assert host_json(sh, host, RECEIPT) is None
    record_verdict(wait)


# --- 3. a request that quotes a config line ---------------------------------------------------------

def test_a_request_log_quoting_an_old_config_line_is_not_a_config_line(
        host, deploy, sh, run_playbook, server_vars, tmp_path):
    # --log-requests logs every prompt; a user pastes an old config line while the host settles.
    extra = {"sglang_extra_args": {"--log-requests": True}, "sglang_min_ready_seconds": 8}
    quoting = []

    def user():
        deadline = time.monotonic() + 50
        while time.monotonic() < deadline and len(quoting) < 3:
            answer = generate_text(host["address"], "Why did my server log this?\n" + OLD_LINE)
            if answer is not None:
                quoting.append(answer)
            time.sleep(0.5)

    prompter = threading.Thread(target=user, daemon=True)
    prompter.start()
    run, results = deploy(host, **extra)
    prompter.join(30)
    assert quoting, "no request reached the server"
    invocation = current_invocation(sh, host)
    journal = invocation_journal(sh, host, invocation)
    assert "Receive: obj=GenerateReqInput(text='Why did my server log this?\\n[2026-11-29 09:00:00 TP0]" in journal
    assert run.rc == 0, run
    wait = results.one(WAIT_TASK, host["name"])["result"]
    assert wait["verdict"] == "pass" and len(wait["config_lines"]) == 1, wait
    record = verify(run_playbook, server_vars, host, tmp_path, **extra)
    assert record["verdict"] == "in_sync", record


def generate_text(address: str, text: str) -> dict | None:
    import urllib.request
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).encode()
    request = urllib.request.Request(f"http://{address}:30000/generate", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


# --- 4. a readiness-only check ------------------------------------------------------------------------

def test_a_readiness_only_check_leaves_no_receipt_to_misread_after_retention(
        host, deploy, sh, run_playbook, server_vars, tmp_path):
    run, results = deploy(host, sglang_verify=False)  # installed and started, nothing verified
    assert run.rc == 0, run
    assert host_json(sh, host, RECEIPT) is None
    result = verify_only(run_playbook, host, config_line="optional")
    assert result["verdict"] == "pass" and "readiness only" in result["msg"], result
    assert result["receipt"] is None and host_json(sh, host, RECEIPT) is None
    # retention removes the start of the invocation (it had logged window 2048)
    sh(host, "journalctl --rotate && sleep 2 && journalctl --vacuum-time=1s")
    record = verify(run_playbook, server_vars, host, tmp_path)
    assert record["verdict"] == "unverified", record  # not "drifted": nothing says it logged no line


# --- 5. a crash before the first look ------------------------------------------------------------------

def test_a_crash_that_systemd_restarted_before_the_first_look_is_a_crash_loop(host, deploy, sh, run_playbook):
    run, results = deploy(host, sglang_min_ready_seconds=1)
    assert run.rc == 0, run
    old = current_invocation(sh, host)
    # the next start crashes once; Restart=on-failure restarts it after 1 s and that one is healthy
    marker = "/tmp/gpf-crash-once"
    dropin = "/etc/systemd/system/sglang.service.d/50-crash-once.conf"
    try:
        sh(host, f"rm -f {marker}; mkdir -p {dropin.rsplit('/', 1)[0]}; "
                 f"printf '[Service]\\nEnvironment=SGLANG_SIM_FAULT=crash_once={marker}\\nRestartSec=1\\n' > {dropin}; "
                 "systemctl daemon-reload; systemctl restart sglang.service")
        # the wait starts late: only once systemd has restarted the crashed process
        wait_for(lambda: sh(host, "systemctl show -p NRestarts --value sglang.service").strip() not in ("", "0"),
                 40, what="systemd's restart of the crashed process")
        late = run_playbook(ready_playbook(host["name"], timeout=40, after_invocation=old,
                                           expect={"draft_window_size": 2048}), env=RUN_ENV)
        result = Results(late.out).one("sglang_ready", host["name"])["result"]
        assert result["verdict"] == "crash_loop", result
        assert "before this wait first looked" in result["msg"], result["msg"]
        assert "simulated crash_during_load" in result["msg"]  # the crashed invocation's own last lines
    finally:
        sh(host, f"rm -f {dropin} {marker}; systemctl daemon-reload", check=False)


# --- 6. a launcher in front of the interpreter ------------------------------------------------------------

def test_a_launcher_that_execs_the_interpreter_is_a_note_not_a_mismatch(host, deploy, sh):
    # a site wrapper (numactl, conda activation, a pyenv shim) that execs the real interpreter
    launcher = "/usr/local/bin/sglang-python"
    sh(host, f"printf '#!/bin/sh\\nexec /opt/sglang/venv/bin/python \"$@\"\\n' > {launcher}; chmod 755 {launcher}")
    try:
        run, results = deploy(host, sglang_python=launcher, sglang_min_ready_seconds=1)
        assert run.rc == 0, run
        wait = results.one(WAIT_TASK, host["name"])["result"]
        assert wait["verdict"] == "pass", wait["msg"]
        assert any(launcher in note and "execs it" in note for note in wait["notes"]), wait["notes"]
        # the case is real: the unit names the launcher, the process shows the interpreter it exec'd
        pid = sh(host, "systemctl show -p MainPID --value sglang.service").strip()
        assert sh(host, f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()[0] != launcher
        assert launcher in [line for line in sh(host, "cat /etc/systemd/system/sglang.service").splitlines()
                            if line.startswith("ExecStart=")][0]
    finally:
        sh(host, f"rm -f {launcher}", check=False)


# --- 7. a journald that keeps nothing ------------------------------------------------------------------------

def test_a_journald_that_keeps_nothing_is_named_as_the_cause(host, deploy, sh):
    dropin = "/etc/systemd/journald.conf.d/60-gpf-test-storage.conf"
    sh(host, f"mkdir -p /etc/systemd/journald.conf.d; printf '[Journal]\\nStorage=none\\n' > {dropin}; "
             "systemctl restart systemd-journald")
    try:
        run, results = deploy(host, sglang_min_ready_seconds=1)
        assert run.rc != 0, run
        wait = results.one(WAIT_TASK, host["name"])["result"]
        assert wait["verdict"] == "unverified", wait["msg"]
        assert "Storage=none" in wait["msg"] and "retention" not in wait["msg"], wait["msg"]
    finally:
        sh(host, f"rm -f {dropin}; systemctl restart systemd-journald", check=False)
