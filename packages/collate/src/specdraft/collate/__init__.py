"""specdraft collate: static pad lengths, collators, samplers, padding accounting."""

__version__ = "0.1.0"
