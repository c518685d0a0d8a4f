"""The simulator on a lab host carries pip-style metadata: its version without importing it."""
from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("lab", REPO / "tests" / "lab" / "lab.py")
lab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab)

PROBE = ("import importlib.metadata as m, sys; sys.path.insert(0, sys.argv[1]); "
         "print(m.version('sglang')); assert 'sglang' not in sys.modules")


def metadata_version(site: Path) -> str:
    """What `importlib.metadata.version('sglang')` says, in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", PROBE, str(site)], check=True,
                         capture_output=True, text=True).stdout
    return out.strip()


def sim_version(site: Path) -> str:
    """What the installed simulator itself reports."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); import sglang; print(sglang.__version__)"
    env = {"PATH": "/usr/bin:/bin"}  # no SGLANG_SIM_VERSION from the test's environment
    return subprocess.run([sys.executable, "-c", code, str(site)], check=True, env=env,
                          capture_output=True, text=True).stdout.strip()


def test_install_writes_a_dist_info_that_matches_the_simulator(tmp_path):
    assert lab.install_simulator(tmp_path)
    site = tmp_path / lab.SIM_SITE
    assert metadata_version(site) == sim_version(site) == "0.5.11"
    info = site / "sglang-0.5.11.dist-info"
    assert (info / "INSTALLER").read_text() == "pip\n"
    assert "Name: sglang\n" in (info / "METADATA").read_text()


def test_record_lists_every_file_with_its_hash_and_size(tmp_path):
    lab.install_simulator(tmp_path)
    site = tmp_path / lab.SIM_SITE
    info = next(site.glob("sglang-*.dist-info"))
    rows = list(csv.reader((info / "RECORD").read_text().splitlines()))
    listed = {row[0] for row in rows}
    on_disk = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}
    assert listed == on_disk
    for path, digest, size in rows:
        if path.endswith("/RECORD"):
            assert (digest, size) == ("", "")
            continue
        data = (site / path).read_bytes()
        algo, value = digest.split("=", 1)
        assert algo == "sha256" and int(size) == len(data)
        assert value == base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_a_pinned_version_and_the_metadata_agree(tmp_path):
    lab.install_simulator(tmp_path)
    site = tmp_path / lab.SIM_SITE
    lab.pin_sim_version(tmp_path, "0.5.23")
    assert metadata_version(site) == sim_version(site) == "0.5.23"
    assert [p.name for p in site.glob("sglang-*.dist-info")] == ["sglang-0.5.23.dist-info"]
    # A refresh copies the package again: version and metadata follow its SIM_VERSION (none).
    lab.install_simulator(tmp_path)
    assert metadata_version(site) == sim_version(site) == "0.5.11"


def test_the_version_follows_the_package_being_installed(tmp_path):
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "_sim_profile.py").write_text('DEFAULT_VERSION = "0.5.14"\n')
    assert lab.sim_version(package) == "0.5.14"
    (package / "SIM_VERSION").write_text("0.5.20\n")
    assert lab.sim_version(package) == "0.5.20"
    assert lab.sim_version(tmp_path / "missing") == lab.SIM_DEFAULT_VERSION
