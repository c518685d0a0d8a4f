"""P4 no-change run: a rollout of a fleet that is already in sync, against a gather-facts-only play.

On --hosts lab hosts (with the router) brought in sync first (the same settings as P3, so after
P3 that is a no-op), --runs rollouts and --runs gather-facts-only plays (alternating, so drift on
a shared machine hits both alike) are timed from ansible-playbook's start to its exit. Target:
median rollout <= 2x median gather-facts play. Checked on every rollout run: zero restarts (each
host's InvocationID is the same after as before) and changed=0 for every host in the PLAY RECAP;
a miss is printed as VIOLATED (a benchmark prints, it does not fail).

Usage: .venv/bin/python tests/benchmarks/bench_nochange.py [--hosts 8] [--runs 3]
"""
from __future__ import annotations

import argparse
import sys

import benchlib as bl

GATHER = bl.HERE / "playbooks" / "gather_facts.yml"
TARGET_RATIO = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--load", type=float, default=8.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--import-seconds", type=float, default=4.0)
    parser.add_argument("--import-mb", type=int, default=450)
    parser.add_argument("--no-lab", action="store_true", help="use the benchmark lab as it is (no lab.py up)")
    args = parser.parse_args()
    if not args.no_lab:
        ok, out = bl.lab_up(args.hosts, exact=True)
        if not ok:
            print(f"### P4 no-change run\n\nThe lab did not boot {args.hosts} hosts:\n```\n{out[-3000:]}\n```")
            return 1
    hosts = bl.lab_hosts()
    window = bl.fleet_window() or bl.WINDOWS[0]
    settings = bl.server_settings(window, args.load, args.settle, args.import_seconds, args.import_mb)
    bl.log(f"P4: bringing {len(hosts)} hosts in sync (draft window {window}; a no-op after P3)")
    run = bl.deploy(settings)
    if run.rc != 0:
        print(f"### P4 no-change run\n\nThe deploy that brings the fleet in sync failed (rc {run.rc}):\n"
              f"```\n{run.tail(40)}\n```")
        return 1
    rollouts, gathers = [], []
    for i in range(args.runs):
        before = bl.invocation_ids(hosts)
        run = bl.rollout()
        after = bl.invocation_ids(hosts)
        restarted = sorted(h for h in before if before[h] != after.get(h))
        recap = run.recap()
        changed = {h: v.get("changed", 0) for h, v in recap.items() if v.get("changed", 0)}
        tasks = {h: v.get("ok", 0) + v.get("skipped", 0) + v.get("failed", 0) for h, v in recap.items()
                 if h != "localhost"}
        rollouts.append({"run": run, "restarted": restarted, "changed": changed, "tasks": tasks})
        bl.log(f"  rollout {i + 1}: rc {run.rc}, {run.wall:.1f} s, restarts {len(restarted)}, changed {changed or 0}")
        g = bl.playbook(GATHER)
        gathers.append(g)
        bl.log(f"  gather facts {i + 1}: rc {g.rc}, {g.wall:.1f} s")
    report(rollouts, gathers, hosts, args)
    return 0


def report(rollouts, gathers, hosts, args):
    rw = [r["run"].wall for r in rollouts]
    gw = [g.wall for g in gathers]
    ratio = bl.median(rw) / bl.median(gw) if gw else float("nan")
    print(f"### P4 no-change run ({len(hosts)} hosts in sync, {args.runs} runs each, alternating)\n")
    print("Wall time = ansible-playbook start to exit.\n")
    rows = [["gpufleet.inference.rollout (nothing to change)", ", ".join(f"{w:.1f}" for w in rw),
             bl.fmt(bl.median(rw), 1), bl.fmt(ratio, 2) + "x",
             bl.verdict(ratio <= TARGET_RATIO)],
            ["gather-facts-only play, same hosts (baseline)", ", ".join(f"{w:.1f}" for w in gw),
             bl.fmt(bl.median(gw), 1), "1x", "(baseline)"]]
    print(bl.table(["play", "runs s", "median s", "ratio", "target <= 2x"], rows))
    print()
    rows = []
    for i, r in enumerate(rollouts, 1):
        run = r["run"]
        tasks = sorted(set(r["tasks"].values()))
        rows.append([i, run.rc, len(r["restarted"]), ", ".join(r["restarted"]) or "-",
                     ", ".join(f"{h}={c}" for h, c in sorted(r["changed"].items())) or "0 on every host",
                     "-".join(str(t) for t in (tasks[:1] + tasks[-1:] if len(tasks) > 1 else tasks)),
                     bl.verdict(not r["restarted"] and not r["changed"] and run.rc == 0),
                     bl.fmt(run.cpu, 1)])
    print(bl.table(["rollout run", "rc", "restarts (InvocationID changed)", "which", "changed in PLAY RECAP",
                    "tasks per host", "zero restarts, changed=0", "controller CPU s"], rows))
    bl.summary("P4", f"no-change rollout vs gather facts ({len(hosts)} hosts, median of {args.runs})",
               f"{bl.fmt(bl.median(rw), 1)} s vs {bl.fmt(bl.median(gw), 1)} s = {bl.fmt(ratio, 2)}x", "<= 2x",
               ratio <= TARGET_RATIO)
    clean = all(not r["restarted"] and not r["changed"] and r["run"].rc == 0 for r in rollouts)
    bl.summary("P4", "no-change rollout: restarts / hosts with changed > 0 (all runs)",
               f"{sum(len(r['restarted']) for r in rollouts)} / {len({h for r in rollouts for h in r['changed']})}",
               "0 / 0", clean)
    run = rollouts[-1]["run"] if rollouts else None
    if run is not None:
        print("\nWhere a no-change rollout's time goes (last run; task start to the next task's start):\n")
        plays = [e for e in run.events if e["kind"] == "play"]
        times = bl.task_times(run.events, run.events[-1]["t"]) if run.events else []
        rows = [[task.replace("|", "/")[:110], bl.fmt(t, 2)] for task, t in sorted(times, key=lambda kv: -kv[1])[:12]]
        print(f"Plays: {', '.join(str(p.get('play')) for p in plays)}\n")
        print(bl.table(["task", "s"], rows))
        if run.rc != 0:
            print(f"\n**The last rollout FAILED (rc {run.rc})**:\n```\n{run.tail(30)}\n```")


if __name__ == "__main__":
    sys.exit(main())
