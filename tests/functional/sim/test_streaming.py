"""Streaming /generate as SGLang sends it, the timing model (prefill, decode steps, noise) and the
slow_decode fault."""
import http.client
import json
import time

import pytest

from conftest import run_python

PROMPT = "speculative decoding in a few words " * 4


def stream_events(sim, body, headers=None):
    """(headers, [(seconds since sent, event text)]) of one streamed /generate, read over raw HTTP/1.1."""
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
    sent = time.monotonic()
    conn.request("POST", "/generate", json.dumps(body), dict({"Content-Type": "application/json"}, **(headers or {})))
    resp = conn.getresponse()
    events = []
    while True:
        line = resp.readline()
        if not line:
            break
        events.append((time.monotonic() - sent, line.decode()))
    conn.close()
    return resp, events


def generate_body(max_new, text=PROMPT):
    return {"text": text, "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True},
            "stream": True}


def test_a_stream_is_sse_chunked_with_cumulative_outputs_and_the_finished_request_last(start_sim):
    sim = start_sim(SGLANG_SIM_TOKEN_SECONDS="0.005").wait_ready()
    resp, events = stream_events(sim, generate_body(40))
    assert resp.status == 200 and resp.getheader("content-type") == "text/event-stream; charset=utf-8"
    assert resp.getheader("transfer-encoding") == "chunked"
    lines = [text for dummy, text in events]
    assert lines[1::2] == ["\n"] * (len(lines) // 2)  # every event ends with a blank line
    data = [line[len("data: "):].rstrip("\n") for line in lines[0::2]]
    assert all(line.startswith("data: ") for line in lines[0::2]) and data[-1] == "[DONE]"
    assert all(", " not in d and '": ' not in d for d in data[:-1])  # orjson's compact form
    chunks = [json.loads(d) for d in data[:-1]]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts[0] == 1 and counts[-1] == 40 and counts == sorted(set(counts))  # the prefill's token, then steps
    assert all(len(c["output_ids"]) == n and len(c["text"].split()) == n for c, n in zip(chunks, counts))
    assert all(chunks[i + 1]["text"].startswith(chunks[i]["text"]) for i in range(len(chunks) - 1))
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    for key in ("id", "prompt_tokens", "weight_version", "completion_tokens", "cached_tokens"):
        assert key in chunks[0]["meta_info"], key
    final = chunks[-1]["meta_info"]
    assert final["finish_reason"] == {"type": "length", "length": 40} and final["e2e_latency"] > 0
    assert final["spec_accept_length"] == pytest.approx(40 / final["spec_verify_ct"], abs=1e-4)
    assert final["spec_verify_ct"] == len(chunks) - 1  # one output per verify step after the prefill


def test_without_speculative_decoding_every_step_is_one_token_and_no_spec_figures(start_sim):
    sim = start_sim(base=["--model-path", "m"], SGLANG_SIM_TOKEN_SECONDS="0.002").wait_ready()
    dummy, events = stream_events(sim, generate_body(6))
    chunks = [json.loads(text[6:]) for dummy, text in events[0::2][:-1]]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4, 5, 6]
    assert "spec_accept_length" not in chunks[-1]["meta_info"]


def test_a_client_that_goes_away_ends_its_request(start_sim):
    sim = start_sim(SGLANG_SIM_TOKEN_SECONDS="0.02").wait_ready()
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
    conn.request("POST", "/generate", json.dumps(generate_body(4000)), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.readline().startswith(b"data: ")
    assert json.loads(sim.get("/get_load")[2])[0]["num_reqs"] == 1
    conn.close()  # 4000 tokens would take tens of seconds; the server notices at its next write
    deadline = time.monotonic() + 10
    while json.loads(sim.get("/get_load")[2])[0]["num_reqs"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads(sim.get("/get_load")[2])[0]["num_reqs"] == 0


def test_slow_decode_lowers_the_accept_length_and_not_what_verification_reads(start_sim):
    window = ["--speculative-dflash-draft-window-size", "2048"]
    normal = start_sim(window, SGLANG_SIM_NOISE="0").wait_ready()
    slow = start_sim(window, faults="slow_decode=2", SGLANG_SIM_NOISE="0").wait_ready()
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 256, "temperature": 0}}
    fast_meta = json.loads(normal.post("/generate", body)[2])["meta_info"]
    slow_meta = json.loads(slow.post("/generate", body)[2])["meta_info"]
    # accept length / sqrt(2), and the step slower by the rest: decode throughput / 2
    assert slow_meta["spec_accept_length"] == pytest.approx(fast_meta["spec_accept_length"] / 2 ** 0.5, rel=0.03)
    slow_info, normal_info = (json.loads(sim.get("/server_info")[2]) for sim in (slow, normal))
    differ = {key for key in slow_info if slow_info[key] != normal_info.get(key)}
    assert differ == {"port", "random_seed", "internal_states"}, differ  # its own port and seed; what it measured
    for sim in (normal, slow):
        sim.proc.terminate()
        sim.wait_exit()
    config = [line.split("] ", 1)[1] for line in slow.output().splitlines() if "Initialized DFLASH draft runner" in line]
    assert config == ["Initialized DFLASH draft runner. attention_backend=flashinfer, model=DFlashDraftModel, "
                      "block_size=16, draft_window_size=2048, compact_cache=True"]


def test_slow_decode_of_two_halves_decode_throughput(start_sim):
    # Wall-clock sleeps of the simulator, compared at once on the same machine; a loose bound, as the
    # point is the model (decode time x2, prefill untouched), not this machine's timing.
    normal = start_sim(SGLANG_SIM_NOISE="0", SGLANG_SIM_TOKEN_SECONDS="0.02").wait_ready()
    slow = start_sim(faults="slow_decode=2", SGLANG_SIM_NOISE="0", SGLANG_SIM_TOKEN_SECONDS="0.02").wait_ready()
    decode = {}
    for name, sim in (("normal", normal), ("slow", slow)):
        dummy, events = stream_events(sim, generate_body(120))
        stamps = [stamp for stamp, text in events if text.startswith("data: {")]
        decode[name] = stamps[-1] - stamps[0]
    assert 1.6 < decode["slow"] / decode["normal"] < 2.6, decode


def test_a_bad_slow_decode_factor_stops_the_launch(start_sim):
    sim = start_sim(faults="slow_decode=0")
    assert sim.wait_exit() != 0
    assert "slow_decode=F needs F > 0" in sim.output()


TIMING = """
import json, os, statistics
from sglang.srt.entrypoints.http_server import Timing, SpecModel
factors = []
for seed in range(400):
    os.environ["SGLANG_SIM_NOISE_SEED"] = str(seed)
    factors.append(Timing(0.01, {}).process_factor)
os.environ["SGLANG_SIM_NOISE"] = "0"
quiet = Timing(0.01, {})
slow = Timing(0.01, {"slow_decode": "1.3"})
class Args:
    speculative_algorithm = "DFLASH"; speculative_num_draft_tokens = 16
print(json.dumps({"sd": statistics.pstdev(factors), "mean": statistics.mean(factors),
                  "quiet": [quiet.process_factor, quiet.request_factor(), quiet.prefill_seconds(256, 1.0)],
                  "slow": slow.decode(4.0), "spec": [SpecModel(Args, None).step_seconds(0.01, 8192),
                                                     SpecModel(Args, 1024).step_seconds(0.01, 8192)]}))
"""


def test_the_noise_model_per_process_drift_and_quiet_mode():
    out = run_python(TIMING)
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    assert 0.012 < figures["sd"] < 0.018 and figures["mean"] == pytest.approx(1.0, abs=0.005)  # SGLANG_SIM_DRIFT 0.015
    assert figures["quiet"] == [1.0, 1.0, pytest.approx(0.02)]  # one step plus one per 256 prompt tokens
    accept, step_factor = figures["slow"]
    assert accept == pytest.approx(4.0 / 1.3 ** 0.5) and accept / step_factor == pytest.approx(4.0 / 1.3)
    full, windowed = figures["spec"]
    assert full > windowed  # a window caps what the draft attends to
