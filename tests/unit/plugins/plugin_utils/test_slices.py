# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sliced wait (plugin_utils/_slices.py), through the sglang_ready action plugin: slices, progress
lines, and a wait that survives SSH drops.

The module is stubbed (``_execute_module``) and the plugin's clock is fake: nothing sleeps."""
import copy

import pytest

from ansible.errors import AnsibleConnectionFailure

from ansible_collections.gpufleet.inference.plugins.action import sglang_ready as action_mod
from ansible_collections.gpufleet.inference.plugins.plugin_utils import _slices as slices

import fakes
from fakes import NEW, OLD

HOST = "gpu-1"


class FakeTime(object):
    """time.monotonic/time.sleep of the plugin: sleeping advances the clock, never the test."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps = []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(slices, "time", fake)
    return fake


@pytest.fixture
def shown(monkeypatch):
    fake = fakes.Display()
    monkeypatch.setattr(slices, "display", fake)
    return fake


class Module(object):
    """_execute_module: answers in order; an exception instance is raised. Each call takes `slice` seconds."""

    def __init__(self, clock, answers, slice_seconds=10.0):
        self.clock = clock
        self.answers = list(answers)
        self.slice_seconds = slice_seconds
        self.calls = []

    def __call__(self, module_name=None, module_args=None, task_vars=None, **kwargs):
        self.calls.append({"module_name": module_name, "args": copy.deepcopy(module_args), "task_vars": task_vars})
        self.clock.now += self.slice_seconds
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return copy.deepcopy(answer)


def make_action(args, check_mode=False):
    return fakes.make_action(action_mod, args, check_mode, action="gpufleet.inference.sglang_ready")


def run(action, module, task_vars=None):
    action._execute_module = module
    return action.run(task_vars=task_vars if task_vars is not None else {"inventory_hostname": HOST})


def state(invocation_id, phase, cursor):
    return {"tracker": {"after": OLD, "invocation_id": invocation_id}, "phase": phase, "cursor": cursor,
            "phases": {"new_invocation": {"elapsed": 1.0}} if invocation_id else {}, "elapsed": 0.0}


def waiting(state_, events=(), phase="", elapsed=0.0):
    return {"changed": False, "verdict": "waiting", "state": state_, "events": list(events), "phase": phase,
            "elapsed": elapsed, "msg": "still waiting"}


def event(elapsed, phase, text):
    return {"elapsed": elapsed, "phase": phase, "text": text}


S1 = state(None, "waiting for a new invocation", None)
S2 = state(NEW, "loading weights: shard 3/16 (19%)", "c17")
PASS = {"changed": True, "verdict": "pass", "invocation_id": NEW, "verified": True, "msg": "serving",
        "events": [event(31.0, "generate", "/generate answered (8 tokens)")], "phase": "serving", "elapsed": 31.0}


# --------------------------------------------------------------------------- connection_lost

@pytest.mark.parametrize("result,reason", [
    ({"unreachable": True, "msg": "Failed to connect to the host via ssh: timeout"},
     "Failed to connect to the host via ssh: timeout"),
    ({"unreachable": True}, "host unreachable"),
    ({"failed": True, "msg": "Module result deserialization failed: No start of json char found\nmore"},
     "Module result deserialization failed: No start of json char found"),
    ({"failed": True, "rc": 255, "msg": "MODULE FAILURE\nSee stdout/stderr for the exact error", "module_stderr": ""},
     "MODULE FAILURE"),
    ({"failed": True, "msg": "", "module_stderr": "Shared connection to 127.0.1.11 closed.\r\n"}, "connection error"),
    ({"failed": True, "msg": "ssh: kex_exchange_identification: read: Connection reset by peer"},
     "ssh: kex_exchange_identification: read: Connection reset by peer"),
    ({"failed": True, "msg": "MODULE FAILURE", "module_stderr": "client_loop: send disconnect: Broken pipe"},
     "MODULE FAILURE"),
])
def test_connection_lost(result, reason):
    assert slices.connection_lost(result) == reason


@pytest.mark.parametrize("result", [
    # the module itself crashed: running it again would not help (even though ssh said goodbye)
    {"failed": True, "rc": 1, "msg": "MODULE FAILURE\nSee stdout/stderr for the exact error",
     "module_stderr": "Traceback (most recent call last):\n  File \"x\", line 1\nKeyError: 'x'\n"
                      "Shared connection to 127.0.1.11 closed.\r\n"},
    {"failed": True, "rc": 255, "module_stderr": "Traceback (most recent call last):\n ValueError"},
    # a verdict is an answer, whatever its words
    {"failed": True, "verdict": "foreign_listener", "msg": "Connection refused on 127.0.1.11:30000"},
    {"failed": True, "verdict": "died", "rc": 255, "msg": "Broken pipe"},
    {"verdict": "pass", "msg": "serving"},
    {"verdict": "waiting", "state": {}},
    # the module refused its arguments: no connection problem
    {"failed": True, "msg": "timeout must be greater than 0, got 0.0"},
    {"changed": False, "msg": "Connection reset"},  # not failed
    {},
])
def test_not_a_lost_connection(result):
    assert slices.connection_lost(result) is None


# --------------------------------------------------------------------------- Progress

def test_progress_prints_every_phase_change_at_once():
    progress = slices.Progress(HOST, interval=5, heartbeat=30)
    lines = progress.lines([event(1.0, "new_invocation", "new invocation x"), event(2.0, "loading_weights", "w"),
                            event(3.0, "kv_cache", "KV cache allocated")], now=0.0)
    assert lines == ["sglang_ready | gpu-1: [   1.0s] new invocation x", "sglang_ready | gpu-1: [   2.0s] w",
                     "sglang_ready | gpu-1: [   3.0s] KV cache allocated"]


def test_progress_same_phase_at_most_once_per_interval_and_the_newest():
    progress = slices.Progress(HOST, interval=5, heartbeat=30)
    assert progress.lines([event(1.0, "loading_weights", "shard 1/16")], now=0.0) == ["sglang_ready | gpu-1: [   1.0s] shard 1/16"]
    assert progress.lines([event(2.0, "loading_weights", "shard 2/16"),
                           event(3.0, "loading_weights", "shard 3/16")], now=2.0) == []  # held
    assert progress.lines([event(4.0, "loading_weights", "shard 4/16")], now=4.9) == []
    assert progress.lines([], now=5.0) == ["sglang_ready | gpu-1: [   4.0s] shard 4/16"]  # the newest held, once
    assert progress.lines([], now=11.0) == []  # nothing held any more, heartbeat not due
    # a phase change drops what was held and prints at once, whatever the interval
    assert progress.lines([event(12.0, "loading_weights", "shard 9/16")], now=12.0) == [
        "sglang_ready | gpu-1: [  12.0s] shard 9/16"]  # the interval has passed since the last line
    assert progress.lines([event(13.0, "loading_weights", "shard 10/16")], now=13.0) == []  # held
    assert progress.lines([event(13.5, "kv_cache", "KV cache allocated")], now=13.5) == [
        "sglang_ready | gpu-1: [  13.5s] KV cache allocated"]
    assert progress.lines([], now=30.0) == []  # the dropped shard line never comes


def test_progress_heartbeat_when_nothing_moves():
    progress = slices.Progress(HOST, interval=5, heartbeat=30)
    progress.lines([event(1.0, "cuda_graph", "capturing CUDA graphs")], now=0.0)
    assert progress.lines([], now=29.0, phase_text="capturing CUDA graphs", elapsed=29.0) == []
    assert progress.lines([], now=30.0, phase_text="capturing CUDA graphs", elapsed=30.5) == [
        "sglang_ready | gpu-1: [  30.5s] still capturing CUDA graphs"]
    assert progress.lines([], now=45.0, phase_text="capturing CUDA graphs", elapsed=45.0) == []  # counted again
    assert progress.lines([], now=60.0, phase_text="capturing CUDA graphs", elapsed=60.0) == [
        "sglang_ready | gpu-1: [  60.0s] still capturing CUDA graphs"]
    assert progress.lines([], now=200.0, phase_text=None) == []  # nothing to say


def test_progress_line_without_text_names_the_phase():
    progress = slices.Progress(HOST)
    assert progress.lines([{"phase": "port_open"}], now=0.0) == ["sglang_ready | gpu-1: [   0.0s] port_open"]


# --------------------------------------------------------------------------- ActionModule.run

def test_slices_then_a_verdict(clock, shown):
    module = Module(clock, [waiting(S1, [event(0.5, "waiting", "old invocation still active")], "waiting"),
                            waiting(S2, [event(2.0, "new_invocation", "new invocation %s" % NEW),
                                         event(3.0, "loading_weights", "shard 3/16")], S2["phase"], 3.0),
                            PASS])
    action = make_action({"unit": "sglang.service", "after_invocation": OLD, "timeout": 900, "slice_seconds": "5",
                          "resume": {"stale": True}})
    result = run(action, module)
    assert result["verdict"] == "pass" and result["invocation_id"] == NEW and result["changed"] is True
    assert "state" not in result and "failed" not in result
    assert [item["text"] for item in result["events"]] == ["old invocation still active", "new invocation %s" % NEW,
                                                           "shard 3/16", "/generate answered (8 tokens)"]
    assert [call["module_name"] for call in module.calls] == ["gpufleet.inference.sglang_ready"] * 3
    assert result["module_runs"] == 3
    first, second, third = (call["args"] for call in module.calls)
    assert "resume" not in first  # a resume given to the task is never passed on
    assert first["slice_seconds"] == 5.0 and first["unit"] == "sglang.service"
    assert second["resume"]["tracker"] == S1["tracker"] and second["resume"]["elapsed"] == 10.0
    assert third["resume"]["cursor"] == "c17" and third["resume"]["elapsed"] == 20.0
    assert module.calls[0]["task_vars"] == {"inventory_hostname": HOST}
    assert shown.lines[:2] == ["sglang_ready | gpu-1: [   0.5s] old invocation still active",
                               "sglang_ready | gpu-1: [   2.0s] new invocation %s" % NEW]
    assert "sglang_ready | gpu-1: [  31.0s] /generate answered (8 tokens)" in shown.lines
    assert shown.lines[-1].startswith("sglang_ready | gpu-1: [  30.0s] pass: "), shown.lines  # the verdict, last
    assert clock.sleeps == []  # no pause between slices that answered


def test_one_call_does_the_whole_wait_with_slice_seconds_0(clock, shown):
    module = Module(clock, [PASS])
    result = run(make_action({"slice_seconds": 0}), module)
    assert result["verdict"] == "pass" and len(module.calls) == 1 and result["module_runs"] == 1
    assert module.calls[0]["args"]["slice_seconds"] == 0.0


def test_without_slice_seconds_a_slice_is_30_seconds(clock, shown):
    # Each slice is a module run (~20 ms of controller CPU): 30 s slices over a 300 s load are 10 runs, not 30.
    module = Module(clock, [PASS])
    run(make_action({"unit": "sglang.service"}), module)
    assert module.calls[0]["args"]["slice_seconds"] == 30.0


def test_a_failed_verdict_is_returned_as_it_is(clock, shown):
    mismatch = {"failed": True, "changed": False, "verdict": "mismatch", "msg": "runs other settings",
                "events": [event(9.0, "draft_runner", "draft runner initialised")]}
    module = Module(clock, [waiting(S2, [event(1.0, "new_invocation", "n")]), mismatch])
    result = run(make_action({}), module)
    assert result["failed"] is True and result["verdict"] == "mismatch" and result["msg"] == "runs other settings"
    assert [item["phase"] for item in result["events"]] == ["new_invocation", "draft_runner"]
    assert len(module.calls) == 2
    assert shown.lines[-1].endswith("] mismatch: runs other settings"), shown.lines


def test_the_last_line_is_short_and_names_the_verdict():
    long = {"verdict": "pass", "msg": "x" * 300 + "\nsecond line"}
    line = slices.final_line("gpu-1", long, 12.25)
    assert line == "sglang_ready | gpu-1: [  12.2s] pass: " + "x" * 197 + "..."
    assert slices.final_line("gpu-1", {"failed": True}, 1) == "sglang_ready | gpu-1: [   1.0s] failed"


def test_a_module_crash_is_not_retried(clock, shown):
    crash = {"failed": True, "rc": 1, "msg": "MODULE FAILURE", "module_stderr": "Traceback (most recent call last):\n"}
    module = Module(clock, [crash, PASS])
    result = run(make_action({}), module)
    assert result["failed"] is True and result["msg"] == "MODULE FAILURE" and len(module.calls) == 1


def test_a_slice_lost_to_the_connection_is_run_again_from_the_same_state(clock, shown):
    module = Module(clock, [waiting(S2, [event(2.0, "new_invocation", "n")], S2["phase"]),
                            AnsibleConnectionFailure("Failed to connect to the host via ssh: Connection timed out"),
                            waiting(dict(S2, cursor="c40"), [event(25.0, "kv_cache", "KV cache allocated")]),
                            PASS])
    action = make_action({"timeout": 900, "connection_retry_seconds": 120})
    result = run(action, module)
    assert result["verdict"] == "pass" and result["invocation_id"] == NEW and "failed" not in result
    lost_call, retried_call = module.calls[1]["args"], module.calls[2]["args"]
    # the retry carries the state of the last answered slice, not a fresh wait
    assert retried_call["resume"]["tracker"] == lost_call["resume"]["tracker"] == S2["tracker"]
    assert retried_call["resume"]["cursor"] == lost_call["resume"]["cursor"] == "c17"
    assert module.calls[3]["args"]["resume"]["cursor"] == "c40"
    assert action._connection.reset.call_count == 1
    assert clock.sleeps == [slices.RETRY_PAUSE_SECONDS]
    assert result["notes"] == ["the connection broke 1 time(s) during the wait (Failed to connect to the host via ssh: "
                               "Connection timed out); each lost slice was run again from its state"]
    assert any("connection lost (Failed to connect to the host via ssh" in line for line in shown.lines)
    assert any("connection back after" in line for line in shown.lines)
    assert [item["phase"] for item in result["events"]] == ["new_invocation", "kv_cache", "generate"]


def test_a_deserialization_failure_is_retried_like_a_drop(clock, shown):
    garbled = {"failed": True, "msg": "Module result deserialization failed: No end of json char found"}
    module = Module(clock, [garbled, garbled, PASS])
    result = run(make_action({}), module)
    assert result["verdict"] == "pass" and len(module.calls) == 3
    # nothing answered yet: the wait starts over, but its deadline still counts the time lost
    assert set(module.calls[2]["args"]["resume"]) == {"elapsed"} and module.calls[2]["args"]["resume"]["elapsed"] > 0
    assert result["notes"][0].startswith("the connection broke 1 time(s)")  # one outage, two lost slices


def test_a_reset_that_raises_does_not_end_the_wait(clock, shown):
    module = Module(clock, [AnsibleConnectionFailure("Connection reset"), PASS])
    action = make_action({})
    action._connection.reset.side_effect = OSError("master gone")
    assert run(action, module)["verdict"] == "pass"


def test_a_connection_that_stays_lost_fails_naming_what_is_known(clock, shown):
    module = Module(clock, [waiting(S2, [event(2.0, "new_invocation", "n")], S2["phase"]),
                            AnsibleConnectionFailure("Failed to connect to the host via ssh: No route to host")],
                    slice_seconds=3.0)
    action = make_action({"timeout": 900, "connection_retry_seconds": 20})
    result = run(action, module)
    assert result["failed"] is True and result["changed"] is False and result["verdict"] == "connection_lost"
    assert result["invocation_id"] == NEW and result["phase"] == S2["phase"]
    assert result["phases"] == S2["phases"]
    assert result["msg"].startswith("connection to gpu-1 lost during the wait for 2")
    assert ("(Failed to connect to the host via ssh: No route to host): no verdict. Last known: invocation %s, "
            "loading weights: shard 3/16 (19%%) after" % NEW) in result["msg"]
    assert "it may be serving, loading or down" in result["msg"]
    assert result["notes"] == ["connection lost 1 time(s): Failed to connect to the host via ssh: No route to host"]
    assert [item["phase"] for item in result["events"]] == ["new_invocation"]
    # it gave up once the retry budget was spent, not before and not much after
    lost_for = clock.now - 1000.0 - 3.0
    assert 20 <= lost_for <= 20 + 3.0 + slices.RETRY_PAUSE_SECONDS + 3.0
    assert all(pause == slices.RETRY_PAUSE_SECONDS for pause in clock.sleeps)


def test_lost_before_the_first_answer(clock, shown):
    module = Module(clock, [{"unreachable": True, "msg": "Connection refused"}], slice_seconds=1.0)
    result = run(make_action({"connection_retry_seconds": 5}), module)
    assert result["verdict"] == "connection_lost" and result["invocation_id"] is None
    assert "Last known: the wait had not reported yet after" in result["msg"]
    assert result["phases"] == {} and result["events"] == []
    assert result["module_runs"] == len(module.calls) > 1  # every try counts


def test_the_task_timeout_bounds_the_retries(clock, shown):
    module = Module(clock, [waiting(S2), AnsibleConnectionFailure("Connection timed out")], slice_seconds=10.0)
    result = run(make_action({"timeout": 30, "connection_retry_seconds": 600}), module)
    assert result["verdict"] == "connection_lost"
    assert clock.now - 1000.0 < 30 + 10 + slices.RETRY_PAUSE_SECONDS + 10


def test_no_progress_lines_when_switched_off_or_in_check_mode(clock, shown):
    answers = [waiting(S2, [event(2.0, "new_invocation", "n")]), AnsibleConnectionFailure("Broken pipe"), PASS]
    run(make_action({"progress": False}), Module(clock, answers))
    run(make_action({}, check_mode=True), Module(clock, answers))
    assert shown.lines == []


def test_without_task_vars_the_host_is_unnamed(clock, shown):
    result = run(make_action({}), Module(clock, [waiting(S2, [event(1.0, "x", "y")]), PASS]), task_vars={})
    assert result["verdict"] == "pass" and shown.lines[0].startswith("sglang_ready | ?: ")
