"""`python -m podium.cli`: the podium command."""

import sys

from podium.cli.main import main

sys.exit(main())
