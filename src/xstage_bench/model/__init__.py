"""The Burst-Gap model: its laws (laws.py) and the fit of T0, R, Q to raw records (fit.py)."""
