"""``python -m asynctier`` is the ``asynctier`` command."""

from asynctier.cli import main

main()
