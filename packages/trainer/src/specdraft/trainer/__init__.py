"""specdraft trainer: data, draft models, backends, training loop, disaggregated runtime."""

__version__ = "0.1.0"
