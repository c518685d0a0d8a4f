"""`make bench`: run every benchmark on a lab of its own and write tests/benchmarks/RESULTS.md.

Parts, in this order (each a script of its own, runnable alone; see its docstring):
  sim  bench_sim.py       the simulator's own timing (no lab)
  P1   bench_detect.py    detection latency of the wait vs uri/until and the 5 s poll; host CPU of a wait
  P2   bench_journal.py   the cost of finding the config line as the unit's journal grows
  P3   bench_rollout.py   rollout overhead per batch and per host out of the router (import cost on)
  P4   bench_nochange.py  a rollout with nothing to change vs a gather-facts-only play
  P5   bench_scale.py     wall time and controller CPU at 8, 16, 32, 64 hosts
  idle bench_idle.py      the controller's CPU per second while a batch waits (no lab)
  canary bench_canary.py  canary analysis: 2x and 1.3x slower decode caught, equal settings passing, 20 runs each

The lab is gpfbench on 127.0.8 (inventory .build/bench/hosts.yml), booted to --hosts first and
taken down at the end (--keep-lab keeps it). RESULTS.md gets the machine (nproc, RAM, kernel,
load average before the run), the exact command, the date, every part's tables and how long it
took, and a closing table of every figure against its target. A part that fails is reported
and the others still run. Benchmarks print figures; a missed target is VIOLATED, not an error.

Usage: .venv/bin/python tests/benchmarks/run_all.py [--parts sim,P1,P2,P3,P4,P5,idle,canary] [--quick]
       [--output tests/benchmarks/RESULTS.md] [--keep-lab]
--quick: short parameters to check the scripts on a loaded machine (3 hosts, 3 restarts, sizes 2,4;
written to .build/bench/RESULTS.quick.md unless --output is given). Not the figures.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import benchlib as bl

FULL = {
    "sim": ["bench_sim.py"],
    "P1": ["bench_detect.py", "--no-lab"],
    "P2": ["bench_journal.py", "--inventory", str(bl.INVENTORY)],
    "P3": ["bench_rollout.py"],
    "P4": ["bench_nochange.py"],
    "P5": ["bench_scale.py"],
    "idle": ["bench_idle.py"],
    "canary": ["bench_canary.py"],
}
QUICK = {
    "sim": ["bench_sim.py", "--runs", "1", "--loads", "1", "--concurrency", "32"],
    "P1": ["bench_detect.py", "--no-lab", "--restarts", "3", "--cpu-load", "20"],
    "P2": ["bench_journal.py", "--inventory", str(bl.INVENTORY), "--flood", "2000", "--rounds", "2"],
    "P3": ["bench_rollout.py", "--hosts", "3", "--load", "4", "--settle", "2", "--import-mb", "0"],
    "P4": ["bench_nochange.py", "--hosts", "3", "--runs", "2", "--load", "4", "--settle", "2", "--import-mb", "0"],
    "P5": ["bench_scale.py", "--sizes", "2,4", "--load", "2", "--settle", "1"],
    "idle": ["bench_idle.py", "--wait", "4", "--runs", "1", "--tasks", "5"],
    "canary": ["bench_canary.py", "--runs", "2", "--factors", "1.0,2.0", "--num-prompts", "16", "--output-len", "64"],
}
TITLES = {
    "sim": "Simulator timing (bench_sim.py)",
    "P1": "P1 detection latency (bench_detect.py)",
    "P2": "P2 journal cost (bench_journal.py)",
    "P3": "P3 rollout overhead (bench_rollout.py)",
    "P4": "P4 no-change run (bench_nochange.py)",
    "P5": "P5 scale (bench_scale.py)",
    "idle": "P5 idle: the controller while a batch waits (bench_idle.py)",
    "canary": "Canary analysis: detection and false alarms (bench_canary.py)",
}
MARKDOWN = {"P1", "P3", "P4", "P5", "idle", "canary"}  # the others print plain text: kept in a code block


def run_part(part: str, argv: list[str]) -> dict:
    cmd = [sys.executable, str(bl.HERE / argv[0])] + argv[1:]
    bl.log(f"{part}: {' '.join(shlex.quote(a) for a in cmd)}")
    started = time.monotonic()
    # stdout: the figures (kept); stderr: progress (shown live)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=str(bl.REPO), check=False)
    seconds = time.monotonic() - started
    sys.stdout.write(proc.stdout)
    sys.stdout.flush()
    bl.log(f"{part}: rc {proc.returncode} in {seconds / 60:.1f} min")
    return {"part": part, "cmd": cmd, "rc": proc.returncode, "seconds": seconds, "out": proc.stdout}


def code_version() -> str:
    def git(*argv):
        return subprocess.run(["git", *argv], cwd=str(bl.REPO), capture_output=True, text=True,
                              check=False).stdout.strip()
    changed = len(git("status", "--porcelain").splitlines())
    return f"commit {git('rev-parse', '--short', 'HEAD') or '?'}" + (
        f" with {changed} uncommitted file(s)" if changed else " (clean tree)")


def summaries(text: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r"<!-- summary (\{.*\}) -->", text)]


def write_results(path: Path, results: list[dict], machine: dict, command: str, started: datetime.datetime,
                  lab_note: str, quick: bool) -> None:
    lines = ["# Benchmark results", ""]
    if quick:
        lines += ["**QUICK RUN (short parameters, to check the scripts): not the figures.**", ""]
    lines += [
        f"- Date: {started.strftime('%Y-%m-%d %H:%M UTC')} (total {sum(r['seconds'] for r in results) / 60:.1f} min)",
        f"- Command: `{command}`",
        f"- Machine: nproc {machine['nproc']}, RAM {machine['ram_gib']} GiB, kernel {machine['kernel']}, "
        f"load average before the run {' '.join(machine['loadavg'])} (1/5/15 min)",
        f"- Code: {code_version()}",
        f"- Lab: {lab_note}",
        "",
        "## Figures against targets",
        "",
    ]
    rows = []
    for r in results:
        for s in summaries(r["out"]):
            rows.append([s["part"], s["what"], s["figure"], s["target"], s["verdict"]])
        if r["rc"] != 0:
            rows.append([r["part"], "the script", f"exit code {r['rc']}", "0", "**FAILED**"])
    lines += [bl.table(["part", "what", "figure", "target", "verdict"], rows), ""]
    lines += ["Run time per part: " + ", ".join(f"{r['part']} {r['seconds'] / 60:.1f} min" for r in results), ""]
    for r in results:
        lines += [f"## {TITLES[r['part']]}", "",
                  f"`{' '.join(shlex.quote(os.path.relpath(a, bl.REPO) if a.startswith(str(bl.REPO)) else a) for a in r['cmd'])}`"
                  f" — {r['seconds'] / 60:.1f} min, exit code {r['rc']}", ""]
        body = re.sub(r"<!-- summary .* -->\n?", "", r["out"]).rstrip()
        if r["part"] in MARKDOWN:
            lines += [body.replace("### ", "#### "), ""]
        else:
            lines += ["```", body, "```", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="sim,P1,P2,P3,P4,P5,idle,canary")
    parser.add_argument("--quick", action="store_true", help="short parameters (checks the scripts; not the figures)")
    parser.add_argument("--hosts", type=int, help="hosts to boot first (default 8, --quick 3)")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--keep-lab", action="store_true")
    args = parser.parse_args()
    machine = bl.machine()  # before anything runs
    started = datetime.datetime.now(datetime.timezone.utc)
    argv = [os.path.relpath(sys.argv[0])] + sys.argv[1:]
    command = os.environ.get("BENCH_COMMAND") or " ".join(shlex.quote(a) for a in argv)
    output = args.output or (bl.BUILD / "RESULTS.quick.md" if args.quick else bl.HERE / "RESULTS.md")
    table = QUICK if args.quick else FULL
    parts = [p for p in args.parts.split(",") if p]
    hosts = args.hosts or (3 if args.quick else 8)
    results = []
    lab_note = f"{bl.LAB['LAB_NAME']} on {bl.LAB['LAB_NET']}.x (systemd-nspawn), inventory {os.path.relpath(bl.INVENTORY, bl.REPO)}"
    try:
        if any(p != "sim" for p in parts):
            ok, out = bl.lab_up(hosts, exact=True)
            if not ok:
                print(out)
                results.append({"part": parts[0], "cmd": ["lab.py", "up"], "rc": 1, "seconds": 0.0,
                                "out": f"The lab did not boot {hosts} hosts:\n{out[-3000:]}"})
                parts = []
        for part in parts:
            results.append(run_part(part, table[part]))
            write_results(output, results, machine, command, started, lab_note, args.quick)
    finally:
        if not args.keep_lab and any(p != "sim" for p in args.parts.split(",")):
            bl.log("taking the benchmark lab down")
            said = bl.lab_down().strip().splitlines()
            bl.log(said[-1] if said else "lab.py down said nothing")
    write_results(output, results, machine, command, started, lab_note, args.quick)
    bl.log(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
