"""Budgeted mixed precision: the ``mixed`` format, groups of linears, the exact multiple-choice knapsack and
the one-process sensitivity scan it chooses from."""
from . import format  # noqa: F401  (registration)
