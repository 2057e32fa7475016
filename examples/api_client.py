"""A script on bastion's HTTP API through the typed client: start a conversation, chat, rate the reply.

`python examples/api_client.py http://127.0.0.1:8000 "$(bastion token ada)"` against `bastion serve`;
the tests run `main` against the assistant.
"""

from __future__ import annotations

import asyncio
import sys

from bastion.client import BastionApiError, BastionClient, user_message


async def main(base_url: str, token: str) -> str:
    async with BastionClient(base_url, token=token) as client:
        conversation = await client.create_conversation(title="From a script")
        reply = ""
        async for chunk in client.chat(conversation.id, [user_message("who am I?")]):
            if chunk["type"] == "text-delta":
                reply += chunk["delta"]
        messages = await client.list_messages(conversation.id)
        await client.add_feedback(conversation.id, messages.messages[-1]["id"], "up")
        await client.delete_conversation(conversation.id)
        try:
            await client.get_conversation(conversation.id)
        except BastionApiError as error:  # gone: 404 with the stable code `not_found`
            reply += f" [{error.status} {error.code}]"
        return reply


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1], sys.argv[2])))
