"""Test data and helpers shared by unit and end-to-end tests."""

from typing import Any

from ctxclient import Client

# OpenAI's worked example ("How to count tokens with tiktoken"): the chat API itself
# reported 129 prompt tokens for these messages on gpt-3.5-turbo-0613 and gpt-4-0613.
OPENAI_EXAMPLE = [
    {"role": "system", "content": "You are a helpful, pattern-following assistant that "
     "translates corporate jargon into plain English."},
    {"role": "system", "name": "example_user",
     "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant",
     "content": "Things working well together will increase revenue."},
    {"role": "system", "name": "example_user",
     "content": "Let's circle back when we have more bandwidth to touch base on opportunities "
     "for increased leverage."},
    {"role": "system", "name": "example_assistant",
     "content": "Let's talk later when we're less busy about how to do better."},
    {"role": "user", "content": "This late pivot means we don't have time to boil the ocean "
     "for the client deliverable."},
]
OPENAI_EXAMPLE_PROMPT_TOKENS = 129


def hello_text(tokens: int) -> str:
    """A text of exactly ``tokens`` cl100k_base tokens ("hello hello …")."""
    return "hello" + " hello" * (tokens - 1)


def next_event(client: Client, timeout: float = 10) -> dict[str, Any]:
    """The next `event` notification a subscribed client receives."""
    message = client.notifications.get(timeout=timeout)
    assert message["method"] == "event"
    return message["params"]  # type: ignore[no-any-return]
