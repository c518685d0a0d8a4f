# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The generated parts of the guide (docs/docsite/rst), from the files that hold the truth.

    python docs/tools/generate.py            # rewrite the generated blocks of the guide's pages
    python docs/tools/generate.py --check    # exit 1 and name the pages that are out of date
    python docs/tools/generate.py --take-captured [DIR]
        # first merge the verdict messages lab tests captured (default .build/results/verdict-examples,
        # written by the fixture record_verdict of tests/integration) into docs/verdict-examples.json

Generated blocks sit between `.. BEGIN GENERATED <name>` and `.. END GENERATED <name>` lines:

- variables.rst: one table of the role's variables (roles/sglang/meta/argument_specs.yml; every entry
  point takes the same ones) and one per playbook (meta/playbook_vars.yml);
- troubleshooting.rst: under each verdict's section, the example message captured on the lab
  (docs/verdict-examples.json: "<source>/<verdict>" -> message, the test that saw it, when).

`make docs` runs this before it builds the site; tests/unit/collection/test_docs_generated.py fails
when a page differs from what this writes.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml
from antsibull_docs_parser.parser import Context, parse
from antsibull_docs_parser.rst import to_rst_plain

REPO = Path(__file__).resolve().parents[2]
RST = REPO / "docs" / "docsite" / "rst"
ROLE_SPEC = REPO / "roles" / "sglang" / "meta" / "argument_specs.yml"
PLAYBOOK_SPEC = REPO / "meta" / "playbook_vars.yml"
EXAMPLES = REPO / "docs" / "verdict-examples.json"
CAPTURED = REPO / ".build" / "results" / "verdict-examples"

BLOCK = re.compile(r"^\.\. BEGIN GENERATED (?P<name>\S+)\n.*?^\.\. END GENERATED (?P=name)\n", re.S | re.M)
# A verdict's section in troubleshooting.rst: its label names the source and the verdict.
VERDICT_LABEL = re.compile(r"^\.\. _ansible_collections\.gpufleet\.inference\.docsite\.verdict\.(?P<source>[a-z_]+)\."
                           r"(?P<verdict>[a-z_]+):$", re.M)


class GenerateError(Exception):
    pass


# ------------------------------------------------------------------ markup and tables

def rst(text) -> str:
    """ansible-doc markup (C(), O(), M(), ...) as reStructuredText."""
    return to_rst_plain(parse(str(text), Context()))


def paragraphs(value) -> list[str]:
    if value is None:
        return []
    return [rst(p) for p in (value if isinstance(value, list) else [value])]


def literal(value) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value)
    return ":literal:`%s`" % text.replace("\\", "\\\\").replace("`", "\\`") if text != "" else '``""``'


def type_of(option: dict) -> str:
    kind = option.get("type", "str")
    return "list of %s" % option["elements"] if kind == "list" and option.get("elements") else kind


def option_cell(option: dict) -> list[str]:
    parts = paragraphs(option.get("description"))
    if option.get("choices"):
        parts.append("Choices: %s." % ", ".join(literal(c) for c in option["choices"]))
    if option.get("required"):
        parts.append("Required.")
    if option.get("no_log"):
        parts.append("Secret: never logged.")
    return parts or [""]


def cell(lines: list[str], first: bool) -> list[str]:
    """One cell of a list-table row: paragraphs separated by blank lines, indented under the bullet."""
    out = []
    for i, text in enumerate(lines):
        if i:
            out.append("")
        for j, line in enumerate(text.splitlines() or [""]):
            lead = ("   * - " if first else "     - ") if i == 0 and j == 0 else "       "
            out.append((lead + line).rstrip())
    return out


def options_table(options: dict) -> str:
    rows = [".. list-table::", "   :header-rows: 1", "   :widths: 24 10 16 50", ""]
    rows += cell(["Variable"], True) + cell(["Type"], False) + cell(["Default"], False) + cell(["Meaning"], False)
    for name in sorted(options):
        option = options[name] or {}
        default = literal(option["default"]) if "default" in option else ""
        rows += cell([literal(name)], True) + cell([type_of(option)], False) + cell([default], False)
        rows += cell(option_cell(option), False)
    return "\n".join(rows) + "\n"


def load_spec(path: Path) -> dict:
    specs = yaml.safe_load(path.read_text())
    if not isinstance(specs, dict) or not isinstance(specs.get("argument_specs"), dict):
        raise GenerateError("%s: no argument_specs mapping" % path.relative_to(REPO))
    return specs["argument_specs"]


def role_variables() -> str:
    specs = load_spec(ROLE_SPEC)
    shared = specs["main"]["options"]
    others = [name for name, spec in specs.items() if spec.get("options") != shared]
    if others:
        raise GenerateError("entry points %s of %s take other variables than main: give them a table of their own"
                            % (", ".join(others), ROLE_SPEC.relative_to(REPO)))
    points = ", ".join("``%s`` (%s)" % (name, rst(spec.get("short_description", ""))) for name, spec in specs.items())
    head = ("Every entry point of the role takes these %d variables: %s.\n\n"
            % (len(shared), points))
    return head + options_table(shared)


def playbook_variables() -> str:
    blocks = []
    for name, spec in load_spec(PLAYBOOK_SPEC).items():
        title = rst(spec.get("short_description", name))
        blocks.append("%s\n%s\n\n" % (title, "~" * len(title)))
        blocks.extend(p + "\n\n" for p in paragraphs(spec.get("description")))
        blocks.append(options_table(spec.get("options") or {}) + "\n")
    return "".join(blocks).rstrip("\n") + "\n"


# ------------------------------------------------------------------ verdict examples

def verdict_sections(page_text: str) -> list[str]:
    """"<source>/<verdict>" of every verdict section of troubleshooting.rst, in page order."""
    return ["%s/%s" % (m.group("source"), m.group("verdict")) for m in VERDICT_LABEL.finditer(page_text)]


def load_examples(path: Path | None = None) -> dict:
    path = path or EXAMPLES
    return json.loads(path.read_text()) if path.exists() else {}


def example_block(key: str, examples: dict) -> str:
    example = examples.get(key)
    if not example:
        return "*No example captured on the lab yet.*\n"
    lines = ["Example (captured on the lab by ``%s``, %s):" % (example["test"], example["captured"]), "",
             ".. code-block:: text", ""]
    lines += ["   " + line if line else "" for line in example["message"].splitlines()]
    return "\n".join(lines) + "\n"


def take_captured(directory: Path, path: Path | None = None) -> list[str]:
    """Merge the captured messages (one JSON file per verdict) into the data file; returns the keys taken."""
    path = path or EXAMPLES
    examples = load_examples(path)
    taken = []
    for file in sorted(directory.glob("*.json")):
        record = json.loads(file.read_text())
        missing = {"source", "verdict", "message", "test", "captured"} - set(record)
        if missing:
            raise GenerateError("%s lacks %s" % (file, ", ".join(sorted(missing))))
        key = "%s/%s" % (record["source"], record["verdict"])
        examples[key] = {k: record[k] for k in ("message", "test", "captured")}
        taken.append(key)
    path.write_text(json.dumps(dict(sorted(examples.items())), indent=2, ensure_ascii=False) + "\n")
    return taken


# ------------------------------------------------------------------ pages

def generated_blocks(page_text: str) -> dict:
    examples = load_examples()
    blocks = {"role-variables": role_variables, "playbook-variables": playbook_variables}
    for key in verdict_sections(page_text):
        blocks["example:" + key] = (lambda k=key: example_block(k, examples))
    return blocks


def render(page_text: str) -> str:
    """The page with each generated block rewritten; an unknown block name is an error."""
    blocks = generated_blocks(page_text)

    def replace(match):
        name = match.group("name")
        if name not in blocks:
            raise GenerateError("unknown generated block %r" % name)
        body = blocks[name]()
        return ".. BEGIN GENERATED %s\n\n%s\n.. END GENERATED %s\n" % (name, body, name)

    return BLOCK.sub(replace, page_text)


def pages() -> list[Path]:
    return sorted(p for p in RST.glob("*.rst") if BLOCK.search(p.read_text()))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only tell which pages are out of date")
    parser.add_argument("--take-captured", nargs="?", const=str(CAPTURED), metavar="DIR",
                        help="merge captured verdict messages into docs/verdict-examples.json first")
    args = parser.parse_args(argv)
    try:
        if args.take_captured:
            taken = take_captured(Path(args.take_captured))
            print("took %d captured example(s): %s" % (len(taken), ", ".join(taken) or "none"))
        stale = []
        for page in pages():
            text = page.read_text()
            new = render(text)
            if new != text:
                stale.append(str(page.relative_to(REPO)))
                if not args.check:
                    page.write_text(new)
    except GenerateError as exc:
        print("generate: %s" % exc, file=sys.stderr)
        return 2
    if args.check and stale:
        print("out of date (run `make docs` or python docs/tools/generate.py): %s" % ", ".join(stale))
        return 1
    print(("rewrote " if stale else "up to date: ") + ", ".join(stale or [str(p.relative_to(REPO)) for p in pages()]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
