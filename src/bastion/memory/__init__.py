"""Memory for agents in Postgres with pgvector, under the same row-level security as conversations.

- `PostgresMemoryStore`: core memory, archival memories (deduplicated, with history), tenant
  knowledge and exact top-k recall stored per operation; `documents` is the versioned document store.
- `define_memory`: per turn, recall as a context message, `remember`/`forget` tools, extraction
  (a durable job per chat turn once started on the durable engine; `failed_extractions` lists those
  that gave up).
- Embedders: the `Embedder` protocol, `OpenAIEmbedder` (any OpenAI-compatible endpoint),
  `HashingEmbedder` (lexical, offline), and `OfflineEmbedder` (the `memory-offline` extra).

Memory needs Postgres: the SQLite store does not support it (`MemoryNotSupportedError`).
"""

from bastion.memory.chunking import chunk_text
from bastion.memory.documents import PostgresMemoryDocuments
from bastion.memory.embedders import Embedder, EmbeddingError, HashingEmbedder, OpenAIEmbedder
from bastion.memory.entities import (
    KnowledgeChunk,
    KnowledgeDocument,
    MemoryDocument,
    MemoryItem,
    MemoryVersion,
    Recall,
    RecalledMemory,
    RememberOutcome,
    RememberResult,
)
from bastion.memory.errors import (
    MemoryDocumentConflictError,
    MemoryNotSupportedError,
    MemoryUnavailableError,
)
from bastion.memory.extraction import Extractor
from bastion.memory.extraction_jobs import ExtractionJob, FailedExtraction, failed_extractions
from bastion.memory.offline import OfflineEmbedder, offline_embedder_available
from bastion.memory.postgres import (
    DEFAULT_NEAR_DUPLICATE_THRESHOLD,
    DEFAULT_OPERATION_TTL,
    PostgresMemoryStore,
    apply_memory_migrations,
)
from bastion.memory.provider import AgentMemory, define_memory, render_recall
from bastion.memory.routes import memory_routes

__all__ = [
    "DEFAULT_NEAR_DUPLICATE_THRESHOLD",
    "DEFAULT_OPERATION_TTL",
    "AgentMemory",
    "Embedder",
    "EmbeddingError",
    "ExtractionJob",
    "Extractor",
    "FailedExtraction",
    "HashingEmbedder",
    "KnowledgeChunk",
    "KnowledgeDocument",
    "MemoryDocument",
    "MemoryDocumentConflictError",
    "MemoryItem",
    "MemoryNotSupportedError",
    "MemoryUnavailableError",
    "MemoryVersion",
    "OfflineEmbedder",
    "OpenAIEmbedder",
    "PostgresMemoryDocuments",
    "PostgresMemoryStore",
    "Recall",
    "RecalledMemory",
    "RememberOutcome",
    "RememberResult",
    "apply_memory_migrations",
    "chunk_text",
    "define_memory",
    "failed_extractions",
    "memory_routes",
    "offline_embedder_available",
    "render_recall",
]
