"""`ansible-galaxy collection build` works and leaves lab artefacts, venvs and caches out."""
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GALAXY = Path(sys.executable).parent / "ansible-galaxy"


def test_build_leaves_out_artefacts(tmp_path):
    proc = subprocess.run([str(GALAXY), "collection", "build", "--output-path", str(tmp_path), str(REPO)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (archive,) = tmp_path.glob("gpufleet-inference-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    for required in ("MANIFEST.json", "FILES.json", "README.md", "meta/runtime.yml",
                     "roles/sglang/tasks/main.yml", "plugins/modules/sglang_ready.py",
                     "playbooks/rollout.yml"):
        assert required in names, required
    forbidden = (".venv/", ".build/", ".git/", "collections/", "results/", "tests/output/",
                 "__pycache__", ".pyc", "inventories/lab/hosts.yml", ".ci/")
    leaked = [n for n in names if any(part in n for part in forbidden)]
    assert not leaked, leaked
