"""The trainer's one error: a bad option, checkpoint or progress value, naming what and why.

The trainer is installed into users' training images on its own, so it depends on nothing else
of qosflow; its messages have the same ``field: rule`` form as the rest of qosflow's.
"""

from __future__ import annotations


class TrainerError(ValueError):
    """An invalid trainer option, checkpoint file or progress value.

    Attributes:
        field: What is wrong (an option and its variable, a file, ``progress.done``).
        rule: The rule it broke, in words.
    """

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}" if field else rule)


def missing_torch(command: str) -> TrainerError:
    """The error for a PyTorch command run where PyTorch is not installed."""
    return TrainerError(
        "PyTorch",
        f"{command} needs it and it is not installed: pip install 'qosflow-trainer[torch]'",
    )
