"""P3 rollout overhead: what a rollout adds to each batch and to each host's time out of the router.

On --hosts lab hosts behind the lab's real sglang-router, the fleet is first brought to one draft
window (a quick one-batch deploy, not measured), then gpufleet.inference.rollout changes it to
the other with its default batches (a canary of 1, then batches of at most 25 %). The simulator
loads for --load seconds after paying --import-seconds for `import sglang` (real 0.5.23: ~4 s,
~450 MB), so the preflight's real cost shows; --settle is sglang_min_ready_seconds.

Per batch:  wall (the callback's play start of the batch to the next play's start) minus the
            longest server time of its hosts (SIGTERM of the old process -> "fired up" of the new:
            drain, exit, import, load, warm-up - the server's own time, not the collection's)
            minus the settle window. Target <= 3 s. The naive figure, wall - (import + load +
            settle) with the configured values, is printed too (it also charges the server's stop).
Per host:   time out of the router (the host record's "draining" step to its "rejoined_at", both
            written by the controller with millisecond timestamps)
            minus (stop + start + settle) from its journal: stop = SIGTERM of the old process ->
            systemd's "Started" of the new; start = "Started" -> "fired up" (import + load).

Usage: .venv/bin/python tests/benchmarks/bench_rollout.py [--hosts 8] [--load 8] [--settle 5]
       [--import-seconds 4] [--import-mb 450]
"""
from __future__ import annotations

import argparse
import sys

import benchlib as bl

TARGET_BATCH = 3.0


def first(entries, key="t"):
    return entries[0][key] if entries else None


def host_timeline(address: str, old: str, new: str) -> dict:
    """Journal times of one host's restart: the old process's SIGTERM, the new one's start and ready."""
    out = {}
    out["sigterm"] = first(bl.journal(address, f"_SYSTEMD_INVOCATION_ID={old}", grep="SIGTERM received", last=1))
    out["stopping"] = first(bl.journal(address, f"INVOCATION_ID={old}", grep="Stopping", last=1))
    out["started"] = first(bl.journal(address, f"INVOCATION_ID={new}", grep="Started", last=1))
    out["first_line"] = first(bl.journal(address, f"_SYSTEMD_INVOCATION_ID={new}", last=None)[:1])
    out["fired_up"] = first(bl.journal(address, f"_SYSTEMD_INVOCATION_ID={new}", grep="fired up and ready", last=1))
    return out


def sub(a, b):
    return a - b if a is not None and b is not None else None


def analyse(run: bl.Run, hosts: list[dict], before: dict, after: dict, settle: float) -> dict:
    address = {h["name"]: h["address"] for h in hosts}
    rid = bl.run_id(run)
    recs = bl.records(rid) if rid else {}
    per_host = {}
    for name in address:
        row = {"host": name, "restarted": bool(before.get(name)) and before.get(name) != after.get(name)}
        record = recs.get(name) or {}
        steps = {s["step"]: s["at"] for s in record.get("steps", [])}
        if "draining" in steps and record.get("rejoined_at"):
            row["out"] = bl.iso_seconds(record["rejoined_at"]) - bl.iso_seconds(steps["draining"])
        if "draining" in steps and "rejoined" in steps:
            row["out_records"] = bl.iso_seconds(steps["rejoined"]) - bl.iso_seconds(steps["draining"])
        if row["restarted"]:
            tl = host_timeline(address[name], before[name], after[name])
            term = tl["sigterm"] or tl["stopping"]
            row["stop"] = sub(tl["started"], term)
            row["start"] = sub(tl["fired_up"], tl["started"])
            row["import"] = sub(tl["first_line"], tl["started"])
            row["server"] = sub(tl["fired_up"], term)
            if row["out"] is not None and row["server"] is not None:
                row["overhead"] = row["out"] - row["server"] - settle
        per_host[name] = row
    batches = []
    raw = bl.batches(run)
    for n, batch in enumerate(raw, 1):
        wall = batch["end"] - batch["start"]
        servers = [per_host[h]["server"] for h in batch["hosts"] if per_host.get(h, {}).get("server") is not None]
        longest = max(servers) if servers else None
        batches.append({"n": n, "hosts": batch["hosts"], "wall": wall, "server": longest,
                        "overhead": wall - longest - settle if longest is not None else None,
                        "tasks": bl.task_times(batch["events"], batch["end"])})
        for h in batch["hosts"]:
            if h in per_host:
                per_host[h]["batch"] = n
    plays = [e for e in run.events if e["kind"] == "play"]
    apply_start = raw[0]["start"] if raw else None
    prepare = {"wall": (apply_start - plays[0]["t"]) if apply_start and plays else None,
               "tasks": bl.task_times([e for e in run.events if plays and plays[0]["t"] <= e["t"] < (apply_start or 0)],
                                      apply_start or 0)}
    return {"run_id": rid, "hosts": per_host, "batches": batches, "prepare": prepare}


def report(result: dict, run: bl.Run, args, window_from, window_to):
    cfg_load = args.import_seconds + args.load
    print(f"### P3 rollout overhead ({len(result['hosts'])} hosts, load {args.load:g} s + import {args.import_seconds:g} s"
          f" (SGLANG_SIM_IMPORT_MB {args.import_mb}), settle {args.settle:g} s, default batches, with the router)\n")
    print(f"Rollout of draft window {window_from} -> {window_to}: rc {run.rc}, wall {run.wall:.1f} s "
          f"(ansible-playbook start to exit), run id {result['run_id']}.")
    prep = result["prepare"]
    print(f"Prepare phase (every host at once: validate, version, drift, preflight): {bl.fmt(prep['wall'], 1)} s.\n")
    rows = []
    for b in result["batches"]:
        naive = b["wall"] - cfg_load - args.settle
        rows.append([b["n"], len(b["hosts"]), ", ".join(h.rsplit("-", 1)[-1] for h in b["hosts"]),
                     bl.fmt(b["wall"], 2), bl.fmt(b["server"], 2), bl.fmt(args.settle, 0), bl.fmt(b["overhead"], 2),
                     bl.fmt(naive, 2),
                     bl.verdict(b["overhead"] <= TARGET_BATCH) if b["overhead"] is not None else "n/a"])
    print(bl.table(["batch", "hosts", "which", "wall s", "server s (longest SIGTERM->fired up)", "settle s",
                    "overhead s", f"naive: wall-(import+load+settle)={cfg_load:g}+{args.settle:g}",
                    "target <= 3 s"], rows))
    print("\nPer host (seconds; out of the router: the record's draining step -> rejoined_at; draining -> the "
          "rejoined step, written after the last-known-good copy is saved, in brackets):\n")
    rows = []
    for name, h in sorted(result["hosts"].items(), key=lambda kv: (kv[1].get("batch") or 0, kv[0])):
        rows.append([name, h.get("batch", "-"), "yes" if h["restarted"] else "NO",
                     f"{bl.fmt(h.get('out'), 2)} ({bl.fmt(h.get('out_records'), 2)})", bl.fmt(h.get("stop"), 2),
                     bl.fmt(h.get("import"), 2), bl.fmt(h.get("start"), 2), bl.fmt(args.settle, 0),
                     bl.fmt(h.get("overhead"), 2)])
    print(bl.table(["host", "batch", "restarted", "out of router", "stop (SIGTERM->Started)",
                    "of start: import (Started->first line)", "start (Started->fired up)", "settle",
                    "overhead = out - stop - start - settle"], rows))
    over = [h["overhead"] for h in result["hosts"].values() if h.get("overhead") is not None]
    if over:
        print(f"\nPer-host overhead: median {bl.fmt(bl.median(over), 2)} s, max {bl.fmt(max(over), 2)} s.")
    print("\nWhere a batch's time goes (apply play, summed over the batches; task start to the next task's start):\n")
    totals = {}
    for b in result["batches"]:
        for task, seconds in b["tasks"]:
            totals.setdefault(task, [0.0, 0])
            totals[task][0] += seconds
            totals[task][1] += 1
    nb = max(1, len(result["batches"]))
    rows = [[task.replace("|", "/")[:110], bl.fmt(t, 2), bl.fmt(t / nb, 2)]
            for task, (t, _c) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:15]]
    print(bl.table(["task", "total s", "per batch s"], rows))
    overs = [b["overhead"] for b in result["batches"] if b["overhead"] is not None]
    bl.summary("P3", f"rollout overhead per batch ({len(result['hosts'])} hosts, {len(result['batches'])} batches): "
               "median / max", f"{bl.fmt(bl.median(overs), 2)} / {bl.fmt(max(overs) if overs else None, 2)} s",
               "<= 3 s per batch", bool(overs) and max(overs) <= TARGET_BATCH)
    if over:
        bl.summary("P3", "per host: out of the router - (stop + start + settle): median / max",
                   f"{bl.fmt(bl.median(over), 2)} / {bl.fmt(max(over), 2)} s", "(no number set)", None)
    print("\nPrepare phase, slowest tasks:\n")
    rows = [[task.replace("|", "/")[:110], bl.fmt(t, 2)] for task, t in
            sorted(prep["tasks"], key=lambda kv: -kv[1])[:8]]
    print(bl.table(["task", "s"], rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--load", type=float, default=8.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--import-seconds", type=float, default=4.0)
    parser.add_argument("--import-mb", type=int, default=450)
    parser.add_argument("--no-lab", action="store_true", help="use the benchmark lab as it is (no lab.py up)")
    args = parser.parse_args()
    if not args.no_lab:
        ok, out = bl.lab_up(args.hosts, exact=True)
        if not ok:
            print(f"### P3 rollout overhead\n\nThe lab did not boot {args.hosts} hosts:\n```\n{out[-3000:]}\n```")
            return 1
    hosts = bl.lab_hosts()
    settings = dict(load=args.load, settle=args.settle, import_seconds=args.import_seconds,
                    import_mb=args.import_mb)
    window_from = bl.fleet_window() or bl.WINDOWS[0]
    bl.log(f"P3: deploying draft window {window_from} to {len(hosts)} hosts (not measured)")
    run = bl.deploy(bl.server_settings(window_from, **settings))
    if run.rc != 0:
        print(f"### P3 rollout overhead\n\nThe deploy before the measured rollout failed (rc {run.rc}):\n"
              f"```\n{run.tail(40)}\n```")
        return 1
    window_to = bl.next_window()
    bl.write_group_vars(bl.server_settings(window_to, **settings))
    before = bl.invocation_ids(hosts)
    bl.log(f"P3: measured rollout {window_from} -> {window_to}")
    run = bl.rollout()
    after = bl.invocation_ids(hosts)
    bl.set_fleet_window(window_to if run.rc == 0 else None)
    result = analyse(run, hosts, before, after, args.settle)
    report(result, run, args, window_from, window_to)
    if run.rc != 0:
        print(f"\n**The measured rollout FAILED (rc {run.rc})**:\n```\n{run.tail(40)}\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
