"""--log-requests as SGLang writes it, and the line shapes the collection reads from it: a request that
quotes a config line must stay a request line (tests/unit/.../test_config_line.py has the parser's side).
Also the bind of "::" (uvicorn: IPv6, dual-stack)."""
import re
import signal

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _config_line as cfg
from ansible_collections.gpufleet.inference.plugins.module_utils import _startup as st
from conftest import http

OLD_LINE = ("[2026-11-29 09:00:00 TP0] Initialized DFLASH draft runner. attention_backend=fa3, model=M, "
            "block_size=16, draft_window_size=None, compact_cache=False")
PROMPT = "My server logged this:\n" + OLD_LINE + "\nThe server is fired up and ready to roll!\nwhy?"


def logged_lines(sim):
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_exit()
    return sim.output().splitlines()


@pytest.mark.parametrize("version,prefixed", [("0.5.11", False), ("0.5.23", True)])
def test_request_lines_quote_the_prompt_through_repr(start_sim, version, prefixed):
    sim = start_sim(["--log-requests", "--speculative-draft-window-size" if version != "0.5.11"
                     else "--speculative-dflash-draft-window-size", "2048"], version=version).wait_ready()
    status, dummy, body = sim.post("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 4}})
    assert status == 200
    lines = logged_lines(sim)
    receive = [line for line in lines if "Receive: obj=GenerateReqInput(text=" in line]
    finish = [line for line in lines if "Finish: obj=GenerateReqInput(" in line]
    assert receive and finish
    # the user's newlines stay inside one line (repr), so no line of the log begins with the quoted text
    assert "\\n" + OLD_LINE[:20] in receive[-1]
    assert not any(line.startswith(OLD_LINE[:20]) for line in lines)
    if prefixed:  # 0.5.12+: the request logger's own "[ts] " (no rank tag)
        assert re.match(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\] Receive: obj=", receive[-1]), receive[-1]
    else:  # 0.5.11: the message alone
        assert receive[-1].startswith("Receive: obj=")
    # what the collection makes of this log: the real config line once, the quote never
    found = cfg.find_config_lines(lines)
    assert [line["values"]["draft_window_size"] for line in found] == [2048]
    assert st.classify(receive[-1]) is None and st.classify(finish[-1]) is None


def test_json_request_log_is_one_line_per_event(start_sim):
    sim = start_sim(["--log-requests", "--log-requests-format", "json"], version="0.5.23").wait_ready()
    sim.post("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 4}})
    lines = logged_lines(sim)
    events = [line for line in lines if '"event": "request.' in line]
    assert len(events) >= 2 and all(PROMPT not in line for line in events)  # the newlines are escaped
    assert cfg.find_config_lines(events) == []


def test_without_log_requests_nothing_of_the_prompt_is_logged(start_sim):
    sim = start_sim().wait_ready()
    sim.post("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 4}})
    assert not any("Receive: obj=" in line for line in logged_lines(sim))


def test_a_wildcard_ipv6_bind_serves_ipv6_and_ipv4_loopback(start_sim):
    sim = start_sim(["--host", "::"]).wait_ready()  # wait_ready probes 127.0.0.1: dual-stack
    status, dummy, dummy = http("GET", "http://[::1]:%s/health" % sim.port)
    assert status == 200
    lines = logged_lines(sim)
    assert any(re.search(r"\] INFO:     Uvicorn running on http://\[::\]:%s " % sim.port, line) for line in lines)
    assert any(re.search(r'INFO:     \[::1\]:\d+ - "GET /health HTTP/1.1" 200 OK', line) for line in lines)
