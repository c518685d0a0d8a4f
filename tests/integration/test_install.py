"""The collection as a stranger runs it: built with ansible-galaxy, installed from the tarball into a fresh
collections path outside the checkout, an empty ansible.cfg, and the playbooks called by their names
(gpufleet.inference.rollout, gpufleet.inference.verify) against the lab - no file of this checkout used."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from rollout_support import DONE
from rollout_support import fleet_inv  # noqa: F401 pylint: disable=unused-import

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Kept for the guide's sample of a run's summary (docs/docsite/rst/outputs.rst), as a run artifact.
SAMPLE = REPO / ".build" / "results" / "install-rollout-summary.json"


def stranger_playbook(installed, inventory: Path, name: str, extra: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), name, "-e", json.dumps(extra)],
                          cwd=installed.root, env=installed.env, capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL, check=False)


def test_the_installed_collection_is_the_only_one_ansible_sees(installed_collection):
    proc = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "list", "gpufleet.inference"],
                          cwd=installed_collection.root, env=installed_collection.env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert str(installed_collection.path.parents[2]) in proc.stdout, proc.stdout
    assert str(REPO) not in proc.stdout and ".build/collections" not in proc.stdout, proc.stdout
    assert (installed_collection.root / "ansible.cfg").read_text() == ""
    assert not installed_collection.root.is_relative_to(REPO)


def test_rollout_and_verify_by_name_from_the_installed_tarball(
        installed_collection, clean_fleet, fleet_inv, lab_hosts, tmp_path):  # noqa: F811
    hosts_yml, set_vars, _host_vars, _deploy = fleet_inv
    set_vars()
    results = tmp_path / "results"
    rollout = stranger_playbook(installed_collection, hosts_yml, "gpufleet.inference.rollout",
                                {"rollout_results_dir": str(results / "rollout")})
    assert rollout.returncode == 0, rollout.stdout[-4000:] + rollout.stderr[-2000:]
    (summary_path,) = (results / "rollout").glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    statuses = {record["host"]: record["status"] for record in summary["hosts"]}
    assert sorted(statuses) == sorted(h["name"] for h in lab_hosts), statuses
    assert all(status in DONE for status in statuses.values()), statuses
    assert str(REPO) not in rollout.stdout  # nothing of this checkout was loaded
    SAMPLE.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(summary_path, SAMPLE)

    verify = stranger_playbook(installed_collection, hosts_yml, "gpufleet.inference.verify",
                               {"verify_results_dir": str(results / "verify")})
    assert verify.returncode == 0, verify.stdout[-4000:] + verify.stderr[-2000:]
    for host in lab_hosts:
        assert f"{host['name']}: in sync (invocation " in verify.stdout, verify.stdout[-3000:]


def test_verify_from_the_installed_tarball_fails_on_a_host_it_cannot_find_in_sync(
        installed_collection, clean_fleet, fleet_inv, lab_hosts, tmp_path, record_verdict):  # noqa: F811
    """The failure path: nothing installed on the hosts, verify by name says so and fails."""
    hosts_yml, set_vars, _host_vars, _deploy = fleet_inv
    set_vars()
    verify = stranger_playbook(installed_collection, hosts_yml, "gpufleet.inference.verify",
                               {"verify_results_dir": str(tmp_path / "verify")})
    assert verify.returncode != 0, verify.stdout[-3000:]
    line = next((line for line in verify.stdout.splitlines() if line.startswith(f"{lab_hosts[0]['name']}: ")), "")
    assert line.startswith(f"{lab_hosts[0]['name']}: NOT INSTALLED"), verify.stdout[-3000:]
    record_verdict({"verdict": "not_installed"}, source="verify", message=line)
