# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every verdict of the wait state machine, with fake clock, systemd, journal and HTTP."""
import collections
import json

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _wait as wait
from ansible_collections.gpufleet.inference.plugins.module_utils._args import flags_for_key
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import Entry
from ansible_collections.gpufleet.inference.plugins.module_utils._probe import HTTP, REFUSED, TIMEOUT, Response
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import UnitState

OLD, NEW, NEWER = "aaaa0000", "bbbb1111", "cccc2222"
CONFIG_2048 = ("[2026-11-29 10:04:49 TP0] Initialized DFLASH draft runner. attention_backend=flashinfer, "
               "model=DFlashDraftModel, block_size=16, draft_window_size=2048, compact_cache=True")
CONFIG_NONE = CONFIG_2048.replace("draft_window_size=2048, compact_cache=True", "draft_window_size=None, compact_cache=False")
EXPECT = {"draft_window_size": "2048", "compact_cache": "true", "block_size": 16}
ARGV = ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server", "--speculative-dflash-draft-window-size", "2048",
        "--speculative-num-draft-tokens", "16"]


class Clock(object):
    def __init__(self):
        self.now = 1000.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


def unit(inv, active="active", sub="running", restarts=0, pid=4242):
    return UnitState({"LoadState": "loaded", "InvocationID": inv, "ActiveState": active, "SubState": sub,
                      "MainPID": str(pid), "NRestarts": str(restarts), "ControlGroup": "/system.slice/sglang.service",
                      "ExecMainStartTimestamp": "Sun 2026-11-29 10:00:00 UTC", "Result": "success"})


class Systemd(object):
    """Returns the scripted states in order; the last one repeats."""

    def __init__(self, states, argv=None):
        self.states = list(states)
        self.argv = argv or ARGV

    def state(self):
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def exec_start(self):
        return [self.argv]


class Journal(object):
    """Per invocation: a list of reads, each a list of messages (the last read repeats as empty)."""

    def __init__(self, invocation_id, reads, grep=None, gaps=False):
        self.invocation_id = invocation_id
        self.reads = list(reads)
        self.grep_result = grep
        self.gaps = gaps
        self.cursor = None
        self.batch = 2000
        self.last_lines = collections.deque(maxlen=20)
        self.grepped = 0
        self.start_lines = None

    def _next(self):
        messages = self.reads.pop(0) if self.reads else []
        entries = [Entry({"MESSAGE": m, "__CURSOR": "c%d" % i}) for i, m in enumerate(messages)]
        for entry in entries:
            self.last_lines.append(entry.message)
        self.cursor = "cursor"
        return entries

    def start(self, lines=None):
        self.start_lines = lines
        return self._next()

    def read_new(self):
        return self._next()

    def tail(self, lines=20):
        return list(self.last_lines)[-lines:]

    def grep(self, pattern):
        self.grepped += 1
        return self.grep_result if self.grep_result is not None else []


class Http(object):
    """Scripted /generate responses (callables get the request timeout); the last one repeats."""

    def __init__(self, responses, server_info=None):
        self.responses = list(responses)
        self.calls = []
        self.info = server_info

    def generate(self, prompt, max_new_tokens, timeout):
        self.calls.append(timeout)
        item = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        return item(timeout) if callable(item) else item

    def server_info(self, timeout):
        if self.info is None:
            return Response(REFUSED, error="refused")
        return Response(HTTP, 200, json.dumps(self.info))


REFUSED_RESP = Response(REFUSED, error="[Errno 111] Connection refused")
GOOD_BODY = {"text": " Paris. The capital", "meta_info": {"completion_tokens": 8, "spec_accept_length": 3.2}}
GOOD = Response(HTTP, 200, json.dumps(GOOD_BODY))
STARTING = Response(HTTP, 503, '{"error": "starting"}')
INSIDE = {"verdict": "inside", "message": "ok", "owners": []}


def make(states, journals, http, clock=None, provenance=None, suppressed=None, **kwargs):
    clock = clock or Clock()
    made = {}

    def factory(invocation_id):
        made[invocation_id] = journals[invocation_id]
        return journals[invocation_id]
    kwargs.setdefault("after_invocation", OLD)
    kwargs.setdefault("expect", EXPECT)
    waiter = wait.Waiter(
        systemd=Systemd(states), journal_factory=factory, http=http, unit="sglang.service", clock=clock,
        sleep=clock.sleep, wall=lambda: 1764410400.0, timeout=kwargs.pop("timeout", 900), poll_interval=5,
        request_timeout=kwargs.pop("request_timeout", 60),
        provenance=provenance or (lambda cgroup, pid: INSIDE), suppressed=suppressed,
        flags_for_key=flags_for_key, **kwargs)
    return waiter, clock, made


def test_pass_after_restart_records_phases():
    journals = {NEW: Journal(NEW, [["Load weight begin."], [CONFIG_2048], ["Uvicorn running"]])}
    http = Http([REFUSED_RESP, REFUSED_RESP, STARTING, GOOD])
    waiter, clock, made = make([unit(OLD), unit(NEW, "activating", "start"), unit(NEW)], journals, http)
    outcome = waiter.run()
    assert outcome.ok and outcome.verdict == wait.PASS, outcome.msg
    result = waiter.result()
    assert result["invocation_id"] == NEW and result["source"] == "journal"
    assert result["observed"]["draft_window_size"] == 2048
    assert result["expected"] == {"draft_window_size": 2048, "compact_cache": True, "block_size": 16}
    assert set(result["phases"]) == {"new_invocation", "config_line", "port_open", "generate"}
    assert result["phases"]["new_invocation"]["elapsed"] <= result["phases"]["config_line"]["elapsed"] \
        <= result["phases"]["port_open"]["elapsed"] <= result["phases"]["generate"]["elapsed"]
    assert result["generate"]["meta_info"]["spec_accept_length"] == 3.2
    assert result["config_line"] == CONFIG_2048
    assert list(made) == [NEW]
    assert journals[NEW].start_lines is None  # new invocation: read from its beginning (bounded batch)


def test_mismatch_fails_at_once_naming_the_flag():
    journals = {NEW: Journal(NEW, [["Load weight begin.", CONFIG_NONE]])}
    http = Http([REFUSED_RESP])
    waiter, clock, made = make([unit(NEW)], journals, http)
    outcome = waiter.run()
    assert outcome.verdict == wait.MISMATCH
    assert ("draft_window_size: expected 2048 (--speculative-dflash-draft-window-size 2048 in sglang.service), "
            "observed None in the config line of invocation %s" % NEW) in outcome.msg
    assert "compact_cache: expected True" in outcome.msg and "observed False" in outcome.msg
    assert clock.sleeps == [] and http.calls == []  # no waiting for the port, no sleep


def test_mismatch_names_missing_flag():
    journals = {NEW: Journal(NEW, [[CONFIG_NONE]])}
    waiter, clock, made = make([unit(NEW)], journals, Http([REFUSED_RESP]))
    waiter.systemd.argv = ["/usr/bin/python", "-m", "sglang.launch_server"]
    outcome = waiter.run()
    assert "neither --speculative-draft-window-size nor --speculative-dflash-draft-window-size in sglang.service's " \
           "ExecStart" in outcome.msg


def test_old_invocation_only_never_passes_even_if_old_process_answers():
    journals = {}
    http = Http([GOOD])  # the OLD process answers /generate perfectly
    waiter, clock, made = make([unit(OLD)], journals, http, timeout=60)
    outcome = waiter.run()
    assert outcome.verdict == wait.TIMEOUT and not outcome.ok
    assert http.calls == [] and made == {}
    assert "waiting for a new invocation of sglang.service (still %s" % OLD in outcome.msg
    assert waiter.result()["elapsed"] == 60


def test_death_fails_fast_with_last_journal_lines():
    lines = ["Load weight begin.", "Scheduler hit an exception: CUDA out of memory",
             "Received sigquit from a child process. It usually means the child failed."]
    journals = {NEW: Journal(NEW, [lines[:1], lines[1:]])}
    waiter, clock, made = make([unit(NEW, "activating", "start"), unit(NEW), unit(NEW, "failed", "failed")],
                               journals, Http([REFUSED_RESP]))
    outcome = waiter.run()
    assert outcome.verdict == wait.DIED
    assert "invocation %s ended (failed/failed" % NEW in outcome.msg
    assert "CUDA out of memory" in outcome.msg and "Received sigquit" in outcome.msg
    assert waiter.result()["journal_tail"][-1].startswith("Received sigquit")
    assert clock.now - 1000 <= 10  # two polls, not a timeout


def test_new_invocation_already_dead_when_first_seen():
    journals = {NEW: Journal(NEW, [["error: the following arguments are required: --model-path/--model"]])}
    waiter, clock, made = make([unit(NEW, "failed", "failed")], journals, Http([REFUSED_RESP]))
    outcome = waiter.run()
    assert outcome.verdict == wait.DIED and clock.sleeps == []


@pytest.mark.parametrize("later,how", [
    (unit(NEWER, "activating", "start", restarts=1), "was replaced by invocation %s" % NEWER),
    (unit(NEW, "activating", "auto-restart"), "systemd is restarting it"),
    (unit(NEW, restarts=1), "NRestarts 0 -> 1"),
])
def test_crash_loop(later, how):
    journals = {NEW: Journal(NEW, [["Load weight begin."]])}
    waiter, clock, made = make([unit(NEW), later], journals, Http([REFUSED_RESP]))
    outcome = waiter.run()
    assert outcome.verdict == wait.CRASH_LOOP
    assert how in outcome.msg and "Load weight begin." in outcome.msg


def test_tolerated_restart_follows_the_next_invocation():
    journals = {NEW: Journal(NEW, [["boom"]]), NEWER: Journal(NEWER, [[CONFIG_2048]])}
    waiter, clock, made = make([unit(NEW), unit(NEWER, restarts=1), unit(NEWER, restarts=1)], journals,
                               Http([GOOD]), crash_loop_restarts=1)
    waiter.http.responses = [REFUSED_RESP, GOOD]
    outcome = waiter.run()
    assert outcome.verdict == wait.PASS, outcome.msg
    assert waiter.result()["invocation_id"] == NEWER
    assert "1 of 1 tolerated restarts" in waiter.result()["notes"][0]


def test_timeout_reports_last_phase_and_last_journal_line():
    journals = {NEW: Journal(NEW, [["Load weight begin. avail mem=70.00 GB"], ["KV Cache is allocated. #tokens: 1000"]])}
    waiter, clock, made = make([unit(NEW)], journals, Http([REFUSED_RESP]), timeout=30)
    outcome = waiter.run()
    assert outcome.verdict == wait.TIMEOUT
    assert "timed out after 30.0s" in outcome.msg
    assert "last phase: loading: no config line yet, port not open yet (connection refused)" in outcome.msg
    assert "last journal line: 'KV Cache is allocated. #tokens: 1000'" in outcome.msg
    assert waiter.result()["elapsed"] == 30.0
    assert max(clock.sleeps) <= 5


def test_timeout_checks_before_first_sleep():
    waiter, clock, made = make([unit(OLD)], {}, Http([GOOD]), timeout=0.001)
    clock.now = 1000.0
    outcome = waiter.run()
    assert outcome.verdict == wait.TIMEOUT


def test_foreign_listener_fails():
    journals = {NEW: Journal(NEW, [[CONFIG_2048]])}
    foreign = {"verdict": "outside", "owners": [], "message": "a process outside sglang.service answers on "
               "127.0.1.11:30000: pid 123 (python3) in /system.slice/other.service"}
    seen = []

    def provenance(cgroup, pid):
        seen.append((cgroup, pid))
        return foreign
    waiter, clock, made = make([unit(NEW)], journals, Http([GOOD]), provenance=provenance)
    outcome = waiter.run()
    assert outcome.verdict == wait.FOREIGN_LISTENER
    assert outcome.msg == foreign["message"]
    assert seen == [("/system.slice/sglang.service", 4242)]


def test_missing_config_line_after_generate_answers():
    journal = Journal(NEW, [["Load weight begin."], ["Uvicorn running on http://127.0.0.1:30000"]])
    waiter, clock, made = make([unit(NEW)], {NEW: journal}, Http([REFUSED_RESP, GOOD]), suppressed=lambda inv, since: [])
    outcome = waiter.run()
    assert outcome.verdict == wait.MISSING_CONFIG_LINE
    assert "no config line" in outcome.msg and NEW in outcome.msg and "/generate answers" in outcome.msg
    assert journal.grepped == 1  # searched the invocation (bounded) before declaring it missing
    # ... but only after journald had time to write a late suppression notice (default grace 35 s)
    assert 35 <= clock.now - 1000.0 < 45


def test_missing_config_line_fails_at_once_without_grace():
    journal = Journal(NEW, [["Uvicorn running on http://127.0.0.1:30000"]])
    waiter, clock, made = make([unit(NEW)], {NEW: journal}, Http([GOOD]), suppressed=lambda inv, since: [],
                               journal_grace=0)
    assert waiter.run().verdict == wait.MISSING_CONFIG_LINE
    assert clock.now - 1000.0 < 1


def test_late_suppression_notice_within_grace_falls_back_to_server_info():
    # journald writes "Suppressed N messages" only after its interval ends and the unit logs again.
    info = {"speculative_dflash_draft_window_size": 2048, "speculative_num_draft_tokens": 16}
    looks = []

    def suppressed(inv, since):
        looks.append(clock.now)
        return SUPPRESSED if len(looks) >= 4 else []
    waiter, clock, made = make([unit(NEW)], {NEW: Journal(NEW, [["x"]])}, Http([GOOD], server_info=info),
                               suppressed=suppressed)
    outcome = waiter.run()
    assert outcome.verdict == wait.PASS, outcome.msg
    assert waiter.result()["source"] == "server_info"
    assert len(looks) == 4 and "suppression notice" not in outcome.msg


def test_timeout_during_grace_reports_the_missing_line_not_readiness():
    waiter, clock, made = make([unit(NEW)], {NEW: Journal(NEW, [["x"]])}, Http([GOOD]),
                               suppressed=lambda inv, since: [], timeout=12)
    outcome = waiter.run()
    assert outcome.verdict == wait.MISSING_CONFIG_LINE, outcome.msg
    assert "no config line" in outcome.msg


def test_config_line_found_by_grep_when_the_stream_had_gaps():
    journal = Journal(NEW, [["decode"] * 3], grep=[CONFIG_2048.replace("TP0", "TP3"), CONFIG_2048], gaps=True)
    waiter, clock, made = make([unit(NEW)], {NEW: journal}, Http([GOOD]))
    outcome = waiter.run()
    assert outcome.verdict == wait.PASS and waiter.result()["config_line"] == CONFIG_2048


def test_no_expectations_pass_without_config_line():
    waiter, clock, made = make([unit(NEW)], {NEW: Journal(NEW, [["x"]])}, Http([GOOD]), expect={})
    assert waiter.run().verdict == wait.PASS


SUPPRESSED = [{"count": 12345, "message": "Suppressed 12345 messages from sglang.service", "invocation_id": NEW}]


def test_suppressed_falls_back_to_server_info_and_agrees():
    info = {"speculative_dflash_draft_window_size": 2048, "speculative_num_draft_tokens": 16, "version": "0.5.11"}
    calls = []

    def suppressed(inv, since):
        calls.append((inv, since))
        return SUPPRESSED
    waiter, clock, made = make([unit(NEW)], {NEW: Journal(NEW, [["x"]])}, Http([GOOD], server_info=info),
                               suppressed=suppressed)
    outcome = waiter.run()
    assert outcome.verdict == wait.PASS, outcome.msg
    result = waiter.result()
    assert result["source"] == "server_info"
    assert result["observed"] == {"draft_window_size": 2048, "compact_cache": True, "block_size": 16}
    assert result["suppression"]["messages_dropped"] == 12345
    assert any("compared with /server_info" in note for note in result["notes"])
    assert calls == [(NEW, "Sun 2026-11-29 10:00:00 UTC")]


def test_suppressed_falls_back_to_server_info_and_disagrees():
    info = {"speculative_draft_window_size": None, "speculative_num_draft_tokens": 16}
    waiter, clock, made = make([unit(NEW)], {NEW: Journal(NEW, [["x"]])}, Http([GOOD], server_info=info),
                               suppressed=lambda inv, since: SUPPRESSED)
    outcome = waiter.run()
    assert outcome.verdict == wait.MISMATCH
    assert "observed None in /server_info of invocation %s" % NEW in outcome.msg
    assert "journald rate limiting dropped 12345 messages" in outcome.msg


def test_suppressed_and_server_info_unreachable_says_so():
    waiter, clock, made = make([unit(NEW)], {NEW: Journal(NEW, [["x"]])}, Http([GOOD]),
                               suppressed=lambda inv, since: SUPPRESSED)
    outcome = waiter.run()
    assert outcome.verdict == wait.MISSING_CONFIG_LINE
    assert "journald rate limiting dropped" in outcome.msg and "/server_info could not stand in" in outcome.msg


def test_generate_that_hangs_is_bounded_by_the_remaining_time():
    clock = Clock()

    def hang(timeout):
        clock.now += timeout  # the request blocks for its whole timeout
        return Response(TIMEOUT, error="timed out")
    journals = {NEW: Journal(NEW, [[CONFIG_2048]])}
    http = Http([hang])
    waiter, clock, made = make([unit(NEW)], journals, http, clock=clock, timeout=100, request_timeout=60)
    outcome = waiter.run()
    assert outcome.verdict == wait.TIMEOUT
    assert clock.now - 1000 <= 100.0001
    assert http.calls[0] == 60 and all(t <= 60 for t in http.calls) and http.calls[-1] < 60
    assert "/generate not answering yet (no answer within the request timeout)" in outcome.msg


def test_unauthorized_fails_fast():
    waiter, clock, made = make([unit(NEW)], {NEW: Journal(NEW, [[CONFIG_2048]])},
                               Http([Response(HTTP, 401, '{"error": "Unauthorized"}')]))
    outcome = waiter.run()
    assert outcome.verdict == wait.UNAUTHORIZED and "api_key" in outcome.msg


def test_check_mode_with_after_invocation_does_not_wait():
    waiter, clock, made = make([unit(OLD)], {}, Http([GOOD]), check_mode=True)
    outcome = waiter.run()
    assert outcome.ok and outcome.verdict == wait.CHECK_MODE and clock.sleeps == [] and made == {}


def test_verify_mode_checks_the_current_invocation_read_only():
    journal = Journal(NEW, [["decode batch"] * 20], grep=[CONFIG_2048], gaps=True)
    waiter, clock, made = make([unit(NEW)], {NEW: journal}, Http([GOOD]), after_invocation=None, check_mode=True)
    outcome = waiter.run()
    assert outcome.verdict == wait.PASS, outcome.msg
    assert journal.start_lines == 20 and journal.grepped == 1
    assert "invocation" in waiter.result()["phases"]


def test_verify_mode_detects_drift():
    journal = Journal(NEW, [["x"]], grep=[CONFIG_NONE], gaps=True)
    waiter, clock, made = make([unit(NEW)], {NEW: journal}, Http([GOOD]), after_invocation=None)
    assert waiter.run().verdict == wait.MISMATCH


def test_verify_mode_unit_not_running():
    waiter, clock, made = make([unit("", "inactive", "dead")], {}, Http([GOOD]), after_invocation=None)
    outcome = waiter.run()
    assert outcome.verdict == wait.NOT_ACTIVE and "not running" in outcome.msg


def test_unit_not_found():
    state = UnitState({"LoadState": "not-found"})
    waiter, clock, made = make([state], {}, Http([GOOD]))
    assert waiter.run().verdict == wait.NOT_FOUND


def test_transient_systemctl_error_is_retried():
    from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import SystemdError

    class Flaky(Systemd):
        def __init__(self):
            Systemd.__init__(self, [unit(NEW)])
            self.failed = False

        def state(self):
            if not self.failed:
                self.failed = True
                raise SystemdError("Failed to connect to bus")
            return Systemd.state(self)
    waiter, clock, made = make([unit(NEW)], {NEW: Journal(NEW, [[CONFIG_2048]])}, Http([GOOD]))
    waiter.systemd = Flaky()
    assert waiter.run().verdict == wait.PASS
