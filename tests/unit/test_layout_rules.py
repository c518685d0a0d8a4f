# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The redesign's rules (issue 10), checked on every commit: logic lives in Python, YAML stays thin.

- no role-private variable (``__sglang_*``) outside ``roles/sglang/``;
- no ``ansible.builtin.shell`` (or ``shell``) task in ``playbooks/``;
- no Jinja program longer than 3 lines in ``playbooks/`` or ``roles/*/tasks/``, counted in the SOURCE
  with the ``|``/``>-`` indicator line (a folded scalar is one string once parsed, but as many lines as
  the reader has to read);
- no comment or docstring quoting a timing (issue 28: figures live in tests/benchmarks/RESULTS.md and the guide);
- no module sent to a host importing controller-only code (issue 28).
"""
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
THIN = sorted([*REPO.glob("playbooks/**/*.yml"), *REPO.glob("roles/*/tasks/*.yml")])


def tasks(node):
    if isinstance(node, list):
        for item in node:
            yield from tasks(item)
    elif isinstance(node, dict):
        if any(key in node for key in ("name", "block")) and not {"hosts", "import_playbook"} & set(node):
            yield node
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            yield from tasks(node.get(key))


def test_the_thin_files_exist():
    assert len(THIN) >= 10, THIN


def test_no_role_private_variable_outside_the_role():
    offenders = []
    for path in REPO.glob("playbooks/**/*.yml"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "__sglang_" in line:
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("path", [p for p in THIN if p.is_relative_to(REPO / "playbooks")],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_shell_in_playbooks(path):
    found = [task.get("name") for task in tasks(yaml.safe_load(path.read_text()))
             if "ansible.builtin.shell" in task or "shell" in task]
    assert not found, found


def jinja_scalars(source):
    """(line, source lines) of every scalar holding Jinja, its lines counted as written in `source`."""
    found = []

    def walk(node):
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                walk(key)
                walk(value)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item)
        elif isinstance(node, yaml.ScalarNode) and ("{{" in node.value or "{%" in node.value):
            # Every line the reader reads, the indicator line of a block scalar (| or >-) included.
            written = source[node.start_mark.index:node.end_mark.index].rstrip().splitlines()
            found.append((node.start_mark.line + 1, len(written)))

    for document in yaml.compose_all(source):
        walk(document)
    return found


@pytest.mark.parametrize("path", THIN, ids=lambda p: str(p.relative_to(REPO)))
def test_no_jinja_program_longer_than_three_lines(path):
    long = [f"{path.relative_to(REPO)}:{line}: {count} lines" for line, count in jinja_scalars(path.read_text())
            if count > 3]
    assert not long, long


def test_the_rule_catches_what_it_must():
    literal = "- name: x\n  ansible.builtin.set_fact:\n    y: |\n      {{ a\n      b\n      c\n      d }}\n"
    folded = "- name: x\n  ansible.builtin.set_fact:\n    y: >-\n      {{ a\n      b\n      c\n      d }}\n    z: 1\n"
    plain = "- name: x\n  ansible.builtin.set_fact:\n    y: \"{{ a\n      b }}\"\n    w: '{{ c }}'\n"
    assert jinja_scalars(literal) == [(3, 5)]
    assert jinja_scalars(folded) == [(3, 5)]  # one line once parsed, five in the source (with ">-")
    assert jinja_scalars(plain) == [(3, 2), (5, 1)]
    assert [task["name"] for task in tasks(yaml.safe_load("- hosts: all\n  tasks:\n    - name: s\n      shell: ls\n"))
            ] == ["s"]


# ------------------------------------------------------------------ issue 28: comments, host-side modules

# Measurements live in tests/benchmarks/RESULTS.md and the guide's performance page, not in the code.
TIMING = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|µs)\b|\b\d+(?:\.\d+)?\s?s of (?:controller )?CPU\b")
CODE = sorted([*REPO.glob("plugins/**/*.py"), *REPO.glob("roles/**/*.yml"), *REPO.glob("playbooks/**/*.yml"),
               REPO / "ansible.cfg"])


def timing_quotes(text):
    return [line.strip() for line in text.splitlines() if TIMING.search(line)]


def test_no_comment_or_docstring_quotes_a_timing():
    found = {}
    for path in CODE:
        quoted = timing_quotes(path.read_text())
        if quoted:
            found[str(path.relative_to(REPO))] = quoted
    assert found == {}, "move the figures to tests/benchmarks/RESULTS.md or the guide"
    assert timing_quotes("# a call costs ~20 ms of controller CPU") and timing_quotes("# 0.09 s of CPU per run")
    assert not timing_quotes("# waits 30 seconds at most") and not timing_quotes("timeout=5.0")


# Code that only the controller runs: a module sent to a host must not carry it.
CONTROLLER_ONLY = {"_args", "_hostpath", "_grouppath", "_fleet", "_rollout", "_records", "_sweep", "_groups"}
IMPORT = re.compile(r"plugins\.module_utils(?:\.(\w+)| import (\w+))")


def module_utils_of(path, seen=None):
    """Every module_utils file `path` imports, directly or through another."""
    seen = set() if seen is None else seen
    for match in IMPORT.finditer(path.read_text()):
        name = match.group(1) or match.group(2)
        if name not in seen:
            seen.add(name)
            module_utils_of(REPO / "plugins" / "module_utils" / f"{name}.py", seen)
    return seen


@pytest.mark.parametrize("path", sorted(REPO.glob("plugins/modules/*.py")), ids=lambda p: p.name)
def test_no_module_sent_to_a_host_imports_controller_only_code(path):
    if "AnsibleModule" not in path.read_text():
        return  # the documentation of an action plugin: never sent to a host
    assert module_utils_of(path) & CONTROLLER_ONLY == set(), path.name


def test_the_import_walk_sees_an_indirect_import():
    assert "_args" in module_utils_of(REPO / "plugins" / "module_utils" / "_hostpath.py")


# A comment that sends the reader to a file of this repository names one that exists (no stale references).
CITED = re.compile(r"(?<![\w/.])((?:docs|tests|plugins|roles|playbooks|meta|changelogs)/[\w./-]*\w|[A-Z][A-Z_]+\.md)\b")


def cited_paths(text):
    return {match.group(1) for match in CITED.finditer(text)}


def cited_exists(cited, path):
    """A path from the repository's root or the citing role's directory; a bare NAME.md anywhere in it."""
    if "/" not in cited:
        return any(found for found in REPO.rglob(cited) if ".venv" not in found.parts and ".build" not in found.parts)
    role = next((parent for parent in path.parents if parent.parent.name == "roles"), None)
    return (REPO / cited).exists() or (role is not None and (role / cited).exists())


def test_every_file_the_shipped_code_cites_exists():
    missing = {}
    for path in CODE:
        gone = sorted(cited for cited in cited_paths(path.read_text()) if not cited_exists(cited, path))
        if gone:
            missing[str(path.relative_to(REPO))] = gone
    assert missing == {}


def test_the_citation_rule_catches_what_it_must():
    text = "# see SGLANG_FACTS.md and docs/canary-analysis.md, not docs/docsite/rst/canary.rst"
    assert cited_paths(text) == {"SGLANG_FACTS.md", "docs/canary-analysis.md", "docs/docsite/rst/canary.rst"}
    here = REPO / "plugins" / "module_utils" / "_canary.py"
    gone = [cited for cited in sorted(cited_paths(text)) if not cited_exists(cited, here)]
    assert gone == ["SGLANG_FACTS.md", "docs/canary-analysis.md"]
    assert cited_exists("meta/argument_specs.yml", REPO / "roles" / "sglang" / "tasks" / "main.yml")
    assert cited_paths("x = REPO / 'tests' / 'lab'") == set()
