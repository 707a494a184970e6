"""Chat (/v1/chat/completions) with AttnRes Serve through the official `openai` package: a
system message and a user message, answered whole, then streamed as it is generated.

    pip install openai
    attnres serve                      # HTTP on 127.0.0.1:8000 (the built-in demo model)
    python clients/python/openai_chat.py --url http://127.0.0.1:8000/v1 \
        --system "You are terse." --message "What is a residual connection?"

The server renders the messages with the model's chat template. At --temperature 0 (the
default here) both answers are the same text. --model defaults to the first model the
server lists; --api-key (or $ATTNRES_API_KEY) only when the server has one.
"""

import argparse
import os
import sys

from openai import OpenAI


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url",
                        default=os.environ.get("ATTNRES_URL", "http://127.0.0.1:8000/v1"),
                        help="the server's OpenAI base URL (default: $ATTNRES_URL, else "
                             "http://127.0.0.1:8000/v1)")
    parser.add_argument("--api-key", default=os.environ.get("ATTNRES_API_KEY", "unused"))
    parser.add_argument("--model", help="the model name (default: the server's first model)")
    parser.add_argument("--system", default="You are a concise assistant.")
    parser.add_argument("--message", default="Explain attention residuals in one sentence.")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    return parser.parse_args()


def usage_line(usage) -> str:
    return (f"usage: prompt {usage.prompt_tokens}, completion {usage.completion_tokens}, "
            f"total {usage.total_tokens}")


def main() -> None:
    args = parse_args()
    client = OpenAI(base_url=args.url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    print(f"model: {model}")
    messages = [{"role": "system", "content": args.system},
                {"role": "user", "content": args.message}]
    request = dict(model=model, messages=messages, max_tokens=args.max_tokens,
                   temperature=args.temperature)

    print("--- not streamed ---")
    response = client.chat.completions.create(**request)
    choice = response.choices[0]
    print(f"{choice.message.role}: {choice.message.content}")
    print(f"finish_reason: {choice.finish_reason}; {usage_line(response.usage)}")

    print("--- streamed ---")
    stream = client.chat.completions.create(**request, stream=True,
                                            stream_options={"include_usage": True})
    finish_reason, usage, role = None, None, None
    for chunk in stream:
        for c in chunk.choices:
            if c.delta.role and role is None:  # the first chunk names the role
                role = c.delta.role
                sys.stdout.write(f"{role}: ")
            sys.stdout.write(c.delta.content or "")
            sys.stdout.flush()
            finish_reason = c.finish_reason or finish_reason
        usage = chunk.usage or usage
    print()
    print(f"finish_reason: {finish_reason}; {usage_line(usage)}")


if __name__ == "__main__":
    main()
