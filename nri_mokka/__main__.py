"""``python -m nri_mokka``: the NRI plugin (see ``nri_mokka.main``)."""

import sys

from nri_mokka.main import main

sys.exit(main())
