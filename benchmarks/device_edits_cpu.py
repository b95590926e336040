"""What one cache edit costs through the device edit graphs (runtime/decoding/device_edits.py)
against numpy, both on the CPU, at the reference model's buffer shapes; and how many bytes each
edit moves on CUDA with and without them (counted from the shapes, not measured).

    python benchmarks/device_edits_cpu.py [--slots 32] [--repeats 200] [--out DIR]
        [--decode BUNDLE [--data examples/uagec_test_sample.tsv] [--batch-size 32] [--rounds 2]]

The graph side is the CUDA code path run on CPU onnxruntime values (cache.ORT_BUFFERS_ON_CPU):
its time here is onnxruntime's per-run overhead plus a CPU memcpy, which says what the path adds
on the host side per edit, NOT what it costs on a GPU (there the copies are device-to-device and
the baseline is the host round trip; benchmarks/gpu/check.sh's ``edits`` stage measures that).
A third side, ``host``, runs the edits CUDA buffers had before the graphs (the whole allocation
copied out, edited by numpy, copied back; cache.DEVICE_EDITS = "host") on CPU onnxruntime
values: the round trip's memory traffic without the PCIe. Sides alternate edit by edit (each
first in turn); medians are printed as a table and written to DIR/device-edits.json.
``--decode``: also greedy over the data at the batch size with each side's buffers, the sides
alternated (each first in turn, ``--rounds`` times): seconds, and whether the outputs agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from aggdec.runtime.decoding import cache
from aggdec.runtime.decoding.cache import KEYS_TRANSPOSED, SlotBuffers

# benchmarks/models/uagec: 2 decoder layers, 4 heads of 64, d_model 256, 256 positions (+2 slack)
SHAPE = dict(layers=2, heads=4, head_dim=64, d_model=256, max_target=258, max_source=256)


def make(side: str, slots: int) -> SlotBuffers:
    """numpy: the CPU's own buffers; graphs: CPU onnxruntime values edited by the edit graphs (the
    CUDA path); host: CPU onnxruntime values edited as CUDA's were before them (the whole
    allocation copied out, edited by numpy, copied back: the round trip without the PCIe)."""
    cache.ORT_BUFFERS_ON_CPU = side != "numpy"
    cache.DEVICE_EDITS = "host" if side == "host" else "graphs"
    try:
        return SlotBuffers(**SHAPE, slots=slots, device="cpu", bound=True, keep_hidden=False,
                           cross_key_layout=KEYS_TRANSPOSED)
    finally:
        cache.ORT_BUFFERS_ON_CPU, cache.DEVICE_EDITS = False, "graphs"


def encoded(rows: int, length: int, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
    cross = [rng.standard_normal(cache.cross_dims(rows, SHAPE["heads"], length, SHAPE["head_dim"], key,
                                                  KEYS_TRANSPOSED)).astype(np.float32)
             for key in [i % 2 == 0 for i in range(2 * SHAPE["layers"])]]
    return cross, np.ones((rows, length), np.int64)


def fill(buffers: SlotBuffers, rows: int, source: int, rng: np.random.Generator) -> None:
    cross, mask = encoded(rows, source, rng)
    buffers.add_rows(cross, mask, None)
    buffers.ensure_capacity(40)  # a typical mid-decode capacity: 64 positions


Edit = Callable[[SlotBuffers], object]


def edits(rng: np.random.Generator, slots: int) -> dict[str, tuple[Edit, Edit]]:
    """name -> (set-up, edit): the set-up (untimed) brings the buffers to the edit's state."""
    one, one_mask = encoded(1, 40, rng)

    def full(buffers: SlotBuffers) -> None:
        while buffers.rows < slots:
            buffers.add_rows(one, one_mask, None)

    def grown(buffers: SlotBuffers) -> None:
        full(buffers)
        buffers.shrink(40)  # back to 64 positions: the edit grows it to 128

    return {
        "finish (last row moves)": (full, lambda b: b.remove_row(3)),
        "join (1 row's cross K/V)": (lambda b: (full(b), b.remove_row(b.rows - 1)),
                                     lambda b: b.add_rows(one, one_mask, None)),
        "beam reorder (4 of 32 rows)": (full, lambda b: b.copy_rows([1, 1, 0, 2], [0, 1, 2, 3])),
        "capacity 64 -> 128": (grown, lambda b: b.ensure_capacity(100)),
    }


def bytes_moved(slots: int, rows: int, capacity: int, source: int) -> dict[str, dict[str, int]]:
    """Per edit, the bytes that cross PCIe on CUDA with the host edits (every buffer downloaded
    and uploaded whole) and that the device edits write (on the device; a join's rows are
    uploaded), from the shapes."""
    item = 4
    self_alloc = slots * SHAPE["heads"] * SHAPE["max_target"] * SHAPE["head_dim"] * item
    cross_alloc = slots * SHAPE["heads"] * SHAPE["max_source"] * SHAPE["head_dim"] * item
    n = 2 * SHAPE["layers"]  # self buffers (key, value per layer); as many cross ones
    self_row = SHAPE["heads"] * capacity * SHAPE["head_dim"] * item
    cross_row = SHAPE["heads"] * source * SHAPE["head_dim"] * item
    return {
        "finish (last row moves)": {"host": 2 * n * (self_alloc + cross_alloc), "device": n * (self_row + cross_row)},
        "join (1 row's cross K/V)": {"host": 2 * n * cross_alloc, "device": n * cross_row},
        # rows 0, 1, 2 are read and 3 of them written: staged through the scratch, 6 row copies
        "beam reorder (4 of 32 rows)": {"host": 2 * n * self_alloc, "device": 6 * n * self_row},
        # the old prefix into the scratch, then the new one written from it
        "capacity 64 -> 128": {"host": 2 * n * self_alloc, "device": n * 3 * rows * self_row},
    }


def decode(bundle: Path, data: Path, batch: int, rounds: int) -> dict:
    from aggdec import Generator
    from aggdec.sentences import load_examples

    texts = [example.source for example in load_examples(str(data), None)]
    generator = Generator(bundle, device="cpu", threads=1)
    texts = [text for text in texts if generator.check(text) is None]
    seconds: dict[str, float] = {}
    outputs: dict[str, list] = {}
    sides = ["numpy", "graphs", "host"]
    for round_ in range(rounds * len(sides)):
        side = (sides if round_ // len(sides) % 2 == 0 else sides[::-1])[round_ % len(sides)]
        cache.ORT_BUFFERS_ON_CPU = side != "numpy"
        cache.DEVICE_EDITS = "host" if side == "host" else "graphs"
        started = time.perf_counter()
        outputs[side] = [r.ids for r in generator.generate(texts, mode="greedy", batch_size=batch)]
        seconds[side] = seconds.get(side, 0.0) + time.perf_counter() - started
        cache.ORT_BUFFERS_ON_CPU, cache.DEVICE_EDITS = False, "graphs"
    equal = {side: sum(a == b for a, b in zip(outputs[side], outputs["numpy"])) for side in sides}
    return {"sentences": len(texts), "batch_size": batch, "rounds": rounds,
            "seconds": {side: round(t, 2) for side, t in seconds.items()},
            "over_numpy": {side: round(t / seconds["numpy"], 3) for side, t in seconds.items()},
            "equal_to_numpy": equal}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--decode", type=Path, metavar="BUNDLE", help="also time greedy decoding of BUNDLE")
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "examples" /
                        "uagec_test_sample.tsv")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    sides = {side: make(side, args.slots) for side in ("numpy", "graphs", "host")}
    for buffers in sides.values():
        fill(buffers, args.slots, 64, rng)
    results = {}
    for name, (setup, edit) in edits(rng, args.slots).items():
        seconds: dict[str, list[float]] = {side: [] for side in sides}
        order = list(sides)
        for repeat in range(args.repeats):
            for side in order[repeat % 3 :] + order[: repeat % 3]:  # each side first in turn
                buffers = sides[side]
                setup(buffers)
                started = time.perf_counter()
                edit(buffers)
                seconds[side].append(time.perf_counter() - started)
        medians = {side: statistics.median(values) * 1e6 for side, values in seconds.items()}
        results[name] = {"median_us": medians, "graphs_over_numpy": medians["graphs"] / medians["numpy"],
                         "host_over_graphs": medians["host"] / medians["graphs"]}
    moved = bytes_moved(args.slots, args.slots, 64, 64)
    print(f"slots {args.slots}, capacity 64, source capacity 64, {args.repeats} repeats per edit and side")
    print("| edit | numpy (us) | graphs (us) | host round trip (us) | graphs / numpy | host / graphs | "
          "on CUDA, host edits move (PCIe) | device edits write |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, row in results.items():
        row["bytes"] = moved[name]
        us = row["median_us"]
        print(f"| {name} | {us['numpy']:.1f} | {us['graphs']:.1f} | {us['host']:.0f} | "
              f"{row['graphs_over_numpy']:.2f} | {row['host_over_graphs']:.0f} | {moved[name]['host'] / 1e6:.1f} MB | "
              f"{moved[name]['device'] / 1e3:.0f} kB |")
    report = {"slots": args.slots, "repeats": args.repeats, "shape": SHAPE, "edits": results}
    if args.decode:
        report["decode"] = decode(args.decode, args.data, args.batch_size, args.rounds)
        print(json.dumps(report["decode"]))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "device-edits.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
