"""The layer runner fails a layer that failed OR ran no test, and counts from junit XML."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("run_layers", REPO / "tests" / "run_layers.py")
run_layers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_layers)


def test_a_layer_that_ran_no_test_is_not_ok():
    assert not run_layers.Outcome("unit").ok
    assert not run_layers.Outcome("unit", passed=0, skipped=4).ok
    assert not run_layers.Outcome("unit", passed=3, failed=1).ok
    assert run_layers.Outcome("unit", passed=3, skipped=1).ok


def test_junit_counts(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite tests="7" failures="1" errors="1" skipped="2"/></testsuites>')
    assert run_layers.junit_counts(xml) == (3, 2, 2)
    assert run_layers.junit_counts(tmp_path / "missing.xml") == (0, 0, 0)


def test_every_place_that_lists_the_layers_lists_all_of_them():
    layers = list(run_layers.LAYERS)
    readme = (REPO / "README.md").read_text()
    quick = next(line for line in readme.splitlines() if line.startswith("make test "))
    table = [line.split("|")[1].strip() for line in readme.split("## Test layers", 1)[1].splitlines()
             if line.startswith("| ") and not line.startswith("| layer")]
    makefile = (REPO / "Makefile").read_text()
    help_line = next(line for line in makefile.splitlines() if '"make test ' in line)
    usage = run_layers.__doc__.split("\n\n")[1]
    for name in layers:
        assert name in quick, f"README's quick start omits {name}"
        assert name in help_line, f"make help omits {name}"
        assert name in usage, f"run_layers.py's usage omits {name}"
    assert table == layers, f"README's table of layers: {table}, run_layers: {layers}"


def test_core_range_takes_every_final_release_inside_the_claim():
    available = ["2.20.0", "2.19.14", "2.19.10", "2.19.2", "2.19.1rc1", "2.19.0", "2.19.0rc2", "2.18.9"]
    assert run_layers.releases_in(">=2.19.0,<2.20.0", available) == ["2.19.0", "2.19.2", "2.19.10", "2.19.14"]
    assert run_layers.releases_in(">=2.19.2", available) == ["2.19.2", "2.19.10", "2.19.14", "2.20.0"]


def test_core_range_runs_every_unit_test_file_that_imports_ansible_core():
    chosen = run_layers.core_dependent_unit_tests()
    assert "tests/unit/plugins/action" in chosen and "tests/unit/plugins/modules" in chosen
    assert "tests/unit/plugins/module_utils/test_sweep.py" in chosen  # imports ansible itself
    assert "tests/unit/plugins/module_utils/test_judge.py" not in chosen  # pure module_utils


def test_main_rejects_unknown_layers(capsys):
    assert run_layers.main(["nope"]) == 2
    assert "unknown layer" in capsys.readouterr().out


def test_every_integration_test_file_runs_in_exactly_one_shard_and_the_groups_tests_on_their_lab():
    shards = run_layers.integration_shards()
    files = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tests" / "integration").glob("test_*.py"))
    ran = sorted(shards["a"] + shards["b"] + [run_layers.GROUPS_TESTS])
    assert ran == files
    assert not set(shards["a"]) & set(shards["b"]) and shards["a"] and shards["b"]
    labs = [run_layers.INTEGRATION_LABS["a"], run_layers.INTEGRATION_LABS["b"], run_layers.GROUPS_LAB]
    assert len({lab["LAB_NAME"] for lab in labs}) == 3 and len({lab["LAB_NET"] for lab in labs}) == 3
    ci = (REPO / ".ci" / "run").read_text()
    for lab in labs + [run_layers.MOLECULE_LAB]:  # CI's cleanup knows every lab make test brings up
        assert f"{lab['LAB_NAME']}:{lab['LAB_NET']}" in ci, lab


def test_a_command_is_streamed_and_its_exit_code_returned(capsys):
    rc, out = run_layers.stream(["sh", "-c", "echo one; echo two >&2; exit 3"], prefix="[x] ")
    assert rc == 3 and out == "one\ntwo\n"
    assert "[x] one\n[x] two\n" in capsys.readouterr().out


def test_a_command_past_its_timeout_is_killed_with_what_it_started():
    rc, out = run_layers.stream(["sh", "-c", "echo started; sleep 60 & sleep 60"], timeout=1)
    assert rc == -9 and out == "started\n"


def test_a_process_left_holding_the_output_is_named_and_killed_and_the_run_goes_on(capsys):
    # setsid: out of the command's process group, as a daemonizing child would be; it still holds stdout
    rc, out = run_layers.stream(["sh", "-c", "setsid sleep 61 & echo done"], linger=0.5)
    printed = capsys.readouterr().out
    assert rc == 0 and out == "done\n"
    assert "still hold its output: pid" in printed and "sleep 61" in printed
    assert not run_layers.pipe_holders(0)
