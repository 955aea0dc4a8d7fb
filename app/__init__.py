"""Envelope: admission rules that keep resource envelopes and quota trees consistent."""

__version__ = "0.1.0"
