"""What taking each position's best id in numpy instead of the argmax graph's ArgMax would gain,
end to end: a prototype, measured before building it.

onnxruntime's CPU ArgMax takes 13x numpy's argmax over the same logits
(``benchmarks/argmax_kernels.py``), and onnxruntime does not skip the nodes of outputs not
requested, so taking the argmax in numpy needs a graph whose output is the logits. This makes
that graph from a bundle's ``verifier_argmax`` (its final ArgMax removed, the logits it read
output under the same name) in a copy of the bundle, and decodes the same sentences with two
Generators in one process, alternating: A as the bundle is, B with the logits graph in place
of the argmax graph and the bound verifier call (CPU, IO binding) patched to take the argmax in
numpy. Thread CPU seconds, medians; every output of B must equal A's (ties: both take the
first id; the process exits 1 otherwise).

The runtime is patched here, not changed: the bundle format (the graph's declared output, the
load checks, the CUDA path) is not built for it. Decision 039.

    python benchmarks/argmax_in_numpy.py BUNDLE [--modes greedy iad] [--batch-sizes 1 8 32]
                                        [--limit 600] [--repeats 4] [--work DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARGMAX_GRAPH = "verifier_argmax.onnx"


def logits_bundle(bundle: Path, work: Path) -> Path:
    """A copy of ``bundle`` whose argmax graph outputs the logits its ArgMax read (same name)."""
    import onnx

    out = work / f"{bundle.name}-logits"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(bundle, out)
    model = onnx.load(str(out / ARGMAX_GRAPH))
    graph = model.graph
    (argmax,) = [node for node in graph.node if node.op_type == "ArgMax"]
    name, logits = argmax.output[0], argmax.input[0]
    graph.node.remove(argmax)
    for node in graph.node:
        for names in (node.input, node.output):
            for index, value in enumerate(names):
                if value == logits:
                    names[index] = name
    for output in graph.output:
        if output.name == name:
            output.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
            del output.type.tensor_type.shape.dim[:]
    onnx.save(model, str(out / ARGMAX_GRAPH))
    return out


def patch_bound_call(logits_sessions: set[int]) -> None:
    """The bound CPU verifier call of a batch whose session is one of ``logits_sessions`` (ids)
    reads the logits and takes their argmax in numpy; every other call runs as it does."""
    from aggdec.runtime.decoding import verifier

    original = verifier.Batch._run

    def run(self, tokens, lengths):
        if self._binding is None or id(self._session) not in logits_sessions:
            return original(self, tokens, lengths)
        rows, new = tokens.shape
        binding = self._binding
        relaid = self._layout != self.buffers.layout
        if relaid or self._bound_width != new:
            for name in self._candidates:
                binding.bind_output(name, "cpu")
            binding.bind_cpu_input("input_ids", tokens)
            binding.bind_cpu_input("past_lengths", lengths)
            self._bound_width = new
        if relaid:
            self._mask = self.buffers.source_mask()
            binding.bind_cpu_input("encoder_attention_mask", self._mask)
            self.buffers.bind(binding, *self._names)
            self._layout = self.buffers.layout
        logits = self._session.run_bound(binding)[0].numpy()
        return self._top([logits.argmax(-1)], rows, new)

    verifier.Batch._run = run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", metavar="BUNDLE")
    parser.add_argument("--modes", nargs="+", default=["greedy", "iad"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--limit", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--data", default="uagec-test")
    parser.add_argument("--work", help="where the logits copy of the bundle goes (default: a temporary folder)")
    args = parser.parse_args(argv)

    from aggdec import Generator
    from aggdec.runtime.session import OrtSession
    from aggdec.sentences import load_examples

    bundle = Path(args.bundle)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp())
    variant = logits_bundle(bundle, work)
    texts = [example.source for example in load_examples(args.data, args.limit)]
    a = Generator(bundle, device="cpu", threads=1)
    b = Generator(bundle, device="cpu", threads=1)
    if a.verifier.argmax is None:
        raise SystemExit(f"{bundle} has no argmax graph")
    # no spec: the load checks would refuse the graph's float output (the point of the prototype)
    b.verifier.argmax = OrtSession(variant / ARGMAX_GRAPH, "cpu", 1, spec=None, name="verifier_argmax")
    patch_bound_call({id(b.verifier.argmax)})
    print(f"{len(texts)} sentences of {args.data}, CPU, 1 thread, thread CPU seconds, medians of {args.repeats}; "
          f"A: {bundle.name} as it is, B: its argmax graph's ArgMax taken in numpy")
    print("| mode | batch | A (s) | B (s) | B / A | B = A outputs |")
    print("|---|---|---|---|---|---|")
    failed = False
    for batch_size in args.batch_sizes:
        for mode in args.modes:
            for generator in (a, b):  # warm-up: first calls, measured costs
                generator.generate(texts[: 4 * batch_size], mode=mode, batch_size=batch_size)
            seconds: dict[str, list[float]] = {"A": [], "B": []}
            outputs: dict[str, list[list[int]]] = {}
            for repeat in range(args.repeats):
                for side, generator in ((("A", a), ("B", b)) if repeat % 2 == 0 else (("B", b), ("A", a))):
                    started = time.thread_time()
                    results = generator.generate(texts, mode=mode, batch_size=batch_size)
                    seconds[side].append(time.thread_time() - started)
                    outputs.setdefault(side, [result.ids for result in results])
            same = sum(x == y for x, y in zip(outputs["A"], outputs["B"]))
            failed |= same != len(texts)
            ta, tb = statistics.median(seconds["A"]), statistics.median(seconds["B"])
            print(f"| {mode} | {batch_size} | {ta:.3f} | {tb:.3f} | {tb / ta:.3f} | {same}/{len(texts)} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
