"""kohakuclip: fast random-access video clips and images for deep-learning training."""

__version__ = "0.1.0"
