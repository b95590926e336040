"""How much a GAD drafter accepts when it reads only the last W output tokens.

For each window, simulates greedy GAD on held-out sources against the verifier's own greedy
outputs (the drafter proposes k tokens after target[:p]; the verifier accepts the common
prefix plus its own next token) and prints tokens per iteration ("Tok."). A drafter's cost
per call is O((W + k)^2) in attention and O(W + k) elsewhere, where reading the whole output
costs O((p + k)^2) at output position p: this shows what a window gives up for that bound.
Windows other than the one a drafter was trained with are out of its training distribution
(0 = the whole output).

    python benchmarks/drafter_window.py MODEL_DIR DRAFTER_DIR --sources FILE [--windows 0 8 16 32]
        [--limit 300] [--work DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from aggdec.export import train_drafter as td
from aggdec.export.drafter import Drafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="the verifier checkpoint")
    parser.add_argument("drafter", help="a directory written by `aggdec train-drafter`")
    parser.add_argument("--sources", required=True, help="held-out sources, one per line")
    parser.add_argument("--windows", type=int, nargs="+", default=[0, 8, 16, 32])
    parser.add_argument("--limit", type=int, default=300, help="sources used (the first N)")
    parser.add_argument("--work", default="drafter-window-work", help="where the greedy outputs are cached")
    args = parser.parse_args()

    torch.set_num_threads(max(1, torch.get_num_threads()))
    sources = td._read_sources(Path(args.sources))[: args.limit]
    model, tokenizer = td._load_verifier(Path(args.model), torch.device("cpu"))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    targets = td._distill(model, tokenizer, sources, Path(args.model), work / td.DISTILL_FILE, 256,
                          torch.device("cpu"), progress=True)
    trained = Drafter.load(args.drafter)
    rows = []
    for window in args.windows:
        drafter = Drafter(dataclasses.replace(trained.config, window=window))
        drafter.load_state_dict(trained.state_dict())
        drafter.eval()
        layout = td._layout(model, tokenizer, drafter)
        examples = [ex for ex in td._examples(tokenizer, sources, targets, layout, drafter.config.max_positions,
                                              td._position_limit(model)) if td._trainable(ex, layout)]
        result = td._evaluate(drafter, model, examples, layout, torch.device("cpu"))
        rows.append({"window": window, "trained_window": trained.config.window, **result})
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
