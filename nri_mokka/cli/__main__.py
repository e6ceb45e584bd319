"""`python -m nri_mokka.cli`."""

from . import main

main()
