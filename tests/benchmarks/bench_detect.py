"""P1 detection latency: how long after the new process can first answer /generate does the wait return?

On one host of the benchmark lab, a unit of its own (gpf-bench-p1.service, port 30100, the
simulator with tp 8 and a DFLASH config line) is restarted --restarts times per method, with
simulated loads spread evenly over --loads (shuffled, the same loads for every method, methods
rotated per restart so drift on a shared machine hits them alike). Methods, all in the same run:

  module        gpufleet.inference.sglang_ready, min_ready_seconds 0, poll_interval 0.25 (default)
  module_poll5  the same with poll_interval 5 (the previous design's 5 s cadence)
  uri           ansible.builtin.uri POST /generate, until/retries/delay 5 (the common pattern)
  module_1call  diagnostic: the module with slice_seconds 0 (the whole wait in one module run, no
                progress lines), which separates the cost of the action plugin's slices (a new
                module process every slice and at every startup phase) from the wait itself

Ready moment: an independent prober on the controller (a thread of this script) arms when the
old process's port refuses connections, then POSTs /generate (max_new_tokens 1, a new connection
each time) every --probe-interval seconds; the send time of its first 200 is the moment the new
process could first answer (resolution: the gap to its previous attempt, printed). Chosen over
"the first access-log line of a 200 /generate" because that line is often the method's own
request (or, in the simulator, its warmup): measuring from it hides exactly the polling delay
under test. The access-log time is printed as a cross-check.

Return moment: the wait task's result as the bench_times callback plugin records it (inside
ansible-playbook, so its start-up and the earlier tasks are not counted).

Host CPU of a wait: the difference, between the wait task's start and its result, of the CPU of
the lab host's sshd processes and the commands they reaped (the module's processes, one per
slice, with their journalctl/systemctl children), read from /proc on the controller (the lab
shares its kernel). Reported per wait-minute; --cpu-load runs one long wait per method for it.

Usage: .venv/bin/python tests/benchmarks/bench_detect.py [--restarts 10] [--loads 3:9]
       [--cpu-load 60] [--methods module,module_poll5,uri,module_1call]
"""
from __future__ import annotations

import argparse
import calendar
import http.client
import json
import random
import socket
import sys
import threading
import time

import benchlib as bl

UNIT = "gpf-bench-p1.service"
PORT = 30100
PLAYBOOK = bl.HERE / "playbooks" / "p1_wait.yml"
METHODS = {
    "module": {"bench_method": "module", "bench_poll_interval": 0.25, "bench_slice_seconds": 30},
    "module_poll5": {"bench_method": "module_poll5", "bench_poll_interval": 5, "bench_slice_seconds": 30},
    "uri": {"bench_method": "uri", "bench_poll_interval": 0.25, "bench_slice_seconds": 30},
    "module_1call": {"bench_method": "module_1call", "bench_poll_interval": 0.25, "bench_slice_seconds": 0},
    "module_slice10": {"bench_method": "module_slice10", "bench_poll_interval": 0.25, "bench_slice_seconds": 10},
}
LABELS = {
    "module": "sglang_ready, poll_interval 0.25 (new)",
    "module_poll5": "sglang_ready, poll_interval 5 (previous cadence)",
    "uri": "uri POST /generate, until/retries/delay 5 (common pattern)",
    "module_1call": "sglang_ready, poll_interval 0.25, slice_seconds 0: one module call (diagnostic)",
    "module_slice10": "sglang_ready, slice_seconds 10 (the previous default; long wait only)",
}
# The long wait (--cpu-load) also runs these: what the slice length costs the controller over a long load.
LONG_ONLY = ("module_slice10",)
TARGET_MEDIAN = 0.3


class Prober(threading.Thread):
    """Arms when the port refuses (the old process is gone), then POSTs /generate until a 200."""

    def __init__(self, address, port, interval):
        super().__init__(daemon=True)
        self.address, self.port, self.interval = address, port, interval
        self.stop = threading.Event()
        self.armed_at = self.first_ok = self.previous_try = None
        self.attempts = 0

    def _generate(self) -> bool:
        conn = http.client.HTTPConnection(self.address, self.port, timeout=5)
        try:
            body = json.dumps({"text": "ping", "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
            conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def run(self):
        while not self.stop.is_set():
            tick = time.time()
            if self.armed_at is None:
                try:
                    socket.create_connection((self.address, self.port), timeout=0.5).close()
                except ConnectionRefusedError:
                    self.armed_at = tick
                except OSError:
                    pass
            else:
                self.attempts += 1
                if self._generate():
                    self.first_ok = tick
                    return
                self.previous_try = tick
            self.stop.wait(max(0.0, tick + self.interval - time.time()))


def install_unit(address: str) -> None:
    flag = bl.window_flag(bl.sim_version(address))
    exec_start = (f"/opt/sglang/venv/bin/python -m sglang.launch_server --model-path m --tp-size 8 "
                  f"--host {address} --port {PORT} --speculative-algorithm DFLASH "
                  f"--speculative-draft-model-path d --speculative-num-draft-tokens 16 {flag} 2048")
    unit = ("[Service]\nEnvironmentFile=/etc/gpf-bench-p1.env\n"
            "Environment=SGLANG_SIM_DRAIN_POLL_SECONDS=0.2 SGLANG_LOG_MS=1\n"
            f"ExecStart={exec_start}\n")
    bl.sh(address, f"printf 'SGLANG_SIM_LOAD_SECONDS=1\\n' > /etc/gpf-bench-p1.env && "
                   f"printf '%s' '{unit}' > /etc/systemd/system/{UNIT} && systemctl daemon-reload && "
                   f"systemctl restart {UNIT}")
    deadline = time.monotonic() + 120
    while True:
        prober = Prober(address, PORT, 0.05)
        prober.armed_at = time.time()
        prober.start()
        prober.join(timeout=5)
        prober.stop.set()
        if prober.first_ok is not None:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{UNIT} on {address} never answered /generate")


def remove_unit(address: str) -> None:
    bl.sh(address, f"systemctl stop {UNIT}; rm -f /etc/systemd/system/{UNIT} /etc/gpf-bench-p1.env; "
                   "systemctl daemon-reload; true", check=False)


def access_log_first_ok(address: str, invocation: str | None) -> float | None:
    if not invocation:
        return None
    for entry in bl.journal(address, f"_SYSTEMD_INVOCATION_ID={invocation}"):
        if '"POST /generate HTTP/1.1" 200' in str(entry.get("MESSAGE", "")):
            return entry["t"]
    return None


def cpu_of(start_event, end_event, host) -> tuple[float | None, float | None]:
    try:
        a, b = start_event["host_cpu"][host], end_event["host_cpu"][host]
    except (KeyError, TypeError):
        return None, None
    if a["processes"] != b["processes"]:
        return None, None  # an sshd session ended in between: its commands' CPU left our sum
    return b["commands"] - a["commands"], b["sshd"] - a["sshd"]


def one(host, method, load, probe_interval, pidns):
    prober = Prober(host["address"], PORT, probe_interval)
    prober.start()
    extra = dict(METHODS[method], bench_host=host["name"], bench_load=load, bench_unit=UNIT, bench_port=PORT)
    run = bl.playbook(PLAYBOOK, extra_vars=extra, env={"GPF_BENCH_HOST_PIDNS": json.dumps({host["name"]: pidns})
                                                       if pidns else ""})
    prober.stop.set()
    prober.join(timeout=10)
    wait_task = "Bench wait uri" if method == "uri" else "Bench wait module"
    starts = run.task_starts(wait_task)
    ends = [e for e in run.results(wait_task) if e["kind"] in ("ok", "failed")]
    row = {"method": method, "load": load, "rc": run.rc, "ok": run.rc == 0 and bool(ends) and ends[0]["kind"] == "ok"}
    if not ends or not starts:
        row["error"] = "wait task did not run: " + run.tail(15)
        return row
    end, start = ends[0], starts[0]
    result = end.get("result") or {}
    row.update(t_end=end["t"], t_start=start["t"], wait=end["t"] - start["t"], ready=prober.first_ok,
               resolution=(prober.first_ok - prober.previous_try) if prober.first_ok and prober.previous_try else None,
               verdict=result.get("verdict"), invocation=result.get("invocation_id"))
    if prober.first_ok is not None:
        row["latency"] = end["t"] - prober.first_ok
    gen_at = ((result.get("phases") or {}).get("generate") or {}).get("at")
    if gen_at and prober.first_ok:
        row["module_generate"] = calendar.timegm(time.strptime(gen_at[:19], "%Y-%m-%dT%H:%M:%S")) \
            + float("0" + gen_at[19:-1]) - prober.first_ok
    row["cpu_commands"], row["cpu_sshd"] = cpu_of(start, end, host["name"])
    # The whole ansible-playbook run's CPU (its start-up and the other tasks are the same for every method).
    row["controller_cpu"], row["module_runs"] = run.cpu, result.get("module_runs")
    if not row.get("invocation"):
        row["invocation"] = bl.sh(host["address"], f"systemctl show -p InvocationID --value {UNIT}").strip()
    access = access_log_first_ok(host["address"], row["invocation"])
    if access is not None and prober.first_ok is not None:
        row["access_vs_prober"] = access - prober.first_ok
    if not row["ok"]:
        row["error"] = (result.get("msg") or run.tail(15))[:500]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=10, help="restarts per method (default 10)")
    parser.add_argument("--loads", default="3:9", help="simulated loads, spread evenly over LO:HI seconds")
    parser.add_argument("--methods", default="module,module_poll5,uri,module_1call")
    parser.add_argument("--cpu-load", type=float, default=60.0,
                        help="load of one extra long wait per method for the CPU figure (0: none)")
    parser.add_argument("--probe-interval", type=float, default=0.015)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--no-lab", action="store_true", help="use the benchmark lab as it is (no lab.py up)")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    lo, hi = (float(x) for x in args.loads.split(":"))
    n = args.restarts
    loads = [round(lo + (hi - lo) * i / max(1, n - 1), 2) for i in range(n)]
    random.Random(args.seed).shuffle(loads)

    if not args.no_lab:
        ok, out = bl.lab_up(1)
        if not ok:
            print(f"P1: the lab did not boot:\n```\n{out[-3000:]}\n```")
            return 1
    host = bl.lab_hosts()[0]
    pidns = bl.host_pidns(host["name"])
    bl.log(f"P1 on {host['name']} ({host['address']}), {n} restarts x {len(methods)} methods, loads {loads}")
    install_unit(host["address"])
    rows = []
    try:
        for i, load in enumerate(loads):
            order = methods[i % len(methods):] + methods[:i % len(methods)]
            for method in order:
                row = one(host, method, load, args.probe_interval, pidns)
                rows.append(row)
                bl.log(f"  restart {i + 1}/{n} {method:<12} load {load:4.1f} s: "
                       f"{'ok' if row['ok'] else 'FAILED'} ready->return {bl.fmt(row.get('latency'), 3)} s, "
                       f"wait {bl.fmt(row.get('wait'), 1)} s, host CPU {bl.fmt(row.get('cpu_commands'), 2)} s")
        long_rows = []
        if args.cpu_load > 0:
            for method in methods + [m for m in LONG_ONLY if m not in methods]:
                row = one(host, method, args.cpu_load, args.probe_interval, pidns)
                long_rows.append(row)
                bl.log(f"  long wait {method:<12} load {args.cpu_load:.0f} s: wait {bl.fmt(row.get('wait'), 1)} s, "
                       f"host CPU {bl.fmt(row.get('cpu_commands'), 2)} s")
    finally:
        remove_unit(host["address"])
    report(rows, long_rows, methods, n, loads, args)
    return 0


def report(rows, long_rows, methods, n, loads, args):
    print(f"### P1 detection latency ({n} restarts per method, loads {min(loads)}-{max(loads)} s, "
          f"min_ready_seconds 0)\n")
    print("Latency = the wait task's result (bench_times callback) minus the first 200 of a controller-side "
          f"prober POSTing /generate every {args.probe_interval * 1000:.0f} ms. Same restarts, same loads, "
          "methods interleaved. No settle window here (min_ready_seconds 0): in a rollout it adds exactly "
          "sglang_min_ready_seconds on purpose (P3 reports it separately).\n")
    headers = ["method", "ok", "median s", "p90 s", "max s", "min s", "target median <= 0.3 s"]
    out = []
    for method in methods:
        lat = [r["latency"] for r in rows if r["method"] == method and r.get("ok") and r.get("latency") is not None]
        okc = sum(1 for r in rows if r["method"] == method and r.get("ok"))
        target = bl.verdict(bl.median(lat) <= TARGET_MEDIAN) if method == "module" and lat else \
            "(diagnostic)" if method == "module_1call" else "(baseline)"
        out.append([LABELS[method], f"{okc}/{sum(1 for r in rows if r['method'] == method)}",
                    bl.fmt(bl.median(lat), 3), bl.fmt(bl.pct(lat, 0.9), 3), bl.fmt(max(lat) if lat else None, 3),
                    bl.fmt(min(lat) if lat else None, 3), target])
    print(bl.table(headers, out))
    res = [r["resolution"] for r in rows if r.get("resolution") is not None]
    acc = [r["access_vs_prober"] for r in rows if r.get("access_vs_prober") is not None]
    inside = []
    for method in methods:
        mod = [r["module_generate"] for r in rows if r["method"] == method and r.get("module_generate") is not None]
        lat = [r["latency"] for r in rows if r["method"] == method and r.get("latency") is not None
               and r.get("module_generate") is not None]
        if mod:
            inside.append(f"{method}: {bl.fmt(bl.median(mod), 3)} s to its first good /generate, then "
                          f"{bl.fmt(bl.median([a - b for a, b in zip(lat, mod)]), 3)} s to the task's result")
    if inside:
        print("Inside the module (phases.generate.at, 10 ms resolution; medians): " + "; ".join(inside) + ". The "
              "first part is the wait's own detection (plus any module start-up of a new slice that fell on the "
              "moment the port opened); the second is the result's way back (module exit, ssh, result processing).")
    print("\nPer restart (seconds):\n")
    per = []
    for r in rows:
        per.append([r["method"], r["load"], "ok" if r.get("ok") else "FAILED", bl.fmt(r.get("latency"), 3),
                    bl.fmt(r.get("wait"), 2), bl.fmt(r.get("module_generate"), 3), bl.fmt(r.get("cpu_commands"), 2),
                    (r.get("error") or "").replace("\n", " ").replace("|", "/")[:160]])
    print(bl.table(["method", "load", "result", "ready->return", "wait task", "ready->module /generate",
                    "host CPU s", "error"], per))
    print("\n#### Host CPU of the wait (module processes + their journalctl/systemctl children; sshd's own "
          "transport in brackets)\n")
    cpu_rows = []
    for method in methods:
        sel = [r for r in rows if r["method"] == method and r.get("cpu_commands") is not None and r.get("wait")]
        wait = sum(r["wait"] for r in sel)
        cmd = sum(r["cpu_commands"] for r in sel)
        ssh = sum(r["cpu_sshd"] for r in sel)
        lrow = [r for r in long_rows if r["method"] == method and r.get("cpu_commands") is not None]
        long_text = "-"
        if lrow:
            lr = lrow[0]
            long_text = (f"{lr['cpu_commands'] / lr['wait'] * 60:.2f} ({lr['cpu_sshd'] / lr['wait'] * 60:.2f}) "
                         f"over a {lr['wait']:.0f} s wait")
        cpu_rows.append([LABELS[method], f"{len(sel)}", bl.fmt(wait, 0), bl.fmt(cmd, 2),
                         f"{bl.fmt(cmd / wait * 60 if wait else None, 2)} ({bl.fmt(ssh / wait * 60 if wait else None, 2)})",
                         long_text])
    print(bl.table(["method", "waits", "wait s total", "CPU s total", "CPU s per wait-minute (sshd)",
                    f"long wait (load {args.cpu_load:.0f} s): CPU s per wait-minute (sshd)"], cpu_rows))
    print("\nA short wait is dominated by each module run's start-up (one Python process per slice); the long "
          "wait shows the steady cost while a model loads.")
    controller_rows(long_rows, args)
    for method in methods:
        lat = [r["latency"] for r in rows if r["method"] == method and r.get("ok") and r.get("latency") is not None]
        bl.summary("P1", f"detection latency, {LABELS[method]}: median / p90 / max",
                   f"{bl.fmt(bl.median(lat), 3)} / {bl.fmt(bl.pct(lat, 0.9), 3)} / {bl.fmt(max(lat) if lat else None, 3)} s",
                   "median <= 0.3 s" if method == "module" else "diagnostic" if method == "module_1call" else "baseline",
                   (bl.median(lat) <= TARGET_MEDIAN if lat else False) if method == "module" else None)
    for method in methods:
        lrow = [r for r in long_rows if r["method"] == method and r.get("cpu_commands") is not None]
        sel = [r for r in rows if r["method"] == method and r.get("cpu_commands") is not None and r.get("wait")]
        use = lrow or sel
        wait = sum(r["wait"] for r in use)
        if wait:
            bl.summary("P1", f"host CPU per wait-minute, {LABELS[method]}"
                       + (f" ({lrow[0]['wait']:.0f} s wait)" if lrow else " (short waits)"),
                       f"{sum(r['cpu_commands'] for r in use) / wait * 60:.2f} s", "small (no number set)", None)


def controller_rows(long_rows, args):
    """The controller's side of the long wait: module runs and the whole run's CPU, per slice length."""
    rows = [r for r in long_rows if r.get("ok") and r.get("controller_cpu") is not None]
    if not rows:
        return
    one_call = next((r for r in rows if r["method"] == "module_1call"), None)
    table = []
    for r in rows:
        extra = None
        if one_call is not None and r["method"] != "module_1call" and r.get("module_runs") and r["module_runs"] > 1:
            extra = (r["controller_cpu"] - one_call["controller_cpu"]) / (r["module_runs"] - 1)
        table.append([LABELS[r["method"]], bl.fmt(r["wait"], 0), str(r.get("module_runs") or "-"),
                      bl.fmt(r["controller_cpu"], 2), bl.fmt(extra, 3)])
    print(f"\nThe controller over the long wait (load {args.cpu_load:.0f} s, one run each): ansible-playbook's whole "
          "CPU (start-up and the other tasks are the same for every method), and per module run beyond the one "
          "call (the difference to slice_seconds 0, over the extra runs; one run each: +-0.1 s of noise):")
    print(bl.table(["method", "wait s", "module runs", "controller CPU s", "CPU s per extra module run"], table))
    for r in rows:
        if r["method"] in ("module", "module_slice10") and r.get("module_runs"):
            per_run = [x[4] for x in table if x[0] == LABELS[r["method"]]][0]
            bl.summary("P5", f"controller CPU of a {r['wait']:.0f} s wait, {LABELS[r['method']]}",
                       f"{r['controller_cpu']:.2f} s whole run, {r['module_runs']} module runs ({per_run} s per "
                       "extra run)", "small (part of <= 0.5 s per host per batch)", None)


if __name__ == "__main__":
    sys.exit(main())
