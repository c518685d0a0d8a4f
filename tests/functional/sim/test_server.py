"""Runtime behaviour of the simulator: logs, lifecycle, HTTP API, auth."""
import json
import re
import signal
import threading
import time


TS = r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}"
# literal format strings copied from SGLang's source (dflash_worker.py, 0.5.11 and 0.5.23)
DFLASH_FMT = ("Initialized DFLASH draft runner. attention_backend=%s, model=%s, block_size=%s, "
              "draft_window_size=%s, compact_cache=%s")
FIRED = "The server is fired up and ready to roll!"
SIGTERM_LINE = "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."


def stop_and_log(sim):
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_exit()
    return sim.output()


def test_dflash_startup_log_tp1(start_sim):
    sim = start_sim(["--speculative-dflash-draft-window-size", "2048"]).wait_ready()
    out = stop_and_log(sim)
    lines = out.splitlines()
    expected = DFLASH_FMT % ("flashinfer", "DFlashDraftModel", 16, 2048, True)
    config = [l for l in lines if "Initialized DFLASH draft runner" in l]
    assert len(config) == 1
    assert re.fullmatch(TS + r"\] " + re.escape(expected), config[0]), config[0]
    order = ["server_args=ServerArgs(", "Load weight begin. avail mem=", "Loading safetensors checkpoint shards: ",
             "Load weight end. elapsed=", "KV Cache is allocated. #tokens: ", "Capture cuda graph begin.",
             "Capture cuda graph end.", "Initialized DFLASH draft runner.", "DFLASH draft runner ready. mask_token=",
             "max_total_num_tokens=", "INFO:     Started server process [", "INFO:     Uvicorn running on http://127.0.0.1:",
             FIRED, SIGTERM_LINE]
    positions = [next(i for i, l in enumerate(lines) if s in l) for s in order]
    assert positions == sorted(positions)
    assert re.search(r"Loading safetensors checkpoint shards:  50% Completed \| 2/4 \[", out)
    assert "(Press CTRL+C to quit)" in out
    assert not re.search(r"\[\S+ \S+ TP0\]", out)  # tp=1: no rank tag


def test_dflash_startup_log_tp8_rank_tags(start_sim):
    sim = start_sim(["--tp-size", "8"], SGLANG_LOG_MS="1").wait_ready()
    out = stop_and_log(sim)
    config = [l for l in out.splitlines() if "Initialized DFLASH draft runner" in l]
    assert len(config) == 1  # TP rank 0 only, once
    expected = DFLASH_FMT % ("flashinfer", "DFlashDraftModel", 16, None, False)
    assert re.fullmatch(TS + r"\.\d{3} TP0\] " + re.escape(expected), config[0]), config[0]
    assert len(re.findall(r" TP\d\] Load weight begin", out)) == 16  # 8 target + 8 draft
    assert re.search(TS + r"\.\d{3}\] " + re.escape(FIRED), out)


def test_ep_and_dp_tags(start_sim):
    sim = start_sim(["--tp-size", "4", "--ep-size", "4"]).wait_ready()
    out = stop_and_log(sim)
    assert re.search(TS + r" TP3 EP3\] Load weight begin", out)


def test_port_closed_while_loading_then_health(start_sim):
    sim = start_sim(load=1.5)
    time.sleep(0.5)
    status, _headers, _body = sim.get("/health")
    assert status == 0  # connection refused
    sim.wait_ready()
    assert sim.get("/health")[0] == 200
    assert sim.get("/health_generate")[0] == 200


def test_generate_shape_and_determinism(start_sim):
    sim = start_sim(["--speculative-dflash-draft-window-size", "1024"]).wait_ready()
    body = {"text": "Tell me about GPUs", "sampling_params": {"max_new_tokens": 32, "temperature": 0}}
    status, headers, raw = sim.post("/generate", body)
    assert status == 200
    data = json.loads(raw)
    meta = data["meta_info"]
    assert data["text"] and len(data["output_ids"]) == 32
    assert meta["finish_reason"] == {"type": "length", "length": 32}
    for key in ("id", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency",
                "spec_verify_ct", "spec_accept_length", "spec_accept_rate"):
        assert key in meta
    assert meta["completion_tokens"] == 32 and meta["sim_worker"] == f"127.0.0.1:{sim.port}"
    again = json.loads(sim.post("/generate", body)[2])
    assert again["text"] == data["text"]
    assert again["meta_info"]["cached_tokens"] > 0
    ids = json.loads(sim.post("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}})[2])
    assert ids["meta_info"]["prompt_tokens"] == 3


def test_generate_bad_requests(start_sim):
    sim = start_sim().wait_ready()
    for body in ({"sampling_params": {}}, {"text": "x", "sampling_params": {"max_new_tokens": -1}}):
        status, _headers, raw = sim.post("/generate", body)
        assert status == 400
        assert isinstance(json.loads(raw)["error"]["message"], str)


def test_accept_length_follows_settings(start_sim):
    results = {}
    for block, window in ((8, 16), (16, 64), (16, 4096)):
        base = ["--model-path", "m", "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "d",
                "--speculative-dflash-block-size", str(block), "--speculative-dflash-draft-window-size", str(window)]
        sim = start_sim(base=base).wait_ready()
        body = {"text": "same", "sampling_params": {"max_new_tokens": 200, "temperature": 0}}
        meta = json.loads(sim.post("/generate", body)[2])["meta_info"]
        results[(block, window)] = meta["spec_accept_length"]
        sim.kill()
    assert results[(16, 4096)] > results[(16, 64)] > results[(8, 16)]


def test_server_info_and_model_endpoints(start_sim):
    sim = start_sim(["--speculative-dflash-draft-window-size", "2048", "--served-model-name", "k2"]).wait_ready()
    info = json.loads(sim.get("/server_info")[2])
    assert info["speculative_dflash_draft_window_size"] == 2048
    # "status" comes from the scheduler's init info: always "ready" (tokenizer_manager's Up is not exposed)
    assert info["version"] == "0.5.11" and info["status"] == "ready" and info["tp_size"] == 1
    assert "avg_spec_accept_length" in info["internal_states"][0]
    assert json.loads(sim.get("/get_server_info")[2])["port"] == sim.port
    models = json.loads(sim.get("/v1/models")[2])
    assert models["object"] == "list" and models["data"][0]["id"] == "k2"
    assert models["data"][0]["owned_by"] == "sglang"
    for path in ("/model_info", "/get_model_info"):
        assert json.loads(sim.get(path)[2])["model_path"] == "/models/kimi-k2.6"
    assert sim.get("/metrics")[0] == 404  # metrics disabled by default


def test_server_info_key_new_name(start_sim):
    sim = start_sim(["--speculative-draft-window-size", "512"], version="0.5.23").wait_ready()
    info = json.loads(sim.get("/server_info")[2])
    assert info["speculative_draft_window_size"] == 512 and info["version"] == "0.5.23"
    assert "speculative_dflash_draft_window_size" not in info
    assert sim.get("/ready")[0] == 200


def test_metrics(start_sim):
    sim = start_sim(["--enable-metrics"]).wait_ready()
    sim.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 10}})
    status, _headers, raw = sim.get("/metrics")
    text = raw.decode()
    assert status == 200
    for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:generation_tokens_total"):
        assert re.search(rf"^{name}\{{.*\}} [0-9.]+$", text, re.M), name


def test_api_key(start_sim):
    sim = start_sim(["--api-key", "sekret", "--enable-metrics"]).wait_ready()
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, _headers, raw = sim.get("/v1/models", headers=headers)
        assert status == 401 and json.loads(raw) == {"error": "Unauthorized"}
        assert sim.post("/generate", {"text": "x"}, headers=headers)[0] == 401
    good = {"Authorization": "Bearer sekret"}
    assert sim.get("/v1/models", headers=good)[0] == 200
    for path in ("/health", "/health_generate", "/metrics"):
        assert sim.get(path)[0] == 200


def test_32_concurrent_generates(start_sim):
    sim = start_sim(SGLANG_SIM_TOKEN_SECONDS="0.01").wait_ready()
    results = []

    def one(i):
        body = {"text": f"req {i}", "sampling_params": {"max_new_tokens": 50}}
        status, _headers, raw = sim.post("/generate", body, timeout=30)
        results.append(status)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    tic = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(200) == 32
    assert time.monotonic() - tic < 5  # served concurrently, not one by one


def test_decode_batch_lines(start_sim):
    sim = start_sim().wait_ready()
    sim.post("/generate", {"text": "long", "sampling_params": {"max_new_tokens": 400}})
    out = stop_and_log(sim)
    lines = [l for l in out.splitlines() if "Decode batch" in l]
    assert lines
    assert re.search(r"\] Decode batch, #running-req: \d+, #token: \d+, token usage: [0-9.]+, "
                     r"accept len: [0-9.]+, accept rate: [0-9.]+, cuda graph: True, "
                     r"gen throughput \(token/s\): [0-9.]+, #queue-req: 0$", lines[0])


def test_ddtree(start_sim):
    base = ["--model-path", "m", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "d",
            "--speculative-dflash-block-size", "8", "--speculative-ddtree-tree-budget", "32"]
    sim = start_sim(base=base, SGLANG_SIM_DDTREE="1").wait_ready()  # a private build with DDTree
    assert json.loads(sim.post("/generate", {"text": "x"})[2])["meta_info"]["spec_accept_length"] > 1
    out = stop_and_log(sim)
    assert re.search(TS + r"\] Initialized DDTree worker. block_size=8, tree_budget=32, max_tree_nodes=33$", out, re.M)


# ---- stopping ---------------------------------------------------------------

def test_sigterm_0_5_11_drains_then_sigkills_itself(start_sim):
    sim = start_sim(SGLANG_SIM_TOKEN_SECONDS="0.01").wait_ready()
    result = {}
    worker = threading.Thread(target=lambda: result.update(
        # ~1 s of generation: still in flight when /health is asked, even on a loaded machine
        r=sim.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 400}}, timeout=30)))
    worker.start()
    time.sleep(0.2)
    sim.proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    assert sim.get("/health")[0] == 503
    worker.join()
    assert result["r"][0] == 200  # in-flight request drained
    assert sim.wait_exit() == -signal.SIGKILL
    out = sim.output()
    assert SIGTERM_LINE in out and "Gracefully exiting... Remaining number of requests 0." in out


def test_sigterm_0_5_23_exits_cleanly(start_sim):
    sim = start_sim(["--speculative-draft-window-size", "64"], version="0.5.23").wait_ready()
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit() == 0
    out = sim.output()
    assert SIGTERM_LINE in out and "INFO:     Finished server process [" in out


def test_sigterm_during_load_dies_at_once(start_sim):
    sim = start_sim(load=5)
    time.sleep(0.3)
    tic = time.monotonic()
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit(timeout=3) == -signal.SIGTERM
    assert time.monotonic() - tic < 1
