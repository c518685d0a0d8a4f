# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render roles/sglang/templates with the real filter through Ansible (no managed host).

Asserts the exact ExecStart, that the API key stays out of the unit (and off the command line:
it goes to the --config YAML file), and that `systemd-analyze verify` accepts the unit, run
exactly as the role's `validate:` runs it.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.inference.plugins.modules import sglang_unit_files

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "sglang"
KEY = "k26-api-key.XYZ"
PYTHON = "/usr/bin/python3"  # an executable that exists, so systemd-analyze verify can pass

K26 = {
    "__sglang_version": "0.5.12",
    "sglang_python": PYTHON,
    "sglang_model_path": "/models/Kimi-K2.6",
    "sglang_served_model_name": "kimi-k2.6",
    "sglang_tp_size": 8,
    "sglang_host": "10.0.0.5",
    "sglang_port": 30000,
    "sglang_speculative_algorithm": "DFLASH",
    "sglang_speculative_draft_model_path": "/models/Kimi-K2.6-DFlash",
    "sglang_speculative_num_draft_tokens": 16,
    "sglang_speculative_draft_window_size": 2048,
    "sglang_api_key": KEY,
    "sglang_extra_args": {"--mem-fraction-static": 0.85, "--trust-remote-code": True,
                          "--enable-metrics": True},
    "sglang_environment": {"SGLANG_LOG_MS": 1, "NOTE": "50% $off"},
}

EXPECTED_EXECSTART = """\
ExecStart="/usr/bin/python3" \\
    "-m" \\
    "sglang.launch_server" \\
    "--model-path" \\
    "/models/Kimi-K2.6" \\
    "--served-model-name" \\
    "kimi-k2.6" \\
    "--tp-size" \\
    "8" \\
    "--host" \\
    "10.0.0.5" \\
    "--port" \\
    "30000" \\
    "--speculative-algorithm" \\
    "DFLASH" \\
    "--speculative-draft-model-path" \\
    "/models/Kimi-K2.6-DFlash" \\
    "--speculative-num-draft-tokens" \\
    "16" \\
    "--speculative-draft-window-size" \\
    "2048" \\
    "--mem-fraction-static" \\
    "0.85" \\
    "--trust-remote-code" \\
    "--enable-metrics" \\
    "--config" \\
    "/etc/sglang/sglang.yaml"
"""


def render(tmp_path, settings, check=False):
    """Render the role's unit, config file and journald drop-in into tmp_path/out with ansible-playbook."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (tmp_path / "settings.yml").write_text(yaml.safe_dump(settings, sort_keys=False))
    tasks = [{"name": "Render " + name,
              "ansible.builtin.template": {"src": str(ROLE / "templates" / src), "dest": str(out / name),
                                           "mode": "0600"}}
             for src, name in (("sglang.service.j2", "sglang.service"),
                               ("journald-ratelimit.conf.j2", "journald.conf"))]
    tasks.append({"name": "Render the SGLang config file",
                  "ansible.builtin.copy": {"content": "{{ __sglang_config_text }}", "dest": str(out / "sglang.yaml"),
                                           "mode": "0600"}})
    play = [{
        "name": "Render the sglang role's templates",
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml"),
                       str(tmp_path / "settings.yml")],
        "tasks": tasks,
    }]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_CONFIG", None)  # cwd is tmp_path: no ansible.cfg of the checkout
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=" + sys.executable, str(tmp_path / "play.yml")]
    if check:
        argv += ["--check", "--diff"]
    result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                            check=False)
    return result, out


@pytest.fixture(scope="module")
def k26_render(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("render")
    result, out = render(tmp_path, K26)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_exact_execstart(k26_render):
    unit = (k26_render / "sglang.service").read_text()
    start = unit.index("ExecStart=")
    end = unit.index("TimeoutStartSec=")
    assert unit[start:end] == EXPECTED_EXECSTART


def test_unit_sections(k26_render):
    unit = (k26_render / "sglang.service").read_text()
    assert unit.startswith("#\n# Ansible managed")
    for line in ("[Unit]", "After=network-online.target", "[Service]", "Type=simple",
                 "User=root", "Group=root", 'Environment="SGLANG_LOG_MS=1"',
                 'Environment="NOTE=50%% $off"',
                 "TimeoutStartSec=900", "TimeoutStopSec=900", "KillMode=control-group",
                 "Restart=on-failure", "RestartSec=10", "SyslogIdentifier=sglang",
                 "[Install]", "WantedBy=multi-user.target"):
        assert line in unit.splitlines(), line


def test_api_key_only_in_the_config_file(k26_render):
    unit = (k26_render / "sglang.service").read_text()
    assert KEY not in unit and "EnvironmentFile" not in unit
    assert yaml.safe_load((k26_render / "sglang.yaml").read_text()) == {"api-key": KEY}


def test_journald_dropin(k26_render):
    text = (k26_render / "journald.conf").read_text()
    assert "[Journal]\nRateLimitIntervalSec=30s\nRateLimitBurst=100000\n" in text


class Host(object):
    """What sglang_unit_files asks of AnsibleModule to verify a unit, done for real here."""

    @staticmethod
    def get_bin_path(name, required=False):
        return shutil.which(name)

    @staticmethod
    def run_command(argv):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr


def verify(text, path="/etc/systemd/system/sglang.service"):
    """The role's install step checks the rendered unit with sglang_unit_files' systemd-analyze verify."""
    sglang_unit_files.verify_unit(Host(), {"path": path, "data": text.encode()})


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_systemd_analyze_accepts_the_unit(k26_render):
    verify((k26_render / "sglang.service").read_text())


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_systemd_analyze_rejects_a_broken_unit(k26_render):
    text = (k26_render / "sglang.service").read_text()
    with pytest.raises(sglang_unit_files.InstallError, match="/nonexistent/python") as caught:
        verify(text.replace('ExecStart="/usr/bin/python3"', 'ExecStart="/nonexistent/python"'))
    assert "systemd-analyze verify rejected /etc/systemd/system/sglang.service" in str(caught.value)


def test_the_role_installs_the_unit_with_verification():
    tasks = yaml.safe_load((ROLE / "tasks" / "apply.yml").read_text())
    (task,) = [t for t in tasks if "gpufleet.inference.sglang_unit_files" in t and "secret_files" in
               t["gpufleet.inference.sglang_unit_files"]]
    assert task["gpufleet.inference.sglang_unit_files"]["files"][0]["verify_unit"] is True


def test_invalid_settings_fail_the_render_naming_the_variable(tmp_path):
    result, out = render(tmp_path, dict(K26, sglang_speculative_num_draft_tokens=4096))
    assert result.returncode != 0
    assert ("sglang_speculative_draft_window_size (2048) must be >="
            " sglang_speculative_num_draft_tokens (4096)") in " ".join(result.stdout.split())
    assert not (out / "sglang.service").exists()


def test_old_version_renders_old_flag(tmp_path):
    result, out = render(tmp_path, dict(K26, __sglang_version="0.5.11"))
    assert result.returncode == 0, result.stdout
    unit = (out / "sglang.service").read_text()
    assert '    "--speculative-dflash-draft-window-size" \\\n    "2048" \\\n' in unit
    assert '"--speculative-draft-window-size"' not in unit


def test_api_key_with_quotes_and_dollars_is_yaml_safe(tmp_path):
    key = "a'b\"c$d%e\\f"
    result, out = render(tmp_path, dict(K26, sglang_api_key=key))
    assert result.returncode == 0, result.stdout
    assert yaml.safe_load((out / "sglang.yaml").read_text()) == {"api-key": key}
    assert key not in result.stdout


def test_check_mode_diff_predicts_without_writing(tmp_path):
    result, out = render(tmp_path, K26, check=True)
    assert result.returncode == 0, result.stdout
    assert '+    "--speculative-draft-window-size" \\' in result.stdout
    assert not (out / "sglang.service").exists()
