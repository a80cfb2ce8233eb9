"""Functions the scheduler tests bind to (allowed with ``--allow-module tests.funcs``)."""
