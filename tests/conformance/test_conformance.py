"""Conformance: the project's args builder, validation, preflight and simulator against the real
SGLang 0.5.23 (its parser and settings resolution, run on the CPU; see README.md).

(a) every args list the builder makes over a matrix of settings passes the real parser and
    the real resolution; (b) the project's DFLASH rules agree with the real ones; (c) the
    simulator's flag table is the real parser's; (d) the DFLASH config line and the log prefix
    of the real source are the simulator's; (e) the preflight gives the same verdicts on real
    0.5.23 as on the simulator's 0.5.23 profile.
"""
import ast
import importlib.util
import json
import re
import warnings
from pathlib import Path

import pytest

import cases
from ansible_collections.gpufleet.inference.plugins.module_utils import _args

REAL_VERSION = cases.VERSION
MATRIX = cases.matrix()
RULES = cases.dflash_rules()
PREFLIGHT = cases.preflight_cases()
API_KEY_ARGS = _args.build_args(cases.api_key_settings(), REAL_VERSION)
BLOCK_ZERO_ARGS = cases.dflash_raw_args(True, 0, None)


def _all_args():
    return ([API_KEY_ARGS, BLOCK_ZERO_ARGS] + [args for case_id, algorithm, args in MATRIX]
            + [cases.dflash_raw_args(draft, block, window) for case_id, draft, block, window in RULES]
            + [args for case_id, args in PREFLIGHT])


@pytest.fixture(scope="session")
def runs(real, sim, models):
    """One worker per side: the flag table, the algorithm names, and a verdict per args list."""
    everything = [cases.substitute(args, models) for args in _all_args()]
    request = {"cases": everything, "flags": True, "api_key": [0, cases.API_KEY],
               "warm": [cases.substitute(args, models) for args in cases.warm_args()]}
    real_run = real.worker(dict(request, algorithms=[a for a in _args.ALGORITHMS if a != "none"]))
    sim_run = sim.worker(request)
    assert real_run["version"] == REAL_VERSION, real_run["version"]
    assert sim_run["version"] == REAL_VERSION, sim_run["version"]

    def by_args(run):
        return {json.dumps(args): result for args, result in zip(everything, run["checks"])}

    return {"real": real_run, "sim": sim_run, "real_checks": by_args(real_run),
            "sim_checks": by_args(sim_run)}


def verdict(runs, side, args, models):
    return runs[side + "_checks"][json.dumps(cases.substitute(args, models))]


def brief(result):
    return {k: result.get(k) for k in ("ok", "stage", "error")}


# ------------------------------------------------------------------ (a) the builder's args

@pytest.mark.parametrize("algorithm, args", [(algorithm, args) for case_id, algorithm, args in MATRIX],
                         ids=[case_id for case_id, algorithm, args in MATRIX])
def test_builder_args_pass_the_real_parser_and_resolution(runs, models, algorithm, args):
    known = runs["real"]["algorithms"]
    result = verdict(runs, "real", args, models)
    if algorithm == "none" or known[algorithm]:
        assert result["ok"], "real SGLang %s refuses %s: %s" % (REAL_VERSION, args, brief(result))
        assert "ServerArgs.resolve_once()" in result["checked"]
    else:
        # In _args.ALGORITHMS, unknown to every public release (custom builds): the host's own
        # parser is the judge, and the real one refuses it before anything starts.
        assert algorithm in _args.CUSTOM_BUILD_ALGORITHMS, (
            "%s is in _args.ALGORITHMS but real SGLang %s does not know it" % (algorithm, REAL_VERSION))
        assert not result["ok"] and result["stage"] in ("parse", "resolve"), brief(result)


def test_the_real_release_knows_every_public_algorithm_of_the_project(runs):
    known = runs["real"]["algorithms"]
    unknown = sorted(name for name, ok in known.items() if not ok)
    assert unknown == sorted(_args.CUSTOM_BUILD_ALGORITHMS)


@pytest.mark.parametrize("side", ["real", "sim"])
def test_the_api_key_reaches_sglang_through_the_projects_config_file(runs, models, side):
    """build_args + config_file_text (what the role installs) as SGLang's --config reads them."""
    assert cases.API_KEY not in " ".join(API_KEY_ARGS)
    assert API_KEY_ARGS[-2:] == ["--config", cases.CONFIG]
    result = verdict(runs, side, API_KEY_ARGS, models)
    assert cases.API_KEY not in json.dumps(result)
    config = Path(models[cases.CONFIG]).read_text()
    assert result["ok"], "%s refuses the project's config file %r: %s" % (
        runs[side]["version"], config.replace(cases.API_KEY, "<key>"), brief(result))
    assert runs[side]["api_key"] is True, "SGLang did not end with the key of the config file"


# ------------------------------------------------------------------ (b) the DFLASH rules

@pytest.mark.parametrize("draft, block, window", [row[1:] for row in RULES], ids=[row[0] for row in RULES])
def test_project_and_real_sglang_agree_on_the_dflash_rules(runs, models, draft, block, window):
    project = cases.project_accepts(draft, block, window)
    result = verdict(runs, "real", cases.dflash_raw_args(draft, block, window), models)
    if block is None and draft and project:
        # Without a block size SGLang takes the draft model's own (its config.json, else 16),
        # which the project cannot know before the host is reached: the preflight judges.
        inferred = cases.DRAFT_BLOCK_SIZE
        expected = window is None or window >= inferred
        assert result["ok"] == expected, brief(result)
        if not expected:
            assert result["error"] == ("--speculative-draft-window-size must be >= --speculative-num-draft-tokens"
                                       " (block_size). window_size=%s, block_size=%s." % (window, inferred))
        return
    assert result["ok"] == project, "project %s, real SGLang %s: %s" % (
        "accepts" if project else "refuses", "accepts" if result["ok"] else "refuses", brief(result))


def test_block_size_zero_project_is_stricter_than_real_resolution(runs, models):
    # Not a DFLASH rule of SGLang: 0.5.23's resolution takes block size 0 (a later stage would
    # fail on it). The project refuses every non-positive count before anything is rendered.
    assert not cases.project_accepts(True, 0, None)
    result = verdict(runs, "real", BLOCK_ZERO_ARGS, models)
    assert result["ok"], brief(result)


# ------------------------------------------------------------------ (c) the flag table

FLAG_FIELDS = ("flags", "dest", "default", "choices", "nargs", "type", "required")


def test_simulator_flag_table_is_the_real_parsers(runs):
    real = {tuple(a["flags"]): {k: a[k] for k in FLAG_FIELDS} for a in runs["real"]["flags"]}
    sim = {tuple(a["flags"]): {k: a[k] for k in FLAG_FIELDS} for a in runs["sim"]["flags"]}
    missing = sorted(set(real) - set(sim))
    extra = sorted(set(sim) - set(real))
    differ = {" ".join(flags): {k: (real[flags][k], sim[flags][k]) for k in FLAG_FIELDS
                                if real[flags][k] != sim[flags][k]}
              for flags in set(real) & set(sim) if real[flags] != sim[flags]}
    assert len(real) > 300  # the real parser was read, not an empty stand-in
    assert not (missing or extra or differ), (
        "simulator %s vs real parser: missing %s; extra %s; differing (real, sim) %s"
        % (REAL_VERSION, missing, extra, json.dumps(differ, indent=1, default=str)[:6000]))


# ------------------------------------------------------------------ (d) log formats from source

def _package_dir(side):
    proc = side.run(["-c", "import importlib.util, os; "
                           "print(os.path.dirname(importlib.util.find_spec('sglang').origin))"])
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip())


def _string_constants(root, prefix):
    found = {}
    for path in sorted(root.rglob("*.py")):
        try:
            with warnings.catch_warnings():  # invalid escapes in other people's sources
                warnings.simplefilter("ignore")
                tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(prefix):
                found.setdefault(node.value, []).append(str(path.relative_to(root)))
    return found


def test_dflash_config_line_format_is_the_real_one(real, sim):
    prefix = "Initialized DFLASH draft runner."
    real_formats = _string_constants(_package_dir(real), prefix)
    sim_formats = _string_constants(_package_dir(sim), prefix)
    assert real_formats, "no DFLASH config line in the real source"
    assert set(sim_formats) == set(real_formats), (real_formats, sim_formats)


def _real_rank_tags(root):
    """(tag, condition) in the order the real scheduler appends them to its log prefix."""
    source = (root / "srt" / "managers" / "scheduler.py").read_text()
    pattern = re.compile(r"if ([^\n:]+):\n\s+prefix \+= f\" ([A-Z_]+)\{")
    return [(tag, condition.strip()) for condition, tag in pattern.findall(source)]


def _load_sim_common(sim_root):
    spec = importlib.util.spec_from_file_location("sim_common", sim_root / "srt" / "utils" / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_log_prefix_rank_tags_are_the_real_ones(real, sim, monkeypatch):
    tags = _real_rank_tags(_package_dir(real))
    assert len(tags) >= 2, "no rank tags found in the real scheduler source: %s" % tags
    monkeypatch.delenv("SGLANG_DP_RANK", raising=False)
    common = _load_sim_common(_package_dir(sim))
    everything = {}
    for index, (tag, condition) in enumerate(tags, start=2):
        dim = tag.lower()
        if condition.endswith("is not None"):  # DP: shown whenever the scheduler has a DP rank
            everything["%s_rank" % dim] = index
            assert common.rank_prefix(**{"%s_rank" % dim: index}) == " %s%d" % (tag, index)
            assert common.rank_prefix() == ""
        else:
            assert re.fullmatch(r"parallel\.%s_size > 1" % dim, condition), condition
            everything.update({"%s_size" % dim: 2, "%s_rank" % dim: index})
            assert common.rank_prefix(**{"%s_size" % dim: 2, "%s_rank" % dim: index}) == " %s%d" % (tag, index)
            assert common.rank_prefix(**{"%s_size" % dim: 1, "%s_rank" % dim: index}) == ""
    expected = "".join(" %s%d" % (tag, index) for index, (tag, condition) in enumerate(tags, start=2))
    assert common.rank_prefix(**everything) == expected


def test_log_line_format_is_the_real_one(real, sim):
    source = (_package_dir(real) / "srt" / "utils" / "common.py").read_text()
    body = source[source.index("def configure_logger("):]
    body = body[:body.index("\ndef ", 1)]
    fmt = re.search(r'format = f"([^"]+)"', body).group(1)
    datefmt = re.search(r'datefmt="([^"]+)"', body).group(1)
    assert "{prefix}" in fmt and "{maybe_ms}" in fmt
    import logging
    import time

    common = _load_sim_common(_package_dir(sim))
    now = time.mktime((2026, 11, 30, 9, 58, 7, 0, 0, -1)) + 0.125  # exact in binary
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "Load weight begin.", None, None)
    record.created, record.msecs = now, 125.0
    for prefix in ("", " TP0", " DP1 TP7 EP3"):
        for ms in ("", ".%(msecs)03d"):
            real_line = logging.Formatter(fmt.replace("{maybe_ms}", ms).replace("{prefix}", prefix),
                                          datefmt=datefmt).format(record)
            env = {"SGLANG_LOG_MS": "1"} if ms else {}
            with pytest.MonkeyPatch.context() as patch:
                patch.delenv("SGLANG_LOG_MS", raising=False)
                for key, value in env.items():
                    patch.setenv(key, value)
                assert common.format_line("Load weight begin.", prefix, now) == real_line


# ------------------------------------------------------------------ (e) preflight verdicts

@pytest.mark.parametrize("args", [args for case_id, args in PREFLIGHT],
                         ids=[case_id for case_id, args in PREFLIGHT])
def test_preflight_gives_the_same_verdict_on_real_and_simulator(real, sim, runs, models, args):
    argv = cases.substitute(args, models)
    on_real, on_sim = real.preflight(argv), sim.preflight(argv)
    # The fresh process (as a module runs it) agrees with the batch run the other tests read.
    assert brief(on_real) == brief(verdict(runs, "real", args, models))
    assert brief(on_sim) == brief(on_real), "simulator %s vs real %s" % (REAL_VERSION, REAL_VERSION)
