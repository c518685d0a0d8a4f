"""The execution environment: what `ansible-builder introspect` finds in the INSTALLED tarball (runtime needs
only, never the dev toolchain), and `ansible-builder create` accepting the EE definition (no container engine
needed: create writes the build context)."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BUILDER = Path(sys.executable).parent / "ansible-builder"


def requirement_names(lines):
    """The package names of requirement lines (`name>=1  # comment` -> `name`)."""
    return sorted(re.match(r"[A-Za-z0-9_.-]+", line).group(0).lower() for line in lines)


def dev_toolchain():
    return requirement_names(line for line in (REPO / "tests" / "requirements.txt").read_text().splitlines()
                             if line and not line.startswith("#"))


def test_introspect_of_the_installed_tarball_lists_only_the_runtime_needs(installed_collection):
    proc = subprocess.run([str(BUILDER), "introspect", "--sanitize", str(installed_collection.path.parents[2])],
                          cwd=installed_collection.root, env=installed_collection.env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = yaml.safe_load(proc.stdout.split("---", 1)[1])
    print(proc.stdout)
    assert requirement_names(found["python"]) == ["matplotlib"]  # the optional chart extra, nothing else
    assert not set(requirement_names(found["python"])) & (set(dev_toolchain()) - {"matplotlib"})
    assert sorted(found["system"]) == ["openssh-client [platform:dpkg]  # from collection gpufleet.inference",
                                       "openssh-clients [platform:rpm]  # from collection gpufleet.inference"]


def test_introspect_would_show_a_dev_toolchain_leak(tmp_path, installed_collection):
    """The check above can fail: a copy whose ee-requirements names the dev toolchain is caught."""
    copy = tmp_path / "ansible_collections" / "gpufleet" / "inference"
    shutil.copytree(installed_collection.path, copy)
    shutil.copy(REPO / "tests" / "requirements.txt", copy / "meta" / "ee-requirements.txt")
    proc = subprocess.run([str(BUILDER), "introspect", "--sanitize", str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=True, env=installed_collection.env)
    names = requirement_names(yaml.safe_load(proc.stdout.split("---", 1)[1])["python"])
    assert {"antsibull-changelog", "sglang-router", "requests"} <= set(names)


def test_create_accepts_the_ee_definition_and_writes_a_build_context(tmp_path, installed_collection):
    """From a copy of the definition and the files it names, with the tarball where `make build` puts it."""
    for rel in ("execution-environment.yml", "meta/ee-requirements.txt", "meta/ee-bindep.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    (tmp_path / ".build" / "dist").mkdir(parents=True)
    shutil.copy(installed_collection.tarball, tmp_path / ".build" / "dist")
    definition = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    assert definition["version"] == 3
    (wanted,) = definition["dependencies"]["galaxy"]["collections"]
    assert wanted["name"] == f"collections/{installed_collection.tarball.name}", \
        "the EE installs another version than galaxy.yml's"
    proc = subprocess.run([str(BUILDER), "create", "-f", "execution-environment.yml", "-c", "context"],
                          cwd=tmp_path, env=installed_collection.env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    context = tmp_path / "context"
    containerfile = next(p for p in (context / "Containerfile", context / "Dockerfile") if p.exists()).read_text()
    assert "ansible-galaxy collection install" in containerfile
    assert (context / "_build" / "collections" / installed_collection.tarball.name).is_file()
    assert requirement_names(l for l in (context / "_build" / "requirements.txt").read_text().splitlines()
                             if l and not l.startswith("#")) == ["matplotlib"]
    assert "openssh-client [platform:dpkg]" in (context / "_build" / "bindep.txt").read_text()
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    assert f'ANSIBLE_INSTALL_REFS="ansible-core{runtime} ansible-runner"' in containerfile  # the range claimed


def test_create_refuses_a_definition_that_names_a_missing_file(tmp_path):
    (tmp_path / "execution-environment.yml").write_text(
        "version: 3\ndependencies:\n  python: meta/none.txt\n")
    proc = subprocess.run([str(BUILDER), "create", "-f", "execution-environment.yml", "-c", "context"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert "meta/none.txt" in proc.stdout + proc.stderr
