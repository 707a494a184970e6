"""Text completions (/v1/completions) from AttnRes Serve with the official `openai` package:
the same request answered whole, then streamed, printing the text as it arrives.

    pip install openai
    attnres serve                      # HTTP on 127.0.0.1:8000 (the built-in demo model)
    python clients/python/openai_completions.py --url http://127.0.0.1:8000/v1 \
        --prompt "Attention residuals" --max-tokens 32

At --temperature 0 (the default here) both answers are the same text. --model defaults to
the first model the server lists (/v1/models); --api-key (or $ATTNRES_API_KEY) is needed only
when the server was started with --api-key.
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
    parser.add_argument("--prompt", default="Attention residuals let each layer")
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
    request = dict(model=model, prompt=args.prompt, max_tokens=args.max_tokens,
                   temperature=args.temperature)

    print("--- not streamed ---")
    completion = client.completions.create(**request)
    choice = completion.choices[0]
    print(choice.text)
    print(f"finish_reason: {choice.finish_reason}; {usage_line(completion.usage)}")

    print("--- streamed ---")
    # include_usage: a last chunk with no choices carries the usage (as OpenAI and vLLM send it).
    stream = client.completions.create(**request, stream=True,
                                       stream_options={"include_usage": True})
    finish_reason, usage = None, None
    for chunk in stream:
        for c in chunk.choices:
            sys.stdout.write(c.text)
            sys.stdout.flush()
            finish_reason = c.finish_reason or finish_reason
        usage = chunk.usage or usage
    print()
    print(f"finish_reason: {finish_reason}; {usage_line(usage)}")


if __name__ == "__main__":
    main()
