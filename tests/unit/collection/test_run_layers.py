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


def test_main_rejects_unknown_layers(capsys):
    assert run_layers.main(["nope"]) == 2
    assert "unknown layer" in capsys.readouterr().out
