"""Canary analysis (issue 31): how often a slower canary is caught, and how often equal settings pass.

For each slow-down factor F (--factors, default 1.0, 1.3, 2.0) the canary runs SGLANG_SIM_FAULT=slow_decode=F
(decode throughput / F, accept length lower, verification untouched; F = 1.0: no fault) and the baseline the
same settings without it. Each of --runs analyses starts from both servers restarted (each process draws its
own speed drift, as real servers differ), then runs the collection's analysis (plugins/module_utils/_canary.py,
what the action sglang_canary_analysis runs) with its defaults - 6 rounds per host of 32 streamed requests,
at most 8 in flight, 256-word prompts, 256 output tokens, ABBA - while --traffic-rps other requests go
through the router to both hosts.

Where: the benchmark lab (its first two hosts, gpufleet.inference.rollout deploys the settings; the real
sglang-router in front; the analysis runs on the controller against each host's own port), or with --no-lab
two simulator processes on loopback (the real router too when sglang-router is installed). The output says which.

Figures: per factor, verdicts (pass / regression / inconclusive) and the median analysis time. Targets (issue 31):
1.3x and 2x caught (regression) in >= 19 of 20 runs, equal settings pass in >= 19 of 20.

Usage: .venv/bin/python tests/benchmarks/bench_canary.py [--runs 20] [--factors 1.0,1.3,2.0] [--no-lab]
       [--token-seconds 0.01] [--traffic-rps 2] [--rounds 6] [--num-prompts 32] [--max-concurrency 8]
       [--input-len 256] [--output-len 256]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import benchlib as bl

sys.path.insert(0, str(bl.REPO / ".build" / "collections"))
bl.ensure_collection_link()

from ansible_collections.gpufleet.inference.plugins.module_utils import _canary  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils._router import RouterClient, RouterError  # noqa: E402

SIM = bl.REPO / "tests" / "sglang_sim"
PORT = 30000
TARGET_RUNS = 19  # of 20
WORDS = {"pass": "pass", "regression": "regression", "inconclusive": "inconclusive"}


def fault_of(factor: float) -> str:
    return "" if factor == 1.0 else f"slow_decode={factor:g}"


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_until(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def routes_to(router: str, urls: set[str]) -> bool:
    """Whether the router lists every one of urls as healthy (False while it does not answer)."""
    try:
        return urls <= {w["url"] for w in RouterClient(router).list_workers() if w["healthy"]}
    except RouterError:
        return False


class Traffic:
    """Other clients: small requests through the router at a steady rate while an analysis runs."""

    def __init__(self, router: str | None, rps: float):
        self.router, self.rps = router, rps
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        body = json.dumps({"text": "a request of another client", "sampling_params": {"max_new_tokens": 16}}).encode()
        while not self.stop.wait(1.0 / self.rps):
            request = urllib.request.Request(self.router + "/generate", data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=30).read()
                self.sent += 1
            except OSError:
                pass

    def __enter__(self):
        if self.router and self.rps > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(30)


# ------------------------------------------------------------------------------------ the lab

class LabPair:
    """The lab's first two hosts: canary and baseline, deployed by the rollout, restarted over SSH."""

    where = "lab"

    def __init__(self, token_seconds: float):
        hosts = bl.lab_hosts()
        if len(hosts) < 2:
            raise RuntimeError(f"the lab {bl.LAB['LAB_NAME']} has {len(hosts)} host(s); it needs 2 and its router")
        self.canary, self.baseline = hosts[0], hosts[1]
        self.router = bl.lab_vars().get("sglang_router_url")
        if not self.router:
            raise RuntimeError("the lab has no router (lab.py up --router)")
        self.token_seconds = token_seconds
        self.host_vars = bl.BUILD / "host_vars" / f"{self.canary['name']}.yml"
        self.limit = f"{self.canary['name']},{self.baseline['name']}"
        self.describe = (f"lab {bl.LAB['LAB_NAME']}: canary {self.canary['name']} ({self.canary['address']}), baseline "
                         f"{self.baseline['name']} ({self.baseline['address']}), real sglang-router {self.router}")

    def url(self, host: dict) -> str:
        return f"http://{host['address']}:{PORT}"

    def settings(self) -> dict:
        settings = bl.server_settings(2048, load=1.0, settle=0, tp=1)
        settings["sglang_environment"] = {"SGLANG_SIM_LOAD_SECONDS": "1", "SGLANG_SIM_ACCESS_LOG": "0",
                                          "SGLANG_SIM_TOKEN_SECONDS": str(self.token_seconds)}
        settings["sglang_extra_args"] = {"--enable-metrics": True}
        return settings

    def deploy(self, factor: float) -> None:
        settings = self.settings()
        bl.write_group_vars(settings)
        self.host_vars.parent.mkdir(parents=True, exist_ok=True)
        env = dict(settings["sglang_environment"], SGLANG_SIM_FAULT=fault_of(factor))
        self.host_vars.write_text("# Written by tests/benchmarks/bench_canary.py (the run in progress).\n---\n"
                                  + json.dumps({"sglang_environment": env}) + "\n")
        run = bl.rollout({"rollout_batches": ["100%"], "sglang_min_ready_seconds": 0}, limit=self.limit)
        active = [bl.sh(h["address"], "systemctl is-active sglang.service", check=False).strip()
                  for h in (self.canary, self.baseline)]
        if run.rc != 0 or active != ["active", "active"]:
            raise RuntimeError(f"deploying slow_decode={factor:g} failed (rc {run.rc}, units {active}):\n{run.tail(40)}")
        bl.set_fleet_window(None)  # other parts must not trust the fleet's state after this

    def restart(self) -> None:
        threads = [threading.Thread(target=bl.sh, args=(h["address"], "systemctl restart sglang.service"))
                   for h in (self.canary, self.baseline)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for host in (self.canary, self.baseline):
            wait_until(lambda h=host: http_ok(self.url(h) + "/health"), f"{host['name']} to answer")
        urls = {self.url(self.canary), self.url(self.baseline)}
        wait_until(lambda: routes_to(self.router, urls), "the router to route to both hosts again")

    def targets(self):
        return ({"name": self.canary["name"], "url": self.url(self.canary)},
                {"name": self.baseline["name"], "url": self.url(self.baseline)})

    def close(self) -> None:
        if self.host_vars.exists():
            self.host_vars.unlink()


# ----------------------------------------------------------------------------------- no lab

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def router_command() -> list[str] | None:
    exe = Path(sys.executable).parent / "sglang-router"
    return [str(exe), "launch"] if exe.exists() else None


class LocalPair:
    """Two simulator processes on loopback, restarted for every run, behind the real router if installed."""

    where = "simulator processes"

    def __init__(self, token_seconds: float):
        self.token_seconds = token_seconds
        self.ports = {"canary": free_port(), "baseline": free_port()}
        self.procs: dict[str, subprocess.Popen] = {}
        self.fault = ""
        self.router_proc = None
        self.router = None
        command = router_command()
        if command:
            port = free_port()
            self.router = f"http://127.0.0.1:{port}"
            self.router_proc = subprocess.Popen(
                command + ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
                           "--prometheus-port", str(free_port()), "--policy", "round_robin", "--worker-urls",
                           *(self.url(role) for role in ("canary", "baseline"))],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.describe = ("two simulator processes on 127.0.0.1" +
                         (", real sglang-router in front" if self.router else ", no router (sglang-router missing)"))

    def url(self, role: str) -> str:
        return f"http://127.0.0.1:{self.ports[role]}"

    def deploy(self, factor: float) -> None:
        self.fault = fault_of(factor)

    def _stop(self, role: str) -> None:
        proc = self.procs.pop(role, None)
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)

    def restart(self) -> None:
        for role in ("canary", "baseline"):
            self._stop(role)
            env = dict(os.environ, PYTHONPATH=str(SIM), SGLANG_SIM_LOAD_SECONDS="0.5", SGLANG_SIM_ACCESS_LOG="0",
                       SGLANG_SIM_TOKEN_SECONDS=str(self.token_seconds),
                       SGLANG_SIM_FAULT=self.fault if role == "canary" else "")
            self.procs[role] = subprocess.Popen(
                [sys.executable, "-m", "sglang.launch_server", "--model-path", "/models/moonshotai/Kimi-K2.6",
                 "--host", "127.0.0.1", "--port", str(self.ports[role]), "--enable-metrics",
                 "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/models/dflash",
                 "--speculative-num-draft-tokens", "16"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for role in ("canary", "baseline"):
            wait_until(lambda r=role: http_ok(self.url(r) + "/health"), f"the {role} simulator")
        if self.router:
            wait_until(lambda: routes_to(self.router, {self.url("canary"), self.url("baseline")}), "the router")

    def targets(self):
        return ({"name": "canary", "url": self.url("canary")}, {"name": "baseline", "url": self.url("baseline")})

    def close(self) -> None:
        for role in list(self.procs):
            self._stop(role)
        if self.router_proc is not None:
            try:
                os.killpg(self.router_proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.router_proc.wait(timeout=10)


# ------------------------------------------------------------------------------------ figures

def analyse_once(pair, args) -> dict:
    canary, baseline = pair.targets()
    params = {"canary": canary, "baseline": baseline, "rounds": args.rounds, "router_url": pair.router,
              "workload": {"num_prompts": args.num_prompts, "max_concurrency": args.max_concurrency,
                           "input_len": args.input_len, "output_len": args.output_len}}
    analysis = _canary.Analysis.prepare(params)
    with Traffic(pair.router, args.traffic_rps):
        started = time.monotonic()
        result = analysis.run()
        result["wall"] = time.monotonic() - started
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--factors", default="1.0,1.3,2.0")
    parser.add_argument("--no-lab", action="store_true", help="simulator processes on loopback instead of the lab")
    parser.add_argument("--token-seconds", type=float, default=0.01, help="the simulator's step time")
    parser.add_argument("--traffic-rps", type=float, default=2.0, help="other requests per second through the router")
    parser.add_argument("--rounds", type=int, default=_canary.DEFAULT_ROUNDS)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-concurrency", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--keep-reports", type=Path, help="write each run's report under this directory")
    args = parser.parse_args()
    factors = [float(f) for f in args.factors.split(",") if f]
    pair = LocalPair(args.token_seconds) if args.no_lab else LabPair(args.token_seconds)
    rows = []
    outcomes = {}
    try:
        for factor in factors:
            bl.log(f"slow_decode={factor:g}: deploying ({pair.where})")
            pair.deploy(factor)
            verdicts = Counter()
            walls = []
            notes = Counter()
            for run in range(1, args.runs + 1):
                pair.restart()
                result = analyse_once(pair, args)
                verdicts[result["verdict"]] += 1
                walls.append(result["wall"])
                for row in result["metrics"]:
                    if row["verdict"] in ("regression", "inconclusive"):
                        notes[f"{row['metric']} {row['verdict']}"] += 1
                for line in result["critical"]:
                    notes["critical: " + line.split(":")[0]] += 1
                if args.keep_reports:
                    _canary.write_report(result, str(args.keep_reports / f"{factor:g}x-run{run:02d}"))
                bl.log(f"slow_decode={factor:g} run {run}/{args.runs}: {result['verdict']} in {result['wall']:.0f} s"
                       + ("" if result["verdict"] == ("pass" if factor == 1.0 else "regression")
                          else f" - {result['message'][:400]}"))
            outcomes[factor] = verdicts
            expected = "pass" if factor == 1.0 else "regression"
            rows.append([f"{factor:g}x" + (" (equal settings)" if factor == 1.0 else ""), args.runs,
                         verdicts["pass"], verdicts["regression"], verdicts["inconclusive"],
                         f"{verdicts[expected]}/{args.runs} {expected}", bl.fmt(bl.median(walls), 0, " s"),
                         bl.fmt(max(walls), 0, " s"),
                         ", ".join(f"{k} x{v}" for k, v in sorted(notes.items())) or "-"])
    finally:
        pair.close()
    print(f"### Canary analysis: detection and false alarms ({pair.where})\n")
    print(f"Where: {pair.describe}. Analysis: {args.rounds} rounds per host (ABBA) of {args.num_prompts} streamed "
          f"requests, at most {args.max_concurrency} in flight, {args.input_len}-word prompts, {args.output_len} output "
          f"tokens, default thresholds; both servers restarted before every run; {args.traffic_rps:g} other "
          f"requests/s through the router; simulator step {args.token_seconds:g} s.\n")
    print(bl.table(["canary decode", "runs", "pass", "regression", "inconclusive", "expected verdict",
                    "analysis time (median)", "max", "metrics flagged (runs)"], rows))
    print()
    need = max(1, round(args.runs * TARGET_RUNS / 20))
    for factor, verdicts in outcomes.items():
        if factor == 1.0:
            bl.summary("canary", f"equal settings pass ({pair.where})", f"{verdicts['pass']}/{args.runs}",
                       f">= {need}/{args.runs}", verdicts["pass"] >= need)
        else:
            bl.summary("canary", f"{factor:g}x slower decode caught ({pair.where})",
                       f"{verdicts['regression']}/{args.runs}", f">= {need}/{args.runs}", verdicts["regression"] >= need)
    return 0


if __name__ == "__main__":
    sys.exit(main())
