"""P5 scale: rollout wall time and controller CPU per host per batch at 8, 16, 32, 64 lab hosts.

For each size the benchmark lab is booted to that many hosts (with the router; hosts already up
are kept), the fleet brought to one draft window (a quick one-batch deploy, not measured: it also
installs the new hosts), then one measured gpufleet.inference.rollout changes every host to the
other window with the default batches (a canary of 1, then batches of at most 25 %). The scale
lab runs the simulator with --tp (default 1: 2 processes per host instead of 9) and without the
import's memory (SGLANG_SIM_IMPORT_MB 0; the import's --import-seconds stay), so 64 hosts fit.

Controller CPU: ansible-playbook's user+sys including every child it waited for (os.wait4 on the
process: the forked workers and their ssh clients). ssh's ControlPersist masters detach from
ansible-playbook, so their CPU is not in that figure; it is printed beside it (a /proc snapshot
of this lab's masters before and after the run). Per batch: the CPU the run spent between the
batch's start and the next play's start (bench_times callback: ansible-playbook's own os.times,
children included once reaped), divided by the batch's hosts.

Controller settings: this checkout's ansible.cfg (pipelining, internal_poll_interval 0.1) and
forks = the rollout's hosts (at least 10), as README recommends for real fleets: the prepare phase runs
every host at once. Baselines in the same session: the rollout back with Ansible's default
internal_poll_interval (0.001 s), at the first size by default (--baseline first|all|none); at each
size whose largest batch is smaller than its forks, the rollout back with forks = the largest batch (at
least 10; README's advice before run 6) (--no-batch-forks-baseline: not).

Every host takes part in the prepare phase once and in exactly one batch, so the headline figure
"CPU per host per batch" is the run's CPU divided by the hosts. Target <= 0.5 s, growth linear or
better (the per-host figure flat or falling as the fleet grows).

A size whose lab does not boot, or whose rollout fails, ends the series; where and why is printed.

Usage: .venv/bin/python tests/benchmarks/bench_scale.py [--sizes 8,16,32,64] [--load 4] [--settle 2]
       [--tp 1] [--import-seconds 4] [--forks N] [--baseline first|all|none] [--no-batch-forks-baseline]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import benchlib as bl

TARGET_CPU = 0.5


def mem_available_gib() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1048576
    return float("nan")


def cpu_at(run, moment):
    """ansible-playbook's CPU (children reaped so far included) at the first event from `moment` on."""
    return next((e["cpu"] + e["cpu_children"] for e in run.events if e["t"] >= moment), None)


def default_poll_config() -> str:
    """This checkout's ansible.cfg with Ansible's own internal_poll_interval (0.001 s): the baseline."""
    text = (bl.REPO / "ansible.cfg").read_text().replace("./", str(bl.REPO) + "/")
    lines = [line for line in text.splitlines() if not line.startswith("internal_poll_interval")]
    path = bl.BUILD / "ansible-default-poll.cfg"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def poll_interval() -> str:
    """internal_poll_interval of this checkout's ansible.cfg (as written there)."""
    for line in (bl.REPO / "ansible.cfg").read_text().splitlines():
        if line.startswith("internal_poll_interval"):
            return line.split("=", 1)[1].strip()
    return "0.001 (Ansible's default)"


def forks_for(size, args) -> int:
    """ansible forks: --forks, else the rollout's hosts (as README recommends), at least 10."""
    return args.forks or max(10, size)


def batch_forks(size) -> int:
    """The largest batch of the default batches (25 % of the hosts), at least 10: the baseline's forks."""
    return max(10, math.ceil(size * 0.25))


def measure(size, args, env) -> dict:
    hosts = bl.lab_hosts()
    addresses = {h["address"] for h in hosts}
    settings = dict(load=args.load, settle=args.settle, import_seconds=args.import_seconds, import_mb=0, tp=args.tp)
    window_from = bl.fleet_window() or bl.WINDOWS[0]
    bl.log(f"P5 {size} hosts: deploying draft window {window_from} (not measured; installs new hosts)")
    deploy = bl.deploy(bl.server_settings(window_from, **settings))
    if deploy.rc != 0:
        return {"size": size, "error": f"the deploy before the measured rollout failed (rc {deploy.rc})",
                "tail": deploy.tail(30)}
    window_to = bl.next_window()
    bl.write_group_vars(bl.server_settings(window_to, **settings))
    before_ids = bl.invocation_ids(hosts)
    masters_before = bl.ssh_master_cpu(addresses)
    mem_before = mem_available_gib()
    bl.log(f"P5 {size} hosts: measured rollout {window_from} -> {window_to}")
    run = bl.rollout(env=env)
    masters_after = bl.ssh_master_cpu(addresses)
    after_ids = bl.invocation_ids(hosts)
    bl.set_fleet_window(window_to if run.rc == 0 else None)
    restarted = sum(1 for h in before_ids if before_ids[h] and before_ids[h] != after_ids.get(h))
    recap = run.recap()
    unreachable = sum(v.get("unreachable", 0) for v in recap.values())
    failed = sum(v.get("failed", 0) for v in recap.values())
    batches = []
    for batch in bl.batches(run):
        start_cpu, end_cpu = cpu_at(run, batch["start"]), cpu_at(run, batch["end"])
        cpu = end_cpu - start_cpu if start_cpu is not None and end_cpu is not None else None
        batches.append({"hosts": len(batch["hosts"]), "wall": batch["end"] - batch["start"],
                        "cpu_per_host": cpu / len(batch["hosts"]) if cpu is not None and batch["hosts"] else None})
    raw = bl.batches(run)
    plays = [e for e in run.events if e["kind"] == "play"]
    prepare_wall = raw[0]["start"] - plays[0]["t"] if raw and plays else None
    prepare_cpu = None
    if raw and plays:
        first_cpu = plays[0]["cpu"] + plays[0]["cpu_children"]
        at_apply = next(e for e in run.events if e["t"] >= raw[0]["start"])
        prepare_cpu = at_apply["cpu"] + at_apply["cpu_children"] - first_cpu
    baseline = None
    if args.baseline and run.rc == 0:
        # The same rollout back, with Ansible's default internal_poll_interval: side by side, same hosts.
        window_back = bl.next_window()
        bl.write_group_vars(bl.server_settings(window_back, **settings))
        bl.log(f"P5 {size} hosts: baseline rollout {window_to} -> {window_back} (internal_poll_interval 0.001)")
        back = bl.rollout(env=dict(env, ANSIBLE_CONFIG=default_poll_config()))
        bl.set_fleet_window(window_back if back.rc == 0 else None)
        baseline = {"rc": back.rc, "wall": back.wall, "cpu": back.cpu}
    fewer = None
    if args.batch_forks_baseline and run.rc == 0 and batch_forks(size) < forks_for(size, args) and \
            (baseline is None or baseline["rc"] == 0):
        # The same rollout back with forks = the largest batch: the prepare phase queues hosts for the workers.
        window_back = bl.next_window()
        bl.write_group_vars(bl.server_settings(window_back, **settings))
        bl.log(f"P5 {size} hosts: baseline rollout {bl.fleet_window()} -> {window_back} (forks {batch_forks(size)})")
        back = bl.rollout(env=dict(env, ANSIBLE_FORKS=str(batch_forks(size))))
        bl.set_fleet_window(window_back if back.rc == 0 else None)
        fewer = {"rc": back.rc, "wall": back.wall, "cpu": back.cpu, "forks": batch_forks(size)}
    return {"size": size, "rc": run.rc, "wall": run.wall, "cpu": run.cpu, "cpu_user": run.cpu_user, "baseline": baseline,
            "fewer_forks": fewer,
            "cpu_sys": run.cpu_sys, "ssh_masters": bl.master_delta(masters_before, masters_after),
            "batches": batches, "restarted": restarted, "unreachable": unreachable, "failed": failed,
            "prepare_wall": prepare_wall, "prepare_cpu": prepare_cpu, "mem_before": mem_before,
            "tail": run.tail(30) if run.rc != 0 else ""}


def report(results, stop_reason, args):
    print(f"### P5 scale (tp {args.tp}, load {args.load:g} s + import {args.import_seconds:g} s, settle {args.settle:g} s,"
          f" default batches, router, ansible forks: {args.forks or 'the hosts, at least 10'},"
          f" this checkout's ansible.cfg: internal_poll_interval {poll_interval()}, pipelining)\n")
    rows = []
    base = None
    for r in results:
        if r.get("error"):
            rows.append([r["size"], "-", "-", "-", "-", "-", "-", "-", "-", r["error"]])
            continue
        per_host = r["cpu"] / r["size"]
        if base is None:
            base = r
        growth_wall = (r["wall"] / base["wall"]) / (r["size"] / base["size"])
        growth_cpu = per_host / (base["cpu"] / base["size"])
        per_batch = [b["cpu_per_host"] for b in r["batches"] if b["cpu_per_host"] is not None]
        rows.append([f"{r['size']} (forks {r.get('forks')})", len(r["batches"]), f"{r['wall']:.1f}", f"{growth_wall:.2f}",
                     f"{r['cpu']:.1f} ({r['cpu_user']:.1f} user + {r['cpu_sys']:.1f} sys)",
                     f"{r['ssh_masters']:.1f}", f"{per_host:.3f} ({(r['cpu'] + r['ssh_masters']) / r['size']:.3f})",
                     f"{growth_cpu:.2f}",
                     f"{bl.fmt(r['prepare_cpu'] / r['size'] if r['prepare_cpu'] is not None else None, 3)} / "
                     f"{bl.fmt(bl.median(per_batch), 3)} / {bl.fmt(max(per_batch) if per_batch else None, 3)}",
                     f"{bl.verdict(per_host <= TARGET_CPU)}; rc {r['rc']}, restarted {r['restarted']}/{r['size']}"
                     + (f", failed {r['failed']}, unreachable {r['unreachable']}" if r["failed"] or r["unreachable"]
                        else "")])
    print(bl.table(["hosts", "batches", "wall s", "wall growth vs per-host linear (1 = linear)",
                    "controller CPU s (ansible-playbook + children)", "+ ssh masters CPU s",
                    "CPU s per host per batch (with ssh masters)", "CPU/host growth vs smallest (<= 1: linear or better)",
                    "CPU s/host: prepare / apply batch median / max", "target <= 0.5 s"], rows))
    print()
    for r in results:
        if r.get("batches"):
            print(f"- {r['size']} hosts: prepare phase {bl.fmt(r['prepare_wall'], 1)} s; batches (hosts: wall s) "
                  + ", ".join(f"{b['hosts']}: {b['wall']:.1f}" for b in r["batches"])
                  + f"; CPU / (hosts x batches) {r['cpu'] / r['size'] / len(r['batches']):.3f} s"
                  + f"; MemAvailable before the rollout {r['mem_before']:.1f} GiB")
        if r.get("baseline"):
            b = r["baseline"]
            print(f"- {r['size']} hosts, baseline in the same session (the rollout back, Ansible's default "
                  f"internal_poll_interval 0.001): rc {b['rc']}, wall {b['wall']:.1f} s, controller CPU {b['cpu']:.1f} s "
                  f"= {b['cpu'] / r['size']:.3f} s per host (vs {r['cpu'] / r['size']:.3f} s with {poll_interval()})")
        if r.get("fewer_forks"):
            b = r["fewer_forks"]
            print(f"- {r['size']} hosts, in the same session: the rollout back with forks {b['forks']} (the largest "
                  f"batch) instead of {r['forks']}: rc {b['rc']}, wall {b['wall']:.1f} s, controller CPU {b['cpu']:.1f} s "
                  f"= {b['cpu'] / r['size']:.3f} s per host (vs {r['cpu'] / r['size']:.3f} s)")
        if r.get("tail"):
            print(f"\n  {r['size']} hosts: output tail:\n```\n{r['tail']}\n```")
    if stop_reason:
        print(f"\n**The series stopped: {stop_reason}**")
    done = [r for r in results if not r.get("error")]
    if done:
        worst = max(r["cpu"] / r["size"] for r in done)
        bl.summary("P5", "controller CPU per host per batch, worst size ("
                   + ", ".join(f"{r['size']}: {r['cpu'] / r['size']:.2f}" for r in done) + ")",
                   f"{worst:.2f} s", "<= 0.5 s", worst <= TARGET_CPU)
        first, last = done[0], done[-1]
        if last is not first:
            growth = (last["cpu"] / last["size"]) / (first["cpu"] / first["size"])
            wall_growth = (last["wall"] / first["wall"]) / (last["size"] / first["size"])
            bl.summary("P5", f"growth {first['size']} -> {last['size']} hosts: CPU per host ratio / wall per host ratio",
                       f"{growth:.2f} / {wall_growth:.2f}", "<= 1 (linear or better; 10 % noise allowed)",
                       growth <= 1.1 and wall_growth <= 1.1)
    if stop_reason or not done:
        bl.summary("P5", "largest size measured", str(done[-1]["size"]) if done else "none", "64 hosts",
                   bool(done) and done[-1]["size"] >= 64)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,16,32,64")
    parser.add_argument("--load", type=float, default=4.0)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--import-seconds", type=float, default=4.0)
    parser.add_argument("--forks", type=int, help="ANSIBLE_FORKS (default: the hosts, at least 10)")
    parser.add_argument("--batch-forks-baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="at each size whose largest batch is under its forks, also roll back with forks = the "
                             "largest batch (at least 10)")
    parser.add_argument("--baseline", default="first", choices=["first", "all", "none"],
                        help="also roll back with Ansible's default internal_poll_interval (0.001): at the first "
                             "size (default), every size, or none")
    args = parser.parse_args()
    results, stop_reason = [], None
    for size in [int(s) for s in args.sizes.split(",") if s]:
        bl.log(f"P5: lab to {size} hosts (MemAvailable {mem_available_gib():.1f} GiB)")
        ok, out = bl.lab_up(size, exact=True)
        if not ok:
            stop_reason = (f"the lab could not boot {size} hosts (MemAvailable {mem_available_gib():.1f} GiB, "
                           f"load {os.getloadavg()[0]:.1f}); lab.py said:\n```\n{out[-2500:]}\n```")
            break
        env = {"ANSIBLE_FORKS": str(forks_for(size, args))}
        run_args = argparse.Namespace(**vars(args))
        run_args.baseline = args.baseline == "all" or (args.baseline == "first" and not results)
        result = measure(size, run_args, env)
        result["forks"] = forks_for(size, args)
        results.append(result)
        if result.get("error") or result.get("rc"):
            stop_reason = f"at {size} hosts the rollout did not complete: {result.get('error') or 'rc %s' % result['rc']}"
            break
    report(results, stop_reason, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
