# The commands a newcomer types: `make demo` and `make test`. Each does its own set-up
# (scripts/setup.sh: apt packages when missing, .venv, pip install, Kafka's jars).
SHELL := /bin/bash
VENV := .venv
ARGS ?=

.PHONY: setup demo test lint bench bench-queue

setup:
	scripts/setup.sh

demo: setup
	$(VENV)/bin/asynctier demo

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# pytest's exit code 5 ("no tests collected") is a failure like any other.
test: lint
	@rc=0; $(VENV)/bin/pytest -q -n 2 --dist loadfile --durations=15 || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; \
	exit $$rc

bench:
	ASYNCTIER_EXTRAS=dev,bench scripts/setup.sh
	ASYNCTIER_VENV=.venv-peers ASYNCTIER_EXTRAS=kafka-peers scripts/setup.sh
	$(VENV)/bin/python bench/run.py $(ARGS)
	$(VENV)/bin/python -m bench.urgency --out bench/RESULTS.md

bench-queue:
	ASYNCTIER_EXTRAS=dev,bench scripts/setup.sh
	$(VENV)/bin/python bench/queue_drain.py $(ARGS)
