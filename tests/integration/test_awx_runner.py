"""Rollouts from AWX / Automation Controller jobs (issue 29), on the lab with the real ansible-runner.

AWX runs each job with ansible-runner in a fresh container: a private data dir of its own, a new
hostname, its own PID namespace, nothing left when the job ends. Each job here is that: ansible-runner
in `unshare --uts --pid --fork --mount-proc` with its own hostname and its own private data dir (the
rollout's results directory inside it), awx_job_id as extra var. A cancelled or killed job is SIGKILL
of its namespace's first process: the kernel ends every process of the namespace, as `podman kill`
does. Nothing is shared between jobs but the fleet (its hosts and its router).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from lab_support import BIN
from rollout_support import (SIM_ENV, assert_runs, describe, fleet_record, fleet_state, host_state, leases,
                             playbook_env, wait_lease_expired)
from rollout_support import fleet_of, lab, make_inventory, need_router  # noqa: F401 pylint: disable=unused-import
from test_rollout_safety import NEW, OLD, OTHER, SLOW_LOAD, assert_last_good, names

SHORT_LEASE = 15  # seconds: the killed job's lease of the canary runs out within the test


class Job:
    """One AWX-like job: ansible-runner with its private data dir, hostname and PID namespace."""

    def __init__(self, root: Path, ident: int, inventory, playbook: str, limit: list[str], extra: dict | None = None):
        self.ident = ident
        self.dir = root / f"awx_{ident}"
        (self.dir / "project").mkdir(parents=True)
        (self.dir / "env").mkdir()
        (self.dir / "project" / "job.yml").write_text(f"- ansible.builtin.import_playbook: {playbook}\n")
        shutil.copytree(inventory.dir, self.dir / "inventory", ignore=shutil.ignore_patterns("*.retry", "deploy.yml"))
        env = playbook_env({"ANSIBLE_SSH_CONTROL_PATH_DIR": f"/tmp/gpf-awx-{ident}", "ANSIBLE_NOCOLOR": "1"})
        keep = ("ANSIBLE_", "HOME", "PYTHONUNBUFFERED")
        (self.dir / "env" / "envvars").write_text(yaml.safe_dump(
            {key: value for key, value in env.items() if key.startswith(keep)}))
        (self.dir / "env" / "extravars").write_text(yaml.safe_dump(dict(
            {"awx_job_id": ident, "rollout_results_dir": str(self.dir / "results")}, **(extra or {}))))
        (self.dir / "env" / "cmdline").write_text("--limit " + ",".join(limit + ["localhost"]))
        script = (f"hostname awx-job-{ident} && exec {BIN / 'ansible-runner'} run {self.dir} -p job.yml "
                  f"--ident {ident}")
        self.proc = subprocess.Popen(["unshare", "--uts", "--pid", "--fork", "--mount-proc", "--", "sh", "-c", script],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=dict(env, PATH=f"{BIN}:{os.environ['PATH']}"))
        self.started = time.monotonic()
        self.namespace = None  # an open reference to the killed job's PID namespace (see kill)

    @property
    def artifacts(self) -> Path:
        return self.dir / "artifacts" / str(self.ident)

    @property
    def out(self) -> str:
        path = self.artifacts / "stdout"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait(self, timeout: float = 900) -> "Job":
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job {self.ident} ran over {timeout}s:\n{self.out[-4000:]}")
        self.seconds = time.monotonic() - self.started
        return self

    def kill(self) -> None:
        """The job's container killed: SIGKILL to the namespace's first process (and the unshare). The test keeps
        a reference to the dead namespace so that no later job's namespace gets its number (the kernel reuses
        them): a later job then sees what a job on another node sees - a holder it cannot tell dead, until its
        lease expires. (A later job that did get the number would rightly resume at once: the holder's
        namespace, and so the holder, is gone.)"""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        first = children.read_text().split() if children.exists() else []
        for pid in first:
            try:
                self.namespace = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY)
            except OSError:
                pass
            os.kill(int(pid), signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    @property
    def status(self) -> str | None:
        path = self.artifacts / "status"
        return path.read_text().strip() if path.exists() else None

    def artifact_data(self) -> dict:
        """What AWX keeps as the job's artifacts: set_stats data of the last playbook_on_stats event."""
        found = {}
        for path in sorted((self.artifacts / "job_events").glob("*.json")):
            event = json.loads(path.read_text())
            if event.get("event") == "playbook_on_stats":
                found = event.get("event_data", {}).get("artifact_data") or {}
        return found

    def __repr__(self):
        return f"Job({self.ident}, status {self.status}, data dir {self.dir})\n{self.out[-6000:]}"


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def jobs(tmp_path):
    started = []

    def start(*args, **kwargs) -> Job:
        started.append(Job(tmp_path, *args, **kwargs))
        return started[-1]
    yield start
    for job in started:
        if job.proc.poll() is None:
            job.kill()
        if job.namespace is not None:
            os.close(job.namespace)
        subprocess.run(["sh", "-c", f"for s in /tmp/gpf-awx-{job.ident}/*; do ssh -O exit -o ControlPath=$s x; "
                                    f"done 2>/dev/null; rm -rf /tmp/gpf-awx-{job.ident}"], check=False)


def test_awx_jobs_two_at_once_one_killed_and_resumed_by_a_new_job_and_a_status_job(
        fleet_of, make_inventory, lab, lab_hosts, need_router, jobs):
    hosts = lab_hosts[:3]
    canary = hosts[0]
    fleet_of(hosts)
    limit = names(hosts)

    # Two jobs at once, other settings each: one is refused naming the other; the fleet is uniform.
    first, second = make_inventory("a"), make_inventory("b")
    first.set_vars(sglang_speculative_draft_window_size=NEW)
    second.set_vars(sglang_speculative_draft_window_size=OTHER)
    a, b = jobs(101, first, "gpufleet.inference.rollout", limit), jobs(102, second, "gpufleet.inference.rollout", limit)
    a.wait(), b.wait()
    statuses = {a.ident: a.status, b.ident: b.status}
    assert sorted(statuses.values()) == ["failed", "successful"], (a, b)
    winner, loser = (a, b) if a.status == "successful" else (b, a)
    window = NEW if winner is a else OTHER
    assert re.search(rf"is leased by rollout \S+ on awx-job-{winner.ident} by \S+ \(AWX job {winner.ident}\)",
                     flat(loser.out)), loser
    state = fleet_state(lab, lab_hosts, need_router)
    for host in hosts:
        assert_runs(state[host["name"]], window, in_router=True)
        assert fleet_record(lab, host)["run_id"] == winner.artifact_data()["gpufleet_rollout"]["run_id"]
    assert not leases(lab, hosts)
    summary = winner.artifact_data()["gpufleet_rollout"]
    assert summary["status"] == "finished" and summary["counts"] == {"updated": 3}, summary

    # A job killed while the canary's new process loads; a new job in a new data dir resumes the run.
    change = make_inventory("c")
    target = OLD
    change.set_vars(sglang_speculative_draft_window_size=target, sglang_lease_seconds=SHORT_LEASE,
                    sglang_environment=SIM_ENV | SLOW_LOAD)
    killed = jobs(103, change, "gpufleet.inference.rollout", limit)
    deadline = time.monotonic() + 300
    while fleet_record(lab, canary).get("step") != "applying" or \
            host_state(lab, canary)["invocation"] == state[canary["name"]]["invocation"]:
        assert time.monotonic() < deadline and killed.proc.poll() is None, killed
        time.sleep(0.5)
    killed.kill()
    run_id = fleet_record(lab, canary)["run_id"]
    assert killed.status != "successful" and not killed.artifact_data(), killed  # killed: no artifacts
    out_of_router = fleet_state(lab, lab_hosts, need_router)[canary["name"]]
    assert out_of_router["in_router"] is False, describe(out_of_router)

    # At once, from another container: the canary's lease binds (its holder cannot be told dead from here)
    early = jobs(104, change, "gpufleet.inference.rollout", limit).wait()
    assert early.status == "failed", early
    assert re.search(rf"{canary['name']} is leased by rollout {run_id} on awx-job-103 by \S+ \(AWX job 103\)",
                     flat(early.out)), early
    assert fleet_record(lab, canary)["run_id"] == run_id and fleet_record(lab, canary)["step"] == "applying"

    wait_lease_expired(lab, canary)
    resumed = jobs(105, change, "gpufleet.inference.rollout", limit).wait()
    assert resumed.status == "successful", resumed
    assert f"resuming run {run_id}: it left {canary['name']} mid-change (its controller is gone" in flat(resumed.out)
    summary = resumed.artifact_data()["gpufleet_rollout"]
    assert summary["run_id"] == run_id and summary["status"] == "finished", summary
    assert summary["counts"] == {"recovered": 1, "updated": 2}, summary
    after = fleet_state(lab, lab_hosts, need_router)
    for host in hosts:
        assert_runs(after[host["name"]], target, in_router=True)
        assert_last_good(after[host["name"]], after[host["name"]]["invocation"], target)
    assert not leases(lab, hosts)

    # A status job from a third data dir shows the run on every host.
    shown = jobs(106, change, "gpufleet.inference.status", limit).wait()
    assert shown.status == "successful", shown
    rows = {row["host"]: row for row in shown.artifact_data()["gpufleet_status"]}
    for host in hosts:
        row = rows[host["name"]]
        assert row["run_id"] == run_id and row["in_router"] is True and not row["leased"], row
        assert row["status"] in ("recovered", "updated"), row
    assert run_id in shown.out
    print(f"\nAWX-like jobs: {winner.ident} won ({winner.seconds:.1f} s), {loser.ident} refused; 103 killed, "
          f"104 refused, 105 resumed {run_id} in {resumed.seconds:.1f} s")
