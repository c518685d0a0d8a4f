"""The example inventory (inventories/example, the guide's K2.6 fleet): its vault decrypts with the TEST
password kept for this test, ansible-inventory parses it, and every host's variables pass the role's
argument spec - and a wrong value or a wrong password is refused."""
import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
INVENTORY = REPO / "inventories" / "example"
PASSWORD = Path(__file__).parent / "data" / "example-vault-password"
VALIDATE = """
- name: Validate every host's variables against the role's argument spec
  hosts: gpu
  gather_facts: false
  tasks:
    - name: Check the variables of entry point main
      ansible.builtin.validate_argument_spec:
        argument_spec: "{{ (lookup('ansible.builtin.file', spec) | from_yaml).argument_specs.main.options }}"
      vars:
        spec: %s
""" % (REPO / "roles" / "sglang" / "meta" / "argument_specs.yml")


def run(argv, **kwargs):
    return subprocess.run([str(a) for a in argv], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False, stdin=subprocess.DEVNULL, **kwargs)


def test_the_vault_file_is_encrypted_and_names_no_key_in_clear():
    text = (INVENTORY / "group_vars" / "gpu" / "vault.yml").read_text()
    assert text.startswith("$ANSIBLE_VAULT;1.1;AES256\n")
    assert "vault_sglang_api_key" not in text


def test_the_inventory_parses_with_the_vault_decrypted():
    proc = run([BIN / "ansible-inventory", "-i", INVENTORY, "--vault-password-file", PASSWORD, "--list"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["gpu"]["children"] == ["k26_dflash", "k26_dflash_canary", "k26_2node"]
    assert len(data["k26_dflash"]["hosts"]) == 4 and data["k26_dflash_canary"]["hosts"] == ["gpu-b01.example.internal"]
    assert data["k26_2node"]["hosts"] == ["gpu-c01.example.internal", "gpu-c02.example.internal"]
    follower = data["_meta"]["hostvars"]["gpu-c02.example.internal"]
    assert follower["sglang_node_rank"] == 1 and follower["sglang_tp_size"] == 16
    assert follower["sglang_serving_groups"] == ["k26_2node"]
    canary = data["_meta"]["hostvars"]["gpu-b01.example.internal"]
    fleet = data["_meta"]["hostvars"]["gpu-a01.example.internal"]
    assert canary["sglang_speculative_draft_window_size"] == 4096 and fleet["sglang_speculative_draft_window_size"] == 2048
    assert canary["sglang_router_url"] == "http://router.example.internal:30080"
    assert canary["vault_sglang_api_key"].startswith("example-key-")  # decrypted (a test value, not printed)


def test_the_inventory_refuses_a_wrong_vault_password(tmp_path):
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    proc = run([BIN / "ansible-inventory", "-i", INVENTORY, "--vault-password-file", wrong, "--list"])
    assert proc.returncode != 0 or "Decryption failed" in proc.stderr, proc.stdout[:500]


def validate(tmp_path, *extra):
    playbook = tmp_path / "validate.yml"
    playbook.write_text(VALIDATE)
    return run([BIN / "ansible-playbook", "-i", INVENTORY, "--vault-password-file", PASSWORD, playbook, *extra])


def test_every_host_of_the_example_passes_the_role_argument_spec(tmp_path):
    proc = validate(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    recap = [line for line in proc.stdout.splitlines() if "ok=1" in line and "failed=0" in line]
    assert len(recap) == 7, proc.stdout[-2000:]  # 5 single-node hosts and the 2 nodes of k26_2node


def test_a_wrong_value_fails_the_argument_spec(tmp_path):
    proc = validate(tmp_path, "-e", json.dumps({"sglang_tp_size": "eight"}))
    assert proc.returncode != 0
    assert "sglang_tp_size" in proc.stdout and "int" in proc.stdout, proc.stdout[-2000:]


def test_the_example_and_the_guide_show_the_same_groups():
    hosts = yaml.safe_load((INVENTORY / "hosts.yml").read_text())
    guide = (REPO / "docs" / "docsite" / "rst" / "inventory.rst").read_text()
    for group, spec in hosts["all"]["children"]["gpu"]["children"].items():
        assert f"{group}:" in guide
        for host in spec["hosts"]:
            assert host in guide, host
