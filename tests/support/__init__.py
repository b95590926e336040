"""Test-support helpers: tiny offline seq2seq checkpoints and pytest fixtures.

Nothing here downloads weights: every model is built from a config (random init) or trained
from scratch on CPU on a synthetic task.
"""
