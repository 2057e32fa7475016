"""Embedders: the small protocol memory needs, an OpenAI-compatible endpoint, and a lexical hashing one.

An embedder names its `model`; every stored vector carries that name and recall compares only vectors
of the same model, so switching models never mixes incompatible spaces (re-embed to migrate).
Queries and documents are embedded separately because retrieval models (E5, say) prefix them
differently. The offline neural embedder lives in `bastion.memory.offline` (an optional extra).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Sequence
from typing import Any, Final, Protocol, runtime_checkable

import httpx2

__all__ = ["Embedder", "EmbeddingError", "HashingEmbedder", "OpenAIEmbedder"]

_WORD: Final = re.compile(r"\w+", re.UNICODE)


@runtime_checkable
class Embedder(Protocol):
    """Turns text into unit vectors of `dimensions` floats; `model` is recorded with each vector."""

    @property
    def model(self) -> str: ...

    @property
    def dimensions(self) -> int: ...

    async def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors for search queries (a new user message)."""
        ...

    async def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors for stored text (memories, knowledge chunks)."""
        ...


class EmbeddingError(RuntimeError):
    """The embedder could not embed the text (endpoint unreachable, bad answer); details in the log."""

    code = "embedding_failed"


class HashingEmbedder:
    """Feature hashing of words and word pairs into signed buckets: deterministic, offline, no weights.

    Lexical, not semantic: texts sharing words are close, paraphrases are not. It suits tests, demos
    and exact-duplicate detection; use a neural embedder for recall by meaning.
    """

    def __init__(self, dimensions: int = 256) -> None:
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 8 <= dimensions <= 4096:
            raise ValueError("dimensions must be a whole number from 8 to 4096.")
        self._dimensions = dimensions

    @property
    def model(self) -> str:
        return f"bastion-hashing-{self._dimensions}"

    @property
    def dimensions(self) -> int:
        return self._dimensions

    async def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.vector(text) for text in texts]

    async def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.vector(text) for text in texts]

    def vector(self, text: str) -> list[float]:
        """The unit vector of one text (all zeros but one bucket for text without words)."""
        words = [word.casefold() for word in _WORD.findall(text)]
        features = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
        values = [0.0] * self._dimensions
        for feature in features or [""]:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "big") % self._dimensions
            values[bucket] += 1.0 if digest[4] & 1 else -1.0
        norm = math.sqrt(sum(value * value for value in values))
        if norm == 0.0:
            values[0] = 1.0
            return values
        return [value / norm for value in values]


class OpenAIEmbedder:
    """Any OpenAI-compatible `POST {base_url}/embeddings` endpoint (OpenAI, Azure, vLLM, Ollama, ...).

    `query_prefix` and `document_prefix` are prepended for models that expect them (`"query: "`
    and `"passage: "` for E5). Vectors are normalized to unit length, so cosine distance is exact.
    """

    def __init__(
        self,
        *,
        model: str,
        dimensions: int,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        request_dimensions: bool = False,
        query_prefix: str = "",
        document_prefix: str = "",
        timeout: float = 30.0,
        http_client: httpx2.AsyncClient | None = None,
    ) -> None:
        if not model:
            raise ValueError("An embedding model needs a name.")
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
            raise ValueError("dimensions must be a positive whole number.")
        self._model = model
        self._dimensions = dimensions
        self._url = base_url.rstrip("/") + "/embeddings"
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._request_dimensions = request_dimensions
        self._query_prefix = query_prefix
        self._document_prefix = document_prefix
        self._timeout = timeout
        self._client = http_client

    @property
    def model(self) -> str:
        return self._model

    @property
    def dimensions(self) -> int:
        return self._dimensions

    async def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return await self._embed([self._query_prefix + text for text in texts])

    async def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return await self._embed([self._document_prefix + text for text in texts])

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        body: dict[str, Any] = {"model": self._model, "input": texts, "encoding_format": "float"}
        if self._request_dimensions:
            body["dimensions"] = self._dimensions
        try:
            if self._client is not None:
                response = await self._client.post(self._url, json=body, headers=self._headers)
            else:
                async with httpx2.AsyncClient(timeout=self._timeout) as client:
                    response = await client.post(self._url, json=body, headers=self._headers)
            response.raise_for_status()
            payload = response.json()
        except (httpx2.HTTPError, ValueError) as error:
            raise EmbeddingError("The embeddings endpoint did not answer.") from error
        return self._vectors(payload, len(texts))

    def _vectors(self, payload: Any, expected: int) -> list[list[float]]:
        """The answer's vectors in input order, each checked and normalized."""
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list) or len(data) != expected:
            raise EmbeddingError("The embeddings endpoint answered with the wrong number of vectors.")
        ordered = sorted(data, key=lambda item: item.get("index", 0) if isinstance(item, dict) else 0)
        vectors = []
        for item in ordered:
            vector = item.get("embedding") if isinstance(item, dict) else None
            if (
                not isinstance(vector, list)
                or len(vector) != self._dimensions
                or not all(isinstance(value, int | float) and math.isfinite(value) for value in vector)
            ):
                raise EmbeddingError("The embeddings endpoint answered with a malformed vector.")
            vectors.append(unit(vector))
        return vectors


def unit(vector: Sequence[float]) -> list[float]:
    """`vector` scaled to length 1 (a zero vector is refused: it has no direction to compare)."""
    norm = math.sqrt(sum(float(value) * float(value) for value in vector))
    if norm == 0.0:
        raise EmbeddingError("The embedder produced a zero vector.")
    return [float(value) / norm for value in vector]
