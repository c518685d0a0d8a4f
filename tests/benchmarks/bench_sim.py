"""Benchmark the SGLang simulator (stdlib only; loopback only; bounded).

(a) load-to-ready accuracy: configured SGLANG_SIM_LOAD_SECONDS vs measured time
    from process start until POST /generate answers 200.
(b) concurrency: N simultaneous POST /generate (32, 64, 128); success count and latency.

Usage: python3 tests/benchmarks/bench_sim.py [--runs 3] [--loads 1,3,5] [--concurrency 32,64,128]
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

SIM_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "sglang_sim"))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(load, token_seconds="0.002"):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=SIM_DIR, SGLANG_SIM_LOAD_SECONDS=str(load),
               SGLANG_SIM_TOKEN_SECONDS=token_seconds, PYTHONWARNINGS="ignore")
    args = [sys.executable, "-m", "sglang.launch_server", "--model-path", "m", "--host", "127.0.0.1",
            "--port", str(port), "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "d",
            "--speculative-dflash-block-size", "16", "--speculative-dflash-draft-window-size", "2048"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def generate(url, max_new_tokens=64, timeout=60):
    body = json.dumps({"text": "benchmark", "sampling_params": {"max_new_tokens": max_new_tokens,
                                                                "temperature": 0}}).encode()
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read())


def load_to_ready(load, runs):
    measured = []
    for _i in range(runs):
        tic = time.monotonic()
        proc, url = start(load)
        try:
            while time.monotonic() - tic < load + 30:
                try:
                    if generate(url, 1, timeout=5)[0] == 200:
                        break
                except OSError:
                    time.sleep(0.01)
            measured.append(time.monotonic() - tic)
        finally:
            stop(proc)
    return measured


def concurrency(url, n):
    latencies, ok, errors = [], [0], []
    lock = threading.Lock()

    def one():
        tic = time.monotonic()
        try:
            status, _body = generate(url, 64)
            with lock:
                ok[0] += status == 200
                latencies.append(time.monotonic() - tic)
        except Exception as exc:  # noqa: BLE001 - report, don't crash
            with lock:
                errors.append(type(exc).__name__)

    threads = [threading.Thread(target=one) for _i in range(n)]
    tic = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ok[0], errors, latencies, time.monotonic() - tic


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--loads", default="1,3")
    parser.add_argument("--concurrency", default="32,64,128")
    opts = parser.parse_args()

    print("(a) load-to-ready: configured SGLANG_SIM_LOAD_SECONDS vs time until /generate answers 200")
    for load in [float(x) for x in opts.loads.split(",")]:
        measured = load_to_ready(load, opts.runs)
        print(f"  configured {load:5.2f} s  measured " + ", ".join(f"{m:.2f}" for m in measured)
              + f"  (mean overhead {statistics.mean(measured) - load:+.2f} s)")

    print("(b) concurrent POST /generate (max_new_tokens=64, token delay 2 ms)")
    proc, url = start(0.2)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if generate(url, 1, timeout=5)[0] == 200:
                    break
            except OSError:
                time.sleep(0.05)
        for n in [int(x) for x in opts.concurrency.split(",")]:
            ok, errors, lat, wall = concurrency(url, n)
            lat.sort()
            p50 = lat[len(lat) // 2] if lat else float("nan")
            p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")
            print(f"  {n:4d} in flight: {ok}/{n} ok, errors={sorted(set(errors)) or 'none'}, "
                  f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, wall {wall:.2f} s")
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
