#!/usr/bin/env bash
# The system packages the lab and the controller venv need, installed when missing.
#
# Used by make (lab-up, demo, bench, test, test-integration, molecule, docs) and by .ci/run.
# Installs nothing, and asks apt nothing, when everything is present; says what it installs;
# without root it names the packages and the command to run, and fails.
set -euo pipefail

missing=()
command -v systemd-nspawn >/dev/null 2>&1 || missing+=(systemd-container)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if ! command -v ssh >/dev/null 2>&1 || ! command -v ssh-keygen >/dev/null 2>&1; then
  missing+=(openssh-client)
fi
command -v make >/dev/null 2>&1 || missing+=(make)
# Debian splits venv/ensurepip off python3; `python3 -m venv` fails without them.
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
# The docs layer opens the built docs site in headless Chromium (tests/docs).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "system-deps: missing system packages ${missing[*]}; run as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: missing system packages ${missing[*]} and no apt-get here; install their equivalents" >&2
  exit 1
fi
echo "system-deps: installing ${missing[*]} (apt-get)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
echo "system-deps: installed ${missing[*]}"
