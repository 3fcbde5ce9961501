"""`podium make-data`: write the deterministic synthetic demo dataset.

Imports inside functions are on purpose (start-up): a command loads only the libraries it uses; each is listed with
its measured cost in tests/unit/test_layers.py.
"""

from __future__ import annotations

import argparse

from podium.cli.options import at_least, whole_number
from podium.settings import PodiumSettings


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add this command's parser and handler."""
    make = sub.add_parser("make-data", help="Write the synthetic demo dataset (Parquet).")
    make.add_argument("--out", help="Output folder or URI (default: .podium/data).")
    make.add_argument("--train-rows", type=at_least(1), default=24000, help="Training rows (default: 24000).")
    make.add_argument("--val-rows", type=at_least(1), default=6000, help="Validation rows (default: 6000).")
    make.add_argument("--features", type=at_least(1), default=16, help="Feature columns (default: 16).")
    make.add_argument("--classes", type=at_least(2), default=4, help="Classes (default: 4).")
    make.add_argument("--seed", type=whole_number, default=0, help="Random seed.")
    make.set_defaults(func=cmd_make_data)


def cmd_make_data(args: argparse.Namespace) -> int:
    """Write the deterministic synthetic dataset."""
    from podium.storage.preflight import check_folder, check_location
    from podium.training.data import make_classification_data

    # a file in the way, or a path no folder can be made at: one sentence, exit 2 (podium.cli.errors)
    out = check_location(check_folder(args.out or str(PodiumSettings().home_dir / "data"), "--out"), write=True)
    train, val = make_classification_data(out, train_rows=args.train_rows, val_rows=args.val_rows,
                                          num_features=args.features, num_classes=args.classes, seed=args.seed)
    print(f"wrote {train}\nwrote {val}")
    return 0
