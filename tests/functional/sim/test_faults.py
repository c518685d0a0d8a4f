"""Each SGLANG_SIM_FAULT and its observable effect."""
import json
import os
import signal
import time

from conftest import http

WINDOW = ["--speculative-dflash-draft-window-size", "2048"]


def test_ignore_window(start_sim):
    sim = start_sim(WINDOW, faults="ignore_window").wait_ready()
    info = json.loads(sim.get("/server_info")[2])
    assert info["speculative_dflash_draft_window_size"] == 2048  # the flag is still parsed
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_exit()
    assert "draft_window_size=None, compact_cache=False" in sim.output()


def test_crash_during_load(start_sim):
    sim = start_sim(faults="crash_during_load", load=0.5)
    rc = sim.wait_exit()
    out = sim.output()
    assert rc != 0
    assert "Scheduler hit an exception: " in out
    assert "Received sigquit from a child process. It usually means the child failed." in out
    assert "fired up" not in out
    assert out.index("Scheduler hit an exception") < out.index("Received sigquit")


def test_crash_after_ready(start_sim):
    sim = start_sim(faults="crash_after_ready=0.5").wait_ready()
    assert sim.wait_exit(timeout=10) != 0
    out = sim.output()
    assert "Scheduler hit an exception" in out and "SIGQUIT received." in out
    assert sim.get("/health")[0] == 0


def test_hang_during_load(start_sim):
    sim = start_sim(faults="hang_during_load", load=0.2)
    time.sleep(1.0)
    assert sim.proc.poll() is None
    assert sim.get("/health")[0] == 0


def test_slow_stop_keeps_answering(start_sim):
    sim = start_sim(faults="slow_stop=1.0").wait_ready()
    sim.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert sim.get("/v1/models")[0] == 200 and sim.get("/health")[0] == 200
    sim.wait_exit()
    assert sim.get("/health")[0] == 0


def test_health_ok_generate_hangs(start_sim):
    sim = start_sim(faults="health_ok_generate_hangs").wait_ready()
    assert sim.get("/health")[0] == 200
    try:
        sim.post("/generate", {"text": "x"}, timeout=1.0)
        hung = False
    except Exception:
        hung = True
    assert hung


def test_no_config_line(start_sim):
    sim = start_sim(WINDOW, faults="no_config_line").wait_ready()
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_exit()
    assert "Initialized DFLASH draft runner" not in sim.output()


def test_orphan_on_stop(start_sim):
    sim = start_sim(faults="orphan_on_stop").wait_ready()
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_exit()
    try:
        deadline = time.monotonic() + 3
        status = 0
        while time.monotonic() < deadline and status != 200:
            status = http("GET", sim.url + "/health", timeout=2)[0]
            time.sleep(0.05)
        assert status == 200  # someone outside the (dead) main process still answers
    finally:
        # the orphan left the process group's parent but kept the session: kill it
        try:
            os.killpg(sim.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_log_flood_before_config_line(start_sim):
    sim = start_sim(WINDOW, faults="log_flood=500").wait_ready()
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_exit()
    lines = sim.output().splitlines()
    flood = [i for i, l in enumerate(lines) if "Performance might be sub-optimal" in l]
    config = next(i for i, l in enumerate(lines) if "Initialized DFLASH draft runner" in l)
    assert len(flood) == 500 and max(flood) < config


def _config_lines(out):
    return [(i, l) for i, l in enumerate(out.splitlines()) if "Initialized DFLASH draft runner." in l]


def _accept_length(sim):
    body = {"text": "same prompt", "sampling_params": {"max_new_tokens": 200, "temperature": 0}}
    return json.loads(sim.post("/generate", body)[2])["meta_info"]["spec_accept_length"]


def test_reinit_draft_logs_a_second_config_line_before_the_port_opens(start_sim):
    sim = start_sim(WINDOW, faults="reinit_draft=64").wait_ready()
    reinit = _accept_length(sim)
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_exit()
    out = sim.output()
    lines = _config_lines(out)
    assert [l.split("] ", 1)[1] for _i, l in lines] == [
        "Initialized DFLASH draft runner. attention_backend=flashinfer, model=DFlashDraftModel, block_size=16, "
        "draft_window_size=2048, compact_cache=True",
        "Initialized DFLASH draft runner. attention_backend=flashinfer, model=DFlashDraftModel, block_size=16, "
        "draft_window_size=64, compact_cache=True",
    ]
    port_open = next(i for i, l in enumerate(out.splitlines()) if "Uvicorn running on" in l)
    assert lines[1][0] < port_open
    # the runtime behaves as the second worker: like a server started with window 64
    plain = start_sim(["--speculative-dflash-draft-window-size", "64"]).wait_ready()
    assert reinit == _accept_length(plain)
    wide = start_sim(WINDOW).wait_ready()
    assert _accept_length(wide) > reinit


def test_reinit_draft_none(start_sim):
    sim = start_sim(["--speculative-draft-window-size", "2048"], faults="reinit_draft=none",
                    version="0.5.23").wait_ready()
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_exit()
    lines = [l for _i, l in _config_lines(sim.output())]
    assert len(lines) == 2
    assert lines[0].endswith("draft_window_size=2048, compact_cache=True")
    assert lines[1].endswith("draft_window_size=None, compact_cache=False")


def test_reinit_draft_after_ready(start_sim):
    sim = start_sim(["--speculative-dflash-draft-window-size", "64"],
                    faults="reinit_draft_after_ready=0.5:none").wait_ready()
    before = _accept_length(sim)
    deadline = time.monotonic() + 5
    while len(_config_lines(sim.output())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    after = _accept_length(sim)
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_exit()
    out = sim.output().splitlines()
    lines = _config_lines(sim.output())
    fired = next(i for i, l in enumerate(out) if "The server is fired up and ready to roll!" in l)
    assert len(lines) == 2 and lines[0][0] < fired < lines[1][0]
    assert lines[1][1].endswith("draft_window_size=None, compact_cache=False")
    assert after > before  # the runtime switched to the new window (none: no window penalty)
