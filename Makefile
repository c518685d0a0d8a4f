# gpufleet.inference — one Makefile for the lab, the demo and every test layer.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV      ?= .venv
PY        := $(VENV)/bin/python
BIN       := $(VENV)/bin
HOSTS     ?= 3
COLL_DIR  := .build/collections
COLL_LINK := $(COLL_DIR)/ansible_collections/gpufleet/inference
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/$(COLL_DIR)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help venv system-deps link lab-up lab-down lab-status demo demo-multinode test test-unit test-functional sanity lint \
        test-integration molecule build ee docs verdict-examples golden test-docs bench clean

help:
	@echo "make demo             bring up the lab ($(HOSTS) hosts) and run the main job on it"
	@echo "make demo-multinode   the lab as 2 serving groups of 2 nodes and 2 single hosts, rolled with groups counted as one"
	@echo "make test             every test layer (unit, functional, docs, sanity, lint, core-range, integration, molecule, lab-cycle, conformance)"
	@echo "make venv | lab-up HOSTS=n | lab-down | lab-status | build | ee | docs | verdict-examples | golden | bench"
	@echo "make test-unit | test-functional | test-docs | sanity | lint | test-integration | molecule"

# The development toolchain (tests/requirements.txt); the collection's own run-time needs are in
# meta/ee-requirements.txt. The stamp follows the pins: a changed pin reinstalls.
$(VENV)/.installed: tests/requirements.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r tests/requirements.txt
	touch $@

venv: $(VENV)/.installed

# Installs the missing system packages (as root; names them), nothing when all are present.
system-deps:
	@tests/lab/system_deps.sh

$(COLL_LINK):
	mkdir -p $(dir $@)
	ln -sfn $(CURDIR) $@

link: $(COLL_LINK)

lab-up: system-deps venv link
	$(PY) tests/lab/lab.py up --hosts $(HOSTS)$(if $(filter 1,$(ROUTER)), --router)

lab-down:
	python3 tests/lab/lab.py down

lab-status:
	python3 tests/lab/lab.py status

# The main job on the lab: a canary rollout through a real sglang-router, verified per host.
demo: ROUTER := 1
demo: lab-up
	$(BIN)/ansible-playbook -i inventories/lab/hosts.yml playbooks/rollout.yml

# A mixed fleet: 2 multi-node serving groups (2 hosts each, one SGLang server per group) and 2 single-node hosts behind
# a real sglang-router. The fleet is brought to the lab's settings at once, then a change (draft window 4096) is rolled
# in batches of [1, 2] servers with half of them kept serving: the canary is a group, and each group is one member of
# its batch and one server of the capacity guard (docs: multi-node serving groups).
demo-multinode: system-deps venv link
	$(PY) tests/lab/lab.py up --hosts 6 --router --groups 2x2
	$(BIN)/ansible-playbook -i $${LAB_INVENTORY:-inventories/lab/hosts.yml} playbooks/rollout.yml \
	  -e '{"rollout_batches": ["100%"]}'
	$(BIN)/ansible-playbook -i $${LAB_INVENTORY:-inventories/lab/hosts.yml} playbooks/rollout.yml \
	  -e '{"sglang_speculative_draft_window_size": 4096, "rollout_batches": [1, 2], "rollout_min_healthy": "50%"}'

build: venv
	rm -rf .build/dist && mkdir -p .build/dist
	$(BIN)/ansible-galaxy collection build --output-path .build/dist .

# The docs site (antsibull-docs + Sphinx) in .build/docs/html, after regenerating the guide's generated
# parts (variables tables, verdict examples) from the files that hold them.
docs: venv link
	$(PY) docs/tools/generate.py
	$(PY) docs/tools/build_site.py

# Merge the verdict messages the lab tests captured (.build/results/verdict-examples) into
# docs/verdict-examples.json and the troubleshooting page.
verdict-examples: venv
	$(PY) docs/tools/generate.py --take-captured

# The golden renders (tests/golden/): every example host's unit, journald drop-in and config file as the role
# renders them; a unit test fails when they differ.
golden: venv link
	$(PY) tests/golden/render.py --write

test-docs: system-deps venv link
	$(PY) tests/run_layers.py docs

# The build context of an execution environment that runs the collection (execution-environment.yml);
# build it with `podman build -t gpufleet-inference-ee .build/ee` where a container engine exists.
ee: build
	rm -rf .build/ee
	$(BIN)/ansible-builder create -f execution-environment.yml -c .build/ee

test: system-deps venv link
	$(PY) tests/run_layers.py all

test-unit: venv link
	$(PY) tests/run_layers.py unit

test-functional: venv link
	$(PY) tests/run_layers.py functional

sanity: venv link
	$(PY) tests/run_layers.py sanity

lint: venv link
	$(PY) tests/run_layers.py lint

test-integration: system-deps venv link
	$(PY) tests/run_layers.py integration

molecule: system-deps venv link
	$(PY) tests/run_layers.py molecule

# Every benchmark (tests/benchmarks/run_all.py) on a lab of its own (gpfbench, 127.0.8), taken down
# after; writes tests/benchmarks/RESULTS.md. BENCH_ARGS: e.g. --parts P1,P3 or --quick.
bench: system-deps venv link
	BENCH_COMMAND="make bench$(if $(BENCH_ARGS), BENCH_ARGS='$(BENCH_ARGS)')" \
	  $(PY) tests/benchmarks/run_all.py $(BENCH_ARGS)

clean:
	rm -rf .build tests/output .pytest_cache
