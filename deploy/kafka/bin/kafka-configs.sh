#!/usr/bin/env bash
# Kafka's kafka-configs.sh, run from the jars asynctier's set-up fetched.
exec "$(dirname "${BASH_SOURCE[0]}")/kafka-run-class.sh" kafka.admin.ConfigCommand "$@"
