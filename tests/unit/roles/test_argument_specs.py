"""meta/argument_specs.yml documents exactly the variables of defaults/main.yml, with the same defaults."""
from pathlib import Path

import yaml

ROLE = Path(__file__).resolve().parents[3] / "roles" / "sglang"


def load(rel):
    return yaml.safe_load((ROLE / rel).read_text())


def test_every_default_is_documented_with_the_same_value():
    defaults = load("defaults/main.yml")
    options = load("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    undocumented = sorted(set(defaults) - set(options))
    assert not undocumented, f"defaults without argument spec: {undocumented}"
    for name, value in defaults.items():
        spec = options[name]
        assert spec.get("default") == value, (name, spec.get("default"), value)
        assert spec.get("description"), name
        assert spec.get("type"), name


def test_every_option_is_prefixed_and_required_ones_have_no_default():
    options = load("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    defaults = load("defaults/main.yml")
    for name, spec in options.items():
        assert name.startswith("sglang_"), name
        if spec.get("required"):
            assert name not in defaults, f"{name} is required but has a default"
        else:
            assert name in defaults, f"{name} is optional but has no default in defaults/main.yml"


def test_secret_options_are_no_log():
    options = load("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert options["sglang_api_key"].get("no_log") is True


def test_every_entry_point_has_a_spec_and_every_spec_a_task_file():
    specs = set(load("meta/argument_specs.yml")["argument_specs"])
    task_files = {p.stem for p in (ROLE / "tasks").glob("*.yml")}
    assert specs <= task_files, specs - task_files
    # rollout_host is the rollout's own step (playbooks/rollout.yml, tasks_from): not an entry point for
    # users; its action checks its arguments after the prepare phase ran `drift`, whose spec Ansible applied.
    assert task_files - specs == {"rollout_host"}, task_files - specs
    # drift is ONE task: Ansible checks the variables against its spec, the action reads them by name
    drift = yaml.safe_load((ROLE / "tasks" / "drift.yml").read_text())
    assert len(drift) == 1 and "gpufleet.inference.sglang_compare" in drift[0] and drift[0]["tags"] == ["always"]
    assert not (drift[0]["gpufleet.inference.sglang_compare"] or {})  # no argument list to keep in step
    options = load("meta/argument_specs.yml")["argument_specs"]
    for name in specs:
        assert options[name]["short_description"] and options[name]["options"], name
