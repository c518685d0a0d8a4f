# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The redesign's rules (issue 10), checked on every commit: logic lives in Python, YAML stays thin.

- no role-private variable (``__sglang_*``) outside ``roles/sglang/``;
- no ``ansible.builtin.shell`` (or ``shell``) task in ``playbooks/``;
- no Jinja program longer than 3 lines in ``playbooks/`` or ``roles/*/tasks/``.
"""
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
THIN = sorted([*REPO.glob("playbooks/**/*.yml"), *REPO.glob("roles/*/tasks/*.yml")])


def strings(node, where=""):
    """Every string value in a YAML document, with a path to it."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from strings(value, f"{where}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from strings(value, f"{where}[{index}]")
    elif isinstance(node, str):
        yield where, node


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


@pytest.mark.parametrize("path", THIN, ids=lambda p: str(p.relative_to(REPO)))
def test_no_jinja_program_longer_than_three_lines(path):
    long = []
    for where, text in strings(yaml.safe_load(path.read_text())):
        if ("{{" in text or "{%" in text) and len(text.strip().splitlines()) > 3:
            long.append(f"{where}: {len(text.strip().splitlines())} lines")
    assert not long, long


def test_the_rule_catches_what_it_must():
    doc = yaml.safe_load("- name: x\n  ansible.builtin.set_fact:\n    y: |\n      {{ a\n      b\n      c\n      d }}\n")
    assert [len(text.strip().splitlines()) for dummy, text in strings(doc) if "{{" in text] == [4]
    assert [task["name"] for task in tasks(yaml.safe_load("- hosts: all\n  tasks:\n    - name: s\n      shell: ls\n"))
            ] == ["s"]
