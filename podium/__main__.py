"""`python -m podium`: the podium command."""

import sys

from podium.cli import main

sys.exit(main())
