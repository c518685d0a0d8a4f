"""Make this checkout importable as the collection `ansible_collections.gpufleet.inference`, and offer
the collection as a stranger gets it (the fixture `installed_collection`: built tarball, fresh path).

The tree is linked at .build/collections/ansible_collections/gpufleet/inference (the same link
`make` uses for ANSIBLE_COLLECTIONS_PATH), so tests import the code exactly as Ansible does.
"""
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = REPO / ".build" / "collections"
LINK = COLLECTIONS / "ansible_collections" / "gpufleet" / "inference"

if not LINK.exists():
    LINK.parent.mkdir(parents=True, exist_ok=True)
    try:
        LINK.symlink_to(REPO, target_is_directory=True)
    except FileExistsError:
        pass
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", str(COLLECTIONS))


# ------------------------------------------------------------------ the collection as a stranger gets it

def _stranger_env(root: Path) -> dict:
    """The environment of someone who installed the tarball: its collections path, an empty ansible.cfg,
    no setting of this checkout (run_layers' ANSIBLE_* would point back at it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["ANSIBLE_CONFIG"] = str(root / "ansible.cfg")
    env["ANSIBLE_COLLECTIONS_PATH"] = str(root / "collections")
    env["ANSIBLE_LOCAL_TEMP"] = str(root / "tmp")
    # Not a setting of the collection: ansible-core 2.19 puts a local task's remote tmp in the passwd
    # home whatever HOME says, and tests leave the user's ~/.ansible alone.
    env["ANSIBLE_REMOTE_TMP"] = str(root / "remote-tmp")
    env["ANSIBLE_FORCE_COLOR"] = "0"
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


@pytest.fixture(scope="session")
def installed_collection(tmp_path_factory):
    """The collection built with `ansible-galaxy collection build` and installed from that tarball into a
    fresh collections path outside the checkout, with an empty ansible.cfg (tests/functional, tests/integration).

    Attributes: root (cwd for commands), tarball, path (the installed collection), env (for subprocess).
    """
    galaxy = Path(sys.executable).parent / "ansible-galaxy"
    root = tmp_path_factory.mktemp("stranger")
    (root / "ansible.cfg").write_text("")
    (root / "tmp").mkdir()
    env = _stranger_env(root)
    build = subprocess.run([str(galaxy), "collection", "build", "--output-path", str(root / "dist"), str(REPO)],
                           cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = (root / "dist").glob("gpufleet-inference-*.tar.gz")
    install = subprocess.run([str(galaxy), "collection", "install", "-p", str(root / "collections"), str(tarball)],
                             cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert install.returncode == 0, install.stdout + install.stderr
    path = root / "collections" / "ansible_collections" / "gpufleet" / "inference"
    assert (path / "MANIFEST.json").is_file(), install.stdout
    return SimpleNamespace(root=root, tarball=tarball, path=path, env=env)


# ------------------------------------------------------------------ nothing left running

def _children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """A test run fails when it leaves a process of its own or a non-daemon thread running: either would
    keep running after the tests (or keep this pytest from exiting, as a hung CI job). Both are named and
    the processes killed. xdist's workers are the controller's own children and end after this hook."""
    import signal
    import threading
    leftovers = [pid for pid in _children_of(os.getpid())
                 if "import sys;exec(eval(sys.stdin.readline()))" not in _cmdline(pid)]
    threads = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    for thread in threads:  # one that is just finishing is not a leftover
        thread.join(5.0 / len(threads))
    threads = [t for t in threads if t.is_alive()]
    if not leftovers and not threads:
        return
    lines = ["", "the tests left running:"]
    for pid in leftovers:
        lines.append(f"  process {pid}: {_cmdline(pid)[:200]} (killed)")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    frames = sys._current_frames()
    for thread in threads:
        frame = frames.get(thread.ident)
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "?"
        lines.append(f"  non-daemon thread {thread.name} at {where}")
    sys.stderr.write("\n".join(lines) + "\n")
    session.exitstatus = 1
