#!/usr/bin/env bash
# Runs one of Kafka's command-line tools (a main class) from the jars asynctier's set-up
# fetched (`python -m asynctier.dev fetch`: ~/.cache/asynctier/kafka-<version>/libs), as
# Kafka's own bin/kafka-run-class.sh does. The kafka-*.sh beside it name the classes;
# `asynctier dev env` puts this folder on PATH.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(sed -n 's:.*<kafka\.version>\(.*\)</kafka\.version>.*:\1:p' "$here/../pom.xml")"
cache="${ASYNCTIER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/asynctier}"
libs="$cache/kafka-$version/libs"
if [ ! -d "$libs" ]; then
  echo "$(basename "$0"): Kafka $version's jars are not in $libs: run scripts/setup.sh" \
       "(or python -m asynctier.dev fetch)" >&2
  exit 1
fi
java="${JAVA:-java}"
# The tools log warnings and errors to stderr only (a short JVM: C1 and a small heap).
exec "$java" -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
  -Dlog4j2.configurationFile="$here/tools-log4j2.properties" \
  -cp "$libs/*" "$@"
