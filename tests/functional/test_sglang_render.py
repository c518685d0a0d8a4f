"""The unit, journald's drop-in and the config file as the role renders them (module_utils/_args.py: one
pure function each), from the role's defaults and a K2.6 host's settings, checked by `systemd-analyze verify`
exactly as the role's install step runs it.

Asserts the exact ExecStart, that the API key stays out of the unit (and off the command line: it goes to
the --config YAML file).
"""
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.inference.plugins.module_utils import _args
from ansible_collections.gpufleet.inference.plugins.modules import sglang_unit_files

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "sglang"
KEY = "k26-api-key.XYZ"
PYTHON = "/usr/bin/python3"  # an executable that exists, so systemd-analyze verify can pass
VERSION = "0.5.12"

K26 = {
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


def role_settings(**over):
    """The role's defaults with a host's settings over them, as Ansible templates them for the role."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    settings = dict((name, defaults[name]) for name in _args.SETTINGS if name in defaults)
    settings["sglang_config_file"] = "/etc/sglang/sglang.yaml"  # the default's template, rendered
    settings.update(over)
    return settings


def render(settings, version=VERSION):
    return {"sglang.service": _args.render_unit(settings, version), "journald.conf": _args.render_journald(settings),
            "sglang.yaml": _args.config_file_text(settings)}


@pytest.fixture(scope="module")
def k26_render():
    return render(role_settings(**K26))


def test_exact_execstart(k26_render):
    unit = k26_render["sglang.service"]
    start = unit.index("ExecStart=")
    end = unit.index("TimeoutStartSec=")
    assert unit[start:end] == EXPECTED_EXECSTART


def test_unit_sections(k26_render):
    unit = k26_render["sglang.service"]
    assert unit.startswith("#\n# Ansible managed")
    for line in ("[Unit]", "After=network-online.target", "[Service]", "Type=simple",
                 "User=root", "Group=root", 'Environment="SGLANG_LOG_MS=1"',
                 'Environment="NOTE=50%% $off"',
                 "TimeoutStartSec=900", "TimeoutStopSec=900", "KillMode=control-group",
                 "Restart=on-failure", "RestartSec=10", "SyslogIdentifier=sglang",
                 "[Install]", "WantedBy=multi-user.target"):
        assert line in unit.splitlines(), line


def test_api_key_only_in_the_config_file(k26_render):
    unit = k26_render["sglang.service"]
    assert KEY not in unit and "EnvironmentFile" not in unit
    assert yaml.safe_load(k26_render["sglang.yaml"]) == {"api-key": KEY}


def test_journald_dropin(k26_render):
    text = k26_render["journald.conf"]
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
    verify(k26_render["sglang.service"])


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_systemd_analyze_rejects_a_broken_unit(k26_render):
    text = k26_render["sglang.service"]
    with pytest.raises(sglang_unit_files.InstallError, match="/nonexistent/python") as caught:
        verify(text.replace('ExecStart="/usr/bin/python3"', 'ExecStart="/nonexistent/python"'))
    assert "systemd-analyze verify rejected /etc/systemd/system/sglang.service" in str(caught.value)


def test_invalid_settings_fail_the_render_naming_the_variable():
    with pytest.raises(_args.SettingsError, match=r"sglang_speculative_draft_window_size \(2048\) must be >= "
                                                  r"sglang_speculative_num_draft_tokens \(4096\)"):
        render(dict(role_settings(**K26), sglang_speculative_num_draft_tokens=4096))


def test_old_version_renders_old_flag():
    unit = render(role_settings(**K26), "0.5.11")["sglang.service"]
    assert '    "--speculative-dflash-draft-window-size" \\\n    "2048" \\\n' in unit
    assert '"--speculative-draft-window-size"' not in unit


def test_api_key_with_quotes_and_dollars_is_yaml_safe():
    key = "a'b\"c$d%e\\f"
    rendered = render(dict(role_settings(**K26), sglang_api_key=key))
    assert yaml.safe_load(rendered["sglang.yaml"]) == {"api-key": key}
    assert key not in rendered["sglang.service"]
