"""Embedders: the lexical hashing embedder, an OpenAI-compatible endpoint (a local fake of its HTTP
API), text chunking, and the real offline model when the `memory-offline` extra is installed."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx2
import pytest

from bastion.memory import Embedder, EmbeddingError, HashingEmbedder, OpenAIEmbedder, chunk_text
from bastion.memory.offline import OfflineEmbedder, offline_embedder_available


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


async def test_the_hashing_embedder_is_deterministic_unit_length_and_lexical() -> None:
    embedder = HashingEmbedder(128)
    [a, b, c] = await embedder.embed_documents(["My name is Ada", "my name is ada", "The launch is Friday"])
    assert a == b
    assert math.isclose(math.sqrt(sum(x * x for x in a)), 1.0)
    assert cosine(a, c) < 0.5
    assert isinstance(embedder, Embedder) and embedder.model == "bastion-hashing-128"


def fake_endpoint(answer: Any, seen: list[dict[str, Any]]) -> httpx2.AsyncClient:
    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(
            {
                "url": str(request.url),
                "auth": request.headers.get("authorization"),
                **json.loads(request.content),
            }
        )
        body = answer(json.loads(request.content)) if callable(answer) else answer
        return httpx2.Response(200, json=body)

    return httpx2.AsyncClient(transport=httpx2.MockTransport(handle))


async def test_the_openai_compatible_embedder_sends_prefixed_texts_and_normalizes_in_input_order() -> None:
    seen: list[dict[str, Any]] = []

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        rows = [
            {"index": i, "embedding": [3.0, 4.0] if i == 0 else [0.0, 2.0]} for i in range(len(body["input"]))
        ]
        return {"data": list(reversed(rows))}

    embedder = OpenAIEmbedder(
        model="e5",
        dimensions=2,
        base_url="http://embeddings.test/v1/",
        api_key="key",
        query_prefix="query: ",
        document_prefix="passage: ",
        http_client=fake_endpoint(answer, seen),
    )
    assert await embedder.embed_queries(["a", "b"]) == [[0.6, 0.8], [0.0, 1.0]]
    await embedder.embed_documents(["c"])
    assert seen[0]["url"] == "http://embeddings.test/v1/embeddings"
    assert seen[0]["auth"] == "Bearer key" and seen[0]["model"] == "e5"
    assert [s["input"] for s in seen] == [["query: a", "query: b"], ["passage: c"]]
    assert "dimensions" not in seen[0]


@pytest.mark.parametrize(
    "answer",
    [
        {"data": []},
        {"data": [{"index": 0, "embedding": [1.0]}]},
        {"data": [{"index": 0, "embedding": [0.0, 0.0]}]},
        {"data": [{"index": 0, "embedding": ["x", 1]}]},
        {"unexpected": True},
    ],
)
async def test_a_malformed_endpoint_answer_is_an_embedding_error(answer: dict[str, Any]) -> None:
    embedder = OpenAIEmbedder(model="m", dimensions=2, http_client=fake_endpoint(answer, []))
    with pytest.raises(EmbeddingError):
        await embedder.embed_queries(["a"])


async def test_an_unreachable_endpoint_is_an_embedding_error() -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("refused", request=request)

    client = httpx2.AsyncClient(transport=httpx2.MockTransport(refuse))
    embedder = OpenAIEmbedder(model="m", dimensions=2, http_client=client)
    with pytest.raises(EmbeddingError):
        await embedder.embed_documents(["a"])


def test_chunks_split_at_paragraphs_then_sentences_and_fit_the_limit() -> None:
    text = "First paragraph.\n\n" + " ".join(f"Sentence number {i} is here." for i in range(40))
    chunks = chunk_text(text, max_chars=200)
    assert chunks[0].startswith("First paragraph. Sentence number 0")
    assert all(len(chunk) <= 200 for chunk in chunks)
    assert " ".join(chunks).split() == text.split()
    assert chunk_text("x" * 450, max_chars=200) == ["x" * 200, "x" * 200, "x" * 50]


@pytest.mark.skipif(not offline_embedder_available(), reason="the memory-offline extra is not installed")
async def test_the_offline_model_ranks_the_related_memory_first_and_separates_paraphrases_from_facts() -> (
    None
):
    embedder = OfflineEmbedder()
    [query] = await embedder.embed_queries(["what is my name?"])
    name, launch, paraphrase = await embedder.embed_documents(
        ["My name is Ada.", "The launch is on Friday.", "I am called Ada."]
    )
    assert len(query) == embedder.dimensions == 384
    assert cosine(query, name) > cosine(query, launch)
    assert cosine(name, paraphrase) > cosine(name, launch)
