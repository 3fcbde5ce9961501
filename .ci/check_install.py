"""After a plain `pip install .`: the distribution adds exactly one top-level import name, `podium`,
and its packages import from site-packages (not from the checkout)."""

import importlib
import importlib.metadata
import os
import sys

dist = importlib.metadata.distribution("podium")
tops = sorted({f.parts[0] for f in dist.files or [] if f.suffix == ".py" and not f.parts[0].endswith(".dist-info")})
if tops != ["podium"]:
    sys.exit(f"the podium distribution installs top-level names {tops}, expected only ['podium']")
os.chdir("/")  # away from the checkout, whose folders would otherwise shadow the install
for name in ("podium.cli", "podium.flows.pipeline", "podium.tasks.promote", "podium.training.loop",
             "podium.deployments.definitions"):
    module = importlib.import_module(name)
    if "site-packages" not in (module.__file__ or ""):
        sys.exit(f"{name} imported from {module.__file__}, not from site-packages")
print(f"plain install: top-level names {tops}; packages import from site-packages")
