"""Model classes named by import path (`promotion.model_class`) in the unit tests."""

from torch import nn


class Net(nn.Module):
    """Builds with no arguments: 3 features, 2 classes."""

    def __init__(self, features: int = 3, classes: int = 2):
        super().__init__()
        self.linear = nn.Linear(features, classes)

    def forward(self, x):
        return self.linear(x)


class Wider(Net):
    """The same keys as Net, of other shapes."""

    def __init__(self):
        super().__init__(features=5)


class NeedsArguments(nn.Module):
    """Cannot be built with no arguments."""

    def __init__(self, features: int):
        super().__init__()
        self.linear = nn.Linear(features, 2)


class NotAModule:
    """Not a torch module."""
