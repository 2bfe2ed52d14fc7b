"""``python -m cupyops.bench``: same as the ``cupyops-bench`` console script."""
import sys

from .cli import main

sys.exit(main())
