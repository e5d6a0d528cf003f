"""Stored weight forms, one folder each: the layout, how a weight is rounded into it and the formats that fill it.
Importing this package registers every built-in one."""
from . import microscaling  # noqa: F401  (registration)
