"""Baselines of the paper, each a small composition of the backbone (or, for the LSTM, its own cell)."""
