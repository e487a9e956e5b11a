"""``python -m cuvil``: the same as the ``cuvil`` command."""

from .cli import main

main(prog_name="cuvil")
