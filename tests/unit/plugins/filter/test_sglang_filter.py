# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filter plugin: same results as the args builder, errors as AnsibleFilterError."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.inference.plugins.filter import sglang as sglang_filter
from ansible_collections.gpufleet.inference.plugins.module_utils import _args

FILTERS = sglang_filter.FilterModule().filters()

SETTINGS = {
    "sglang_model_path": "/models/Kimi-K2.6",
    "sglang_tp_size": 8,
    "sglang_host": "127.0.1.2",
    "sglang_port": 30000,
    "sglang_speculative_algorithm": "DFLASH",
    "sglang_speculative_draft_model_path": "/models/Kimi-K2.6-DFlash",
    "sglang_speculative_num_draft_tokens": 16,
    "sglang_speculative_draft_window_size": 2048,
    "sglang_api_key": "k3y",
}


def test_exposed_filters():
    assert set(FILTERS) == {"sglang_validate", "sglang_args", "sglang_expect", "sglang_execstart",
                            "systemd_quote", "systemd_environment", "sglang_intent", "sglang_server_info",
                            "sglang_endpoints", "sglang_config_path", "sglang_config_text",
                            "sglang_verified_from_drift", "sglang_verification", "sglang_adopted_record",
                            "sglang_revert_outcome"}


def test_every_filter_has_its_documentation():
    from pathlib import Path
    docs = Path(sglang_filter.__file__).parent
    from ansible_collections.gpufleet.inference.plugins.filter import sweep
    for name in list(FILTERS) + list(sweep.FilterModule().filters()):
        assert (docs / ("%s.yml" % name)).is_file(), name


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_intent_and_server_info_come_from_the_one_builder(version):
    intent = FILTERS["sglang_intent"](SETTINGS, version)
    assert intent == _args.build_intent(SETTINGS, version)
    assert intent["config_line"] == "required" and intent["command"][-2:] == ["--config", "/etc/sglang/sglang.yaml"]
    assert FILTERS["sglang_server_info"](SETTINGS, version) == _args.intended_server_info(SETTINGS, version)
    bad = dict(SETTINGS, sglang_speculative_draft_window_size=8)
    with pytest.raises(AnsibleFilterError, match="sglang_speculative_draft_window_size"):
        FILTERS["sglang_intent"](bad, version)


@pytest.mark.parametrize("host,address,url,worker_url", [
    ("0.0.0.0", "10.0.0.5", "http://127.0.0.1:30000", "http://10.0.0.5:30000"),
    ("::", "10.0.0.5", "http://[::1]:30000", "http://10.0.0.5:30000"),
    ("fd00::5", "10.0.0.5", "http://[fd00::5]:30000", "http://[fd00::5]:30000"),
    ("gpu-1.example.internal", "10.0.0.5", "http://gpu-1.example.internal:30000",
     "http://gpu-1.example.internal:30000"),
    ("127.0.1.11", None, "http://127.0.1.11:30000", "http://127.0.1.11:30000"),
    ("", "10.0.0.5", "http://127.0.0.1:30000", "http://127.0.0.1:30000"),  # SGLang's default bind
])
def test_endpoints_filter(host, address, url, worker_url):
    assert FILTERS["sglang_endpoints"](host, 30000, address) == {"url": url, "worker_url": worker_url}


def test_endpoints_filter_tls_and_errors():
    assert FILTERS["sglang_endpoints"]("h", "443", None, {"--ssl-certfile": "/c.pem"})["url"] == "https://h:443"
    with pytest.raises(AnsibleFilterError, match="sglang_endpoints"):
        FILTERS["sglang_endpoints"]("h", "not-a-port")


def test_config_filters_hold_the_key_only_where_it_belongs():
    import yaml
    assert FILTERS["sglang_config_path"](dict(SETTINGS, sglang_unit_name="llm.service")) == "/etc/sglang/llm.yaml"
    assert FILTERS["sglang_config_path"](dict(SETTINGS, sglang_config_file="/srv/k.yaml")) == "/srv/k.yaml"
    assert yaml.safe_load(FILTERS["sglang_config_text"](SETTINGS)) == {"api-key": "k3y"}


@pytest.mark.parametrize("version", ["0.5.11", "0.5.12", "0.5.19", "0.5.23"])
def test_filters_call_the_one_builder(version):
    assert FILTERS["sglang_args"](SETTINGS, version) == _args.build_args(SETTINGS, version)
    assert FILTERS["sglang_expect"](SETTINGS, version) == _args.build_expect(SETTINGS, version)
    execstart = _args.render_execstart(SETTINGS, version)
    assert FILTERS["sglang_execstart"](SETTINGS, version) == execstart
    assert FILTERS["sglang_validate"](SETTINGS, version) is True
    assert FILTERS["sglang_validate"](SETTINGS) is True


def test_filter_error_names_the_variable():
    bad = dict(SETTINGS, sglang_speculative_draft_window_size=8)
    for name in ("sglang_args", "sglang_expect", "sglang_execstart"):
        with pytest.raises(AnsibleFilterError, match=r"sglang_speculative_draft_window_size \(8\)"
                                                     r" must be >= sglang_speculative_num_draft_tokens"
                                                     r" \(16\)"):
            FILTERS[name](bad, "0.5.12")
    with pytest.raises(AnsibleFilterError, match="sglang_speculative_draft_window_size"):
        FILTERS["sglang_validate"](bad)


def test_filter_error_for_old_version():
    with pytest.raises(AnsibleFilterError, match="has no DFLASH"):
        FILTERS["sglang_args"](SETTINGS, "0.5.10")


def test_api_key_not_in_filter_output():
    assert "k3y" not in repr(FILTERS["sglang_args"](SETTINGS, "0.5.23"))
    assert "k3y" not in FILTERS["sglang_execstart"](SETTINGS, "0.5.23")


def test_systemd_quote_filter():
    assert FILTERS["systemd_quote"]('a "50%" $HOME\\') == '"a \\"50%%\\" $$HOME\\\\"'
    with pytest.raises(AnsibleFilterError, match="newline or control character"):
        FILTERS["systemd_quote"]("a\nb")


def test_systemd_environment_filter():
    assert FILTERS["systemd_environment"]({"SGLANG_LOG_MS": 1, "NOTE": "50% $off",
                                           "FLAG": True}) == [
        '"SGLANG_LOG_MS=1"', '"NOTE=50%% $off"', '"FLAG=1"']
    assert FILTERS["systemd_environment"]({}) == []
    assert FILTERS["systemd_environment"](None) == []
    with pytest.raises(AnsibleFilterError, match="sglang_environment key 'A-B'"):
        FILTERS["systemd_environment"]({"A-B": "x"})
    with pytest.raises(AnsibleFilterError, match=r"sglang_environment\['SGLANG_API_KEY'\]"):
        FILTERS["systemd_environment"]({"SGLANG_API_KEY": "x"})


def test_filters_through_ansible_templating():
    """The filters as the role calls them: through Ansible's templar (lazy containers, tags)."""
    from ansible.template import Templar, trust_as_template
    from ansible.parsing.dataloader import DataLoader

    templar = Templar(loader=DataLoader(), variables={"settings": SETTINGS, "version": "0.5.12"})
    expect = templar.template(
        trust_as_template("{{ settings | gpufleet.inference.sglang_expect(version) }}"))
    assert expect == {"block_size": 16, "draft_window_size": 2048, "compact_cache": True}
    args = templar.template(
        trust_as_template("{{ settings | gpufleet.inference.sglang_args(version) }}"))
    assert args[args.index("--speculative-draft-window-size") + 1] == "2048"
