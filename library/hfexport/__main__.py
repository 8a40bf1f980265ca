"""`python -m hfexport ARGS`: the same command line as the `hfexport` console script."""

import sys

from hfexport.surfaces.cli import main

sys.exit(main())
