"""Offline feature shards: prepare once with the target, train without it."""
