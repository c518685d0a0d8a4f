# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The wait end to end on a scripted host (fakes.FakeHost) with a fake clock: every verdict as the loop reaches
it, slices and resumes. The judge alone, branch by branch, is a table in test_judge.py."""
import json

from ansible_collections.gpufleet.inference.plugins.module_utils import _evidence as ev
from ansible_collections.gpufleet.inference.plugins.module_utils import _judge as jd
from ansible_collections.gpufleet.inference.plugins.module_utils import _wait as wait
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import JournalError
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import EffectiveUnit, SystemdError

from fakes import (COMMAND, CONFIG_2048, CONFIG_512, CONFIG_NONE, EXPECT_2048, GOOD, NEW, NEWER, OLD, STARTING,
                   STARTUP, FakeHost, entry, timed, unit_state)

STARTED = [(0.0, unit_state(OLD)), (1.0, unit_state(NEW, "activating", "start")), (2.0, unit_state(NEW))]
PORT_AT = 4.0


def healthy_host(lines=None, port_at=PORT_AT, **kwargs):
    """Old invocation until 1 s, the new one logs its startup from 2 s, its port opens at `port_at`."""
    lines = STARTUP if lines is None else lines
    kwargs.setdefault("states", STARTED)
    tail_at = port_at if port_at is not None else 4.0
    kwargs.setdefault("journal", {NEW: timed(2.0, lines[:-2], 0.2) + timed(tail_at, lines[-2:], 0.1)})
    kwargs.setdefault("port", [(port_at, True)] if port_at is not None else [])
    kwargs.setdefault("generate", [(port_at, GOOD)])
    kwargs.setdefault("cmdline", COMMAND)
    return FakeHost(**kwargs)


def waiter(host, after=OLD, expect=None, config_line=None, command=COMMAND, environment=None, resume=None,
           **policy):
    policy.setdefault("timeout", 120)
    policy.setdefault("min_ready_seconds", 0)
    intent = ev.Intent(EXPECT_2048 if expect is None else expect, config_line, command, environment)
    return wait.Waiter(host, "sglang.service", intent, jd.Policy(**policy), after_invocation=after, resume=resume)


def run(host, **kwargs):
    w = waiter(host, **kwargs)
    outcome = w.run()
    return outcome, w.result(), w


# --------------------------------------------------------------------------- passing

def test_pass_after_restart_with_phases_evidence_and_receipt():
    host = healthy_host()
    outcome, result, w = run(host)
    assert outcome.ok and outcome.verdict == jd.PASS, outcome.message
    assert result["invocation_id"] == NEW and result["source"] == "journal" and result["verified"]
    assert result["observed"]["draft_window_size"] == 2048
    assert result["expected"] == {"draft_window_size": 2048, "compact_cache": True, "block_size": 16}
    phases = result["phases"]
    assert set(phases) == {"new_invocation", "config_line", "port_open", "generate"}
    assert phases["new_invocation"]["elapsed"] <= phases["config_line"]["elapsed"] <= phases["port_open"]["elapsed"] \
        <= phases["generate"]["elapsed"]
    # compared keys are named; never "agrees" about nothing
    assert "compared block_size=16, compact_cache=True, draft_window_size=2048 (config line in its journal)" \
        in outcome.message
    assert "its command line" in outcome.message
    assert result["launched"]["command_checked"] and result["launched"]["command"] == COMMAND
    # the old invocation was never probed; the new one as soon as its port opened
    assert phases["generate"]["elapsed"] - PORT_AT < 0.3
    receipt = host.written[-1]
    assert receipt["invocation_id"] == NEW and receipt["unit"] == "sglang.service"
    assert receipt["config_lines"][0]["values"]["draft_window_size"] == 2048
    assert receipt["config_lines"][0]["cursor"] and receipt["expect"]["draft_window_size"] == 2048
    assert result["receipt"] == host.receipt_path
    # the api key of the server_args line never reaches the tail
    assert all("sekret" not in line for line in w.state.journal.tail)


def test_detects_readiness_within_a_tick_not_a_poll_interval():
    host = healthy_host(port_at=5.55)
    outcome, result, w = run(host, tick=0.25)
    assert outcome.ok, outcome.message
    assert result["phases"]["generate"]["elapsed"] - 5.55 <= 0.3


def test_old_invocation_answering_never_passes():
    host = FakeHost(states=[(0.0, unit_state(OLD))], generate=[(0.0, GOOD)])
    outcome, result, w = run(host, timeout=30)
    assert outcome.verdict == jd.TIMEOUT and not outcome.ok
    assert "generate" not in host.calls and not host.followers
    assert "waiting for a new invocation of sglang.service (still %s" % OLD in outcome.message


def test_journal_lagging_behind_the_port_waits_for_the_line():
    # /generate answers before journald has delivered the config line: not a missing line.
    lines = STARTUP
    journal = {NEW: timed(2.0, lines[:6], 0.1) + [(4.6, entry(CONFIG_2048))] + timed(4.7, lines[7:], 0.1)}
    host = healthy_host(journal=journal)
    outcome, result, w = run(host)
    assert outcome.verdict == jd.PASS, outcome.message
    assert result["source"] == "journal"


def test_off_is_an_expectation_and_passes_when_no_line_is_logged():
    lines = [line for line in STARTUP if "draft runner" not in line]
    host = healthy_host(lines=lines)
    outcome, result, w = run(host, expect={}, config_line="absent")
    assert outcome.verdict == jd.PASS, outcome.message
    assert "no draft-runner line, as intended (speculative decoding off)" in outcome.message


def test_nothing_compared_says_so():
    host = healthy_host(lines=[line for line in STARTUP if "draft runner" not in line])
    outcome, result, w = run(host, expect={}, config_line="optional", command=None)
    assert outcome.verdict == jd.PASS
    assert "nothing was compared (no expectation given): readiness only" in outcome.message
    assert "agrees" not in outcome.message


def test_two_agreeing_config_lines_pass():
    lines = STARTUP[:7] + [CONFIG_2048] + STARTUP[7:]
    outcome, result, w = run(healthy_host(lines=lines))
    assert outcome.verdict == jd.PASS and len(result["config_lines"]) == 2
    assert "2 config lines" in outcome.message


# --------------------------------------------------------------------------- mismatches

def test_mismatch_fails_at_once_naming_the_flag():
    host = healthy_host(lines=STARTUP[:6] + [CONFIG_NONE] + STARTUP[7:], port_at=60)
    outcome, result, w = run(host)
    assert outcome.verdict == jd.MISMATCH
    assert ("draft_window_size: expected 2048 (--speculative-dflash-draft-window-size 2048 in sglang.service), "
            "observed None in the config line of invocation %s" % NEW) in outcome.message
    assert "compact_cache: expected True" in outcome.message and "observed False" in outcome.message
    assert host.now < 10 and "generate" not in host.calls  # no waiting for the port


def test_mismatch_names_a_missing_flag():
    host = healthy_host(lines=STARTUP[:6] + [CONFIG_NONE], port_at=60)
    outcome, result, w = run(host, command=["/usr/bin/python", "-m", "sglang.launch_server"])
    assert "no --speculative-draft-window-size / --speculative-dflash-draft-window-size in sglang.service's " \
           "ExecStart" in outcome.message


def test_a_second_config_line_with_other_values_is_a_mismatch():
    lines = STARTUP[:7] + [CONFIG_512] + STARTUP[7:]
    outcome, result, w = run(healthy_host(lines=lines))
    assert outcome.verdict == jd.MISMATCH
    assert "observed 512 in the second config line of invocation %s" % NEW in outcome.message


def test_a_reinitialised_worker_during_settle_is_a_mismatch():
    journal = {NEW: timed(2.0, STARTUP, 0.2) + [(8.0, entry(CONFIG_512))]}
    outcome, result, w = run(healthy_host(journal=journal), min_ready_seconds=10)
    assert outcome.verdict == jd.MISMATCH and "second config line" in outcome.message
    assert not w.host.written


def test_off_intended_but_a_draft_runner_logged():
    outcome, result, w = run(healthy_host(), expect={}, config_line="absent")
    assert outcome.verdict == jd.MISMATCH
    assert "expected no draft-runner line (speculative decoding off), but it logged" in outcome.message
    assert "draft_window_size=2048" in outcome.message


def test_command_line_of_a_drop_in_is_a_mismatch_naming_the_drop_in():
    dropped = COMMAND[:-2] + ["--speculative-dflash-draft-window-size", "512"]
    effective = EffectiveUnit({"DropInPaths": "/etc/systemd/system/sglang.service.d/override.conf",
                               "Environment": "A=1 B=2"})
    lines = [line.replace("2048", "2048") for line in STARTUP]
    host = healthy_host(lines=lines, cmdline=dropped, effective=effective, environ={"A": "1", "B": "2"})
    outcome, result, w = run(host, environment={"A": "1"})
    assert outcome.verdict == jd.MISMATCH
    assert "--speculative-dflash-draft-window-size: expected 2048, observed 512 on the command line of its main " \
           "process 4242" in outcome.message
    assert "B: expected nothing, observed 2 in the effective Environment= of sglang.service" in outcome.message \
        or "B: expected None, observed 2" in outcome.message
    assert "drop-ins of sglang.service: /etc/systemd/system/sglang.service.d/override.conf" in outcome.message


def test_command_line_read_while_the_process_is_still_in_exec():
    calls = []

    def cmdline(now):
        calls.append(now)
        return None if len(calls) < 3 else COMMAND  # empty while inside exec
    outcome, result, w = run(healthy_host(cmdline=cmdline))
    assert outcome.verdict == jd.PASS and len(calls) >= 3


# --------------------------------------------------------------------------- no evidence

def test_config_line_lost_to_journald_rate_limit_is_unverified_never_pass():
    lines = [line for line in STARTUP if "draft runner" not in line]
    notices = [{"count": 4321, "message": "Suppressed 4321 messages from sglang.service", "invocation_id": NEW}]
    host = healthy_host(lines=lines, notices=notices, server_info={"speculative_dflash_draft_window_size": 2048})
    outcome, result, w = run(host)
    assert outcome.verdict == jd.UNVERIFIED and not outcome.ok
    assert "journald's rate limit dropped 4321 messages" in outcome.message
    assert "/server_info only echoes the parsed arguments and does not count" in outcome.message
    assert result["observed"] is None and result["source"] is None and not result["verified"]
    assert result["suppression"]["messages_dropped"] == 4321
    assert not host.written


def test_accept_unverified_passes_with_a_warning_and_verified_false():
    lines = [line for line in STARTUP if "draft runner" not in line]
    notices = [{"count": 10, "message": "Suppressed 10 messages from sglang.service", "invocation_id": NEW}]
    outcome, result, w = run(healthy_host(lines=lines, notices=notices), accept_unverified=True)
    assert outcome.ok and outcome.verdict == jd.PASS and "UNVERIFIED" in outcome.message
    assert result["verified"] is False and not w.host.written


def test_complete_journal_without_the_line_is_a_missing_config_line():
    lines = [line for line in STARTUP if "draft runner" not in line]
    outcome, result, w = run(healthy_host(lines=lines))
    assert outcome.verdict == jd.MISSING_CONFIG_LINE
    assert "its journal is complete around where the line belongs" in outcome.message


def test_nothing_after_the_line_within_journal_grace_is_unverified():
    lines = list(STARTUP[:6])  # no line after where the config line belongs, ever
    host = healthy_host(journal={NEW: timed(2.0, lines, 0.2)})
    outcome, result, w = run(host, journal_grace=5)
    assert outcome.verdict == jd.UNVERIFIED
    assert "cannot be told whether journald dropped the line" in outcome.message
    assert 5 <= host.now - result["phases"]["generate"]["elapsed"] < 6.5


def test_verify_only_after_retention_uses_the_receipt_of_the_same_invocation():
    # A long-running invocation whose startup was vacuumed away: only later lines remain.
    journal = {NEW: [(0.0, entry('INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK'))]}
    values = {"block_size": 16, "draft_window_size": 2048, "compact_cache": True}
    receipt = {"version": 1, "unit": "sglang.service", "invocation_id": NEW, "verified_at": 0,
               "config_lines": [{"line": CONFIG_2048, "values": values}]}
    host = FakeHost(states=[(0.0, unit_state(NEW))], journal=journal, cmdline=COMMAND, receipt=receipt)
    host.now = 100.0
    outcome, result, w = run(host, after=None, min_ready_seconds=10)
    assert outcome.verdict == jd.PASS, outcome.message
    assert result["source"] == "receipt" and "from the receipt of its verification" in outcome.message
    assert host.now - 100 < 2  # credited settle: verified long ago
    assert not host.written  # no new receipt for an invocation that has one


def test_verify_only_after_retention_without_receipt_names_retention():
    journal = {NEW: [(0.0, entry('INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK'))]}
    other = {"version": 1, "unit": "sglang.service", "invocation_id": OLD, "config_lines": [
        {"line": CONFIG_2048, "values": {"draft_window_size": 2048}}]}
    host = FakeHost(states=[(0.0, unit_state(NEW))], journal=journal, cmdline=COMMAND, receipt=other)
    outcome, result, w = run(host, after=None)
    assert outcome.verdict == jd.UNVERIFIED
    assert "no longer holds the start of invocation %s" % NEW in outcome.message
    assert "journal retention" in outcome.message and host.receipt_path.rsplit("/", 1)[0] in outcome.message


def stopped_host(stop_job):
    """A server that ran, then ended SIGKILLed (SGLang 0.5.11 after draining a SIGTERM), with PID 1's notes."""
    notes = [entry("Stopping sglang.service - SGLang...", systemd=True, JOB_TYPE=stop_job)] if stop_job else []
    notes += [entry("sglang.service: Main process exited, code=killed, status=9/KILL", systemd=True,
                    EXIT_CODE="killed", EXIT_STATUS="9"),
              entry("sglang.service: Failed with result 'signal'.", systemd=True)]
    journal = {NEW: timed(0.0, STARTUP, 0.01) + [(0.5, item) for item in notes]}
    killed = unit_state(NEW, "failed", "failed", pid=0, result="signal", code="2", status="9")
    return FakeHost(states=[(0.0, killed)], journal=journal, cmdline=COMMAND)


def test_verify_only_of_a_unit_someone_stopped_is_not_active_whatever_its_exit():
    host = stopped_host("stop")
    host.now = 10.0
    outcome, result, w = run(host, after=None)
    assert outcome.verdict == jd.NOT_ACTIVE, outcome.message
    assert "stopped by a stop job of systemd" in outcome.message and "code=killed, status=9/KILL" in outcome.message
    assert "systemd_notes:%s" % NEW in host.calls


def test_verify_only_of_a_unit_that_ended_without_a_stop_job_died_with_its_last_lines():
    host = stopped_host(None)
    host.now = 10.0
    outcome, result, w = run(host, after=None)
    assert outcome.verdict == jd.DIED, outcome.message
    assert "is not running (failed/failed, code=killed, status=9/KILL, Result signal)" in outcome.message
    assert "Last " in outcome.message and "stop job" not in outcome.message


def test_receipt_with_other_values_is_a_mismatch():
    receipt = {"version": 1, "unit": "sglang.service", "invocation_id": NEW, "config_lines": [
        {"line": CONFIG_512, "values": {"block_size": 16, "draft_window_size": 512, "compact_cache": True}}]}
    host = FakeHost(states=[(0.0, unit_state(NEW))], cmdline=COMMAND, receipt=receipt)
    outcome, result, w = run(host, after=None)
    assert outcome.verdict == jd.MISMATCH and "kept by its receipt" in outcome.message


def test_verify_only_of_a_process_still_loading_follows_on_from_its_journal():
    host = healthy_host(states=[(0.0, unit_state(NEW))], port_at=8.0,
                        journal={NEW: timed(0.0, STARTUP[:3], 0.1) + timed(5.0, STARTUP[3:7], 0.2)
                                 + timed(8.0, STARTUP[7:], 0.1)})
    host.now = 1.0
    outcome, result, w = run(host, after=None)
    assert outcome.verdict == jd.PASS, outcome.message
    assert result["source"] == "journal"
    # where its journal ended is read BEFORE the search: lines logged during the search are read after it
    assert host.calls[1:3] == ["last_cursor:%s" % NEW, "grep:%s" % NEW], host.calls


def test_first_install_reads_the_start_logged_between_two_slices():
    """No previous invocation (first install): the wait starts before SGLang logged anything (its
    import takes seconds) and its first line comes while no slice runs; the next slice reads it."""
    host = healthy_host(states=[(0.0, unit_state(NEW))], port_at=6.0,
                        journal={NEW: timed(3.0, STARTUP[:-2], 0.1) + timed(6.0, STARTUP[-2:], 0.1)})
    first = waiter(host, after=None)
    assert first.run(slice_seconds=1).verdict == jd.WAITING
    state = json.loads(json.dumps(first.to_state()))
    assert state["journal"]["cursor"] is None  # nothing was logged yet
    host.now = 4.0  # the gap between two slices: its start and more are logged meanwhile
    while True:
        nxt = waiter(host, after=None, resume=state)
        outcome = nxt.run(slice_seconds=1)
        if outcome.verdict != jd.WAITING:
            break
        state = json.loads(json.dumps(nxt.to_state()))
    assert outcome.verdict == jd.PASS, outcome.message
    assert nxt.result()["source"] == "journal" and nxt.result()["observed"]["draft_window_size"] == 2048


# --------------------------------------------------------------------------- deaths

def test_crash_after_the_config_line_names_the_phase_exit_status_and_cause():
    lines = STARTUP[:7] + ["Scheduler hit an exception: RuntimeError: CUDA error: an illegal memory access",
                           "Traceback (most recent call last):", '  File "x.py", line 1',
                           "Received sigquit from a child process. It usually means the child failed."]
    journal = {NEW: timed(2.0, lines, 0.2) + [(4.5, entry("sglang.service: Main process exited, code=killed, "
                                                          "status=9/KILL", systemd=True, EXIT_CODE="killed",
                                                          EXIT_STATUS="9")),
                                              (4.6, entry("sglang.service: Failed with result 'signal'.",
                                                          systemd=True))]}
    states = STARTED + [(4.5, unit_state(NEW, "failed", "failed", result="signal", code="2", status="9"))]
    host = healthy_host(journal=journal, states=states, port_at=None)
    outcome, result, w = run(host)
    assert outcome.verdict == jd.DIED
    assert "while draft runner initialised: block_size=16, draft_window_size=2048" in outcome.message
    assert "no config line yet" not in outcome.message
    assert "code=killed, status=9/KILL, Result signal" in outcome.message
    assert "Cause: Received sigquit from a child process" in outcome.message
    assert result["journal_tail"][-1].startswith("Received sigquit")
    assert host.now < 10


def test_crash_loop_is_named_and_fast():
    crashed = unit_state(NEW, "activating", "auto-restart", restarts=1, result="exit-code", code="1", status="1")
    states = STARTED + [(3.0, crashed)]
    host = healthy_host(states=states, port_at=None)
    outcome, result, w = run(host)
    assert outcome.verdict == jd.CRASH_LOOP and "crash loop" in outcome.message
    assert "code=exited, status=1/FAILURE" in outcome.message


def test_tolerated_restart_follows_the_next_invocation():
    states = STARTED + [(3.0, unit_state(NEWER, "activating", "start", restarts=1)),
                        (3.5, unit_state(NEWER, restarts=1))]
    journal = {NEW: timed(2.0, STARTUP[:2]), NEWER: timed(3.6, STARTUP, 0.1, NEWER)}
    host = healthy_host(states=states, journal=journal, port_at=4.5, generate=[(4.5, GOOD)])
    outcome, result, w = run(host, crash_loop_restarts=1)
    assert outcome.verdict == jd.PASS, outcome.message
    assert result["invocation_id"] == NEWER
    assert "tolerated restarts" in result["notes"][0]


def test_another_restart_by_someone_else_is_replaced():
    states = STARTED + [(3.0, unit_state(NEWER))]
    host = healthy_host(states=states, port_at=None)
    outcome, result, w = run(host)
    assert outcome.verdict == jd.REPLACED
    assert "someone or something else restarted sglang.service" in outcome.message


def test_crash_seconds_after_first_answer_fails_the_settle_window():
    states = STARTED + [(6.0, unit_state(NEW, "activating", "auto-restart", restarts=1))]
    host = healthy_host(states=states)
    outcome, result, w = run(host, min_ready_seconds=10)
    assert outcome.verdict == jd.CRASH_LOOP and not outcome.ok
    assert "settling after its first good /generate" in outcome.message
    assert not host.written  # never a receipt (or a last-known-good) for it


def test_stops_answering_during_settle_is_unstable():
    host = healthy_host(generate=[(PORT_AT, GOOD), (PORT_AT + 1, STARTING)])
    outcome, result, w = run(host, min_ready_seconds=5)
    assert outcome.verdict == jd.UNSTABLE and "no longer" in outcome.message


def test_settle_passes_after_min_ready_seconds():
    host = healthy_host()
    outcome, result, w = run(host, min_ready_seconds=5)
    assert outcome.verdict == jd.PASS and "stayed up for min_ready_seconds 5" in outcome.message
    assert host.now - result["phases"]["generate"]["elapsed"] >= 5


# --------------------------------------------------------------------------- other verdicts

def test_foreign_listener():
    outside = {"verdict": "outside", "message": "a process outside sglang.service answers on h:1: pid 9", "owners": []}
    outcome, result, w = run(healthy_host(listener=outside))
    assert outcome.verdict == jd.FOREIGN_LISTENER and "pid 9" in outcome.message


def test_unauthorized():
    from fakes import http_json
    outcome, result, w = run(healthy_host(generate=[(PORT_AT, http_json(401, {"error": "Unauthorized"}))]))
    assert outcome.verdict == jd.UNAUTHORIZED


def test_not_found_and_not_active():
    outcome, result, w = run(FakeHost(states=[(0.0, unit_state("", load="not-found"))]), after=None)
    assert outcome.verdict == jd.NOT_FOUND
    outcome, result, w = run(FakeHost(states=[(0.0, unit_state("", "inactive", "dead"))]), after=None)
    assert outcome.verdict == jd.NOT_ACTIVE


def test_timeout_names_the_last_phase_and_line():
    host = healthy_host(port_at=None)
    outcome, result, w = run(host, timeout=20)
    assert outcome.verdict == jd.TIMEOUT
    assert "last phase: " in outcome.message and "port not open yet" in outcome.message
    assert "fired up" in outcome.message  # the last line seen, quoted


def test_a_broken_follower_is_started_again_from_its_cursor():
    host = healthy_host()
    host.follow_errors = 2
    outcome, result, w = run(host)
    assert outcome.verdict == jd.PASS
    assert len(host.followers) >= 2 and host.followers[-1].cursor


# --------------------------------------------------------------------------- slices

def test_slices_carry_the_wait_over_and_end_early_on_a_new_phase():
    host = healthy_host(port_at=12.0)
    first = waiter(host)
    outcome = first.run(slice_seconds=10)
    assert outcome.verdict == jd.WAITING and outcome.ok
    assert host.now < 10  # returned at the first phase change, not at the slice's end
    state = json.loads(json.dumps(first.to_state()))  # what travels between slices is plain JSON
    states, events = [state], list(first.result()["events"])
    while True:
        nxt = waiter(host, resume=state)
        outcome = nxt.run(slice_seconds=10)
        events += nxt.result()["events"]
        if outcome.verdict != jd.WAITING:
            break
        state = json.loads(json.dumps(nxt.to_state()))
        states.append(state)
    assert outcome.verdict == jd.PASS, outcome.message
    assert any(s["tracker"]["invocation_id"] == NEW and s["journal"]["cursor"] for s in states)
    assert all(s["tracker"]["after"] == OLD for s in states)
    result = nxt.result()
    assert result["phases"]["new_invocation"]["elapsed"] < result["phases"]["generate"]["elapsed"]
    phases = [event["phase"] for event in events]
    assert phases.index("waiting") < phases.index("new_invocation") < phases.index("loading_weights") \
        < phases.index("kv_cache") < phases.index("port_open") < phases.index("generate")
    assert sum(1 for event in events if event["phase"] == "new_invocation") == 1
    assert len(states) <= 12  # slices end on phase changes, not on every line


def test_a_slice_run_again_from_the_same_state_gives_the_same_verdict():
    host = healthy_host(port_at=3.0)
    first = waiter(host)
    first.run(slice_seconds=2)
    state = json.loads(json.dumps(first.to_state()))
    outcome_a = waiter(host, resume=json.loads(json.dumps(state))).run()
    outcome_b = waiter(host, resume=state).run()  # the same slice again (its answer was lost)
    assert outcome_a.verdict == outcome_b.verdict == jd.PASS


def test_policy_coerces_jinja_strings():
    policy = jd.Policy(timeout="30", min_ready_seconds="10", tick="0.5", accept_unverified=False)
    assert (policy.timeout, policy.min_ready_seconds, policy.tick) == (30.0, 10.0, 0.5)


# --------------------------------------------------------------------------- found on the lab (issue 8)

def test_verify_only_compares_the_config_lines_it_looks_back_at():
    # A running invocation (no restart, no receipt) whose journal holds another window: never a pass,
    # and never a receipt of it.
    journal = {NEW: timed(0.0, STARTUP[:6] + [CONFIG_512] + STARTUP[7:], 0.1)}
    host = FakeHost(states=[(0.0, unit_state(NEW))], journal=journal, cmdline=COMMAND)
    host.now = 100.0
    outcome, result, w = run(host, after=None, command=None)
    assert outcome.verdict == jd.MISMATCH, outcome.message
    assert "draft_window_size: expected 2048" in outcome.message and "observed 512" in outcome.message
    assert not host.written


def test_a_config_line_mismatch_names_what_the_command_line_shows():
    # Off intended; a drop-in launched DFLASH: the message names the line, the command line and the drop-in.
    off_command = COMMAND[:5]
    effective = EffectiveUnit({"DropInPaths": "/etc/systemd/system/sglang.service.d/override.conf"})
    host = healthy_host(cmdline=COMMAND, effective=effective)
    outcome, result, w = run(host, expect={}, config_line="absent", command=off_command, environment={})
    assert outcome.verdict == jd.MISMATCH
    assert "expected no draft-runner line (speculative decoding off), but it logged" in outcome.message
    assert "--speculative-algorithm: expected nothing, observed DFLASH on the command line of its main process " \
           "4242" in outcome.message
    assert "drop-ins of sglang.service: /etc/systemd/system/sglang.service.d/override.conf" in outcome.message
    assert result["launched"]["command_checked"]


def test_journal_grace_makes_the_idle_server_log_so_journald_can_write_its_notice():
    # journald writes "Suppressed N messages" only when the unit logs again: the wait sends /generate
    # now and then while it waits for a line after the config line's place.
    lines = list(STARTUP[:6])
    host = healthy_host(journal={NEW: timed(2.0, lines, 0.2)})
    outcome, result, w = run(host, journal_grace=10)
    assert outcome.verdict == jd.UNVERIFIED
    assert 4 <= host.calls.count("generate") <= 8, host.calls.count("generate")


def test_a_death_seen_before_its_lines_were_read_names_the_phase_they_show():
    # The process logged its config line and died before the wait first looked at the unit.
    lines = STARTUP[:7] + ["Received sigquit from a child process. It usually means the child failed."]
    failed = unit_state(NEW, "failed", "failed", result="signal", code="2", status="9")
    host = FakeHost(states=[(0.0, failed)], journal={NEW: timed(0.0, lines, 0.01)}, cmdline=COMMAND)
    host.now = 5.0
    outcome, result, w = run(host)
    assert outcome.verdict == jd.DIED
    assert "while draft runner initialised: block_size=16, draft_window_size=2048" in outcome.message, outcome.message
    assert "code=killed, status=9/KILL, Result signal" in outcome.message
    assert outcome.message.count("status=9/KILL") == 1  # said once
    assert result["journal_tail"][-1].startswith("Received sigquit")


def test_a_crash_loop_seen_at_the_start_of_a_slice_reads_the_last_lines_first():
    # Each slice starts without a journal follower: the lines logged since its cursor (the crash) and
    # systemd's exit notes must be read before the verdict, not only the tail the last slice kept.
    host = healthy_host()
    first = waiter(host, min_ready_seconds=10)
    while first.run(slice_seconds=2).verdict == jd.WAITING and first.state.found.generate is None:
        first = waiter(host, resume=json.loads(json.dumps(first.to_state())), min_ready_seconds=10)
    assert first.state.found.generate is not None  # settling
    state = json.loads(json.dumps(first.to_state()))
    now = host.now
    crash = ["Scheduler hit an exception: RuntimeError: CUDA error (simulated crash_after_ready)",
             "Received sigquit from a child process. It usually means the child failed."]
    host.journal[NEW] += timed(now - 0.5, crash, 0.1) + [
        (now - 0.3, entry("sglang.service: Main process exited, code=killed, status=9/KILL", systemd=True,
                          EXIT_CODE="killed", EXIT_STATUS="9")),
        (now - 0.2, entry("sglang.service: Failed with result 'signal'.", systemd=True))]
    host.states = host.states + [(now - 0.1, unit_state(NEWER, restarts=1))]
    outcome = waiter(host, resume=state, min_ready_seconds=10).run(slice_seconds=2)
    assert outcome.verdict == jd.CRASH_LOOP, outcome.message
    assert "settling after its first good /generate" in outcome.message
    assert "code=killed, status=9/KILL, Result signal" in outcome.message
    assert "Cause: Received sigquit from a child process" in outcome.message
    assert not host.written


def test_a_new_invocation_first_seen_while_systemd_restarts_it_is_a_crash_loop():
    # The wait attached late: the first new invocation it sees has already died and Restart= is on it.
    restarting = unit_state(NEW, "activating", "auto-restart", restarts=1, pid=0, result="signal", code="2",
                            status="9")
    host = FakeHost(states=[(0.0, restarting)], journal={NEW: timed(0.0, STARTUP[:3], 0.01)}, cmdline=COMMAND)
    host.now = 5.0
    outcome, result, w = run(host)
    assert outcome.verdict == jd.CRASH_LOOP, outcome.message
    assert "ended before it could be checked (activating/auto-restart, code=killed, status=9/KILL, Result signal)" \
        in outcome.message
    failed = unit_state(NEW, "failed", "failed", pid=0, result="exit-code", code="1", status="1")
    outcome, result, w = run(FakeHost(states=[(0.0, failed)], cmdline=COMMAND))
    assert outcome.verdict == jd.DIED and "status=1/FAILURE, Result exit-code" in outcome.message


# --------------------------------------------------------------------------- evidence only the server can write

def forged(message, invocation=NEW):
    """What an unprivileged local user can write (logger --journald): the client field INVOCATION_ID names
    the invocation; journald sets _SYSTEMD_INVOCATION_ID from the writer's own cgroup (its session scope)."""
    return entry(message, invocation="5c09e1ffffffffffffffffffffffffff", INVOCATION_ID=invocation, _PID="4711",
                 _UID="1000", SYSLOG_IDENTIFIER="sglang")


def test_a_config_line_forged_by_another_user_is_no_evidence():
    # the server never logs its config line; a hostile user writes one in the new invocation's name
    lines = [line for line in STARTUP if "draft runner" not in line]
    journal = {NEW: timed(2.0, lines[:-2], 0.2) + [(3.5, forged(CONFIG_2048))] + timed(PORT_AT, lines[-2:], 0.1)}
    host = healthy_host(lines=lines, journal=journal)
    outcome, result, w = run(host)
    assert outcome.verdict == jd.MISSING_CONFIG_LINE, outcome.message
    assert result["config_lines"] == [] and not host.written


def test_a_forged_systemd_message_does_not_end_the_invocation():
    # "Main process exited" from a user's process is not systemd's: the wait goes on and passes
    journal = {NEW: timed(2.0, STARTUP[:-2], 0.2) + [(3.0, forged("sglang.service: Main process exited, "
                                                                  "code=exited, status=1/FAILURE"))]
               + timed(PORT_AT, STARTUP[-2:], 0.1)}
    outcome, result, w = run(healthy_host(journal=journal))
    assert outcome.verdict == jd.PASS, outcome.message
    assert result["unit_state"]["exit"] is None


def test_a_request_log_quoting_an_old_config_line_during_settle_is_no_mismatch():
    quoted = "[2026-11-29 10:05:00] Receive: obj=GenerateReqInput(text=%r, sampling_params={})" % (
        "why did my server log " + CONFIG_NONE)
    journal = {NEW: timed(2.0, STARTUP[:-2], 0.2) + timed(PORT_AT, STARTUP[-2:], 0.1) + [(6.0, entry(quoted))]}
    outcome, result, w = run(healthy_host(journal=journal), min_ready_seconds=5)
    assert outcome.verdict == jd.PASS, outcome.message
    assert result["config_lines"] == [CONFIG_2048]


def test_a_readiness_only_check_writes_no_receipt():
    host = healthy_host()
    outcome, result, w = run(host, expect={}, config_line="optional", command=None)
    assert outcome.verdict == jd.PASS and "readiness only" in outcome.message
    assert not host.written and result["receipt"] is None


def test_verify_only_with_a_receipt_judges_a_line_logged_after_it():
    # verified at 2048; the draft worker re-initialised without a window later; the start was rotated away
    values = {"block_size": 16, "draft_window_size": 2048, "compact_cache": True}
    receipt = {"version": 1, "unit": "sglang.service", "invocation_id": NEW, "verified_at": 0,
               "config_line_mode": "required", "journal_cursor": "%s:0" % NEW,
               "config_lines": [{"line": CONFIG_2048, "values": values, "cursor": "old"}]}
    journal = {NEW: [(0.0, entry('INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK')),
                     (50.0, entry(CONFIG_NONE))]}
    host = FakeHost(states=[(0.0, unit_state(NEW))], journal=journal, cmdline=COMMAND, receipt=receipt)
    host.now = 100.0
    outcome, result, w = run(host, after=None)
    assert outcome.verdict == jd.MISMATCH, outcome.message
    assert "second config line" in outcome.message and "draft_window_size: expected 2048" in outcome.message
    assert result["config_lines"] == [CONFIG_2048, CONFIG_NONE]


def test_a_crash_restarted_by_systemd_before_the_first_look_is_a_crash_loop():
    # the new process (NEW) exited 1 and systemd restarted it (NEWER) before the wait first looked
    crashed = {NEW: timed(0.5, ["[2026-11-29 10:00:00] server_args=ServerArgs()",
                                "ValueError: --speculative-draft-window-size must be positive, got 0."], 0.1)}
    restarts = [(1.0, {"invocation_id": NEW, "n_restarts": 1,
                       "message": "sglang.service: Scheduled restart job, restart counter is at 1."})]
    host = healthy_host(states=[(0.0, unit_state(NEWER, restarts=1))], journal=dict(
        crashed, **{NEWER: timed(2.0, STARTUP, 0.2, NEWER)}), restarts=restarts)
    host.now = 2.0
    outcome, result, w = run(host)
    assert outcome.verdict == jd.CRASH_LOOP, outcome.message
    assert "restarted it once before this wait first looked" in outcome.message and NEW in outcome.message
    assert "must be positive" in outcome.message  # the crashed invocation's own last lines
    assert not host.written


def test_a_restart_before_the_first_look_counts_against_tolerated_restarts():
    restarts = [(1.0, {"invocation_id": NEW, "n_restarts": 1, "message": "Scheduled restart job"})]
    host = healthy_host(states=[(0.0, unit_state(NEWER, restarts=1))],
                        journal={NEWER: timed(2.0, STARTUP, 0.2, NEWER)}, restarts=restarts)
    host.now = 2.0
    outcome, result, w = run(host, crash_loop_restarts=1)
    assert outcome.verdict == jd.PASS, outcome.message
    assert "before this wait first looked" in result["notes"][0]
    # one more restart by systemd would now exceed crash_loop_restarts=1


def test_a_launcher_in_front_of_the_interpreter_is_a_note_not_a_mismatch():
    shimmed = ["/usr/bin/python3.11"] + COMMAND[1:]  # a pyenv shim or wrapper exec'd the real interpreter
    outcome, result, w = run(healthy_host(cmdline=shimmed))
    assert outcome.verdict == jd.PASS, outcome.message
    assert any("/usr/bin/python3.11" in note and "execs it" in note for note in result["notes"])


def test_a_launcher_does_not_hide_other_arguments():
    other = ["/usr/bin/python3.11"] + [arg if arg != "2048" else "512" for arg in COMMAND[1:]]
    outcome, result, w = run(healthy_host(cmdline=other))
    assert outcome.verdict == jd.MISMATCH
    assert "program: expected /opt/sglang/venv/bin/python" in outcome.message
    assert "--speculative-dflash-draft-window-size: expected 2048, observed 512" in outcome.message


def test_a_journald_that_keeps_nothing_is_named_as_the_cause():
    host = healthy_host(journal={}, storage="none")
    outcome, result, w = run(host)
    assert outcome.verdict == jd.UNVERIFIED
    assert "Storage=none" in outcome.message and "retention" not in outcome.message


# --------------------------------------------------------------------------- the loop and its record

def test_the_state_record_travels_as_plain_json_without_secrets():
    host = healthy_host(port_at=30.0)
    first = waiter(host)
    assert first.run(slice_seconds=6).verdict == jd.WAITING
    state = json.loads(json.dumps(first.to_state()))
    assert sorted(state) == ["elapsed", "found", "journal", "notes", "phase", "phases", "tracker"]
    assert sorted(state["tracker"]) == ["after", "baseline_restarts", "deaths", "invocation_id", "main_pid"]
    assert sorted(state["journal"]) == ["cursor", "log", "own_cursor", "receipt", "tail"]
    assert sorted(state["found"]) == ["evidence", "generate", "launched", "listener"]
    assert state["tracker"]["invocation_id"] == NEW and state["elapsed"] == host.now
    assert "sekret" not in json.dumps(state)
    again = waiter(host, resume=state)
    assert json.loads(json.dumps(again.to_state())) == state  # read back as it was written


def test_a_resumed_wait_counts_the_time_of_earlier_slices():
    host = healthy_host(port_at=None)
    state = dict(waiter(host).to_state(), elapsed=115.0)  # the action plugin says how long the wait has taken
    outcome = waiter(host, resume=state).run()
    assert outcome.verdict == jd.TIMEOUT and "timed out after 12" in outcome.message and host.now < 6


def test_a_look_is_made_at_most_once_per_look_at_the_host(monkeypatch):
    host = healthy_host()
    asked = []

    def stubborn(snap):
        asked.append(dict(snap.looks))
        return jd.Judgement(jd.WAITING, "probing", look=jd.PORT)
    monkeypatch.setattr(jd, "judge", stubborn)
    outcome = waiter(host).run(slice_seconds=2)
    assert outcome.verdict == jd.WAITING and "probing" in outcome.message
    assert all(len(looks) <= 1 for looks in asked) and len(asked) < 40


def test_a_systemd_that_stops_answering_is_named_in_the_timeout_once():
    host = healthy_host(port_at=None)
    answering = host.state

    def state():
        if host.now > 3:
            raise SystemdError("systemctl show sglang.service failed (rc=1): Failed to connect to bus")
        return answering()
    host.state = state
    outcome = waiter(host, timeout=10).run()
    assert outcome.verdict == jd.TIMEOUT
    assert outcome.message.count("(last error: systemctl show sglang.service failed") == 1, outcome.message


def test_a_note_about_what_could_not_be_read_is_said_once():
    lines = list(STARTUP[:6])  # nothing after the config line's place: journald's notices are read at each look
    host = healthy_host(journal={NEW: timed(2.0, lines, 0.2)})

    def broken(invocation_id, since):
        raise JournalError("journalctl failed (rc=1)")
    host.suppressed = broken
    outcome, result, w = run(host, journal_grace=3)
    assert outcome.verdict == jd.UNVERIFIED
    assert result["notes"] == ["could not look for journald suppression notices: journalctl failed (rc=1)"]


# --------------------------------------------------------------------------- a follower node of a serving group

JOINED = "[2026-11-29 10:00:04] Dummy health check server started in background thread at 127.0.1.12:30000"
FOLLOWER_STARTUP = ["[2026-11-29 10:00:00] server_args={'nnodes': 2, 'node_rank': 1}",
                    "[2026-11-29 10:00:00 TP1] Init parallel begin.",
                    "[2026-11-29 10:00:02 TP1] Init parallel ends. elapsed=2.00 s",
                    "[2026-11-29 10:00:02 TP1] Load weight begin. avail mem=78.50 GB",
                    "[2026-11-29 10:00:03 TP1] Load weight end. elapsed=1.00 s",
                    JOINED]
FOLLOWER_COMMAND = COMMAND + ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "127.0.1.11:50000"]


def follower_journal(start=2.0, lines=None, step=0.4):
    """The follower's lines (FOLLOWER_STARTUP unless given), each with journald's own timestamp (the host's clock)."""
    from fakes import WALL0
    lines = FOLLOWER_STARTUP if lines is None else lines
    return [(start + index * step, entry(line, __REALTIME_TIMESTAMP=str(int((WALL0 + start + index * step) * 1e6))))
            for index, line in enumerate(lines)]


def follower_host(**kwargs):
    kwargs.setdefault("states", STARTED)
    kwargs.setdefault("journal", {NEW: follower_journal()})
    kwargs.setdefault("port", [])  # a follower's HTTP is never looked at
    kwargs.setdefault("generate", [])
    kwargs.setdefault("cmdline", FOLLOWER_COMMAND)
    return FakeHost(**kwargs)


def follower_waiter(host, after=OLD, resume=None, command=FOLLOWER_COMMAND, **policy):
    policy.setdefault("timeout", 60)
    policy.setdefault("min_ready_seconds", 3)
    intent = ev.Intent({}, "optional", command, None, follower=True)
    return wait.Waiter(host, "sglang.service", intent, jd.Policy(**policy), after_invocation=after, resume=resume)


def test_a_follower_passes_on_its_own_journal_after_settling_since_it_joined_without_any_http_request():
    host = follower_host()
    w = follower_waiter(host)
    outcome = w.run()
    result = w.result()
    assert outcome.verdict == jd.PASS, outcome.message
    assert "joined its serving group as a follower node" in outcome.message
    assert "stayed up for min_ready_seconds 3" in outcome.message and "its command line" in outcome.message
    assert "generate" not in host.calls and "port_open" not in result["phases"]
    joined_at = 2.0 + 5 * 0.4
    assert host.now >= joined_at + 3 and result["phases"]["joined"]["elapsed"] >= joined_at
    assert result["verified"] and result["source"] == "journal" and host.written == []  # no config line: no receipt


def test_a_follower_that_never_joins_times_out_naming_where_it_waits():
    host = follower_host(journal={NEW: follower_journal(lines=FOLLOWER_STARTUP[:2])})
    outcome = follower_waiter(host, timeout=15).run()
    assert outcome.verdict == jd.TIMEOUT
    assert "distributed init (waiting for every rank to join); not joined its serving group yet" in outcome.message


def test_a_follower_other_arguments_than_intended_is_a_mismatch():
    host = follower_host(cmdline=COMMAND + ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.9.9.9:50000"])
    outcome = follower_waiter(host).run()
    assert outcome.verdict == jd.MISMATCH and "10.9.9.9:50000" in outcome.message


def test_a_follower_that_dies_after_joining_fails_with_its_journal_tail():
    lines = FOLLOWER_STARTUP + ["[2026-11-29 10:00:05] Scheduler or DataParallelController 77 terminated with -9"]
    states = STARTED + [(5.0, unit_state(NEW, "inactive", "dead"))]
    host = follower_host(journal={NEW: follower_journal(lines=lines)}, states=states)
    w = follower_waiter(host, min_ready_seconds=10)
    outcome = w.run()
    assert outcome.verdict == jd.DIED and "terminated with -9" in outcome.message
    assert w.result()["journal_tail"][-1].endswith("terminated with -9")


def test_a_running_follower_that_joined_long_ago_is_verified_without_settling_again():
    host = follower_host(states=[(0.0, unit_state(NEW))], journal={NEW: follower_journal(start=0.0, step=0.1)})
    host.now = 100.0
    w = follower_waiter(host, after=None, min_ready_seconds=10)
    outcome = w.run()
    assert outcome.verdict == jd.PASS, outcome.message
    assert host.now < 105
