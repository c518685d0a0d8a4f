"""Per-release runtime surface: log prefixes, startup lines, /server_info, auth, /ready."""
import json
import re
import signal
import time

import pytest

TS = r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}"
PLAIN = ["--model-path", "/models/kimi-k2.6"]


def stop_and_log(sim):
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_exit()
    return sim.output()


def prefixes(out, message):
    """The rank tags of every line carrying ``message``."""
    return sorted(re.findall(TS + r"((?: [A-Z_]+\d+)*)\] " + re.escape(message), out))


@pytest.mark.parametrize("version,args,expected", [
    # configure_scheduler_process: DP, PP, ATTN_CP, MOE_DP, TP, EP; only dimensions > 1 (DP: when ranked)
    ("0.5.11", ["--tp-size", "4", "--attn-cp-size", "2"],
     [" ATTN_CP0 TP0", " ATTN_CP0 TP1", " ATTN_CP1 TP2", " ATTN_CP1 TP3"]),
    ("0.5.23", ["--tp-size", "4", "--moe-dp-size", "2", "--ep-size", "2"],
     [" MOE_DP0 TP0 EP0", " MOE_DP0 TP1 EP1", " MOE_DP1 TP2 EP0", " MOE_DP1 TP3 EP1"]),
    ("0.5.11", ["--tp-size", "4", "--dp-size", "2", "--enable-dp-attention", "--ep-size", "4"],
     [" DP0 TP0 EP0", " DP0 TP1 EP1", " DP1 TP2 EP2", " DP1 TP3 EP3"]),
    ("0.5.23", ["--tp-size", "2", "--attn-dp-size", "2"], [" DP0 TP0", " DP1 TP1"]),
    ("0.5.23", ["--tp-size", "2", "--dp-size", "2"], [" DP0 TP0", " DP0 TP1", " DP1 TP0", " DP1 TP1"]),
])
def test_rank_tags(start_sim, version, args, expected):
    sim = start_sim(args, version=version, base=PLAIN).wait_ready()
    # bootstrap.py: "Init torch distributed begin." up to 0.5.20, "Init parallel begin." from 0.5.21
    init = "Init parallel begin." if version >= "0.5.21" else "Init torch distributed begin."
    assert prefixes(stop_and_log(sim), init) == expected


def test_rank_tags_in_the_real_order(start_sim):
    args = ["--pp-size", "2", "--tp-size", "4", "--attn-cp-size", "2", "--moe-dp-size", "2", "--ep-size", "2"]
    sim = start_sim(args, version="0.5.23", base=PLAIN).wait_ready()
    tags = prefixes(stop_and_log(sim), "Load weight begin. avail mem=78.50 GB")
    assert len(tags) == 8
    assert " PP1 ATTN_CP1 MOE_DP1 TP3 EP1" in tags and " PP0 ATTN_CP0 MOE_DP0 TP0 EP0" in tags


def test_config_line_once_per_dp_replica(start_sim):
    # dflash_worker logs when tp_rank == 0: once per DP replica
    sim = start_sim(["--tp-size", "2", "--dp-size", "2"], version="0.5.23").wait_ready()
    out = stop_and_log(sim)
    assert prefixes(out, "Initialized DFLASH draft runner.") == [" DP0 TP0", " DP1 TP0"]


@pytest.mark.parametrize("version,has_scale", [("0.5.17", False), ("0.5.18", True), ("0.5.23", True)])
def test_noise_embed_scale_from_0_5_18(start_sim, version, has_scale):
    sim = start_sim(version=version).wait_ready()
    ready = [l for l in stop_and_log(sim).splitlines() if "DFLASH draft runner ready." in l]
    assert len(ready) == 1
    assert ready[0].endswith("mask_token_id_override=None" + (", noise_embed_scale=1.0" if has_scale else ""))


@pytest.mark.parametrize("version,form", [("0.5.11", "repr"), ("0.5.18", "repr"), ("0.5.19", "dict"),
                                          ("0.5.23", "dict")])
def test_first_line(start_sim, version, form):
    sim = start_sim(["--api-key", "k3y"], version=version).wait_ready()
    first = [l for l in stop_and_log(sim).splitlines() if "server_args=" in l]
    assert len(first) == 1
    body = first[0].split("] server_args=", 1)[1]
    if form == "repr":  # logger.info(f"{server_args=}"), fields resolved by __post_init__
        assert body.startswith("ServerArgs(model_path='/models/kimi-k2.6', tokenizer_path='/models/kimi-k2.6',")
        assert "api_key='k3y'" in body and "speculative_num_draft_tokens=16" in body
    else:  # server_args.resolved_dict()
        assert body.startswith("{'model_path': '/models/kimi-k2.6', 'tokenizer_path': '/models/kimi-k2.6',")
        assert "'api_key': 'k3y'" in body and "'speculative_num_draft_tokens': 16" in body


EXTRA_KEYS = ("launch_command", "startup_time", "kv_events", "frontend")


@pytest.mark.parametrize("version,extra,fields", [
    ("0.5.11", (), 368), ("0.5.14", ("kv_events",), 404), ("0.5.17", ("startup_time", "kv_events"), 458),
    ("0.5.20", ("launch_command", "startup_time", "kv_events"), 499),
    ("0.5.23", ("launch_command", "startup_time", "kv_events", "frontend"), 546),
])
def test_server_info_per_release(start_sim, version, extra, fields):
    window = "--speculative-dflash-draft-window-size" if version == "0.5.11" else "--speculative-draft-window-size"
    sim = start_sim([window, "2048", "--tp-size", "2", "--api-key", "k3y"], version=version).wait_ready()
    info = json.loads(sim.get("/server_info", headers={"Authorization": "Bearer k3y"})[2])
    for key in EXTRA_KEYS:
        assert (key in info) is (key in extra), key
    scheduler = {"status", "max_total_num_tokens", "max_req_input_len", "internal_states", "version"}
    scheduler |= {"hicache_object_layout"} if version == "0.5.23" else set()
    assert len(info) == fields + len(extra) + len(scheduler)
    # resolved values, not the raw nulls
    assert info["status"] == "ready" and info["version"] == version
    assert info["speculative_algorithm"] == "DFLASH" and info["speculative_num_draft_tokens"] == 16
    assert info["speculative_num_steps"] == 1 and info["speculative_eagle_topk"] == 1
    assert info["speculative_draft_model_revision"] == "main" and info["speculative_moe_runner_backend"] == "auto"
    assert info["speculative_draft_attention_backend"] == (None if version < "0.5.15" else "flashinfer")
    assert info["served_model_name"] == "/models/kimi-k2.6" and info["model_path"] == "/models/kimi-k2.6"
    assert info["tp_size"] == 2 and info["host"] == "127.0.0.1" and info["port"] == sim.port
    assert info["api_key"] == "k3y"  # real releases return it
    key = "speculative_dflash_draft_window_size" if version == "0.5.11" else "speculative_draft_window_size"
    assert info[key] == 2048 and info["max_running_requests"] == 48
    if "launch_command" in extra:
        assert info["launch_command"].endswith("--speculative-draft-window-size 2048 --tp-size 2 --api-key k3y")


@pytest.mark.parametrize("version,ready_route,ready_open", [
    ("0.5.19", False, False), ("0.5.20", True, True), ("0.5.23", True, True)])
def test_open_paths_without_the_key(start_sim, version, ready_route, ready_open):
    sim = start_sim(["--api-key", "k3y", "--enable-metrics"], version=version).wait_ready()
    for path in ("/health", "/health_generate", "/metrics"):
        assert sim.get(path)[0] == 200, path
    # /ready exists from 0.5.20 (empty body); the auth middleware runs before routing
    status, _headers, body = sim.get("/ready")
    assert status == (200 if ready_open else 401) and (body == b"" or not ready_open)
    assert sim.get("/ready", headers={"Authorization": "Bearer k3y"})[0] == (200 if ready_route else 404)
    assert sim.get("/metricsx")[0] == 404  # a prefix match: open, then not found
    assert sim.get("/v1/models")[0] == 401
    assert sim.get("/v1/models", headers={"Authorization": "bearer k3y"})[0] == 200  # scheme is case-insensitive
    assert sim.get("/v1/models", headers={"Authorization": "Bearer  k3y"})[0] == 401


def test_ready_is_503_while_stopping(start_sim):
    sim = start_sim(version="0.5.23", SGLANG_SIM_DRAIN_POLL_SECONDS="2").wait_ready()
    assert sim.get("/ready")[0] == 200
    sim.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    assert sim.get("/ready")[0] == 503  # gracefully_exit: not ready, still answering
    assert sim.wait_exit() == 0


@pytest.mark.parametrize("version,code", [("0.5.18", -signal.SIGKILL), ("0.5.19", 0)])
def test_stop_after_drain(start_sim, version, code):
    # sigterm_watchdog: kill_process_tree(os.getpid(), include_parent=True) up to 0.5.18
    sim = start_sim(version=version).wait_ready()
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit() == code
