"""`ansible-galaxy collection build` makes a tarball that carries what a user runs and reads, and no file
that only works in this checkout (galaxy.yml's build_ignore); installed, ansible-doc documents it."""
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml
from ansible.module_utils.compat.version import LooseVersion

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DOC = Path(sys.executable).parent / "ansible-doc"

REQUIRED = ("MANIFEST.json", "FILES.json", "README.md", "LICENSE", "CHANGELOG.rst", "meta/runtime.yml",
            "meta/execution-environment.yml", "meta/ee-requirements.txt", "meta/ee-bindep.txt",
            "roles/sglang/tasks/main.yml", "roles/sglang/meta/argument_specs.yml", "plugins/modules/sglang_ready.py",
            "playbooks/rollout.yml", "meta/playbook_vars.yml", "inventories/example/hosts.yml",
            "docs/docsite/extra-docs.yml", "docs/docsite/rst/troubleshooting.rst", "changelogs/changelog.yaml",
            "tests/unit/conftest.py")
# Checkout-only: this checkout's ansible.cfg (lab inventory, ./.build paths), tool configs, the lab and
# everything bound to it, benchmark results, CI, build and run output, the docs generators.
FORBIDDEN = ("ansible.cfg", "pytest.ini", ".ansible-lint", ".gitignore", "Makefile", "execution-environment.yml",
             "inventories/lab/", "roles/sglang/molecule/", "tests/benchmarks/", "tests/lab/", "tests/sglang_sim/",
             "tests/integration/", "tests/functional/", "tests/conformance/", "tests/lab_cycle/", "tests/docs/",
             "tests/run_layers.py", "tests/unit/collection/", "docs/tools/", "changelogs/fragments/", ".ci/", ".venv/", ".build/", ".git/",
             "collections/", "results/", "tests/output/", "__pycache__", ".pyc")


def leaked(names):
    return [n for n in names if any(n == f or n.startswith(f) or (f.startswith(("_", ".py")) and f in n)
                                    for f in FORBIDDEN)]


def test_the_rule_for_checkout_only_files_catches_what_it_must():
    assert leaked(["ansible.cfg", "tests/benchmarks/RESULTS.md", "plugins/x/__pycache__/a.pyc", "inventories/lab/g"]) \
        == ["ansible.cfg", "tests/benchmarks/RESULTS.md", "plugins/x/__pycache__/a.pyc", "inventories/lab/g"]
    assert leaked(["meta/execution-environment.yml", "inventories/example/hosts.yml", "tests/unit/conftest.py"]) == []


def test_the_tarball_carries_what_a_user_needs_and_nothing_checkout_only(installed_collection):
    with tarfile.open(installed_collection.tarball) as tar:
        names = [n.rstrip("/") + ("/" if m.isdir() else "") for m in tar.getmembers() for n in [m.name]]
    missing = [r for r in REQUIRED if r not in names]
    assert not missing, missing
    assert not leaked(names), leaked(names)


def test_the_manifest_names_the_license_file_and_the_ansible_core_range_is_one(installed_collection):
    manifest = json.loads((installed_collection.path / "MANIFEST.json").read_text())["collection_info"]
    assert manifest["license_file"] == "LICENSE"
    license_head = (installed_collection.path / "LICENSE").read_text().splitlines()[:2]
    assert [line.strip() for line in license_head] == ["GNU GENERAL PUBLIC LICENSE", "Version 3, 29 June 2007"]
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    role_meta = yaml.safe_load((REPO / "roles" / "sglang" / "meta" / "main.yml").read_text())["galaxy_info"]
    lowest = runtime.split(",")[0].removeprefix(">=")
    assert lowest.startswith(role_meta["min_ansible_version"] + "."), (runtime, role_meta["min_ansible_version"])
    pinned = next(line.split("==")[1] for line in (REPO / "tests" / "requirements.txt").read_text().splitlines()
                  if line.startswith("ansible-core=="))
    low, high = runtime.split(",")
    assert LooseVersion(low.removeprefix(">=")) <= LooseVersion(pinned) < LooseVersion(high.removeprefix("<")), \
        f"the pinned ansible-core {pinned} is outside requires_ansible {runtime}"


def ansible_doc(installed_collection, *args):
    proc = subprocess.run([str(ANSIBLE_DOC), *args], cwd=installed_collection.root, env=installed_collection.env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_ansible_doc_documents_a_module_and_the_role_of_the_installed_tarball(installed_collection):
    module = ansible_doc(installed_collection, "gpufleet.inference.sglang_ready")
    assert "Blocks until the *new* process of an SGLang systemd unit" in module
    assert str(installed_collection.path) in module  # the installed copy, not this checkout
    role = ansible_doc(installed_collection, "-t", "role", "gpufleet.inference.sglang")
    for entry_point in ("ENTRY POINT: *main*", "ENTRY POINT: *drift*", "ENTRY POINT: *revert*"):
        assert entry_point in role, entry_point
    listing = ansible_doc(installed_collection, "-l", "gpufleet.inference")
    assert "gpufleet.inference.sglang_ready" in listing
