"""Depth-attention heatmap of a prompt, from a running AttnRes Serve (docs/ATTNRES.md §5): asks
/v1/completions for the prompt's depth-attention weights with the official `openai` package
(the request field `return_depth_attention`) and draws them as a PNG with matplotlib: one row
per mixing sublayer (layer 0 attention at the top, ... "final" for models with a final mix),
one column per source (the embedding, then the bank entries; a row's partial, its running sum
or the block being summed, is the column right after its last bank entry), colour = the
weight averaged over the prompt's tokens, blank where a sublayer has no such source. It is the
paper's Figure 7 picture for any prompt.

    pip install openai matplotlib
    attnres serve --model DIR          # an AttnRes model (plain models have no depth attention)
    python3 clients/python/depth_heatmap.py --url http://127.0.0.1:8000 \
        --prompt "Attention residuals let each layer" --out depth.png

--url may end in /v1 or not. --model defaults to the first model the server lists; --api-key
(or $ATTNRES_API_KEY) is needed only when the server was started with --api-key. --json FILE
also saves the response's depth_attention object.
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from openai import OpenAI  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("ATTNRES_URL", "http://127.0.0.1:8000"),
                        help="the server (default: $ATTNRES_URL, else http://127.0.0.1:8000)")
    parser.add_argument("--api-key", default=os.environ.get("ATTNRES_API_KEY", "unused"))
    parser.add_argument("--model", help="the model name (default: the server's first model)")
    parser.add_argument("--prompt", default="Attention residuals let each layer choose")
    parser.add_argument("--out", default="depth_attention.png", help="the PNG to write")
    parser.add_argument("--json", help="also write the depth_attention object to this file")
    return parser.parse_args()


def fetch_depth_attention(client: OpenAI, model: str, prompt: str) -> dict:
    """The prompt's depth_attention object: sublayers, sources, prompt_mean (null = unused)."""
    response = client.completions.create(
        model=model, prompt=prompt, max_tokens=1, temperature=0,
        extra_body={"return_depth_attention": True})
    choice = response.choices[0]
    depth = getattr(choice, "depth_attention", None)
    if depth is None and choice.model_extra:
        depth = choice.model_extra.get("depth_attention")
    if depth is None:
        sys.exit("the server returned no depth_attention: is it AttnRes Serve?")
    return depth


def draw(depth: dict, prompt: str, model: str, out: str) -> None:
    weights = np.array([[np.nan if v is None else v for v in row] for row in depth["prompt_mean"]],
                       dtype=float)
    rows, cols = weights.shape
    fig, ax = plt.subplots(figsize=(2.5 + 0.9 * cols, 1.5 + 0.32 * rows))
    image = ax.imshow(np.ma.masked_invalid(weights), cmap="viridis", vmin=0.0,
                      vmax=float(np.nanmax(weights)), aspect="auto", interpolation="nearest")
    ax.set_xticks(range(cols))
    ax.set_xticklabels(depth["sources"], rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(rows))
    ax.set_yticklabels(depth["sublayers"], fontsize=8)
    ax.set_xlabel("source (a row's partial: the column after its last bank entry)")
    ax.set_ylabel("sublayer")
    shown = prompt if len(prompt) <= 60 else prompt[:57] + "..."
    ax.set_title(f"depth attention of {model}\naveraged over the prompt {shown!r}", fontsize=9)
    fig.colorbar(image, ax=ax, label="weight (softmax over sources)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    base = args.url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    client = OpenAI(base_url=base, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    depth = fetch_depth_attention(client, model, args.prompt)
    draw(depth, args.prompt, model, args.out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(depth, f)
    rows, cols = len(depth["sublayers"]), len(depth["sources"])
    print(f"wrote {args.out}: {rows} sublayers x {cols} sources")


if __name__ == "__main__":
    main()
