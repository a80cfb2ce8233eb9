#!/usr/bin/env bash
# Kafka's kafka-reassign-partitions.sh, run from the jars asynctier's set-up fetched.
exec "$(dirname "${BASH_SOURCE[0]}")/kafka-run-class.sh" org.apache.kafka.tools.reassign.ReassignPartitionsCommand "$@"
