# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A rollout's inputs, its records and the controller's copy of them.

Private to this collection: no compatibility promise. Pure functions plus file I/O under one
results directory, used by the ``sglang_rollout`` and ``sglang_rollout_host`` action plugins.

The fleet is the source of truth: each host holds its lease and its record
(module_utils/_lease.py); router membership comes from the router. The results directory
(``rollout_results_dir``) is a copy for people, written as the run goes::

    <run id>/<host>.json       what this run did on the host (rewritten at every step)
    <run id>/summary.json      every host file of the run, regenerated with each write
    <run id>/summary.md        the same as a table
    <run id>/run.json          the run itself: status, request, what it resumed

Every file is written to a temporary name and renamed, under an fcntl lock of the directory, so a
reader never sees a half-written record and the summary always agrees with the host files.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import math
import os
import re
import secrets

from ansible_collections.gpufleet.inference.plugins.module_utils import _files
from ansible_collections.gpufleet.inference.plugins.module_utils._flags import SETTING_KEYS
from ansible_collections.gpufleet.inference.plugins.module_utils._records import NOT_VERIFIED

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class RolloutError(Exception):
    """A plain-words error: bad input, a held lock, an unreadable record."""


# ------------------------------------------------------------------------------ inputs

def parse_count(value, name, allow_zero=True):
    """An int >= 0 (>= 1 unless allow_zero) or 'N%': returns int or the string 'N%'."""
    if isinstance(value, bool):
        raise RolloutError("%s must be a number or a percentage like '25%%', got %r" % (name, value))
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and _PERCENT.match(value):
        percent = float(_PERCENT.match(value).group(1))
        if percent > 100 or (percent <= 0 and not allow_zero):
            lowest = "0" if allow_zero else "above 0"
            raise RolloutError("%s percentage must be %s..100, got %r" % (name, lowest, value))
        return "%g%%" % percent
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    else:
        raise RolloutError("%s must be a number or a percentage like '25%%', got %r" % (name, value))
    if number < (0 if allow_zero else 1):
        raise RolloutError("%s must be %s, got %r" % (name, "0 or more" if allow_zero else "1 or more", value))
    return number


def parse_seconds(value, name, minimum=0):
    """A whole number of seconds >= minimum (an int, a whole float such as YAML's 5.0, or their text from -e k=v)."""
    try:
        number = float(str(value).strip())
    except ValueError:
        number = None
    if isinstance(value, bool) or value is None or number is None or not math.isfinite(number) \
            or not number.is_integer() or number < minimum:
        raise RolloutError("%s must be a whole number of seconds, %d or more; got %r" % (name, minimum, value))
    return int(number)


def parse_batches(value):
    """rollout_batches as given (a list, a number, a '25%', or the text of a list from -e k=v)
    -> a list for the play's ``serial`` (Ansible repeats its last element)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text.replace("'", '"'))
            except ValueError:
                raise RolloutError("rollout_batches %r is not a list like [1, '25%%'] (with -e, quote it: "
                                   "-e '{\"rollout_batches\": [1, \"25%%\"]}')" % value)
        else:
            value = [p for p in re.split(r"[\s,]+", text) if p]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise RolloutError("rollout_batches must be a non-empty list of batch sizes (numbers or percentages like "
                           "'25%%'), got %r" % (value,))
    return [parse_count(item, "rollout_batches[%d]" % index, allow_zero=False) for index, item in enumerate(value)]


def resolve_count(value, total):
    """A parsed count against a group of `total`; a percentage rounds down, to at least 1 (as
    Ansible's serial does)."""
    if isinstance(value, str):
        return max(1, int(float(value.rstrip("%")) / 100.0 * total))
    return min(int(value), total)


def batch_sizes(batches, total):
    """The sizes of the batches Ansible's serial makes of `total` hosts (last element repeats)."""
    sizes, left, index = [], total, 0
    while left > 0:
        size = max(1, resolve_count(batches[min(index, len(batches) - 1)], total))
        size = min(size, left)
        sizes.append(size)
        left -= size
        index += 1
    return sizes


# ------------------------------------------------------------------------------ files

def utc_now():
    return datetime.datetime.now(datetime.timezone.utc)


def iso(moment=None):
    """UTC with milliseconds: step records are a few seconds apart."""
    return (moment or utc_now()).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_iso(text):
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.datetime.strptime(text, fmt).replace(tzinfo=datetime.timezone.utc)
        except (TypeError, ValueError):
            continue
    return None


def new_run_id(moment=None):
    """Unique even for runs started in the same second: time plus 6 random hex digits."""
    return "%s-%s" % ((moment or utc_now()).strftime("%Y%m%dT%H%M%SZ"), secrets.token_hex(3))


def check_run_id(run_id):
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise RolloutError("rollout_run_id %r must be letters, digits, '.', '_' or '-'" % (run_id,))
    return run_id


def write_json(path, data):
    """A record, atomically; a value JSON cannot hold is written as its text (a record is never lost)."""
    _files.write_json(path, data, default=str)


def read_json(path, default=None):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return default


class RootLock(object):
    """An fcntl lock on the results directory: one writer of the copy at a time across the controller's forks."""

    def __init__(self, root):
        self.root = root
        self.handle = None

    def __enter__(self):
        if not os.path.isdir(self.root):
            os.makedirs(self.root, 0o755)
        self.handle = open(os.path.join(self.root, ".write.lock"), "a")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


# ------------------------------------------------------------------------------ records

# step -> (in_router, what runs on the host, status while at that step)
STEPS = {
    "draining": (False, "the previous unit (leaving the router)", "in progress"),
    "applying": (False, "the new unit, not verified yet (install, restart, wait)", "in progress"),
    "verified": (False, "the new unit, verified", "verified, not rejoined"),
    "rejoined": (True, "the new unit, verified", "updated"),
}
# A host at one of these lets the rollout go on to the next batch (its record's continue_rollout,
# which the playbook and the finish step read; any other status stops the run).
CONTINUE_STATUSES = ("updated", "recovered", "unchanged (verified)", "updated (not verified)",
                     "unchanged (not verified)", "unchanged (verified), out of the router",
                     "updated, left out of the router")
# A host at one of these stopped the rollout (the run fails).
STOPPED_STATUSES = ("failed", "verified, not rejoined", "not verified, not rejoined", "reverted",
                    "updated, analysis inconclusive")


def summarize(run, records):
    """summary.json: the run and its host records, with counts (consistent with the host files)."""
    counts = {}
    for record in records:
        counts[record.get("status", "?")] = counts.get(record.get("status", "?"), 0) + 1
    return {"run": run, "counts": counts, "hosts": sorted(records, key=lambda r: r.get("host", ""))}


def summary_text(summary):
    """summary.json's text: the run and the counts indented, then each host's record on ONE line
    (`grep HOST summary.json` shows that host; keys sorted). Why not all indented: a rollout rewrites
    the summary at every step of every host, and Python's json encodes indented text in Python, the
    compact one in C (tests/benchmarks/RESULTS.md)."""
    hosts = summary.get("hosts")
    if not isinstance(hosts, list):
        return json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n"
    rest = dict((key, value) for key, value in summary.items() if key != "hosts")
    lines = ",\n".join("    " + json.dumps(record, sort_keys=True, default=str) for record in hosts)
    body = '  "hosts": [\n%s\n  ]' % lines if hosts else '  "hosts": []'
    if not rest:
        return "{\n%s\n}\n" % body
    head = json.dumps(rest, indent=2, sort_keys=True, default=str)  # ends with "\n}"
    return "%s,\n%s\n}\n" % (head[:-2], body)


def write_summary_file(path, summary):
    """summary.json, atomically (see summary_text)."""
    _files.write_atomic(path, summary_text(summary).encode("utf-8"), 0o644)


def table(records):
    """The end-of-rollout table: host, status, old -> new invocation, time to ready, config seen."""
    rows = [("host", "status", "invocation (old -> new)", "ready", "config seen")]
    for record in sorted(records, key=lambda r: r.get("host", "")):
        old = (record.get("old_invocation") or "-")[:8]
        new = (record.get("new_invocation") or "-")[:8]
        ready = record.get("time_to_ready")
        observed = record.get("observed") or {}
        keys = SETTING_KEYS
        seen = ", ".join("%s=%s" % (key, observed[key]) for key in keys if key in observed)
        group = record.get("group") or {}
        if not seen and group.get("head") not in (None, record.get("host")):
            seen = "node of %s (head %s)" % (group.get("name"), group.get("head"))  # its head's line is the group's
        rows.append((record.get("host", "?"), record.get("status", "?"), "%s -> %s" % (old, new),
                     "%.1fs" % ready if isinstance(ready, (int, float)) else "-",
                     seen or ("off" if record.get("config_line_mode") == "absent" else "-")))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    for record in sorted(records, key=lambda r: r.get("host", "")):
        analysis = record.get("analysis") or {}
        if analysis:  # the canary analysis: one line under the table
            lines.append("canary analysis of %s against %s: %s - %s%s" % (
                record.get("host"), analysis.get("baseline"), analysis.get("verdict"), analysis.get("message"),
                " (report: %s)" % (analysis.get("report") or {}).get("markdown") if analysis.get("report") else ""))
    return "\n".join(lines)


def record_step(run, host, step, args):
    """Write one step of a host into the controller's copy (its record and the run's summary, under the
    directory's lock); returns the merged record, which the caller also writes on the host."""
    if not run.get("run_dir"):
        raise RolloutError("record needs run (the result of state=start)")
    root = os.path.dirname(run["run_dir"])
    with RootLock(root):
        record = build_record(host, step, args, run)
        if args.get("analysis"):
            record["analysis"] = args["analysis"]
        path = os.path.join(run["run_dir"], "%s.json" % host)
        merged = dict(read_json(path) or {}, **record)
        merged["steps"] = (merged.get("steps") or []) + [{"step": step, "at": iso(), "status": merged["status"]}]
        merged["continue_rollout"] = merged["status"] in CONTINUE_STATUSES
        write_json(path, merged)
        update_summary(run, merged)
    return merged


def host_record(merged, run, drained_by=None, worker_url=None):
    """What the host keeps of a step in its own record (sglang_lease's record): enough for any controller
    to tell where it is, which run left it there, and whether this collection took it out of the router."""
    keys = ("step", "status", "in_router", "old_invocation", "new_invocation", "runs", "failed_step", "outcome",
            "connection_lost", "reverted", "recovering", "analysis")
    record = dict((key, merged.get(key)) for key in keys if merged.get(key) is not None)
    record.update(kind="rollout", run_id=run.get("run_id"), drained_by=drained_by, worker_url=worker_url,
                  intent_digest=(run.get("digests") or {}).get(merged.get("host")))
    return record


def update_summary(run, record):
    """summary.json with one host's record replaced: one file read, not every host file (a step of
    a 64-host rollout would otherwise read 64 records). Rebuilt from the host files when absent."""
    path = os.path.join(run["run_dir"], "summary.json")
    summary = read_json(path)
    if not isinstance(summary, dict) or not isinstance(summary.get("hosts"), list):
        return write_summary(run)
    records = [item for item in summary["hosts"] if item.get("host") != record.get("host")] + [record]
    write_summary_file(path, summarize(summary.get("run") or {}, records))
    return summary.get("run") or {}, records


def build_record(host, step, args, run):
    """The record of a host at `step` from that step's values (drift, verified, failure...; at step
    prepared, ``plan``: the host's entry of the run's plan, _fleet.plan)."""
    drift = args.get("drift") or {}
    record = {"host": host, "run_id": run.get("run_id")}
    if step == "prepared":
        planned = args.get("plan") or {}
        action = planned.get("action", "apply" if not drift.get("in_sync") else "keep")
        if run.get("check_mode"):
            status = "in sync" if action in ("keep", "left_out") else "would change"
        elif action == "keep":
            status = "unchanged (verified)"
        elif action == "left_out":
            status = "unchanged (verified), out of the router"
        else:
            status = "pending"
        router = bool(args.get("router"))
        record.update(status=status, step=step, old_invocation=drift.get("invocation_id"),
                      endpoint=args.get("endpoint"), observed=drift.get("observed"),
                      differences=drift.get("differences") or [], restart_pending=drift.get("restart_pending"),
                      drift_verdict=drift.get("verdict"), in_router=(planned.get("drain_url") is not None)
                      if router else None, router_url=planned.get("drain_url"), plan=planned.get("reason"))
        if planned.get("recovering"):
            record["recovering"] = planned["recovering"]
        if planned.get("group"):
            record["group"] = {"name": planned["group"], "head": planned.get("head")}  # changed with its group
        earlier = planned.get("earlier") or {}
        if action == "keep" and earlier.get("status") and not run.get("check_mode"):
            record.update(status=earlier["status"], old_invocation=earlier.get("old_invocation"),
                          new_invocation=earlier.get("new_invocation"), plan="done before the run was interrupted")
        return record
    if step in STEPS:
        in_router, runs, status = STEPS[step]
        if not args.get("router"):
            in_router = None
        if step == "rejoined" and args.get("recovering"):
            status = "recovered"
        record.update(step=step, status=status, in_router=in_router, runs=runs)
        verified = args.get("verified") or {}
        unverified = verified.get("verdict") == NOT_VERIFIED  # sglang_verify off: nothing saw the process
        if step in ("verified", "rejoined") and verified:
            if unverified:  # the step restarted or started the unit, or not; its invocation is unknown
                restarted = bool(verified.get("restarted"))
            else:
                restarted = verified.get("invocation_id") != drift.get("invocation_id")
            record.update(new_invocation=verified.get("invocation_id"), observed=verified.get("observed"),
                          config_line_mode=verified.get("config_line_mode"), source=verified.get("source"),
                          verified=verified.get("verified"), restarted=restarted,
                          time_to_ready=(verified.get("phases") or {}).get("generate", {}).get("elapsed")
                          if restarted else None,
                          settle_seconds=args.get("min_ready_seconds"), verify_msg=verified.get("msg"))
            if step == "verified" and unverified:
                record["status"] = "not verified, not rejoined"
            elif step == "rejoined" and unverified:
                record["status"] = "updated (not verified)" if restarted else "unchanged (not verified)"
            elif step == "rejoined" and not restarted and status == "updated":
                record["status"] = "recovered" if args.get("recovering") else "unchanged (verified)"
        if step == "rejoined" and args.get("held"):
            # the canary analysis could not tell (rollout_analysis_on_inconclusive: stop): left as it is, the run holds
            record["status"] = "updated, analysis inconclusive"
        if step == "rejoined" and args.get("left_out"):
            # changed and verified, not put into the router: it was out before, not by this collection
            record["in_router"] = False
            record["status"] = {"updated": "updated, left out of the router",
                                "unchanged (verified)": "unchanged (verified), out of the router"}.get(
                record["status"], record["status"])
        if args.get("drained") is not None:
            record["drained_seconds"] = (args.get("drained") or {}).get("drain_seconds")
        if step == "rejoined":
            if args.get("rejoined_at"):
                record["rejoined_at"] = args["rejoined_at"]  # back in the router (the step is written after the save)
            saved = args.get("last_good") or {}
            record["last_good_saved"] = bool(saved.get("exists")) and not args.get("last_good_error")
            if unverified:
                record["last_good_note"] = ("not saved: the new process was not verified (sglang_verify is off); "
                                            "the last-known-good unit is still the one from before")
            if args.get("last_good_error"):
                record["last_good_error"] = args["last_good_error"]
        return record
    if step == "failed":
        return failure_record(record, args)
    raise RolloutError("unknown step %r" % step)


def failure_record(record, args):
    """A failed host's record: where it stopped, what runs on it, whether it is in the router."""
    reached = (args.get("state_before") or {}).get("step")
    failure = args.get("failure") or {}
    revert = args.get("revert") or {}
    router = bool(args.get("router"))
    lost = failure.get("verdict") == "connection_lost" or failure.get("unreachable")
    cause = failure.get("msg") or "unknown failure"
    if isinstance(cause, list):
        cause = "; ".join(str(item) for item in cause)
    task = args.get("task") or "?"
    rejoined = bool(args.get("rejoined_after_revert"))
    left = reached in ("draining", "applying")  # it had been taken out of the router
    if args.get("taken_over"):
        status, in_router = "failed", ((not left) if router else None)
        runs = STEPS[reached][1] if reached in STEPS else "the previous unit (unchanged)"
        outcome = ("its lease was taken over by another writer: this run stopped touching it at step %s (no revert, "
                   "no router call); the host's own record says what its new holder did" % (reached or "prepared"))
    elif reached == "verified":
        status = "verified, not rejoined"
        outcome = ("the new settings were verified, but the host could not be put back into the router: it runs "
                   "the new, verified unit and serves no router traffic. It was NOT reverted (nothing is wrong "
                   "with it); re-run the rollout to put it back")
        in_router = False
        runs = STEPS["verified"][1]
    elif lost:
        # Before its first step nothing on the host was touched: it runs what it ran.
        runs = STEPS[reached][1] if reached in STEPS else "the previous unit (unchanged)"
        outcome = ("the connection to the host was lost at step %s: nothing more is known of it; it %s and "
                   "runs %s. Re-run the rollout when it is reachable: it resumes this run" % (
                       reached or "prepared", "is OUT of the router" if router and left else
                       "was not taken out of the router" if router else "was not reverted", runs))
        status, in_router = "failed", ((not left) if router else None)
    elif not args.get("changed"):
        status, outcome = "failed", "nothing on the host had changed; no revert needed"
        in_router = (rejoined or not left) if router else None
        runs = "the previous unit (unchanged)"
        if router and left and not rejoined:
            outcome += "; it is OUT of the router (it had left it)"
            if args.get("kept_out_of_router"):
                outcome += ": %s" % args["kept_out_of_router"]
    elif not revert:
        status = "failed"
        outcome = "NO last-known-good unit to revert to: the host is left as it is%s" % (
            " and is OUT of the router, serving nothing" if router else "")
        in_router, runs = (False if router else None), "the new unit, not verified"
    elif revert.get("healthy"):
        status = "reverted"
        outcome = "reverted to the last-known-good unit: invocation %s verified (%s)%s" % (
            revert.get("invocation_id"), revert.get("observed"),
            "; back in the router" if router and rejoined else
            "; NOT back in the router: %s" % args["kept_out_of_router"] if router and args.get("kept_out_of_router")
            else "; NOT back in the router" if router else "")
        in_router, runs = (rejoined if router else None), "the last-known-good unit, verified"
    else:
        status = "failed"
        outcome = ("the revert to the last-known-good unit FAILED too (%s): %s. The host is %s and runs the "
                   "last-known-good unit, not verified" % (revert.get("verdict"), revert.get("msg"),
                                                           "OUT of the router, serving nothing" if router
                                                           else "not serving verified settings"))
        in_router, runs = (False if router else None), "the last-known-good unit, not verified"
    record.update(step="failed", status=status, failed_step=reached, failed_task=task, error=cause,
                  in_router=in_router, runs=runs, connection_lost=bool(lost), outcome=outcome,
                  reverted=bool(revert.get("healthy")), revert=revert or None,
                  message="Rollout stopped at %s: %s: %s. %s." % (record["host"], task, cause.rstrip("."),
                                                                  outcome))
    return record


def write_summary(run):
    """summary.json of the run from its host files; returns (run.json, records)."""
    run_dir = run["run_dir"]
    records = []
    for name in sorted(os.listdir(run_dir)):
        if name.endswith(".json") and name not in ("summary.json", "run.json") and not name.startswith("."):
            item = read_json(os.path.join(run_dir, name))
            if item:
                records.append(item)
    meta = read_json(os.path.join(run_dir, "run.json"), {})
    write_summary_file(os.path.join(run_dir, "summary.json"), summarize(meta, records))
    return meta, records


def markdown(summary):
    """summary.md: the run and one table row per host, for people (the JSON is for tools)."""
    run = summary.get("run") or {}
    lines = ["# Rollout %s" % run.get("run_id", "?"), "",
             "Status: %s. Controller: %s, user %s%s." % (
                 run.get("status", "?"), run.get("controller", "?"), run.get("user", "?"),
                 ", AWX job %s" % run["job"] if run.get("job") else ""), "",
             "| host | status | old -> new invocation | ready | in router | note |",
             "|---|---|---|---|---|---|"]
    for record in summary.get("hosts") or []:
        ready = record.get("time_to_ready")
        note = record.get("outcome") or record.get("recovering") or record.get("plan") or ""
        lines.append("| %s | %s | %s -> %s | %s | %s | %s |" % (
            record.get("host"), record.get("status"), (record.get("old_invocation") or "-")[:8],
            (record.get("new_invocation") or "-")[:8], "%.1fs" % ready if isinstance(ready, (int, float)) else "-",
            {True: "yes", False: "NO"}.get(record.get("in_router"), "-"), str(note).replace("|", "/")))
    return "\n".join(lines) + "\n"


def write_markdown(path, summary):
    _files.write_atomic(path, markdown(summary).encode("utf-8"), 0o644)


def stats(summary):
    """What AWX keeps of the run (set_stats, the job's artifacts): the run, the counts, one line per host."""
    run = summary.get("run") or {}
    return {"run_id": run.get("run_id"), "status": run.get("status"), "counts": summary.get("counts"),
            "hosts": dict((record.get("host"), record.get("status")) for record in summary.get("hosts") or [])}


def status_table(rows):
    """gpufleet.inference.status: host, lease, run, step, status, settings digest, in the router."""
    table_rows = [("host", "run", "step", "status", "settings", "in router", "lease")]
    for row in rows:
        table_rows.append((row["host"], row.get("run_id") or "-", row.get("step") or "-", row.get("status") or "-",
                           row.get("intent_digest") or "-", {True: "yes", False: "NO"}.get(row.get("in_router"), "-"),
                           row.get("lease") or "-"))
    widths = [max(len(str(row[i])) for row in table_rows) for i in range(len(table_rows[0]))]
    return "\n".join("  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
                     for row in table_rows)
