"""One strategy interface (base.py) and one file per algorithm."""
