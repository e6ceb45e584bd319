"""`python -m mokka.cli`."""

from . import main

main()
