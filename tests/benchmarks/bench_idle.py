"""P5 idle: the controller's CPU while a batch waits for its model loads, and the latency it buys.

A rollout's controller spends most of its wall time waiting: each batch waits for its hosts' model
loads (minutes on a real fleet, 4-8 s in the lab). While it waits, ansible-playbook's main process
wakes every `internal_poll_interval` to look for results. That cost grows with the load time, which
the lab's short loads hide: this measures it per second of waiting, so it can be multiplied by a
real load.

Method (no lab; localhost, connection local): one play whose one task waits --wait seconds (a
command `sleep`); ansible-playbook's main process's own CPU from that task's start to its result
(os.times in the bench_times callback, i.e. in the main process), over --wait, is the CPU per second
of waiting (the worker, which only waits for its command, is not counted). Median of --runs runs. The latency: a
play of --tasks quick tasks in a row (ansible.builtin.debug), its wall time minus the same play at
Ansible's default 0.001 s, per task: how much later a result is seen.

Variants: Ansible's default internal_poll_interval (0.001 s), 0.02 s (this checkout's setting before),
and 0.1 s (this checkout's ansible.cfg and the guide's advice now).

Usage: .venv/bin/python tests/benchmarks/bench_idle.py [--wait 20] [--runs 2] [--tasks 30]
"""
from __future__ import annotations

import argparse
import statistics
import sys

import yaml

import benchlib as bl

TARGET_CPU = 0.5  # P5's target per host per batch, of which this is a part
# (label, internal_poll_interval, strategy: None - the play's default, linear)
VARIANTS = (
    ("Ansible's default, internal_poll_interval 0.001", "0.001", None),
    ("internal_poll_interval 0.02 (this checkout before)", "0.02", None),
    ("internal_poll_interval 0.1 (this checkout's ansible.cfg, README)", "0.1", None),
)


def config(interval: str) -> str:
    """This checkout's ansible.cfg with internal_poll_interval set to `interval` (absolute paths)."""
    text = (bl.REPO / "ansible.cfg").read_text().replace("./", str(bl.REPO) + "/")
    lines = [line for line in text.splitlines() if not line.startswith("internal_poll_interval")]
    at = lines.index("[defaults]") + 1
    lines.insert(at, f"internal_poll_interval = {interval}")
    path = bl.BUILD / f"ansible-poll-{interval}.cfg"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def play_file(name: str, strategy: str | None, tasks: list[dict]) -> str:
    play = {"name": name, "hosts": "localhost", "gather_facts": False, "tasks": tasks}
    if strategy:
        play["strategy"] = strategy
    path = bl.BUILD / f"idle-{name}-{(strategy or 'linear').replace('.', '_')}.yml"
    path.write_text(yaml.safe_dump([play], sort_keys=False))
    return str(path)


def run(path: str, interval: str, extra: list[str] | None = None) -> bl.Run:
    """One ansible-playbook run on localhost, with the bench_times events (main process's CPU at each)."""
    run_ = bl.playbook(path, inventory="localhost,", env={"ANSIBLE_CONFIG": config(interval),
                                                          "ANSIBLE_DEPRECATION_WARNINGS": "0"},
                       args=["-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"] + (extra or []))
    if run_.rc != 0:
        raise RuntimeError(f"{path} failed:\n{run_.tail(30)}")
    return run_


def waiting_cpu(run_: bl.Run) -> float:
    """ansible-playbook's main process's own CPU from the wait task's start to its result."""
    start = next(e for e in run_.events if e["kind"] == "task" and e.get("task") == "wait")
    end = next(e for e in run_.events if e["kind"] == "ok" and e.get("task") == "wait")
    return end["cpu"] - start["cpu"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wait", type=float, default=20.0, help="seconds of waiting measured (default 20)")
    parser.add_argument("--runs", type=int, default=2, help="runs per variant (median; default 2)")
    parser.add_argument("--tasks", type=int, default=30, help="quick tasks in the latency play (default 30)")
    args = parser.parse_args()
    rows, figures = [], {}
    latency_base = None
    for label, interval, strategy in VARIANTS:
        wait_task = {"name": "wait", "ansible.builtin.command": "sleep {{ seconds }}", "changed_when": False}
        waiting = play_file("wait", strategy, [wait_task])
        quick = play_file("quick", strategy, [{"name": f"task {n}", "ansible.builtin.debug": {"msg": "x"}}
                                              for n in range(args.tasks)])
        per_second = [waiting_cpu(run(waiting, interval, ["-e", f"seconds={args.wait:g}"])) / args.wait
                      for dummy in range(args.runs)]
        walls = [run(quick, interval).wall for dummy in range(args.runs)]
        cpu = statistics.median(per_second)
        wall = statistics.median(walls)
        if latency_base is None:
            latency_base = wall
        figures[interval if not strategy else "strategy"] = cpu
        bl.log(f"P5 idle: {label}: {cpu * 1000:.1f} ms of CPU per second of waiting; {args.tasks} tasks in {wall:.2f} s")
        rows.append([label, f"{cpu * 1000:.1f} ({', '.join(f'{c * 1000:.1f}' for c in per_second)})",
                     f"{cpu * 300:.2f}", f"{wall:.2f}", f"{(wall - latency_base) / args.tasks * 1000:+.0f}"])
    print(f"### P5 idle: controller CPU while a batch waits (localhost, {args.wait:g} s of waiting, median of "
          f"{args.runs}; {args.tasks} quick tasks for the latency)\n")
    print(bl.table(["variant", "CPU ms per second of waiting (runs)", "CPU s over a 300 s load (one batch)",
                    f"{args.tasks} tasks, wall s", "ms later per task result vs 0.001"], rows))
    print()
    chosen = figures.get("0.1")
    if chosen is not None:
        # A batch of 2 hosts (the default batches' 25 % at 8 hosts) waiting for a 300 s load.
        per_host = chosen * 300 / 2
        bl.summary("P5", "controller CPU while a batch waits, internal_poll_interval 0.1 (this checkout): per "
                   "second; per host of a 2-host batch over a 300 s load",
                   f"{chosen * 1000:.1f} ms/s; {per_host:.3f} s (0.02: {figures.get('0.02', float('nan')) * 150:.3f} s)",
                   f"part of the <= {TARGET_CPU} s per host per batch", None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
