# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Golden renders: what the role installs on every host of the example inventory, with no host needed.

For each host of inventories/example (its group_vars, the vault decrypted with the test password) and
each SGLang version the role renders for differently, the role's own code (module_utils/_args.py, as
the role's drift check calls it) renders the unit, journald's drop-in and the config file; a node of a
serving group (module_utils/_groups.py) gets its node's flags. They are
compared with the committed files under tests/golden/<host>/<version>/; the API key's value is written
as <sglang_api_key>, never in clear.

    python tests/golden/render.py           # exit 1 and name the files that differ (make test)
    python tests/golden/render.py --write   # rewrite them (make golden)
"""
from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
INVENTORY = REPO / "inventories" / "example" / "hosts.yml"
VAULT_PASSWORD = REPO / "tests" / "functional" / "data" / "example-vault-password"
DEFAULTS = REPO / "roles" / "sglang" / "defaults" / "main.yml"
# The versions whose flags differ (the draft window's flag was renamed after 0.5.11: plugins/module_utils/_flags.py).
VERSIONS = ("0.5.11", "0.5.23")
MANAGED = "Ansible managed"  # Ansible's default ansible_managed
KEY_SHOWN_AS = "<sglang_api_key>"

sys.path.insert(0, str(REPO / ".build" / "collections"))


def host_settings():
    """{host: (the role's settings for it, its node's arguments)}: role defaults, then the inventory's variables,
    templated as Ansible templates them (the vault decrypted); the node's arguments of a serving group's host."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import VaultSecret
    from ansible.template import Templar, trust_as_template
    from ansible.vars.manager import VariableManager
    from ansible_collections.gpufleet.inference.plugins.module_utils import _args, _groups
    from ansible_collections.gpufleet.inference.plugins.plugin_utils._serving import variables_of

    loader = DataLoader()
    loader.set_vault_secrets([("default", VaultSecret(VAULT_PASSWORD.read_bytes().strip()))])
    inventory = InventoryManager(loader=loader, sources=[str(INVENTORY)])
    variables = VariableManager(loader=loader, inventory=inventory)
    # a role's defaults are templates Ansible trusts, as it does when it loads the role
    defaults = dict((name, trust_as_template(value) if isinstance(value, str) else value)
                    for name, value in yaml.safe_load(DEFAULTS.read_text()).items())
    found, group_vars = {}, {}
    for host in sorted(inventory.get_hosts(), key=lambda h: h.name):
        merged = dict(defaults, **variables.get_vars(host=host))
        templar = Templar(loader=loader, variables=merged)
        found[host.name] = dict((name, templar.template(merged[name])) for name in _args.SETTINGS)
        group_vars[host.name] = variables_of(dict((name, templar.template(merged[name])) for name in merged
                                                  if name.startswith("sglang_") or name == "group_names"), host.name)
    groups = _groups.serving_groups(group_vars)
    return dict((host, (settings, _groups.node_args(groups, host))) for host, settings in found.items())


def renders():
    """{relative path: text} of every golden file."""
    from ansible_collections.gpufleet.inference.plugins.module_utils import _args

    files = {}
    for host, (settings, node) in host_settings().items():
        key = settings.get("sglang_api_key") or ""
        paths = _args.unit_paths(settings)
        for version in VERSIONS:
            base = "%s/%s/" % (host, version)
            files[base + Path(paths["unit"]).name] = _args.render_unit(settings, version, MANAGED, node)
            files[base + Path(paths["journald"]).name] = _args.render_journald(settings, MANAGED)
            config = _args.config_file(settings)
            if config:
                text = _args.config_file_text(settings)
                files[base + Path(config["path"]).name] = text.replace(key, KEY_SHOWN_AS) if key else text
    return files


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the golden files")
    args = parser.parse_args(argv)
    wanted = renders()
    present = set(str(p.relative_to(GOLDEN)) for p in GOLDEN.glob("*/*/*") if p.is_file())
    if args.write:
        for stale in present - set(wanted):
            (GOLDEN / stale).unlink()
        for name, text in wanted.items():
            path = GOLDEN / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        print("golden: wrote %d files under %s" % (len(wanted), GOLDEN.relative_to(REPO)))
        return 0
    problems = []
    for name in sorted(set(wanted) | present):
        path = GOLDEN / name
        if name not in wanted:
            problems.append("%s: committed, but the role renders no such file" % name)
        elif not path.is_file():
            problems.append("%s: the role renders it, no golden file" % name)
        elif path.read_text() != wanted[name]:
            diff = "".join(difflib.unified_diff(path.read_text().splitlines(True), wanted[name].splitlines(True),
                                                "golden/" + name, "rendered/" + name))
            problems.append(diff)
    if problems:
        print("\n".join(problems))
        print("golden: %d file(s) differ from what the role renders; `make golden` rewrites them" % len(problems))
        return 1
    print("golden: %d files as the role renders them" % len(wanted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
