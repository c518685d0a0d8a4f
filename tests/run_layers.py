"""Run the test layers of gpufleet.inference and print what each one counted.

    python tests/run_layers.py all|unit|functional|docs|sanity|lint|core-range|integration|molecule|lab-cycle|conformance

A layer fails when its tool fails OR when it ran no test. Lab-backed layers bring their own lab
up (a lab name and loopback net of their own, so a `make demo` lab is never touched) and take it
down afterwards, also on failure.
"""
from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RESULTS = REPO / ".build" / "results"
LAB = [sys.executable, str(REPO / "tests" / "lab" / "lab.py")]

# Each lab-backed layer gets its own machines and addresses. The integration tests run as two shards side by
# side, each on a lab of its own (their tests mostly wait for servers to load, so two labs on two cores take
# about half the time of one); a test file runs in shard b only when it is listed there.
INTEGRATION_LABS = {
    "a": {"LAB_NAME": "gpftest", "LAB_NET": "127.0.2", "HOSTS": "4", "LAB_ROUTER": "1",
          "LAB_INVENTORY": str(REPO / ".build" / "integration" / "hosts.yml")},
    "b": {"LAB_NAME": "gpftesb", "LAB_NET": "127.0.4", "HOSTS": "4", "LAB_ROUTER": "1",
          "LAB_INVENTORY": str(REPO / ".build" / "integration-b" / "hosts.yml")},
}
SHARD_B = ["test_fleet_truth.py", "test_verdicts.py", "test_awx_runner.py", "test_install.py",
           "test_sweep_without_matplotlib.py", "test_canary.py", "test_unit_verdicts.py", "test_provenance.py",
           "test_endpoints.py", "test_lab.py"]
MOLECULE_LAB = {"LAB_NAME": "gpfmol", "LAB_NET": "127.0.3", "HOSTS": "2",
                "LAB_INVENTORY": str(REPO / ".build" / "molecule" / "hosts.yml")}
# Multi-node serving groups need hosts laid out as groups (2 groups x 2 nodes, 2 single hosts): a lab of their own,
# so the other lab tests keep their single-node hosts. It runs after shard b, in the same thread.
GROUPS_LAB = {"LAB_NAME": "gpftgrp", "LAB_NET": "127.0.6", "HOSTS": "6", "LAB_ROUTER": "1", "LAB_GROUPS": "2x2",
              "LAB_INVENTORY": str(REPO / ".build" / "integration-groups" / "hosts.yml")}
GROUPS_TESTS = "tests/integration/test_groups.py"


class Outcome:
    def __init__(self, name: str, passed: int = 0, failed: int = 0, skipped: int = 0,
                 note: str = ""):
        self.name, self.passed, self.failed, self.skipped, self.note = (
            name, passed, failed, skipped, note)
        self.seconds = 0.0

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.passed > 0


# Tests leave the user's home as they found it: Ansible's tmp and ssh sockets, ansible-test's
# venvs and caches, ansible-lint's, pip's and matplotlib's all go to a home of their own.
TEST_HOME = Path(os.environ.get("GPUFLEET_TEST_HOME", "/var/tmp/gpufleet-test-home"))


def env_with(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    TEST_HOME.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(TEST_HOME)
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", str(REPO / ".build" / "collections"))
    env.setdefault("ANSIBLE_CONFIG", str(REPO / "ansible.cfg"))
    # HOME alone is not enough: ansible-core 2.19 puts a local-connection task's remote tmp in
    # the real user's home (pwd), e.g. /root/.ansible/tmp for molecule's create and destroy.
    env.setdefault("ANSIBLE_REMOTE_TMP", str(TEST_HOME / ".ansible" / "tmp"))
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["PY_COLORS"] = "0"
    env.update(extra or {})
    return env


def stream(argv, cwd=REPO, env=None, timeout: float = 3600, prefix: str = "", linger: float = 10) -> tuple[int, str]:
    """Run argv, echo its output live (line by line, flushed: a CI that kills the job still shows where
    it was), and return (rc, output).

    The command runs in a session of its own: after ``timeout`` seconds its whole process group is
    killed (rc -9). Once the command has exited, output is read for ``linger`` seconds more: a process it
    left behind that still holds the pipe must not hang the run: it is named and killed (a pytest run already
    fails when it leaves a process of its own: tests/conftest.py).
    """
    say(prefix + "+ " + " ".join(str(a) for a in argv))
    proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env or env_with(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines = []

    def echo():
        for line in proc.stdout:
            say(prefix + line.rstrip("\n"))
            lines.append(line)
    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        say(f"{prefix}{argv[0]} still ran after {timeout:.0f} s: killing its process group")
        kill_group(proc.pid)
        rc = proc.wait()
    reader.join(linger)
    if reader.is_alive():
        holders = pipe_holders(os.fstat(proc.stdout.fileno()).st_ino)
        say(f"{prefix}{Path(str(argv[0])).name} exited (rc {rc}) but processes it started still hold its output: "
            + "; ".join(f"pid {pid} {cmd[:160]}" for pid, cmd in holders) + " - WARNING: killing them")
        kill_group(proc.pid)
        for pid, dummy in holders:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reader.join(10)
    sys.stdout.flush()
    return rc, "".join(lines)


_SAY = threading.Lock()


def say(line: str) -> None:
    """One whole line to stdout, flushed (shards running side by side never split each other's lines)."""
    with _SAY:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def pipe_holders(inode: int) -> list[tuple[int, str]]:
    """(pid, command line) of every other process with the pipe ``inode`` open."""
    holders = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if any(os.readlink(fd) == f"pipe:[{inode}]" for fd in (entry / "fd").iterdir()):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                holders.append((int(entry.name), cmd.strip()))
        except OSError:
            continue
    return holders


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def junit_counts(path: Path) -> tuple[int, int, int]:
    if not path.exists():
        return 0, 0, 0
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return total - failed - skipped, failed, skipped


def pytest_layer(name: str, paths: list[str], extra_env: dict | None = None, timeout: float = 3600,
                 prefix: str = "") -> Outcome:
    RESULTS.mkdir(parents=True, exist_ok=True)
    xml = RESULTS / f"{name}.xml"
    xml.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={xml}", *paths]
    rc = stream(argv, env=env_with(extra_env), timeout=timeout, prefix=prefix)[0]
    passed, failed, skipped = junit_counts(xml)
    if rc not in (0, 5) and failed == 0:
        failed = 1  # pytest failed outside any test (collection error, crash)
    return Outcome(name, passed, failed, skipped)


# ---------------------------------------------------------------- layers

def layer_unit() -> Outcome:
    return pytest_layer("unit", ["tests/unit"], timeout=900)


def layer_functional() -> Outcome:
    """Tests that start real processes (the simulator, sglang-router, ansible-playbook on localhost)."""
    return pytest_layer("functional", ["-n", "2", "tests/functional"], timeout=1200)


def collection_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if (REPO / f).is_file()]


def ensure_pip_bootstrap() -> None:
    """ansible-test downloads a get-pip script from a host this network cannot reach.

    Save, where it looks first, a small script of our own that installs pip from the wheel of
    the version ansible-test itself asks for (read from ansible-test, not hard-coded here).
    """
    from ansible_test._internal.python_requirements import get_venv_packages

    class _Py:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"

    pip_version = get_venv_packages(_Py())["pip"]
    cache = TEST_HOME / ".ansible" / "test" / "cache"
    script = cache / f"get_pip_{pip_version.replace('.', '_')}.py"
    wheels = cache / f"pip-{pip_version}-wheel"
    if script.exists() and any(wheels.glob("pip-*.whl")):
        return
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--dest", str(wheels), f"pip=={pip_version}"], check=True)
    wheel = next(wheels.glob("pip-*.whl"))
    script.write_text(f'''"""Installs pip {pip_version} from a local wheel (stands in for get-pip.py)."""
import sys
sys.path.insert(0, {str(wheel)!r})
from pip._internal.cli.main import main
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", "--no-index", "--find-links", {str(wheels)!r}] + args))
''')


def layer_sanity() -> Outcome:
    ensure_pip_bootstrap()
    # ansible-test wants the collection at ansible_collections/NS/NAME, and skips every file
    # below a dot-directory (so not under .build/); a stable path keeps its venvs cached.
    root = Path(os.environ.get("SANITY_ROOT", "/var/tmp/gpufleet-sanity"))
    dest = root / "ansible_collections" / "gpufleet" / "inference"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for rel in collection_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    rc, out = stream([BIN / "ansible-test", "sanity", "--venv", "--python", py, "--color", "no"], cwd=dest)
    ran = set(re.findall(r"Running sanity test [\"']([\w-]+)[\"']", out))
    failing = set(re.findall(r"ERROR: Found \d+ ([\w-]+) issue", out))
    if rc != 0 and not failing:
        failing = {"ansible-test"}  # it failed before or outside any single test
    return Outcome("sanity", passed=len(ran - failing), failed=len(failing),
                   note="tests: " + ",".join(sorted(failing)) + " FAILED" if failing else "")


def layer_lint() -> Outcome:
    # ansible-lint puts ~/.ansible/collections (the test home's) in front of ANSIBLE_COLLECTIONS_PATH:
    # an installed copy of this collection there (left by another tool) would be linted instead of
    # this checkout's roles and plugins.
    shutil.rmtree(TEST_HOME / ".ansible" / "collections" / "ansible_collections" / "gpufleet" / "inference",
                  ignore_errors=True)
    rc, out = stream([BIN / "ansible-lint", "--profile", "production", "--offline"])
    out = re.sub(r"\x1b\[[0-9;]*m", "", out)  # colour codes, should a terminal have asked for them
    match = re.search(r"Passed:? (\d+) failure\(s\), (\d+) warning\(s\) (?:on|in) (\d+) files", out)
    if rc == 0 and match:
        return Outcome("lint", passed=int(match.group(3)), note="files linted")
    failures = re.search(r"Failed: (\d+) failure", out)
    return Outcome("lint", failed=int(failures.group(1)) if failures else 1)


def with_lab(settings: dict, body, prefix: str = "") -> Outcome:
    env = env_with(settings)
    rc = stream([*LAB, "up"], env=env, timeout=900, prefix=prefix)[0]
    try:
        if rc != 0:
            return Outcome(body.__name__, failed=1, note="lab did not come up")
        return body(env)
    finally:
        stream([*LAB, "down"], env=env, timeout=300, prefix=prefix)


def integration_shards() -> dict[str, list[str]]:
    """Shard name -> the test files it runs (every file in exactly one shard; groups' tests in none)."""
    files = sorted(p.name for p in (REPO / "tests" / "integration").glob("test_*.py"))
    missing = sorted(set(SHARD_B) - set(files))
    if missing:
        raise RuntimeError(f"SHARD_B names test files that do not exist: {', '.join(missing)}")
    groups = Path(GROUPS_TESTS).name
    return {"a": [f"tests/integration/{f}" for f in files if f not in SHARD_B and f != groups],
            "b": [f"tests/integration/{f}" for f in files if f in SHARD_B]}


def layer_integration() -> Outcome:
    shards = integration_shards()
    results: dict[str, Outcome] = {}

    def shard(name):
        settings = INTEGRATION_LABS[name]
        prefix = f"[{name}] "

        def tests(env):
            return pytest_layer(f"integration-{name}", [*shards[name], "--durations=20"],
                                {k: env[k] for k in settings} | {"GPUFLEET_LAB_INVENTORY": env["LAB_INVENTORY"]},
                                timeout=2700, prefix=prefix)
        return with_lab(settings, tests, prefix)

    def serving_groups(env):
        return pytest_layer("integration-groups", [GROUPS_TESTS, "--durations=10"], {k: env[k] for k in GROUPS_LAB} | {
            "GPUFLEET_LAB_INVENTORY": env["LAB_INVENTORY"]}, timeout=1200, prefix="[groups] ")

    def run(name, parts):
        try:
            results[name] = [part() for part in parts]
        except Exception as exc:  # a harness error in one thread fails the layer, never hangs it
            say(f"[{name}] crashed: {exc!r}")
            results[name] = [Outcome(name, failed=1, note=f"harness error: {exc}")]

    threads = [threading.Thread(target=run, args=("a", [lambda: shard("a")])),
               threading.Thread(target=run, args=("b", [lambda: shard("b"),
                                                        lambda: with_lab(GROUPS_LAB, serving_groups, "[groups] ")]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    parts = [part for name in ("a", "b") for part in results.get(name, [Outcome(name, failed=1, note="no result")])]
    return Outcome("integration", sum(part.passed for part in parts), sum(part.failed for part in parts),
                   sum(part.skipped for part in parts), "; ".join(part.note for part in parts if part.note))


def layer_molecule() -> Outcome:
    scenarios_root = REPO / "roles" / "sglang" / "molecule"
    scenarios = sorted(p.parent.name for p in scenarios_root.glob("*/molecule.yml"))
    outcome = Outcome("molecule", note="scenarios")
    env = env_with(MOLECULE_LAB)
    for scenario in scenarios:
        rc = stream([BIN / "molecule", "test", "-s", scenario], cwd=REPO / "roles" / "sglang",
                    env=env)[0]
        if rc == 0:
            outcome.passed += 1
        else:
            outcome.failed += 1
    # molecule's destroy should have run; make sure, by this lab's own records.
    stream([*LAB, "down"], env=env)
    return outcome


def layer_docs() -> Outcome:
    """The docs: lint of plugin docs and guide, changelog lint, the site built and opened in Chromium
    (tests/docs; a screenshot of the index lands in .build/results/docs-index.png)."""
    return pytest_layer("docs", ["tests/docs"])


def releases_in(claim: str, available: list[str]) -> list[str]:
    """The final releases of `available` inside a requires_ansible claim like '>=2.19.0,<2.20.0', oldest first."""
    def key(version):
        return tuple(int(part) for part in version.split("."))
    low = re.search(r">=\s*([\d.]+)", claim).group(1)
    high = re.search(r"<\s*([\d.]+)", claim)
    return sorted((v for v in available if re.fullmatch(r"\d+(?:\.\d+)*", v) and key(v) >= key(low)
                   and (high is None or key(v) < key(high.group(1)))), key=key)


def available_releases(python: Path, package: str) -> list[str]:
    """What the package index offers this Python (pip index versions), newest first."""
    proc = subprocess.run([python, "-m", "pip", "index", "versions", package], capture_output=True, text=True,
                          check=False)
    found = re.search(r"^Available versions: (.*)$", proc.stdout, flags=re.M)
    return [v.strip() for v in found.group(1).split(",")] if found else []


# Unit tests whose code under test runs ansible-core's own code: the action plugins, modules (AnsibleModule),
# plugin_utils, the role's argument spec, and any test file that imports ansible-core itself. The rest test
# pure module_utils, which no ansible-core release changes.
CORE_TEST_DIRS = ("tests/unit/plugins/action", "tests/unit/plugins/modules", "tests/unit/plugins/plugin_utils",
                  "tests/unit/roles")
_IMPORTS_ANSIBLE = re.compile(r"^\s*(?:from ansible[. ]|import ansible\b)", re.M)


def core_dependent_unit_tests() -> list[str]:
    found = set(CORE_TEST_DIRS)
    for path in sorted((REPO / "tests" / "unit").rglob("test_*.py")):
        relative = str(path.relative_to(REPO))
        if not relative.startswith(CORE_TEST_DIRS) and _IMPORTS_ANSIBLE.search(path.read_text()):
            found.add(relative)
    return sorted(found)


def layer_core_range() -> Outcome:
    """The claimed ansible-core range is the tested range: unit and sanity tests on the LOWEST release of
    meta/runtime.yml's requires_ansible, and the unit tests that run ansible-core's code on every other
    release inside it that the package index offers this Python (the pinned one runs every layer). A venv
    of its own with the toolchain; each release is put in place in turn (--no-deps), the lowest last."""
    import yaml
    claim = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    lowest = re.match(r">=\s*([\d.]+)", claim).group(1)
    pins = (REPO / "tests" / "requirements.txt").read_text()
    wanted = re.sub(r"^ansible-core==.*$", f"ansible-core=={lowest}", pins, flags=re.M)
    # Outside the checkout (like the conformance venv), named by what it holds: a clean clone reuses it.
    cache = Path(os.environ.get("GPUFLEET_CORE_RANGE_CACHE", "/var/cache/gpufleet-core-range"))
    venv = cache / f"venv-core-{lowest}-{hashlib.sha256(wanted.encode()).hexdigest()[:16]}"
    python = venv / "bin" / "python"
    stamp = venv / "requirements.txt"
    if not stamp.exists() or stamp.read_text() != wanted:
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        (venv / "wanted.txt").write_text(wanted)
        rc = stream([python, "-m", "pip", "install", "--quiet", "-r", venv / "wanted.txt"])[0]
        if rc != 0:
            return Outcome("core-range", failed=1, note=f"venv with ansible-core {lowest} failed")
        stamp.write_text(wanted)
    pinned = re.search(r"^ansible-core==(\S+)$", pins, flags=re.M).group(1)
    offered = available_releases(python, "ansible-core")
    others = [v for v in releases_in(claim, offered) if v not in (lowest, pinned)]
    outcome = Outcome("core-range")
    unit_env = env_with({"PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}"})
    failed_on = []
    for release in [*others, lowest]:  # the lowest last: sanity below runs on it, and the venv stays as stamped
        if stream([python, "-m", "pip", "install", "--quiet", "--no-deps", f"ansible-core=={release}"])[0] != 0:
            outcome.failed += 1
            failed_on.append(f"{release} (install)")
            continue
        unit_xml = RESULTS / f"core-range-unit-{release}.xml"
        unit_xml.unlink(missing_ok=True)
        tests = ["tests/unit"] if release == lowest else core_dependent_unit_tests()
        rc = stream([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={unit_xml}", *tests],
                    env=unit_env)[0]
        passed, failed, _skipped = junit_counts(unit_xml)
        outcome.passed += passed
        outcome.failed += failed + (1 if rc not in (0, 5) and not failed else 0)
        if rc != 0:
            failed_on.append(release)
    tested = f"{others[0]}..{others[-1]}, " if others else ""
    outcome.note = f"ansible-core {lowest}: unit + sanity; {tested.rstrip(', ') or 'no other release'}: the unit tests " \
                   "that run ansible-core's code"
    if not offered:  # said, not failed: the pinned and the lowest release are still tested
        outcome.note += "; the package index listed no ansible-core releases (pip index versions)"
    if failed_on:
        outcome.note += "; unit FAILED on " + ", ".join(failed_on)
    sanity = subprocess.run([python, str(Path(__file__)), "sanity"], cwd=REPO, check=False,
                            env=env_with({"SANITY_ROOT": os.environ.get("SANITY_ROOT", "/var/tmp/gpufleet-sanity") + f"-core-{lowest}"}))
    if sanity.returncode == 0:
        outcome.passed += 1
    else:
        outcome.failed += 1
        outcome.note += "; sanity FAILED"
    return outcome


LAYERS = {"unit": layer_unit, "functional": layer_functional, "docs": layer_docs, "sanity": layer_sanity,
          "lint": layer_lint, "core-range": layer_core_range, "integration": layer_integration,
          "molecule": layer_molecule}


def layer_lab_cycle() -> Outcome:
    """lab.py up/down several times in a row, with a lab of its own (tests/lab_cycle)."""
    settings = {"LAB_NAME": "gpfcyc", "LAB_NET": "127.0.5", "HOSTS": "2",
                "LAB_INVENTORY": str(REPO / ".build" / "lab_cycle" / "hosts.yml")}
    try:
        return pytest_layer("lab-cycle", ["tests/lab_cycle"], settings)
    finally:
        stream([*LAB, "down"], env=env_with(settings))  # whatever a failing test left


LAYERS["lab-cycle"] = layer_lab_cycle


def layer_conformance() -> Outcome:
    """The real SGLang 0.5.23 (a cached venv outside the repo) against builder, preflight, sim."""
    if stream([sys.executable, REPO / "tests" / "conformance" / "build_venv.py"])[0] != 0:
        return Outcome("conformance", failed=1, note="venv build failed")
    return pytest_layer("conformance", ["tests/conformance"])


LAYERS["conformance"] = layer_conformance


def user_ansible_dirs() -> set[Path]:
    """The user's own ~/.ansible (HOME's and the passwd entry's) and everything under it."""
    homes = {Path(os.path.expanduser("~")), Path(pwd.getpwuid(os.getuid()).pw_dir)}
    found = set()
    for home in homes:
        top = home / ".ansible"
        if top.exists():
            found.add(top)
            found.update(top.rglob("*"))
    return found


def home_check(before: set[Path]) -> Outcome:
    """Fails when the layers left anything new in the user's ~/.ansible."""
    new = sorted(user_ansible_dirs() - before)
    if new:
        listed = ", ".join(str(p) for p in new[:5]) + (" ..." if len(new) > 5 else "")
        print(f"the tests left new paths in the user's home: {listed}")
        return Outcome("home", failed=1, note=f"new in ~/.ansible: {listed}")
    return Outcome("home", passed=1, note="nothing new in the user's ~/.ansible")


def main(argv: list[str]) -> int:
    names = list(LAYERS) if argv[:1] in ([], ["all"]) else argv
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        print(f"unknown layer(s): {', '.join(unknown)}; choose from {', '.join(LAYERS)}")
        return 2
    home_before = user_ansible_dirs()
    outcomes = []
    for name in names:
        print(f"\n===== layer: {name} =====", flush=True)
        started = time.monotonic()
        try:
            outcome = LAYERS[name]()
        except Exception as exc:  # a layer's harness broke: count it, go on, fail at the end
            print(f"layer {name} crashed: {exc!r}")
            outcome = Outcome(name, failed=1, note=f"harness error: {exc}")
        outcome.seconds = time.monotonic() - started
        outcomes.append(outcome)
    outcomes.append(home_check(home_before))
    print("\n===== summary =====")
    print(f"{'layer':<12} {'passed':>7} {'failed':>7} {'skipped':>8} {'time':>8}  note")
    for o in outcomes:
        flag = "" if o.ok else ("  <- RAN NO TEST" if o.failed == 0 else "  <- FAILED")
        print(f"{o.name:<12} {o.passed:>7} {o.failed:>7} {o.skipped:>8} {o.seconds:>7.0f}s  "
              f"{o.note}{flag}")
    passed = sum(o.passed for o in outcomes)
    failed = sum(o.failed for o in outcomes) + sum(1 for o in outcomes if not o.ok and not o.failed)
    skipped = sum(o.skipped for o in outcomes)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
