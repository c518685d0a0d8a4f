"""SGLANG_SIM_IMPORT_SECONDS / SGLANG_SIM_IMPORT_MB: the cost of `import sglang` on a real host."""
import shutil
import subprocess
import sys
import time

from conftest import SIM_DIR, sim_env

RSS = ("import sys\n"
       "def rss():\n"
       "    for line in open('/proc/self/status'):\n"
       "        if line.startswith('VmRSS:'):\n"
       "            return int(line.split()[1]) // 1024\n"
       "base = rss()\n"
       "import sglang\n"
       "print(rss() - base)\n")


def run(code, env):
    tic = time.monotonic()
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stderr
    return time.monotonic() - tic, res.stdout.strip()


def test_defaults_cost_nothing():
    _elapsed, grown = run(RSS, sim_env("0.5.23"))
    assert int(grown) < 40


def test_import_sleeps_and_holds_memory():
    env = sim_env("0.5.23", SGLANG_SIM_IMPORT_SECONDS="1.0", SGLANG_SIM_IMPORT_MB="128")
    elapsed, grown = run(RSS, env)
    assert elapsed >= 1.0
    assert 128 <= int(grown) < 200  # resident (every page touched), not just reserved


def test_submodule_imports_pay_too():
    # `from sglang.srt.server_args import ...` imports the package first, as on a real host
    env = sim_env("0.5.23", SGLANG_SIM_IMPORT_SECONDS="1.0")
    elapsed, _out = run("import sglang.srt.server_args", env)
    assert elapsed >= 1.0


def test_version_lookup_by_metadata_does_not_import(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(f"{SIM_DIR}/sglang", site / "sglang")
    info = site / "sglang-0.5.23.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    env = sim_env("0.5.23", SGLANG_SIM_IMPORT_SECONDS="30", PYTHONPATH=str(site))
    code = ("import importlib.metadata, sys; print(importlib.metadata.version('sglang'), "
            "'sglang' in sys.modules)")
    elapsed, out = run(code, env)
    assert out == "0.5.23 False" and elapsed < 20  # the 30 s import was not paid
