"""How long producing a prompt window takes (engine/prompts.py), per context (not a test).

Trains the preset's tokenizer (as `coldbench model create` does; no weights), then times, in
this process, the first window of each context (which tokenizes whatever part of the corpus it
reaches) and the later rounds' windows (the corpus already tokenized), and prints the corpus's
size in tokens with this tokenizer.

    python -m benchmarks.prompt_windows --preset tiny
    python -m benchmarks.prompt_windows --preset llama-8b-shape \\
        --contexts 4096,131072,262144 --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import time

from coldbench.engine import checkpoints
from coldbench.engine.prompts import PromptSource


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", help="whose tokenizer (no weights are made)")
    parser.add_argument("--contexts", default="262144,131072,4096")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    started = time.perf_counter()
    tokenizer = checkpoints.train_tokenizer(checkpoints.get_preset(args.preset).tokenizer_vocab)
    print(f"tokenizer of {args.preset}: trained in {time.perf_counter() - started:.2f} s")
    source = PromptSource.from_tokenizer(tokenizer)
    print(f"{'context':>10} {'first window s':>15} {'later windows s (median)':>25}")
    for context in contexts:
        times = []
        for round_index in range(args.rounds):
            started = time.perf_counter()
            prompt = source.prompt(args.seed, round_index, context)
            times.append(time.perf_counter() - started)
            assert len(prompt.ids) == context
        later = f"{statistics.median(times[1:]):.3f}" if len(times) > 1 else "-"
        print(f"{context:>10,} {times[0]:>15.3f} {later:>25}")
    pieces = source._pieces
    print(
        f"corpus tokenized so far: {pieces.encoded} of {len(pieces.texts)} pieces, "
        f"{pieces.tokens:,} tokens"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
