# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What an invocation's journal says about its startup: phases, config lines, evidence of completeness."""
import json
import re

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _startup as st
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import JournalError

from fakes import CONFIG_2048, CONFIG_512, NEW, OLD, STARTUP, FakeHost, entry, timed, unit_state


def entries_of(messages, invocation=NEW):
    out = []
    for index, message in enumerate(messages):
        item = entry(message, invocation)
        item.cursor = "c%d" % index
        item.realtime_usec = 1764410400000000 + index
        out.append(item)
    return out


@pytest.mark.parametrize("message,found", [
    ("[2026-11-29 10:00:00] server_args=ServerArgs(model_path='/m')", ("starting", None)),
    ("[2026-11-29 10:00:00 TP0] Load weight begin. avail mem=78.50 GB", ("loading_weights", None)),
    ("Loading safetensors checkpoint shards:  50% Completed | 8/16 [00:01<00:01, 3.0it/s]",
     ("loading_weights", "shard 8/16 (50%)")),
    ("Loading safetensors checkpoint shards: 100% Completed | 16/16 [00:02<00:00]",
     ("loading_weights", "shard 16/16 (100%)")),
    ("[2026-11-29 10:00:00 TP0] Load weight end. elapsed=1.24 s", ("weights_loaded", None)),
    ("[2026-11-29 10:00:00 TP0] KV Cache is allocated. #tokens: 352000", ("kv_cache", None)),
    ("[2026-11-29 10:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.", ("cuda_graph", None)),
    ("INFO:     Uvicorn running on http://127.0.1.11:30000 (Press CTRL+C to quit)", ("port_open", None)),
    ('INFO:     127.0.0.1:5 - "POST /generate HTTP/1.1" 200 OK', ("port_open", None)),
    ('INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK', ("port_open", None)),
    ("[2026-11-29 10:00:00 TP0] Prefill batch. #new-seq: 1", ("port_open", None)),
    ("[2026-11-29 10:00:00 TP0] Decode batch. #running-req: 1", ("port_open", None)),
    ("[2026-11-29 10:00:00] The server is fired up and ready to roll!", ("ready", None)),
    # SGLang's uvicorn format (set_uvicorn_logging_configs): its own "[ts] " in front of the level
    ("[2026-11-29 10:00:00] INFO:     Uvicorn running on http://127.0.1.11:30000 (Press CTRL+C to quit)",
     ("port_open", None)),
    ('[2026-11-29 10:00:00] INFO:     127.0.0.1:5 - "POST /generate HTTP/1.1" 200 OK', ("port_open", None)),
    ("\rLoading safetensors checkpoint shards:  6% Completed | 1/16\rLoading safetensors checkpoint shards:  12% "
     "Completed | 2/16", ("loading_weights", "shard 2/16 (12%)")),
    # a node of a serving group: where every rank waits for the others; a follower's last line (it joined)
    ("[2026-11-29 10:00:00 TP8] Init parallel begin.", ("rendezvous", None)),
    ("[2026-11-29 10:00:00 TP0] Init torch distributed begin.", ("rendezvous", None)),
    ("[2026-11-29 10:00:00] Dummy health check server started in background thread at 10.0.0.2:30000",
     ("joined", None)),
    ("[2026-11-29 10:00:00] Receive: obj=GenerateReqInput(text='Dummy health check server started')", None),
    ("[2026-11-29 10:00:00 TP0] something else", None),
    ("", None),
    # request logs quote user text: a phase's words inside them are not that phase
    ("[2026-11-29 10:00:00] Receive: obj=GenerateReqInput(text='The server is fired up and ready to roll!')", None),
    ("[2026-11-29 10:00:00] Receive: obj=GenerateReqInput(text='INFO:     Uvicorn running on http://x:1')", None),
    ("Receive: obj=GenerateReqInput(text='[2026-11-29 10:00:00] server_args=ServerArgs()')", None),
    ("[2026-11-29 10:00:00] Finish: obj=GenerateReqInput(text='x'), out={'text': 'Load weight begin'}", None),
    ("says Loading safetensors checkpoint shards:  50% Completed | 8/16", None),
])
def test_classify(message, found):
    assert st.classify(message) == found


def test_a_healthy_startup_in_order():
    log = st.StartupLog()
    log.feed(entries_of(STARTUP))
    assert log.phase == "ready" and log.start_seen and log.after_config_seen
    assert log.lines_seen == len(STARTUP)
    assert [phase for phase, detail in log.take_events()] == [
        "loading_weights", "loading_weights", "weights_loaded", "kv_cache", "cuda_graph", "draft_runner",
        "port_open", "ready"]
    assert log.take_events() == []  # taken once
    assert len(log.config_lines) == 1
    line = log.config_lines[0]
    assert line["values"]["draft_window_size"] == 2048 and line["cursor"] == "c6"
    assert line["realtime_usec"] == 1764410400000006
    assert log.describe() == "warmed up (fired up and ready to roll)"


def test_phases_never_go_backwards():
    log = st.StartupLog()
    log.feed(entries_of(["[2026-11-29 10:00:00 TP0] KV Cache is allocated.", "[2026-11-29 10:00:00 TP1] Load weight begin.",
                         "Loading safetensors checkpoint shards:  50% Completed | 8/16", "[2026-11-29 10:00:00] server_args=x"]))
    assert log.phase == "kv_cache"
    assert [phase for phase, detail in log.take_events()] == ["kv_cache"]
    assert log.start_seen  # a late first line still proves the start is in the journal


def test_shard_progress_is_one_event_per_new_detail():
    log = st.StartupLog()
    log.feed(entries_of(["Loading safetensors checkpoint shards:  50% Completed | 8/16",
                         "Loading safetensors checkpoint shards:  50% Completed | 8/16",
                         "Loading safetensors checkpoint shards:  56% Completed | 9/16"]))
    assert log.take_events() == [("loading_weights", "shard 8/16 (50%)"), ("loading_weights", "shard 9/16 (56%)")]
    assert log.describe() == "loading weights: shard 9/16 (56%)"


def test_start_seen_and_after_config_seen_rules():
    only_start = st.StartupLog()
    only_start.feed(entries_of(STARTUP[:6]))
    assert only_start.start_seen and not only_start.after_config_seen
    no_start = st.StartupLog()
    no_start.feed(entries_of(STARTUP[1:]))
    assert not no_start.start_seen and no_start.after_config_seen
    # the config line itself proves nothing about what comes after it
    config_only = st.StartupLog()
    config_only.feed(entries_of([STARTUP[0], CONFIG_2048]))
    assert config_only.start_seen and not config_only.after_config_seen
    # an access-log line does
    served = st.StartupLog()
    served.feed(entries_of(['INFO:     1.2.3.4:5 - "POST /generate HTTP/1.1" 200 OK']))
    assert served.after_config_seen and not served.start_seen


def test_config_lines_every_rank0_line_redacted_with_its_cursor():
    secret_line = CONFIG_2048 + ", api_key='sekret'"
    log = st.StartupLog()
    log.feed(entries_of([CONFIG_2048.replace("TP0", "TP3"), secret_line, CONFIG_512]))
    assert [line["values"]["draft_window_size"] for line in log.config_lines] == [2048, 512]
    assert [line["cursor"] for line in log.config_lines] == ["c1", "c2"]
    assert "sekret" not in log.config_lines[0]["line"]
    assert "api_key='********'" in log.config_lines[0]["line"]
    # a non-rank-0 config line moves nothing
    other = st.StartupLog()
    other.feed(entries_of([CONFIG_2048.replace("TP0", "TP3")]))
    assert other.config_lines == [] and other.phase == "starting" and other.take_events() == []


def test_draft_runner_event_names_the_settings():
    log = st.StartupLog()
    log.feed(entries_of([CONFIG_2048]))
    assert log.take_events() == [("draft_runner", "block_size=16, draft_window_size=2048, compact_cache=True")]
    assert st.describe_phase("draft_runner", "x") == "draft runner initialised: x"
    assert st.describe_phase("unknown_phase") == "unknown_phase"


def test_systemd_messages_give_the_exit_and_are_not_lines():
    log = st.StartupLog()
    log.feed([entry("sglang.service: Main process exited, code=killed, status=9/KILL", systemd=True,
                    EXIT_CODE="killed", EXIT_STATUS="9")]
             + [entry("systemd note %d" % index, systemd=True) for index in range(6)])
    assert log.exit == "code=killed, status=9/KILL"  # systemd's own wording (signal name)
    assert log.lines_seen == 0 and log.phase == "starting"
    assert log.systemd_messages == ["systemd note %d" % index for index in range(1, 6)]  # the newest 5


def test_systemd_result_joins_the_exit():
    log = st.StartupLog()
    log.feed([entry("sglang.service: Main process exited, code=exited, status=1/FAILURE", systemd=True,
                    EXIT_CODE="exited", EXIT_STATUS="1"),
              entry("sglang.service: Failed with result 'exit-code'.", systemd=True)])
    assert log.exit == "code=exited, status=1/FAILURE, Result exit-code"
    log.feed([entry("sglang.service: Failed with result 'exit-code'.", systemd=True)])  # fed again: said once
    assert log.exit == "code=exited, status=1/FAILURE, Result exit-code"


def test_a_stop_job_of_pid_1_is_an_end_that_was_asked_for():
    log = st.StartupLog()
    log.feed([entry("Started sglang.service - SGLang.", systemd=True, JOB_TYPE="start")])
    assert log.stop_job is None
    log.feed([entry("Stopping sglang.service - SGLang...", systemd=True, JOB_TYPE="stop")])
    assert log.stop_job == "stop" and st.StartupLog(log.to_state()).stop_job == "stop"
    # a client may write JOB_TYPE too: only PID 1's entries are systemd's
    other = st.StartupLog()
    other.feed([entry("Stopping sglang.service - SGLang...", JOB_TYPE="stop")])
    assert other.stop_job is None


def test_to_state_round_trip_through_json():
    log = st.StartupLog()
    log.feed(entries_of(STARTUP[:7]))
    log.feed([entry("exited", systemd=True, EXIT_CODE="exited", EXIT_STATUS="1")])
    state = json.loads(json.dumps(log.to_state()))
    again = st.StartupLog(state)
    assert again.to_state() == log.to_state()
    assert again.events == []  # events are not state: the next slice reports only its own
    # the next slice goes on from there, never backwards
    again.feed(entries_of(["[2026-11-29 10:00:00 TP0] Load weight begin."]))
    assert again.phase == "draft_runner" and again.take_events() == []
    again.feed(entries_of(STARTUP[7:]))
    assert again.phase == "ready" and again.after_config_seen and again.lines_seen == 7 + 1 + 2
    assert st.StartupLog(None).to_state()["phase"] == "starting"


def test_grep_pattern_finds_the_landmarks_only():
    landmarks = [line for line in STARTUP if re.search(st.GREP_PATTERN, line)]
    assert landmarks == [STARTUP[0], CONFIG_2048, STARTUP[7], STARTUP[8]]
    assert re.search(st.GREP_PATTERN, "[2026-11-29 10:00:00 TP0] Initialized DDTree worker. block_size=16")


# --------------------------------------------------------------------------- look_back

RECEIPT = {"version": 1, "unit": "sglang.service", "invocation_id": NEW, "config_line_mode": "required",
           "config_lines": [{"line": CONFIG_2048, "values": {"draft_window_size": 2048}, "cursor": "%s:6" % NEW}],
           "journal_cursor": "%s:8" % NEW}


def test_look_back_takes_the_receipt_and_searches_only_after_it():
    host = FakeHost(states=[(0.0, unit_state(NEW))], receipt=RECEIPT, journal={NEW: timed(0.0, STARTUP)})
    host.now = 10.0
    found = st.look_back(host, NEW)
    assert found.receipt is RECEIPT and found.entries == [] and found.note is None
    assert host.calls == ["grep:%s after %s:8" % (NEW, NEW)]
    assert [line["line"] for line in found.lines] == [CONFIG_2048] and found.source == "receipt"


def test_look_back_never_lets_a_receipt_hide_a_later_config_line():
    later = CONFIG_2048.replace("draft_window_size=2048, compact_cache=True", "draft_window_size=None, compact_cache=False")
    host = FakeHost(states=[(0.0, unit_state(NEW))], receipt=RECEIPT, journal={NEW: timed(0.0, STARTUP + [later])})
    host.now = 10.0
    found = st.look_back(host, NEW)
    assert [line["line"] for line in found.lines] == [CONFIG_2048, later]
    assert found.source == "receipt+journal"


def test_look_back_ignores_a_receipt_of_another_invocation_and_greps():
    other = dict(RECEIPT, invocation_id=OLD)
    host = FakeHost(states=[(0.0, unit_state(NEW))], receipt=other, journal={NEW: timed(0.0, STARTUP, 0.1)})
    host.now = 10.0
    found = st.look_back(host, NEW)
    assert found.receipt is None and found.note is None
    assert host.calls == ["grep:%s" % NEW]
    assert [item.message for item in found.entries] == [STARTUP[0], CONFIG_2048, STARTUP[7], STARTUP[8]]
    log = found.log
    assert log.start_seen and log.after_config_seen and len(log.config_lines) == 1
    assert log.events == []  # a look back reports no progress
    assert found.source == "journal" and found.lines == log.config_lines


def test_look_back_when_grep_is_unsupported_says_so():
    host = FakeHost(states=[(0.0, unit_state(NEW))], grep=False)
    found = st.look_back(host, NEW)
    assert (found.receipt, found.entries, found.lines, found.source) == (None, [], [], None)
    assert found.note == "journalctl here cannot --grep; the journal of invocation %s was not searched" % NEW
    assert not found.log.start_seen


def test_look_back_when_the_journal_cannot_be_read():
    host = FakeHost(states=[(0.0, unit_state(NEW))])

    def broken(invocation_id, after_cursor=None):
        raise JournalError("journalctl failed (rc=1): Permission denied")
    host.grep = broken
    found = st.look_back(host, NEW)
    assert found.receipt is None and found.entries == []
    assert found.note == "could not search the journal of invocation %s: journalctl failed (rc=1): Permission denied" % NEW


def test_a_follower_is_joined_when_it_logs_that_its_schedulers_are_ready_with_the_journals_own_time():
    log = st.StartupLog()
    log.feed(entries_of(["[2026-11-29 10:00:00] server_args={'node_rank': 1}", "[ts TP1] Init parallel begin.",
                         "[2026-11-29 10:00:00 TP1] Init parallel begin."]))
    assert log.phase == "rendezvous" and log.joined_at is None
    joined = entries_of(["[2026-11-29 10:00:09] Dummy health check server started in background thread at h:1"])
    joined[0].realtime_usec = 1764410409500000
    log.feed(joined)
    assert log.phase == "joined" and log.joined_at == 1764410409.5
    assert st.StartupLog(log.to_state()).joined_at == 1764410409.5
    assert re.search(st.GREP_PATTERN, joined[0].message)  # a running follower's look-back finds it
