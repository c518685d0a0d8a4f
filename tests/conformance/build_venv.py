"""Build (once per recipe) the venv with the real SGLang that the conformance tests run.

    python3 tests/conformance/build_venv.py          # prints the venv's python
    python3 tests/conformance/build_venv.py --force  # rebuild even if cached

The venv lives OUTSIDE the repository, in $GPUFLEET_CONFORMANCE_CACHE (default
/var/cache/gpufleet-conformance) as venv-<hash>, where the hash covers the recipe:
requirements.lock, the stand-in modules under stubs/, the Python version and BUILD_STEPS. A
changed recipe builds a new venv (and removes older ones); an unchanged one costs nothing.
The build goes to a temporary directory that is renamed into place only once the real SGLang
imports from it, so a failed or interrupted build never looks cached. Concurrent callers wait
on a lock instead of building twice.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCK = HERE / "requirements.lock"
STUBS = HERE / "stubs"
DEFAULT_CACHE = "/var/cache/gpufleet-conformance"
# Bump when the build steps below change what ends up in the venv (the hash covers the inputs:
# requirements.lock, stubs/, the Python version; not this script's wording).
BUILD_STEPS = 1
# What must import for the tests to run at all.
SMOKE = "import sglang, sglang.srt.server_args; print(sglang.__version__)"


def cache_root() -> Path:
    return Path(os.environ.get("GPUFLEET_CONFORMANCE_CACHE", DEFAULT_CACHE))


def recipe_hash() -> str:
    digest = hashlib.sha256()
    digest.update(("python %d.%d steps %d\n" % (*sys.version_info[:2], BUILD_STEPS)).encode())
    for path in [LOCK, *sorted(p for p in STUBS.rglob("*") if p.is_file() and "__pycache__" not in p.parts)]:
        digest.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def venv_dir() -> Path:
    return cache_root() / f"venv-{recipe_hash()}"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def requirements() -> list[str]:
    lines = [line.split("#", 1)[0].strip() for line in LOCK.read_text().splitlines()]
    return [line for line in lines if line]


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return Path(out)


def build(target: Path) -> None:
    work = target.with_name(target.name + f".build-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    started = time.monotonic()
    try:
        subprocess.run([sys.executable, "-m", "venv", str(work)], check=True)
        python = python_of(work)
        # Exact pins, no resolver: every package the import needs is listed (requirements.lock).
        # torch==2.13.0 is the CPU build on this machine's disk (pip's find-links).
        pip = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              "--no-deps", *requirements()], capture_output=True, text=True, check=False)
        if pip.returncode != 0:
            sys.stderr.write(pip.stdout[-3000:] + pip.stderr[-5000:])
            raise RuntimeError("pip install failed (exit %d)" % pip.returncode)
        dest = site_packages(python)
        for stub in sorted(STUBS.iterdir()):
            if stub.name == "__pycache__":
                continue
            if stub.is_dir():
                shutil.copytree(stub, dest / stub.name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(stub, dest / stub.name)
        # Compile once here rather than in the first (timed) test run.
        subprocess.run([str(python), "-m", "compileall", "-q", "-j", "0", str(dest / "sglang")],
                       check=False, stdout=subprocess.DEVNULL)
        subprocess.run([str(python), "-c", SMOKE], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        (work / "RECIPE").write_text(recipe_hash() + "\n")
        # A venv's interpreter finds its prefix from its own path, so the renamed tree works.
        work.rename(target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    print(f"built {target} in {time.monotonic() - started:.0f}s", file=sys.stderr)


def ensure(force: bool = False) -> Path:
    """The cached venv's python, building the venv first when its recipe has none yet."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = venv_dir()
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = (target / "RECIPE").is_file() and python_of(target).exists()
        if force and target.exists():
            shutil.rmtree(target)
            ready = False
        if not ready:
            shutil.rmtree(target, ignore_errors=True)
            build(target)
            for old in root.glob("venv-*"):  # superseded recipes
                if old != target and old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)
    return python_of(target)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--print-hash", action="store_true", help="print the recipe hash and exit")
    args = parser.parse_args(argv)
    if args.print_hash:
        print(recipe_hash())
        return 0
    print(ensure(force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
