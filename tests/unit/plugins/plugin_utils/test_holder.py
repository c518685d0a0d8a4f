# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A lease's holder is provably gone only when its process ran here (same boot, same PID namespace)."""
import os
import subprocess
import sys

from ansible_collections.gpufleet.inference.plugins.plugin_utils import _holder


def lease_of(process):
    return {"live": True, "holder": {"run_id": "r1", "process": process}}


def test_a_holder_made_here_names_its_process_and_a_new_session_each_time():
    one = _holder.make_holder("rollout", "r1", {"awx_job_id": 42})
    two = _holder.make_holder("rollout", "r1", {})
    assert one["session"] != two["session"] and one["job"] == "42" and two["job"] is None
    assert one["process"]["pid"] == os.getppid() and one["process"]["start"] == _holder.process_start(os.getppid())
    assert one["process"]["boot"] and one["process"]["pid_ns"].startswith("pid:[")
    assert not _holder.gone(lease_of(one["process"]))  # our own parent runs


def test_an_ended_process_here_is_gone_and_a_reused_pid_is_not_taken_for_it():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    here = _holder.this_process()
    process = dict(here, pid=child.pid, start=_holder.process_start(child.pid))
    assert not _holder.gone(lease_of(process))
    child.kill()
    child.wait()
    assert _holder.gone(lease_of(process))
    # the PID runs again, but another process (another start time): still gone
    assert _holder.gone(lease_of(dict(here, start=(here["start"] or 0) + 1)))


def test_elsewhere_nothing_can_be_told():
    here = _holder.this_process()
    ended = dict(here, pid=2 ** 22 + 7, start=1)  # no such process here
    assert _holder.gone(lease_of(ended))
    assert not _holder.gone(lease_of(dict(ended, boot="another-boot")))     # another machine, or a reboot
    assert not _holder.gone(lease_of(dict(ended, pid_ns="pid:[1]")))        # another container on this node
    assert not _holder.gone(lease_of({})) and not _holder.gone(None)        # a holder that named no process


def test_a_worker_that_outlives_its_ansible_playbook_keeps_the_holder_alive():
    here = _holder.this_process()
    ended = dict(here, pid=2 ** 22 + 7, start=1)  # the ansible-playbook: gone
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        alive = dict(ended, worker={"pid": worker.pid, "start": _holder.process_start(worker.pid)})
        assert not _holder.gone(lease_of(alive))  # its worker still renews it
    finally:
        worker.kill()
        worker.wait()
    assert _holder.gone(lease_of(alive))
    renewed = _holder.with_worker({"kind": "rollout", "process": here})
    assert renewed["process"]["worker"]["pid"] == os.getpid() and renewed["process"]["pid"] == here["pid"]
