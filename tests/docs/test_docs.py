"""The docs as a reader meets them: the site `make docs` builds, opened in headless Chromium (its index and
the page of sglang_ready render with real content), and the lints that keep docs and changelog well-formed
(antsibull-docs lint-collection-docs, antsibull-changelog lint)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RESULTS = REPO / ".build" / "results"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def tool_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    # This checkout's collection only: pytest-ansible puts <repo>/collections in front of the path.
    env["ANSIBLE_COLLECTIONS_PATH"] = str(REPO / ".build" / "collections")
    return env


# ------------------------------------------------------------------ lints

def test_antsibull_docs_lint_finds_nothing_in_the_plugins_role_and_guide():
    proc = subprocess.run([str(BIN / "antsibull-docs"), "lint-collection-docs", "--plugin-docs", "."],
                          cwd=REPO / ".build" / "collections" / "ansible_collections" / "gpufleet" / "inference",
                          env=tool_env(), capture_output=True, text=True, timeout=600, check=False)
    problems = [line for line in proc.stdout.splitlines() if re.match(r"\S+:\d+:\d+: ", line)]
    assert proc.returncode == 0 and not problems, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_antsibull_changelog_lint_accepts_the_fragments_and_the_changelog():
    for argv in (["lint"], ["lint-changelog-yaml", "changelogs/changelog.yaml"]):
        proc = subprocess.run([str(BIN / "antsibull-changelog"), *argv], cwd=REPO, env=tool_env(),
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0 and not proc.stdout.strip(), (argv, proc.stdout, proc.stderr)


def test_the_released_changelog_is_what_antsibull_changelog_generates(tmp_path):
    copy = tmp_path / "ansible_collections" / "gpufleet" / "inference"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".build", ".venv", ".git", "tests", "results"))
    proc = subprocess.run([str(BIN / "antsibull-changelog"), "generate"], cwd=copy, env=tool_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (copy / "CHANGELOG.rst").read_text() == (REPO / "CHANGELOG.rst").read_text()
    assert "v0.1.0\n======" in (REPO / "CHANGELOG.rst").read_text()


# ------------------------------------------------------------------ the site in a browser

class _Text(HTMLParser):
    """The visible text of an HTML document (no script or style)."""

    def __init__(self):
        super().__init__()
        self.parts, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style") and self._skip > 0

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def visible_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    return " ".join(" ".join(parser.parts).split())


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    dest = tmp_path_factory.mktemp("docs")
    proc = subprocess.run([sys.executable, str(REPO / "docs" / "tools" / "build_site.py"), "--dest", str(dest)],
                          cwd=REPO, env=tool_env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return dest / "html"


@pytest.fixture(scope="module")
def chromium():
    exe = shutil.which("chromium")
    assert exe, "chromium is not installed: tests/lab/system_deps.sh installs it (make system-deps)"
    return exe


def browse(chromium: str, url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    profile.mkdir()
    return subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url],
                          capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)


def rendered(chromium, page: Path, profile: Path) -> str:
    proc = browse(chromium, page.as_uri(), profile, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_the_index_renders_with_the_guide_and_the_collection(site, chromium, tmp_path):
    dom = rendered(chromium, site / "index.html", tmp_path / "profile")
    text = visible_text(dom)
    assert "Roll SGLang inference servers across GPU fleets" in text, text[:2000]
    for entry in ("Install", "Troubleshooting by verdict", "Variables", "The verification contract", "Canary analysis",
                  "Multi-node serving groups", "Running from AWX"):  # every page of extra-docs.yml, by its title
        assert entry in text, (entry, text[:3000])
    assert 'href="collections/gpufleet/inference/index.html"' in dom, dom[:3000]
    RESULTS.mkdir(parents=True, exist_ok=True)
    shot = RESULTS / "docs-index.png"
    shot.unlink(missing_ok=True)
    proc = browse(chromium, (site / "index.html").as_uri(), tmp_path / "shot-profile",
                  f"--screenshot={shot}", "--window-size=1280,1000", "--hide-scrollbars")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000, shot.stat().st_size


def test_the_page_of_sglang_ready_renders_its_parameters_and_return_values(site, chromium, tmp_path):
    page = site / "collections" / "gpufleet" / "inference" / "sglang_ready_module.html"
    text = visible_text(rendered(chromium, page, tmp_path / "profile"))
    assert "gpufleet.inference.sglang_ready module" in text, text[:2000]
    assert "Wait until the new process of an SGLang systemd unit serves the intended settings" in text
    for heading in ("Parameters", "Return Values", "Examples"):
        assert heading in text, heading
    assert "after_invocation" in text and "accept_unverified" in text and "verdict" in text


def test_the_troubleshooting_page_renders_a_section_per_verdict(site, chromium, tmp_path):
    page = site / "collections" / "gpufleet" / "inference" / "docsite" / "troubleshooting.html"
    text = visible_text(rendered(chromium, page, tmp_path / "profile"))
    for verdict in ("mismatch", "crash_loop", "unverified", "drifted", "in_sync", "not_installed"):
        assert verdict in text, verdict
    assert text.count("What it means.") >= 20, text.count("What it means.")
    assert "Example (captured on the lab by tests/integration/test_ready_faults.py::" in text, text[:3000]


def test_the_content_check_fails_on_a_page_without_the_content(chromium, tmp_path):
    """What the checks above read is what the browser rendered: an empty page has none of it."""
    page = tmp_path / "empty.html"
    page.write_text("<html><head><title>gpufleet</title></head><body><script>var x = 'Parameters';</script></body></html>")
    text = visible_text(rendered(chromium, page, tmp_path / "profile"))
    assert "Parameters" not in text and "gpufleet.inference.sglang_ready module" not in text
