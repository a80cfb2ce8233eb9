#!/usr/bin/env bash
# Idempotent set-up of a machine for asynctier (Debian / Ubuntu):
#   1. apt-get install what is missing: redis-server, postgresql (its server binaries, 15+),
#      prometheus, maven, chromium and chromium-driver (the console's browser test),
#      a Java 17+ runtime (when not root it prints the exact command
#      and stops);
#   2. a virtual environment in .venv with asynctier installed in editable mode;
#   3. Kafka's jars (with its command-line tools) and Apicurio Registry fetched by Maven,
#      and helm and kubecheck (the chart's tests) and Jaeger (the traces' tests) built by
#      Go from the Go module proxy, into ~/.cache/asynctier (once: minutes on a new
#      machine; Jaeger alone about seven on two cores).
# Environment: PYTHON (default python3, 3.11+), ASYNCTIER_EXTRAS (default "dev"),
# ASYNCTIER_VENV (default .venv; `make bench` puts its Kafka-native peers in .venv-peers).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
EXTRAS=${ASYNCTIER_EXTRAS:-dev}
VENV=${ASYNCTIER_VENV:-.venv}

say() { printf 'setup: %s\n' "$*" >&2; }

java_major() {
  # Prints the major version of `java` on PATH (0 when there is none).
  command -v java >/dev/null 2>&1 || { echo 0; return; }
  java -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\).*/\1/p' | head -n1
}

postgres_found() {
  # True when PostgreSQL 15+ server binaries are there (Debian keeps them off PATH).
  local bin version
  for bin in /usr/lib/postgresql/*/bin/postgres; do
    version=$(basename "$(dirname "$(dirname "$bin")")")
    [ -x "$bin" ] && [ "$version" -ge 15 ] 2>/dev/null && return 0
  done
  command -v postgres >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1
}

missing_packages() {
  local pkgs=()
  command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
  postgres_found || pkgs+=(postgresql)
  command -v prometheus >/dev/null 2>&1 || pkgs+=(prometheus)
  command -v mvn >/dev/null 2>&1 || pkgs+=(maven)
  [ "$(java_major)" -ge 17 ] || pkgs+=(openjdk-17-jre-headless)
  command -v make >/dev/null 2>&1 || pkgs+=(make)
  command -v go >/dev/null 2>&1 || pkgs+=(golang-go)
  # the console's browser test drives Debian's chromium through its chromedriver
  command -v chromium >/dev/null 2>&1 || pkgs+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || pkgs+=(chromium-driver)
  if ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then pkgs+=(python3-venv); fi
  echo "${pkgs[@]:-}"
}

install_packages() {
  local pkgs
  read -r -a pkgs <<<"$(missing_packages)"
  [ "${#pkgs[@]}" -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    say "missing: ${pkgs[*]}. Install them as root, then run this again:"
    say "  sudo apt-get update && sudo apt-get install -y ${pkgs[*]}"
    exit 1
  fi
  say "installing ${pkgs[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  local i
  for i in "${!pkgs[@]}"; do  # no openjdk-17 on newer releases: take their default JRE
    if [ "${pkgs[$i]}" = openjdk-17-jre-headless ] &&
       ! apt-cache policy openjdk-17-jre-headless | grep -q 'Candidate: [0-9]'; then
      pkgs[$i]=default-jre-headless
    fi
  done
  apt-get install -y -q --no-install-recommends "${pkgs[@]}"
}

check_python() {
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    say "$PYTHON is older than 3.11: set PYTHON to a Python 3.11+ interpreter"; exit 1; }
}

install_venv() {
  [ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
  local stamp="$VENV/.asynctier-setup"
  local want
  want="$(cat pyproject.toml <(echo "$EXTRAS") <(pwd) | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
     "$VENV/bin/python" -c 'import asynctier' >/dev/null 2>&1; then
    return 0
  fi
  say "pip install -e .[$EXTRAS]"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]"
  echo "$want" >"$stamp"
}

if [ -x /usr/local/go/bin/go ]; then PATH="$PATH:/usr/local/go/bin"; fi  # where Go installs itself
install_packages
check_python
install_venv
"$VENV/bin/python" -m asynctier.dev fetch >&2
say "ready"
