# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build the collection's docs site into .build/docs/html (`make docs`).

antsibull-docs' own Sphinx site (what `antsibull-docs sphinx-init` sets up): `antsibull-docs collection`
renders every plugin's and the role's documentation plus the guide (docs/docsite, its extra docs) as
reStructuredText, and Sphinx builds it with the Ansible theme. Warnings are errors, except references to
docs.ansible.com pages (intersphinx would resolve them, and this machine has no network).

    python docs/tools/build_site.py [--dest DIR]

Needs the checkout linked at .build/collections (make link); antsibull-docs runs ansible-doc from the venv.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

CONF = '''# Written by docs/tools/build_site.py (antsibull-docs sphinx-init's conf.py, without intersphinx).
project = "gpufleet.inference"
copyright = "gpufleet maintainers, GPL-3.0-or-later"
title = "gpufleet.inference"
html_short_title = "gpufleet.inference"
html_title = "gpufleet.inference documentation"
extensions = ["sphinx.ext.autodoc", "sphinx_antsibull_ext"]
pygments_style = "ansible"
highlight_language = "YAML+Jinja"
html_theme = "sphinx_ansible_theme"
html_show_sphinx = False
display_version = False
html_use_smartypants = True
html_use_modindex = False
html_use_index = False
html_copy_source = False
default_role = "any"
nitpicky = True
# Labels of docs.ansible.com (common_return_values, action_plugins, ansible.builtin's modules): resolved
# by intersphinx on a networked build; here they would be the only warnings.
suppress_warnings = ["ref.ref"]
'''

# The front page: the collection (its guide, then its plugins and role) and the indexes.
INDEX = '''.. _docsite_root_index:

gpufleet.inference
==================

Roll SGLang inference servers across GPU fleets as systemd units, and prove that every restart took
effect. Start with the guide's :ref:`install page <ansible_collections.gpufleet.inference.docsite.install>`;
when a run fails, :ref:`troubleshooting by verdict <ansible_collections.gpufleet.inference.docsite.troubleshooting>`
says what its verdict means and what to do.

The guide:

{guide}

.. toctree::
   :maxdepth: 2
   :caption: Collection

   collections/gpufleet/inference/index

.. toctree::
   :maxdepth: 1
   :caption: Plugin indexes
   :glob:

   collections/index_*

.. toctree::
   :maxdepth: 1
   :caption: Reference indexes

   collections/index
   collections/environment_variables
'''

ANTSIBULL_CFG = '''breadcrumbs = true
indexes = true
use_html_blobs = false
add_antsibull_docs_version = false
collection_url = {
  * = "https://github.com/gpufleet/inference"
}
collection_install = {
  * = "ansible-galaxy collection install {namespace}.{name}"
}
'''


def guide_list():
    """The front page's list of the guide: every page of extra-docs.yml, in its order, by its own title."""
    pages = yaml.safe_load((REPO / "docs" / "docsite" / "extra-docs.yml").read_text())["sections"][0]["toctree"]
    lines = []
    for page in pages:
        text = (REPO / "docs" / "docsite" / "rst" / ("%s.rst" % page)).read_text().splitlines()
        title = next(line for line, under in zip(text, text[1:]) if line.strip() and set(under) == {"="})
        target = "ansible_collections.gpufleet.inference.docsite.%s" % page
        lines.append("- :ref:`%s <%s>`" % (title.replace("`", ""), target))
    return "\n".join(lines)


def run(argv, **kwargs):
    print("+ " + " ".join(str(a) for a in argv), flush=True)
    subprocess.run([str(a) for a in argv], check=True, **kwargs)


def build(dest: Path) -> Path:
    env = dict(os.environ)
    env["PATH"] = "%s:%s" % (BIN, env.get("PATH", ""))
    # This checkout's collection (make link), whatever else is on the path: another copy would be documented.
    env["ANSIBLE_COLLECTIONS_PATH"] = str(REPO / ".build" / "collections")
    if dest.exists():
        shutil.rmtree(dest)
    src = dest / "src"
    rst = src / "rst"
    rst.mkdir(parents=True)
    os.chmod(rst, 0o755)  # antsibull-docs wants the directory writable by itself only
    (src / "conf.py").write_text(CONF)
    (src / "antsibull-docs.cfg").write_text(ANTSIBULL_CFG)
    run([BIN / "antsibull-docs", "--config-file", src / "antsibull-docs.cfg", "collection", "--use-current",
         "--cleanup", "everything", "--dest-dir", rst, "gpufleet.inference"], env=env)
    (rst / "index.rst").write_text(INDEX.replace("{guide}", guide_list()))
    # antsibull-docs copies the guide's pages, not the images they show
    images = REPO / "docs" / "docsite" / "rst" / "images"
    if images.is_dir():
        shutil.copytree(images, rst / "collections" / "gpufleet" / "inference" / "docsite" / "images")
    run([BIN / "sphinx-build", "-b", "html", "-c", src, "-W", "--keep-going", "-q", rst, dest / "html"], env=env)
    index = dest / "html" / "index.html"
    if not index.is_file():
        raise SystemExit("no %s after the build" % index)
    return index


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=REPO / ".build" / "docs")
    args = parser.parse_args(argv)
    print("built %s" % build(args.dest))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
