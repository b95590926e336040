"""Two decoding set-ups against each other on the same sentences, in one process, alternating
sentence by sentence (or chunk by chunk when batched) so machine drift hits both alike: what an
option, a tuning field or another bundle costs or gains, and whether the outputs are the same.

    python benchmarks/ab.py BUNDLE [--set KEY=VALUE ...] --a KEY=VALUE ... --b KEY=VALUE ...
                            [--limit 300] [--threads 1] [--batch-size 1] [--data uagec-test]

A side is ``--set`` (both sides) overridden by its own ``--a``/``--b`` settings. A KEY is

- a :class:`DecodeOptions` field: ``mode`` (default greedy), ``beta``, ``tau``, ``draft_k``,
  or ``block.FIELD`` for IAD's BlockOptions (``block.max_block=4``, ``block.adaptive=false``);
- a :class:`Tuning` field (``gad_decay``, ``min_repeat``, ``length_classes=32,64``, ...), on
  top of the device's profile;
- ``bundle=DIR`` (default: BUNDLE), ``int8_drafter=false`` (the float drafter on the CPU) or
  ``static_shapes=true`` (one verifier shape per batch, decision 034).

Values: integers, numbers, true/false, none, and comma lists for tuples (empty: ``()``).
Each side has a Generator of its own (its own measured costs and acceptance priors).

The scripts this replaces, as settings (``OFF=1000000000``, a repeat no output reaches):

    GAD decay 0.8 against 0.5:       --set mode=gad --a gad_decay=0.8 --b gad_decay=0.5
    repetition drafts off / on:      --set mode=iad --a min_repeat=OFF           (and mode=gad)
    fixed against shared prior:      --set mode=iad --a shared_prior=false
    two bundles, several modes:      --modes greedy iad gad --a bundle=A --b bundle=B
    the float against the int8 drafter: --set mode=gad --a int8_drafter=false

Run it in both orders (A and B swapped) for an effect of a few percent: an A/A run (one bundle
in two folders, batch 1) measured side B 0.972x and 0.985x side A's time on the shared 2-core
machine (``results/int8-fewer-nodes-cpu/``), a bias of the setup, not of either side. A/A runs
there (``aa-build-order.txt``) pinned it on the order the sides are built and warmed up: B
built and warmed last 0.960, A built and warmed last 1.043, A built first but warmed last
1.011 (decision 042). The two orders' B/A figures bracket the effect.

Prints each side's summed decode time, tokens per verifier call, B's time over A's overall and on
outputs over 64 and 128 tokens, and B's outputs against A's. Two sides on the same bundle in
exact modes must give the same outputs; on different bundles each exact side is checked
against its own bundle's greedy (decoded once, untimed). Exit status 1 if an exact side differs
(a bug: drafts, tuning and options of exact modes change speed, never an output).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from alternate import alternate

CHUNK = 64  # sentences per alternation when batched
GENERATOR_KEYS = ("bundle", "int8_drafter", "static_shapes")


def parse_value(text: str, like: Any) -> Any:
    """``text`` as a value of the type of ``like`` (a field's default; None: guessed)."""
    lowered = text.strip().lower()
    if lowered in ("none", "null"):
        return None
    if isinstance(like, bool) or lowered in ("true", "false"):
        if lowered not in ("true", "false"):
            raise ValueError(f"expected true or false, got {text!r}")
        return lowered == "true"
    if isinstance(like, tuple):
        return tuple(int(part) for part in text.split(",") if part.strip()) if text.strip() not in ("", "()") else ()
    if isinstance(like, int):
        return int(text)
    if isinstance(like, float):
        return float(text)
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def side_settings(pairs: list[str]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"ab.py: expected KEY=VALUE, got {pair!r}")
        settings[key.strip()] = value
    return settings


@dataclasses.dataclass
class SideSetup:
    """What one side decodes with."""

    generator_args: dict[str, Any]
    option_fields: dict[str, Any]  # DecodeOptions fields (a block as BlockOptions)
    tuning_fields: dict[str, Any]


def build_side(settings: dict[str, str], default_bundle: str, modes_given: bool = False) -> SideSetup:
    from aggdec.runtime.decoding.sizing import BlockOptions
    from aggdec.runtime.options import DecodeOptions
    from aggdec.runtime.tuning import Tuning

    tuning_defaults = {f.name: f.default for f in dataclasses.fields(Tuning)}
    block_defaults = {f.name: f.default for f in dataclasses.fields(BlockOptions)}
    option_names = {f.name for f in dataclasses.fields(DecodeOptions)} - {"block"}
    generator_args: dict[str, Any] = {"bundle": default_bundle}
    option_fields: dict[str, Any] = {}
    block_fields: dict[str, Any] = {}
    tuning_fields: dict[str, Any] = {}
    for key, text in settings.items():
        if key in GENERATOR_KEYS:
            generator_args[key] = text if key == "bundle" else parse_value(text, True)
        elif key in option_names:
            option_fields[key] = text if key == "mode" else parse_value(text, None)
        elif key.startswith("block.") and key[6:] in block_defaults:
            block_fields[key[6:]] = parse_value(text, block_defaults[key[6:]])
        elif key in tuning_defaults:
            tuning_fields[key] = parse_value(text, tuning_defaults[key])
        else:
            raise SystemExit(f"ab.py: unknown key {key!r}; keys: {', '.join(sorted(option_names))}, block.FIELD "
                             f"({', '.join(block_defaults)}), {', '.join(tuning_defaults)}, "
                             f"{', '.join(GENERATOR_KEYS)}")
    if block_fields:
        option_fields["block"] = BlockOptions(**block_fields)
    if not modes_given:
        DecodeOptions(**option_fields)  # a bad option is refused here, before anything is loaded
    elif "mode" in option_fields:
        raise SystemExit("ab.py: give --modes or mode=, not both")
    return SideSetup(generator_args, option_fields, tuning_fields)


def describe(options: Any) -> str:
    """The options' mode and the fields that are set, as KEY=VALUE."""
    return " ".join([options.mode.value] + [f"{f.name}={getattr(options, f.name)}" for f in dataclasses.fields(options)
                                            if f.name != "mode" and getattr(options, f.name) is not None])


def exact(options: Any) -> bool:
    """Whether the options promise greedy's output token for token."""
    return options.mode.value != "gad++" or options.beta == 1


def for_mode(fields: dict[str, Any], mode: str | None) -> Any:
    """DecodeOptions of ``fields`` in ``mode`` (None: the fields' own mode), keeping the fields
    that apply to it."""
    from aggdec.runtime.options import APPLIES_TO, DecodeOptions, Mode

    if mode is None:
        return DecodeOptions(**fields)
    kept = {name: value for name, value in fields.items() if name in APPLIES_TO and Mode.parse(mode) in APPLIES_TO[name]}
    return DecodeOptions(mode, **kept)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", metavar="BUNDLE")
    parser.add_argument("--set", dest="both", nargs="+", default=[], metavar="KEY=VALUE", help="both sides")
    parser.add_argument("--a", nargs="+", default=[], metavar="KEY=VALUE", help="side A")
    parser.add_argument("--b", nargs="+", default=[], metavar="KEY=VALUE", help="side B")
    parser.add_argument("--modes", nargs="+", metavar="MODE",
                        help="run each side in each of these modes (in place of its mode setting), all alternated")
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--data", default="uagec-test", help="uagec-test, or a file of sources, one per line")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.limit < 1:
        parser.error("--batch-size and --limit must be at least 1")

    from aggdec import Generator
    from aggdec.runtime.tuning import tuning_for
    from aggdec.sentences import load_examples

    both = side_settings(args.both)
    setups = {name: build_side({**both, **side_settings(pairs)}, args.bundle, bool(args.modes))
              for name, pairs in (("A", args.a), ("B", args.b))}
    generators = {}
    for name, setup in setups.items():
        generator_args = dict(setup.generator_args)
        generators[name] = Generator(generator_args.pop("bundle"), threads=args.threads,
                                     tuning=tuning_for("cpu").replace(**setup.tuning_fields), **generator_args)
    modes = args.modes or [None]
    # (side, mode) -> the options it decodes with, resolved against its bundle
    options = {(name, mode): generators[name].resolve_options(for_mode(setup.option_fields, mode))
               for name, setup in setups.items() for mode in modes}
    sources = [example.source for example in load_examples(args.data, limit=args.limit)]
    for (name, _), chosen in options.items():  # arenas, kernel choice and first calls out of the timings
        generators[name].warm_up(chosen, batch_size=args.batch_size)
    if args.batch_size == 1:
        units = sources
        sides = {key: (lambda source, g=generators[key[0]], o=chosen: g.generate([source], o)[0])
                 for key, chosen in options.items()}
    else:
        size = max(CHUNK, args.batch_size)
        units = [sources[i : i + size] for i in range(0, len(sources), size)]
        sides = {key: (lambda texts, g=generators[key[0]], o=chosen: g.generate(texts, o, batch_size=args.batch_size))
                 for key, chosen in options.items()}
    done = alternate(sides, units)

    n, failed = len(sources), False
    print(f"{n} sentences of {args.data}, batch {args.batch_size}, CPU, {args.threads} thread(s)")
    for name, setup in setups.items():
        print(f"  {name}: {setup.generator_args['bundle']} ({generators[name].drafter_graph or 'no drafter'}), "
              f"tuning {setup.tuning_fields or 'default'}")
    one_bundle = (Path(setups["A"].generator_args["bundle"]).resolve()
                  == Path(setups["B"].generator_args["bundle"]).resolve())
    greedy: dict[str, list] = {}  # each side's own greedy, decoded once (untimed) when needed
    for mode in modes:
        a, b = done["A", mode], done["B", mode]
        for name, side in (("A", a), ("B", b)):
            print(f"    {name} {describe(options[name, mode])}: {side.total:.2f} s, "
                  f"{side.tokens_per_call():.2f} tokens/call")
        print(f"  B/A time {b.total / a.total:.3f}")
        for over in (64, 128) if args.batch_size == 1 else ():  # a batched side's time is per chunk
            long = [i for i, ids in enumerate(a.outputs) if len(ids) > over]
            if not long:
                continue
            ta, tb = (sum(side.seconds[i] for i in long) for side in (a, b))
            print(f"    {len(long)} outputs over {over} tokens: B/A {tb / max(ta, 1e-9):.3f} "
                  f"(A {ta:.2f} s, B {tb:.2f} s)")
        same = sum(x == y for x, y in zip(a.outputs, b.outputs))
        print(f"    B = A outputs: {same}/{n}")
        if one_bundle and exact(options["A", mode]) and exact(options["B", mode]):
            failed |= same != n
            continue
        for name in setups:
            if not exact(options[name, mode]):
                continue
            if name not in greedy:
                greedy[name] = [r.ids for r in generators[name].generate(sources, batch_size=max(args.batch_size, 8))]
            own = sum(x == y for x, y in zip(done[name, mode].outputs, greedy[name]))
            print(f"    {name} = its own greedy: {own}/{n}")
            failed |= own != n
    return 1 if failed else 0

if __name__ == "__main__":
    from aggdec.runtime.errors import AggdecError

    try:
        sys.exit(main())
    except AggdecError as exc:  # a bad setting or bundle: one line, as the CLI says it
        sys.exit(f"ab.py: error: {exc}")
