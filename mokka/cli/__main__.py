"""`python -m mokka.cli`."""

from . import main

main(prog_name="mokka")
