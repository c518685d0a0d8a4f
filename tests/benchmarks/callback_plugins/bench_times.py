# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmarks only: write one JSON line per task start and per host result, with the time.

Enabled by the benchmark scripts (ANSIBLE_CALLBACK_PLUGINS=tests/benchmarks/callback_plugins,
ANSIBLE_CALLBACKS_ENABLED=bench_times, GPF_BENCH_EVENTS=<file>), so a figure can start or end at
a task's end instead of at ansible-playbook's own start-up. Each line also carries the
controller process's CPU (os.times(): this process and its reaped children, i.e. the forked
workers and their ssh clients).

GPF_BENCH_HOST_PIDNS (JSON {inventory_hostname: "pid:[inode]" of that lab host's PID namespace}) adds, per event of such a host,
the CPU of that lab host's sshd processes and of the commands they ran and reaped (a command run
over ssh - the module, its journalctl/systemctl children - is accounted to its sshd parent when
it exits): the difference between two events is what the host spent on the tasks in between.
"""
from __future__ import annotations

DOCUMENTATION = r"""
name: bench_times
type: aggregate
short_description: task and result timestamps for the benchmarks (tests/benchmarks)
description:
  - Writes task starts and host results with wall time and CPU to the file named by GPF_BENCH_EVENTS.
requirements:
  - GPF_BENCH_EVENTS set
"""

import json
import os
import time

from ansible.plugins.callback import CallbackBase

KEEP = ("verdict", "elapsed", "phases", "invocation_id", "attempts", "status", "msg", "module_runs")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def sshd_cpu(pidns):
    """CPU seconds of the sshd processes in PID namespace `pidns`: their own, the commands they reaped."""
    own = reaped = 0.0
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink("/proc/%s/ns/pid" % name) != pidns:
                continue
            with open("/proc/%s/stat" % name) as handle:
                stat = handle.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if comm != "sshd":
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        own += (int(fields[11]) + int(fields[12])) / float(CLK_TCK)
        reaped += (int(fields[13]) + int(fields[14])) / float(CLK_TCK)
        count += 1
    return {"sshd": round(own, 3), "commands": round(reaped, 3), "processes": count}


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bench_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super(CallbackModule, self).__init__()
        path = os.environ.get("GPF_BENCH_EVENTS")
        self._out = open(path, "a") if path else None
        self._pidns = json.loads(os.environ.get("GPF_BENCH_HOST_PIDNS") or "{}")

    def _write(self, kind, host=None, **fields):
        if self._out is None:
            return
        times = os.times()
        event = {"kind": kind, "t": time.time(), "host": host,
                 "cpu": round(times[0] + times[1], 3), "cpu_children": round(times[2] + times[3], 3)}
        event.update(fields)
        if self._pidns:
            hosts = [host] if host in self._pidns else (list(self._pidns) if host is None else [])
            event["host_cpu"] = dict((name, sshd_cpu(self._pidns[name])) for name in hosts)
        self._out.write(json.dumps(event, default=str) + "\n")
        self._out.flush()

    def v2_playbook_on_play_start(self, play):
        self._write("play", play=play.get_name())

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._write("task", task=task.get_name(), uuid=task._uuid)

    def v2_playbook_on_handler_task_start(self, task):
        self._write("task", task=task.get_name(), uuid=task._uuid, handler=True)

    def _result(self, kind, result):
        data = result._result if isinstance(result._result, dict) else {}
        kept = dict((key, data[key]) for key in KEEP if key in data)
        self._write(kind, result._host.get_name(), task=result._task.get_name(), uuid=result._task._uuid,
                    changed=bool(data.get("changed")), result=kept)

    def v2_runner_on_ok(self, result):
        self._result("ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result("failed", result)

    def v2_runner_on_skipped(self, result):
        self._result("skipped", result)

    def v2_runner_on_unreachable(self, result):
        self._result("unreachable", result)

    def v2_playbook_on_stats(self, stats):
        hosts = sorted(stats.processed.keys())
        self._write("stats", summary=dict((name, stats.summarize(name)) for name in hosts))
