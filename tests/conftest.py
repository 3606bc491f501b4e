"""Shared test settings: caches under build/ so compiled graphs and tiny assets are reused."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / "build" / "inductor-cache"))
os.environ.setdefault("SPECDRAFT_CACHE", str(ROOT / "build" / "cache"))
# No model hub: every model and tokenizer in the tests is built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
