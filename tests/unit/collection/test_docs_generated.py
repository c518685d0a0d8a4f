# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The generated parts of the guide agree with the files that hold the truth (docs/tools/generate.py):
the variables tables with the argument specs, the playbook spec with what the playbooks read, the
troubleshooting page with the verdicts the code can give and with docs/verdict-examples.json."""
import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
SPEC = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "tools" / "generate.py")
generate = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(generate)

TROUBLESHOOTING = generate.RST / "troubleshooting.rst"
# Verdicts that no lab test produces yet, so no example could be captured for them. The lead's wiring
# of the lab tests (record_verdict) empties this set; a verdict that gets an example must leave it.
NO_LAB_TEST_YET: set[str] = set()  # a verdict no lab test produces yet (none: every one has its captured example)


@pytest.mark.parametrize("page", generate.pages(), ids=lambda p: p.name)
def test_each_generated_page_is_what_the_generator_writes(page):
    text = page.read_text()
    assert generate.render(text) == text, f"{page.name} is out of date: run `make docs`"


def test_the_pages_with_generated_blocks_are_the_variables_and_troubleshooting_pages():
    assert [p.name for p in generate.pages()] == ["troubleshooting.rst", "variables.rst"]


def test_a_changed_spec_makes_the_variables_page_stale(monkeypatch, tmp_path):
    spec = yaml.safe_load(generate.PLAYBOOK_SPEC.read_text())
    knob = {"type": "int", "default": 3, "description": "A new knob."}
    spec["argument_specs"]["rollout"]["options"]["rollout_new_knob"] = knob
    changed = tmp_path / "playbook_vars.yml"
    changed.write_text(yaml.safe_dump(spec))
    monkeypatch.setattr(generate, "PLAYBOOK_SPEC", changed)
    text = (generate.RST / "variables.rst").read_text()
    rendered = generate.render(text)
    assert rendered != text and ":literal:`rollout_new_knob`" in rendered


def test_every_role_variable_is_in_the_table():
    text = (generate.RST / "variables.rst").read_text()
    options = yaml.safe_load(generate.ROLE_SPEC.read_text())["argument_specs"]["main"]["options"]
    assert len(options) >= 30
    missing = [name for name in options if f"   * - :literal:`{name}`" not in text]
    assert not missing, missing


def playbook_variables_read():
    """Every rollout_*/verify_*/sweep_*/status_* variable a playbook reads with a default (a user's knob) and does not
    set itself (set_fact, play vars, register), and the router variables they read."""
    found, own = set(), set()
    for path in (REPO / "playbooks").rglob("*.yml"):
        if path == generate.PLAYBOOK_SPEC:
            continue
        text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        found.update(re.findall(r"\b((?:rollout|verify|sweep|status)_[a-z_]+) \| default\(", text))
        found.update(re.findall(r"\b(sglang_router_(?:url|api_key))\b", text))
        found.update(re.findall(r"\b(sweep_matrix)\b", text))
        own.update(re.findall(r"^\s+((?:rollout|verify|sweep|status)_[a-z_]+):", text, re.M))
        own.update(re.findall(r"^\s+register: (\w+)", text, re.M))
    return found - own


def test_the_playbook_spec_names_every_variable_the_playbooks_read_and_no_other():
    spec = yaml.safe_load(generate.PLAYBOOK_SPEC.read_text())["argument_specs"]
    documented = {name for entry in spec.values() for name in entry["options"]}
    read = playbook_variables_read()
    assert {"rollout_batches", "verify_hosts", "sweep_restore", "sglang_router_url"} <= read
    assert read - documented == set(), "read by the playbooks, not in meta/playbook_vars.yml"
    assert documented - read == set(), "in meta/playbook_vars.yml, read by no playbook"


def test_the_playbook_spec_defaults_are_the_playbooks_defaults():
    spec = yaml.safe_load(generate.PLAYBOOK_SPEC.read_text())["argument_specs"]
    text = "\n".join(p.read_text() for p in (REPO / "playbooks").rglob("*.yml"))
    for entry in spec.values():
        for name, option in entry["options"].items():
            for default in re.findall(r"\b%s \| default\(([^()]*?)\)" % name, text):
                if default.startswith(("omit", "lookup", "None")) or "," in default:
                    continue
                value = yaml.safe_load(default)
                assert value == option.get("default"), (name, value, option.get("default"))


# ------------------------------------------------------------------ troubleshooting

def verdicts_the_code_gives():
    """sglang_ready's verdicts (its RETURN, less `waiting`, which only a slice returns) and verify's (the
    drift comparison's, and `unchecked` for a host the check could not read)."""
    from ansible_collections.gpufleet.inference.plugins.modules import sglang_ready
    from ansible_collections.gpufleet.inference.plugins.module_utils import _drift
    ready_doc = yaml.safe_load(sglang_ready.RETURN)["verdict"]["description"]
    ready = set(re.findall(r"V\(([a-z_]+)\)", " ".join(ready_doc))) - {"waiting"}
    drift = {getattr(_drift, n) for n in ("IN_SYNC", "DRIFTED", "UNVERIFIED", "NOT_RUNNING", "NOT_INSTALLED")}
    report = (REPO / "plugins" / "action" / "sglang_drift_report.py").read_text()
    assert '"unchecked": "NOT CHECKED"' in report
    return {f"sglang_ready/{v}" for v in ready} | {f"verify/{v}" for v in drift | {"unchecked"}}


def test_the_page_has_one_section_per_verdict_the_code_can_give():
    sections = generate.verdict_sections(TROUBLESHOOTING.read_text())
    assert len(sections) == len(set(sections)), "a verdict has two sections"
    assert set(sections) == verdicts_the_code_gives()


def test_every_section_has_a_meaning_a_remedy_and_an_example_block():
    text = TROUBLESHOOTING.read_text()
    for key in generate.verdict_sections(text):
        body = text.split(".. _ansible_collections.gpufleet.inference.docsite.verdict.%s:" % key.replace("/", "."))[1]
        body = body.split(".. _ansible_collections.gpufleet.inference.docsite.verdict.")[0]
        assert "**What it means.**" in body and "**What to do.**" in body, key
        assert f".. BEGIN GENERATED example:{key}" in body, key


def test_every_verdict_has_an_example_captured_on_the_lab_except_those_no_lab_test_produces_yet():
    examples = generate.load_examples()
    sections = set(generate.verdict_sections(TROUBLESHOOTING.read_text()))
    missing = sections - set(examples)
    assert missing <= NO_LAB_TEST_YET, f"no captured example for {sorted(missing - NO_LAB_TEST_YET)}"
    stale = NO_LAB_TEST_YET & set(examples)
    assert not stale, f"{sorted(stale)} have examples now: take them out of NO_LAB_TEST_YET"
    assert NO_LAB_TEST_YET <= sections


def test_every_example_was_captured_by_a_test_and_belongs_to_a_section():
    examples = generate.load_examples()
    sections = set(generate.verdict_sections(TROUBLESHOOTING.read_text()))
    assert set(examples) <= sections, set(examples) - sections
    for key, example in examples.items():
        assert re.match(r"tests/integration/test_\w+\.py::\S+", example["test"]), (key, example["test"])
        assert re.match(r"\d{4}-\d\d-\d\dT", example["captured"]), (key, example["captured"])
        assert example["message"].strip(), key


def test_take_captured_merges_a_recorded_verdict_and_the_page_shows_it(tmp_path, monkeypatch):
    data = tmp_path / "examples.json"
    data.write_text(json.dumps({"verify/drifted": {"message": "old", "test": "tests/integration/test_a.py::t",
                                                   "captured": "2025-01-01T00:00:00Z"}}))
    captured = tmp_path / "captured"
    captured.mkdir()
    (captured / "sglang_ready-died.json").write_text(json.dumps({
        "source": "sglang_ready", "verdict": "died", "message": "sglang.service: invocation x died\nline 2",
        "test": "tests/integration/test_b.py::test_c", "captured": "2025-12-05T10:00:00Z"}))
    assert generate.take_captured(captured, data) == ["sglang_ready/died"]
    merged = json.loads(data.read_text())
    assert set(merged) == {"verify/drifted", "sglang_ready/died"}
    monkeypatch.setattr(generate, "EXAMPLES", data)
    block = generate.example_block("sglang_ready/died", generate.load_examples())
    assert "``tests/integration/test_b.py::test_c``" in block and "   line 2" in block


def test_take_captured_refuses_a_record_without_its_test(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"source": "verify", "verdict": "drifted", "message": "m"}))
    with pytest.raises(generate.GenerateError, match="lacks captured, test"):
        generate.take_captured(tmp_path, tmp_path / "examples.json")


def test_an_unknown_generated_block_is_an_error():
    with pytest.raises(generate.GenerateError, match="unknown generated block 'nope'"):
        generate.render(".. BEGIN GENERATED nope\n.. END GENERATED nope\n")
