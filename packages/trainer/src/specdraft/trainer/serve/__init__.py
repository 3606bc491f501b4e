"""Drafts served by a real engine: vLLM in a child process (its own venv), driven from here."""
