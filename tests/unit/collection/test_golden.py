# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Golden renders (issue 30): what the role installs on each host of the example inventory is the committed
files of tests/golden/, rendered by the role's own code with no host; `make golden` rewrites them."""
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SPEC = importlib.util.spec_from_file_location("golden_render", REPO / "tests" / "golden" / "render.py")
golden = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(golden)


@pytest.fixture(scope="module")
def rendered():
    return golden.renders()


def test_every_host_and_version_is_rendered_and_the_key_never_in_clear(rendered):
    hosts = {name.split("/")[0] for name in rendered}
    assert hosts == set(golden.host_settings()) and "gpu-b01.example.internal" in hosts
    assert len(rendered) == len(hosts) * len(golden.VERSIONS) * 3  # unit, journald drop-in, config file
    secret = golden.host_settings()["gpu-a01.example.internal"][0]["sglang_api_key"]
    assert secret and all(secret not in text for text in rendered.values())
    canary = rendered["gpu-b01.example.internal/0.5.23/sglang.service"]
    assert '"--speculative-draft-window-size" \\\n    "4096"' in canary and "/etc/sglang/sglang.yaml" in canary
    assert '"--speculative-dflash-draft-window-size"' in rendered["gpu-b01.example.internal/0.5.11/sglang.service"]


def test_the_nodes_of_the_example_group_run_their_node_flags_and_a_single_host_none(rendered):
    follower = rendered["gpu-c02.example.internal/0.5.23/sglang.service"]
    flags = ('"--nnodes" \\\n    "2" \\\n    "--node-rank" \\\n    "1" \\\n    "--dist-init-addr" \\\n'
             '    "gpu-c01.example.internal:50000" \\\n    "--dist-timeout" \\\n    "900"')
    assert flags in follower and "KillMode=mixed" in follower
    assert '"--node-rank" \\\n    "0"' in rendered["gpu-c01.example.internal/0.5.23/sglang.service"]
    single = rendered["gpu-a01.example.internal/0.5.23/sglang.service"]
    assert "--nnodes" not in single and "KillMode=control-group" in single


def test_the_committed_files_are_what_the_role_renders(capsys):
    assert golden.main([]) == 0, capsys.readouterr().out


def test_a_render_that_differs_is_named_with_its_diff(tmp_path, monkeypatch, capsys, rendered):
    for name, text in rendered.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text.replace('"4096"', '"2048"'))
    (tmp_path / "gpu-x/0.5.23").mkdir(parents=True)
    (tmp_path / "gpu-x/0.5.23/sglang.service").write_text("stale")
    monkeypatch.setattr(golden, "GOLDEN", tmp_path)
    assert golden.main([]) == 1
    out = capsys.readouterr().out
    assert '-    "2048"' in out and '+    "4096"' in out and "gpu-x/0.5.23/sglang.service: committed" in out
    assert "make golden" in out
