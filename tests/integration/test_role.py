"""The role gpufleet.inference.sglang on the lab: real systemd, real journald, the real simulator.

Tests use the first lab host unless they say otherwise; test_deploy_* uses the first two (or the
only one) in parallel. Every test starts and ends with clean hosts (clean_fleet), except that the
tests of TestOnADeployedHost share one deployment (class-scoped): each of them proves it changed
neither the unit file nor the running invocation.

What the role verified is read from its tasks' results: the wait for the new process (the restart
handler), or, when nothing restarted, the fact sglang_verified (the drift check's, when a receipt
shows the running invocation was verified before; else the no-restart verification's).
"""
from __future__ import annotations

import json
import re
import shlex
import time

import pytest

from lab_support import CLEAN_HOST
from role_support import (BASE_ENV, CONFIG_FILE, EXPECT_2048, LAST_GOOD_RECORD, RECEIPT, RUN_ENV, UNIT_PATH,
                          VALIDATE_TASK, VERIFIED_TASK, VERIFY_TASK, WAIT_TASK, WINDOW_FLAG, GenerateProbe, Results,
                          generate, host_json, invocation_journal, ready_playbook, role_playbook, unit_checksum,
                          unit_file, verified_fact, verify_records, wait_for, wait_result, replaced_invocation)

TIMEOUT = 60


@pytest.fixture
def host(clean_fleet):
    return clean_fleet[0]


@pytest.fixture
def apply_role(run_playbook, server_vars):
    """apply_role(hosts, env=None, check=False, diff=False, **vars) -> (run, results, seconds)."""
    def _apply(hosts, env=None, check=False, diff=False, **over):
        hosts = hosts if isinstance(hosts, list) else [hosts]
        environment = dict(BASE_ENV)
        environment.update(env or {})
        over.setdefault("sglang_ready_timeout", TIMEOUT)
        started = time.monotonic()
        run = run_playbook(role_playbook(":".join(h["name"] for h in hosts)),
                           extra_vars=server_vars(sglang_environment=environment, **over),
                           check=check, diff=diff, env=RUN_ENV)
        return run, Results(run.out), time.monotonic() - started
    return _apply


def report(results, host) -> dict:
    """The wait for the new process (it passed), with the invocation it replaced."""
    result = wait_result(results, host)
    assert result["verdict"] == "pass", result.get("msg")
    previous = replaced_invocation(results, host)
    if previous:  # a restart: the wait waited for ANOTHER invocation than the one it replaced
        assert result["phases"]["new_invocation"]["invocation_id"] == result["invocation_id"] != previous, result
    return dict(result, previous_invocation=previous)


def journal_entries(sh, host, invocation) -> list[tuple[float, str]]:
    """(epoch seconds, message) of one invocation's journal."""
    out = invocation_journal(sh, host, invocation, fmt="json")
    entries = []
    for line in out.splitlines():
        if line.startswith("{"):
            fields = json.loads(line)
            message = fields.get("MESSAGE")
            if isinstance(message, list):
                message = bytes(message).decode("utf-8", "replace")
            entries.append((int(fields["__REALTIME_TIMESTAMP"]) / 1e6, message or ""))
    return entries


def execstart_lines(unit_text: str) -> list[str]:
    lines = unit_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    block = [lines[start]]
    while block[-1].endswith("\\"):
        block.append(lines[start + len(block)])
    return block


# --- 1. success -------------------------------------------------------------------------------

def test_deploy_window_2048_verifies_the_new_invocation(clean_fleet, apply_role, sh, state_of):
    hosts = clean_fleet[:2]
    run, results, seconds = apply_role(hosts)
    assert run.rc == 0, run
    for host in hosts:
        rep = report(results, host)
        invocation = state_of(host)["InvocationID"]
        assert rep["verdict"] == "pass" and rep["invocation_id"] == invocation, rep
        assert rep["observed"]["draft_window_size"] == 2048, rep
        assert rep["observed"]["compact_cache"] is True, rep
        assert rep["source"] == "journal" and rep["verified"] is True
        assert rep["generate"]["status"] == 200 and rep["generate"]["text"].strip(), rep
        assert "compared block_size=16, compact_cache=True, draft_window_size=2048 (config line in its journal); " \
               "its command line; its environment" in rep["msg"], rep["msg"]
        assert "stayed up for min_ready_seconds 10" in rep["msg"], rep["msg"]
        assert rep["launched"]["command_checked"] and rep["launched"]["drop_in_paths"] == []
        # the receipt of exactly this invocation, on the host
        receipt = host_json(sh, host, RECEIPT)
        assert rep["receipt"] == RECEIPT and receipt["invocation_id"] == invocation, receipt
        assert receipt["config_lines"][0]["values"]["draft_window_size"] == 2048
        assert verified_fact(results, host)["invocation_id"] == invocation
        # the config line, in the journal of exactly that invocation
        journal = invocation_journal(sh, host, invocation)
        assert re.search(r"Initialized DFLASH draft runner\. .*block_size=16, draft_window_size=2048, "
                         r"compact_cache=True", journal), journal[-2000:]
        # one ExecStart argument per line, each quoted
        block = execstart_lines(unit_file(sh, host))
        assert block[0] == 'ExecStart="/opt/sglang/venv/bin/python" \\'
        for line in block[1:]:
            assert re.fullmatch(r'    "[^"]*"( \\)?', line), line
        args = [line.strip().rstrip("\\").strip().strip('"') for line in block[1:]]
        assert args[args.index(WINDOW_FLAG) + 1] == "2048"
        assert args[args.index("--host") + 1] == host["address"]


# --- 3. the old process keeps answering during the restart -------------------------------------

SLOW_STOP = 20


def test_slow_stop_passes_only_with_the_new_invocation(host, apply_role, sh, state_of, record_property):
    # Deploy #1 runs the process that will be slow to stop: slow_stop is in ITS environment.
    run, results, seconds = apply_role(host, env={"SGLANG_SIM_FAULT": f"slow_stop={SLOW_STOP}"})
    assert run.rc == 0, run
    old = report(results, host)["invocation_id"]
    probe = GenerateProbe(host["address"], interval=0.5)
    probe.start()
    try:
        started = time.time()
        run, results, seconds = apply_role(host, sglang_speculative_draft_window_size=4096)
    finally:
        probe.stop()
    assert run.rc == 0, run
    rep = report(results, host)
    new = rep["invocation_id"]
    assert new != old and new == state_of(host)["InvocationID"], (old, rep)
    assert rep["previous_invocation"] == old
    assert rep["observed"]["draft_window_size"] == 4096

    old_entries = journal_entries(sh, host, old)
    sigterm = next(t for t, m in old_entries if "SIGTERM received" in m)
    new_start = journal_entries(sh, host, new)[0][0]
    # The old process answered /generate after SIGTERM, while the play was waiting ...
    answered = [t for t, m in old_entries if t > sigterm and '"POST /generate HTTP/1.1" 200' in m]
    assert answered, old_entries[-30:]
    assert any(ok and sigterm < t < new_start for t, ok in probe.samples), probe.samples
    # ... for at least its stop delay, and the verdict came only from the new process after that.
    record_property("old_answered_after_sigterm", max(answered) - sigterm)
    record_property("sigterm_to_new_start", new_start - sigterm)
    record_property("deploy_seconds", seconds)
    assert new_start - sigterm >= SLOW_STOP, (sigterm, new_start)
    assert max(answered) < new_start
    assert started < sigterm and seconds >= SLOW_STOP
    wait = results.one(WAIT_TASK, host["name"])["result"]
    record_property("verdict", wait["verdict"])
    record_property("time_to_verdict", wait["elapsed"])
    assert wait["invocation_id"] == new and wait["phases"]["new_invocation"]["invocation_id"] == new


# --- 8. bad variables fail before any host change ---------------------------------------------

BAD_VARIABLES = [
    ({"sglang_speculative_draft_window_size": 8}, "sglang_speculative_draft_window_size (8) must be >="),
    ({"sglang_speculative_draft_model_path": ""}, "sglang_speculative_draft_model_path is required"),
    ({"sglang_tp_size": -2}, "sglang_tp_size must be a positive integer"),
    ({"sglang_model_path": "/models/a\nb"}, "sglang_model_path contains a newline"),
    ({"sglang_extra_args": {"mem-fraction-static": 0.8}}, "is not a --flag"),
]


def test_bad_variables_fail_before_any_host_change(host, apply_role, sh, state_of):
    def assert_refused(over, expected):
        run, results, seconds = apply_role(host, **over)
        assert run.rc != 0, (over, run)
        item = results.one(VALIDATE_TASK, host["name"])
        assert item["status"] == "fatal", item
        assert expected in run.out, (expected, run)
        # nothing after validation ran on the host (before it: only the argument spec check)
        ran = results.tasks_ran(host["name"])
        assert ran[-1] == VALIDATE_TASK and len(ran) <= 2, ran

    # On a host without SGLang: no unit, no config file, no journald drop-in, no receipt appear.
    assert_refused(*BAD_VARIABLES[0])
    assert unit_file(sh, host) is None
    assert sh(host, f"ls {CONFIG_FILE} /etc/systemd/journald.conf.d/50-gpufleet-sglang.conf "
                    "/var/lib/gpufleet-inference 2>/dev/null || true").strip() == ""

    # On a deployed host: the unit file and the running invocation stay as they were.
    run, results, seconds = apply_role(host)
    assert run.rc == 0, run
    checksum, before = unit_checksum(sh, host), state_of(host)
    for over, expected in BAD_VARIABLES[1:]:
        assert_refused(over, expected)
        assert unit_checksum(sh, host) == checksum, over
        after = state_of(host)
        assert (after["InvocationID"], after["MainPID"]) == (before["InvocationID"], before["MainPID"])


# --- the API key: in SGLang's config file, never on a command line or in a result ---------------

# A backslash: SGLang's server_args line (a repr) doubles it, so Ansible's masking of the exact
# no_log value would not catch a leak of that line; the distinctive tail is what the tests look for.
API_KEY = "gpfLab\\KeyQZXw9"
KEY_MARK = "KeyQZXw9"


def test_api_key_is_in_no_process_list_and_no_result(host, apply_role, run_playbook, server_vars, sh, state_of,
                                                     tmp_path, record_verdict):
    run, results, seconds = apply_role(host, sglang_api_key=API_KEY)
    assert run.rc == 0, run
    assert wait_result(results, host)["verdict"] == "pass"
    # The server runs WITH the key: refused without it, answered with it.
    assert generate(host["address"]) is None
    assert (generate(host["address"], api_key=API_KEY) or {}).get("text"), "the key does not open /generate"
    # The process list shows the config file, never the key (every process of the unit).
    processes = sh(host, "ps -eo pid,args")
    assert KEY_MARK not in processes, processes
    assert f"--config {CONFIG_FILE}" in processes
    main_pid = state_of(host)["MainPID"]
    assert KEY_MARK not in sh(host, f"tr '\\0' '\\n' < /proc/{main_pid}/environ")
    assert KEY_MARK not in unit_file(sh, host) and "EnvironmentFile" not in unit_file(sh, host)
    # Only the root-only config file holds it (and SGLang read it from there).
    assert sh(host, f"stat -c '%a %U %G' {CONFIG_FILE}").split() == ["640", "root", "root"]
    assert KEY_MARK in sh(host, f"cat {CONFIG_FILE}")
    server_args = [line for line in invocation_journal(sh, host, state_of(host)["InvocationID"]).splitlines()
                   if "server_args=" in line]
    assert server_args and KEY_MARK in server_args[0]  # SGLang read it (its own log prints it, root-only)
    # No module result carries it: every result of the deploy, a no-change run, a drift check (and
    # its report files), sglang_info; nor the receipt.
    again, again_results, seconds = apply_role(host, sglang_api_key=API_KEY)
    assert again.rc == 0, again
    assert again_results.recap[host["name"]]["changed"] == 0, again_results.recap
    verify_dir = tmp_path / "verify"
    verify = run_playbook("playbooks/verify.yml", env=RUN_ENV, extra_vars=server_vars(
        sglang_environment=dict(BASE_ENV), sglang_api_key=API_KEY, verify_hosts=host["name"],
        verify_results_dir=str(verify_dir)))
    assert verify.rc == 0, verify
    assert verify_records(verify_dir)[host["name"]]["verdict"] == "in_sync"
    info = run_playbook(f"""---
- hosts: {host['name']}
  gather_facts: false
  tasks:
    - name: sglang_info
      gpufleet.inference.sglang_info:
        unit: sglang.service
        url: "http://{{{{ sglang_host }}}}:30000"
        api_key: "{{{{ gpf_key }}}}"
""", extra_vars={"gpf_key": API_KEY}, env=RUN_ENV)
    assert info.rc == 0, info
    facts = Results(info.out).one("sglang_info", host["name"])["result"]
    assert facts["server_info"] and facts["invocation_id"] == state_of(host)["InvocationID"], facts
    # A wait given another key is refused by the server, and says so (without either key).
    wrong = run_playbook(ready_playbook(host["name"], expect=EXPECT_2048, timeout=20, api_key="not-the-key"),
                         env=RUN_ENV)
    assert wrong.rc != 0, wrong
    refused = Results(wrong.out).one("sglang_ready", host["name"])["result"]
    assert refused["verdict"] == "unauthorized", refused
    assert "answers /generate with HTTP 401: the api_key does not match" in refused["msg"], refused["msg"]
    record_verdict(refused)
    for output in (run.out, again.out, verify.out, info.out, wrong.out):
        assert KEY_MARK not in output
    for path in verify_dir.rglob("*.json"):
        assert KEY_MARK not in path.read_text(), path
    assert KEY_MARK not in sh(host, f"cat {RECEIPT}")


# --- 11. drift ---------------------------------------------------------------------------------

def test_drift_is_caught_without_restart_and_the_role_puts_it_back(host, apply_role, run_playbook,
                                                                   sh, state_of):
    run, results, seconds = apply_role(host)
    assert run.rc == 0, run
    deployed = unit_checksum(sh, host)
    # By hand: another window in the unit, and a restart.
    sh(host, f"sed -i 's/^    \"2048\"$/    \"4096\"/' {UNIT_PATH} && grep -q '\"4096\"' {UNIT_PATH} "
             "&& systemctl daemon-reload && systemctl restart sglang.service")
    wait_for(lambda: generate(host["address"]), 30, what="the hand-restarted server")
    hand = state_of(host)

    # Verify only (no after_invocation): the running process disagrees with the intent. Its
    # journal is looked back at (not followed from now), and what is found there is compared.
    run = run_playbook(ready_playbook(host["name"], expect=EXPECT_2048, timeout=30), env=RUN_ENV)
    assert run.rc != 0, run
    result = Results(run.out).one("sglang_ready", host["name"])["result"]
    assert result["verdict"] == "mismatch", result
    assert result["invocation_id"] == hand["InvocationID"]
    assert "draft_window_size: expected 2048" in result["msg"] and "observed 4096" in result["msg"], result["msg"]
    assert f"{WINDOW_FLAG} 4096 in sglang.service" in result["msg"], result["msg"]
    assert state_of(host)["InvocationID"] == hand["InvocationID"]  # caught, nothing restarted
    receipt = host_json(sh, host, RECEIPT) or {}
    assert receipt.get("invocation_id") != hand["InvocationID"]  # a mismatch leaves no receipt

    # The role (same vars as the deploy) puts the unit back and verifies a new process.
    run, results, seconds = apply_role(host)
    assert run.rc == 0, run
    rep = report(results, host)
    assert rep["previous_invocation"] == hand["InvocationID"]
    assert rep["invocation_id"] not in (hand["InvocationID"], None)
    assert rep["observed"]["draft_window_size"] == 2048
    assert unit_checksum(sh, host) == deployed


# --- the role twice in one play; verification off and the last-known-good unit -----------------

TWICE = """---
- name: The role twice in one play, a second operator restarting the unit in between
  hosts: {host}
  gather_facts: false
  tasks:
    - name: First apply
      ansible.builtin.include_role:
        name: gpufleet.inference.sglang
    - name: A second operator restarts the unit (same settings; the new invocation has no receipt)
      ansible.builtin.command: systemctl restart sglang.service
      changed_when: true
    - name: Second apply
      ansible.builtin.include_role:
        name: gpufleet.inference.sglang
"""


def test_a_second_apply_in_the_same_play_verifies_the_process_that_runs_now(host, apply_role, run_playbook,
                                                                            server_vars, sh, state_of):
    """The first apply's wait (a registered result) outlives its include: the second apply, which
    restarts nothing, must verify the invocation that runs now, not report the first one's wait."""
    run = run_playbook(TWICE.format(host=host["name"]), env=RUN_ENV, extra_vars=server_vars(
        sglang_environment=dict(BASE_ENV), sglang_ready_timeout=TIMEOUT))
    assert run.rc == 0, run
    results = Results(run.out)
    now = state_of(host)["InvocationID"]
    first, second = [item["result"]["ansible_facts"]["sglang_verified"]
                     for item in results.of(VERIFIED_TASK, host["name"])]
    assert first["verdict"] == "pass" and first["invocation_id"] not in (None, now), (first, now)
    assert second["verdict"] == "pass" and second["invocation_id"] == now, (second, now)
    assert second["source"] == "journal" and second["observed"]["draft_window_size"] == 2048, second
    # the first apply's verification is its handler's wait; the second's is its own look at the running process
    assert first["invocation_id"] == results.one(WAIT_TASK, host["name"])["result"]["invocation_id"]


SAVE = """---
- name: Apply, then keep the unit as last-known-good
  hosts: {host}
  gather_facts: false
  roles:
    - role: gpufleet.inference.sglang
  tasks:
    - name: Keep it
      ansible.builtin.include_role:
        name: gpufleet.inference.sglang
        tasks_from: save_last_good
"""


def test_save_last_good_keeps_a_verified_unit_and_refuses_an_unverified_one(
        host, run_playbook, server_vars, sh, state_of):
    playbook = SAVE.format(host=host["name"])
    run = run_playbook(playbook, env=RUN_ENV, extra_vars=server_vars(
        sglang_environment=dict(BASE_ENV), sglang_ready_timeout=TIMEOUT))
    assert run.rc == 0, run
    good = host_json(sh, host, LAST_GOOD_RECORD)
    verified = state_of(host)["InvocationID"]
    assert good and good["invocation_id"] == verified and good["observed"]["draft_window_size"] == 2048, good

    # Another window with verification off: the unit is restarted, nothing sees the new process.
    run = run_playbook(playbook, env=RUN_ENV, extra_vars=server_vars(
        sglang_environment=dict(BASE_ENV), sglang_ready_timeout=TIMEOUT, sglang_verify=False,
        sglang_speculative_draft_window_size=4096))
    assert run.rc != 0, run
    results = Results(run.out)
    fact = verified_fact(results, host)
    assert fact["verdict"] == "not_verified" and fact["verified"] is False, fact
    assert fact["invocation_id"] is None and fact["restarted"] is True, fact  # never the replaced one's
    assert fact["previous_invocation"] == verified, fact
    refused = results.one("Keep the verified unit as last-known-good", host["name"])
    assert refused["status"] == "fatal" and "not kept as last-known-good" in refused["result"]["msg"], refused
    assert state_of(host)["InvocationID"] != verified  # it was restarted ...
    assert host_json(sh, host, LAST_GOOD_RECORD) == good  # ... and the last-known-good unit is the verified one


REVERT = """---
- name: Apply, then revert to the last-known-good unit
  hosts: {host}
  gather_facts: false
  roles:
    - role: gpufleet.inference.sglang
  tasks:
    - name: Revert
      ansible.builtin.include_role:
        name: gpufleet.inference.sglang
        tasks_from: revert
"""


def test_revert_brings_back_the_last_known_good_unit_and_verifies_its_new_process(
        host, run_playbook, server_vars, sh, state_of):
    """The entry point revert: the saved unit back, a restart, and the NEW process verified against
    what was recorded with it (not against the settings applied since)."""
    run = run_playbook(SAVE.format(host=host["name"]), env=RUN_ENV, extra_vars=server_vars(
        sglang_environment=dict(BASE_ENV), sglang_ready_timeout=TIMEOUT))
    assert run.rc == 0, run
    good_unit = unit_file(sh, host)

    # 4096 applied and verified but not kept (the role keeps every verified change unless told not to)
    run = run_playbook(REVERT.format(host=host["name"]), env=RUN_ENV, extra_vars=server_vars(
        sglang_environment=dict(BASE_ENV), sglang_ready_timeout=TIMEOUT, sglang_speculative_draft_window_size=4096,
        sglang_keep_last_good=False))
    assert run.rc == 0, run
    results = Results(run.out)
    applied = verified_fact(results, host)
    assert applied["verdict"] == "pass" and applied["observed"]["draft_window_size"] == 4096, applied
    revert = results.one("Revert to the last-known-good unit and verify it", host["name"])
    outcome = revert["result"]["ansible_facts"]["sglang_revert"]
    now = state_of(host)["InvocationID"]
    assert outcome["healthy"] is True and outcome["verdict"] == "pass" and outcome["restored"] is True, outcome
    assert outcome["invocation_id"] == now != applied["invocation_id"], (outcome, now, applied)
    assert outcome["observed"]["draft_window_size"] == 2048, outcome
    assert unit_file(sh, host) == good_unit


def test_revert_without_a_last_known_good_unit_changes_nothing_and_says_so(
        host, run_playbook, server_vars, sh, state_of):
    run = run_playbook(REVERT.format(host=host["name"]), env=RUN_ENV, extra_vars=server_vars(
        sglang_environment=dict(BASE_ENV), sglang_ready_timeout=TIMEOUT, sglang_keep_last_good=False))
    assert run.rc == 0, run  # revert does not fail: the caller judges sglang_revert
    results = Results(run.out)
    applied = verified_fact(results, host)
    unit = unit_file(sh, host)
    outcome = results.one("Revert to the last-known-good unit and verify it",
                          host["name"])["result"]["ansible_facts"]["sglang_revert"]
    assert outcome["verdict"] == "not_restored" and outcome["healthy"] is False, outcome
    assert outcome["restored"] is False and outcome["invocation_id"] is None, outcome
    assert state_of(host)["InvocationID"] == applied["invocation_id"]  # not restarted
    assert unit_file(sh, host) == unit


ADOPT = """---
- name: Compare, then adopt the running unit as last-known-good
  hosts: {host}
  gather_facts: false
  tasks:
    - name: Compare
      ansible.builtin.include_role:
        name: gpufleet.inference.sglang
        tasks_from: drift
    - name: Adopt
      ansible.builtin.include_role:
        name: gpufleet.inference.sglang
        tasks_from: adopt_last_good
"""
ADOPT_TASK = "Keep what runs now as last-known-good (first change on this host)"


def window_in(unit_text: str) -> str | None:
    """The draft window an ExecStart= of a unit file passes (its words, quoted or not)."""
    command = " ".join(line.rstrip("\\") for line in execstart_lines(unit_text)).split("=", 1)[1]
    words = shlex.split(command)
    return words[words.index(WINDOW_FLAG) + 1] if WINDOW_FLAG in words else None


def test_adopt_last_good_keeps_what_runs_not_a_unit_file_that_never_ran(host, apply_role, run_playbook,
                                                                        server_vars, sh, state_of):
    """A lost restart handler: the installed unit says 4096, the process still runs 2048. Adopting it
    must keep the unit that RUNS (rebuilt from the process), with that invocation, and restart nothing;
    a second adopt, with a copy in place, keeps the copy as it is."""
    run, results, dummy = apply_role(host)
    assert run.rc == 0, run
    running = state_of(host)["InvocationID"]
    sh(host, "rm -rf " + LAST_GOOD_RECORD.rsplit("/", 1)[0])
    # The unit writes each argument quoted on its own line: the value is on the line after the flag.
    sh(host, """sed -i '/"%s"/{n;s/"2048"/"4096"/}' %s && systemctl daemon-reload""" % (WINDOW_FLAG, UNIT_PATH))
    installed = unit_file(sh, host)
    assert window_in(installed) == "4096", installed  # the edit took (else the test proves nothing)

    playbook = ADOPT.format(host=host["name"])
    run = run_playbook(playbook, env=RUN_ENV, extra_vars=server_vars(
        sglang_environment=dict(BASE_ENV), sglang_ready_timeout=TIMEOUT, sglang_speculative_draft_window_size=4096))
    assert run.rc == 0, run
    results = Results(run.out)
    adopt = results.one(ADOPT_TASK, host["name"])
    assert adopt["status"] == "changed", adopt
    assert state_of(host)["InvocationID"] == running  # nothing restarted
    record = host_json(sh, host, LAST_GOOD_RECORD)
    assert record["adopted"] is True and record["invocation_id"] == running, record
    assert record["observed"]["draft_window_size"] == 2048, record
    assert record["intent"]["expect"]["draft_window_size"] == 2048, record
    assert record["rebuilt_from_process"]["path"] == UNIT_PATH, record
    copy = next(item["copy"] for item in record["files"] if item["path"] == UNIT_PATH)  # where the module kept it
    kept = sh(host, "cat %s/%s" % (LAST_GOOD_RECORD.rsplit("/", 1)[0], copy))
    assert window_in(kept) == "2048", kept
    assert unit_file(sh, host) == installed  # the installed unit is left as it was

    run = run_playbook(playbook, env=RUN_ENV, extra_vars=server_vars(
        sglang_environment=dict(BASE_ENV), sglang_ready_timeout=TIMEOUT, sglang_speculative_draft_window_size=4096))
    assert run.rc == 0, run
    again = Results(run.out).one(ADOPT_TASK, host["name"])
    assert again["status"] == "ok" and "a last-known-good copy exists already" in again["result"]["msg"], again
    assert host_json(sh, host, LAST_GOOD_RECORD) == record
    assert state_of(host)["InvocationID"] == running


# --- 9, 10, 13: on a deployed host, each of them changes nothing (and proves it) --------------

@pytest.fixture(scope="class")
def deployed(lab_hosts, run_playbook, server_vars, sh, state_of):
    """The first lab host with the role applied once (window 2048), for tests that change nothing."""
    host = lab_hosts[0]
    sh(host, CLEAN_HOST, check=False)
    run = run_playbook(role_playbook(host["name"]),
                       extra_vars=server_vars(sglang_environment=dict(BASE_ENV), sglang_ready_timeout=TIMEOUT),
                       env=RUN_ENV)
    assert run.rc == 0, run
    yield {"host": host, "report": report(Results(run.out), host), "state": state_of(host),
           "checksum": unit_checksum(sh, host)}
    sh(host, CLEAN_HOST, check=False)


class TestOnADeployedHost:

    def assert_unchanged(self, deployed, sh, state_of):
        host = deployed["host"]
        assert unit_checksum(sh, host) == deployed["checksum"]
        after = state_of(host)
        assert (after["InvocationID"], after["MainPID"]) == (
            deployed["state"]["InvocationID"], deployed["state"]["MainPID"]), (deployed["state"], after)

    def test_second_run_restarts_nothing_and_verifies(self, deployed, apply_role, sh, state_of):
        host = deployed["host"]
        run, results, seconds = apply_role(host)
        assert run.rc == 0, run
        assert results.recap[host["name"]]["changed"] == 0, results.recap
        assert results.recap[host["name"]]["failed"] == 0
        assert results.of(WAIT_TASK) == []  # no handler: nothing restarted
        # The drift check found the receipt of the running invocation (and no later config line): no second wait.
        assert "verified before, receipt kept" in results.one(VERIFY_TASK, host["name"])["result"]["msg"]
        verified = verified_fact(results, host)
        assert verified["verdict"] == "pass" and verified["verified"] is True, verified
        assert verified["source"] == "receipt"
        assert verified["invocation_id"] == deployed["state"]["InvocationID"]
        assert verified["observed"]["draft_window_size"] == 2048
        self.assert_unchanged(deployed, sh, state_of)

    def test_second_run_without_a_receipt_verifies_the_running_process(self, deployed, apply_role, sh, state_of):
        host = deployed["host"]
        sh(host, f"mv {RECEIPT} {RECEIPT}.away")
        try:
            run, results, seconds = apply_role(host)
        finally:
            sh(host, f"mv -f {RECEIPT}.away {RECEIPT}", check=False)
        assert run.rc == 0, run
        assert results.of(WAIT_TASK) == []  # nothing restarted ...
        verified = results.one(VERIFY_TASK, host["name"])  # ... but the running process was verified
        assert verified["status"] in ("ok", "changed"), verified
        result = verified["result"]
        assert result["verdict"] == "pass" and result["source"] == "journal", result["msg"]
        assert result["invocation_id"] == deployed["state"]["InvocationID"]
        assert result["observed"]["draft_window_size"] == 2048
        assert verified_fact(results, host)["invocation_id"] == deployed["state"]["InvocationID"]
        self.assert_unchanged(deployed, sh, state_of)

    def test_check_mode_shows_the_diff_and_changes_nothing(self, deployed, apply_role, sh, state_of):
        run, results, seconds = apply_role(deployed["host"], check=True, diff=True,
                                           sglang_speculative_draft_window_size=4096)
        assert run.rc == 0, run
        assert '-    "2048"' in run.out and '+    "4096"' in run.out, run
        assert f'"{WINDOW_FLAG}" \\' in run.out
        waited = results.of(WAIT_TASK, deployed["host"]["name"])
        assert all(item["result"].get("verdict") in (None, "check_mode") for item in waited), waited
        self.assert_unchanged(deployed, sh, state_of)

    def test_sglang_info_reports_facts_of_the_current_invocation(self, deployed, fleet, sh, state_of):
        host = deployed["host"]

        def info(unit="sglang.service"):
            module = getattr(fleet[host["name"]], "gpufleet.inference.sglang_info")
            result = module(unit=unit, url=f"http://{host['address']}:30000")
            return dict(result.contacted[host["name"]])

        missing = info("gpf-never-installed.service")
        assert missing["exists"] is False and missing["changed"] is False, missing
        assert missing["invocation_id"] is None and missing["server_info"] is None
        assert missing["config"] is None and missing["exec_start"] == []

        facts = info()
        state = deployed["state"]
        assert facts["exists"] is True and facts["changed"] is False
        assert facts["invocation_id"] == state["InvocationID"] == deployed["report"]["invocation_id"]
        assert facts["main_pid"] == int(state["MainPID"]) > 0
        assert facts["active_state"] == "active"
        assert facts["config"] == {"attention_backend": facts["config"]["attention_backend"],
                                   "model": "DFlashDraftModel", "block_size": 16,
                                   "draft_window_size": 2048, "compact_cache": True}, facts["config"]
        assert "Initialized DFLASH draft runner" in facts["config_line"]
        assert WINDOW_FLAG in facts["exec_start"] and host["address"] in facts["exec_start"]
        server_info = facts["server_info"]
        assert server_info["speculative_algorithm"] == "DFLASH"
        assert server_info["speculative_dflash_draft_window_size"] == 2048
        assert server_info["tp_size"] == 8 and server_info["version"] == "0.5.11"
        self.assert_unchanged(deployed, sh, state_of)
