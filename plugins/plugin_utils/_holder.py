# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who holds a host's lease (controller side): the holder of this ansible-playbook run, and whether the
holder of a lease is provably gone.

A lease binds until it expires (module_utils/_lease.py); on another machine nothing else can be told.
On THIS machine one thing can: the holder's ansible-playbook process is gone, and so is the worker
that renewed the lease last (Ansible's workers run in sessions of their own: one can outlive a killed
ansible-playbook and go on with its task). That is judged only when
the holder ran in the same boot and the same PID namespace as we do (two AWX jobs on one node share the
boot but not the PID namespace; two bastions with one hostname share neither), and by the process's
start time too, so a reused PID is not taken for the holder. Then a re-run after Ctrl-C resumes at once
instead of waiting for the lease to expire.
"""
from __future__ import annotations

import getpass
import os
import socket
import uuid


def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return None


def process_start(pid, proc="/proc"):
    """A process's start time in clock ticks since boot (tells a reused PID apart), or None when it is gone."""
    text = _read(os.path.join(proc, str(pid), "stat"))
    try:
        return int(text.rsplit(")", 1)[-1].split()[19]) if text else None
    except (ValueError, IndexError):
        return None


def this_process(proc="/proc"):
    """The ansible-playbook process (an action runs in a worker forked from it) and where it runs."""
    pid = os.getppid()
    try:
        namespace = os.readlink(os.path.join(proc, "self", "ns", "pid"))
    except OSError:
        namespace = None
    return {"boot": _read(os.path.join(proc, "sys", "kernel", "random", "boot_id")), "pid_ns": namespace,
            "pid": pid, "start": process_start(pid, proc)}


def with_worker(holder):
    """The holder as this worker renews its lease: Ansible's workers run in sessions of their own and outlive a
    killed ansible-playbook, so a holder is gone only when the worker that last renewed its lease is gone too."""
    holder = dict(holder)
    pid = os.getpid()
    holder["process"] = dict(holder.get("process") or {}, worker={"pid": pid, "start": process_start(pid)})
    return holder


def make_holder(kind, run_id, task_vars):
    """A new holder: kind, run id, a session of this ansible-playbook run, controller, user, AWX job, process."""
    job = task_vars.get("awx_job_id") or task_vars.get("tower_job_id")
    return {"kind": kind, "run_id": run_id, "session": uuid.uuid4().hex, "controller": socket.gethostname(),
            "user": getpass.getuser(), "job": str(job) if job else None, "generation": None,
            "process": this_process()}


def gone(lease, proc="/proc"):
    """Whether the holder of `lease` (a lease as sglang_lease returns it) is provably gone: its
    ansible-playbook process ran here - same boot, same PID namespace - and is not running any more."""
    process = ((lease or {}).get("holder") or {}).get("process") or {}
    here = this_process(proc)
    if not process.get("pid") or not process.get("boot") or not process.get("pid_ns"):
        return False
    if process.get("boot") != here["boot"] or process.get("pid_ns") != here["pid_ns"]:
        return False
    worker = process.get("worker") or {}
    if worker.get("pid") and process_start(worker["pid"], proc) == worker.get("start"):
        return False  # the worker that renewed it last still runs (it outlives its ansible-playbook)
    return process_start(process["pid"], proc) != process.get("start")
