"""Kernel time per node of the verifier graphs under onnxruntime's profiler, decoding the first N test sentences:
python nodeprof.py BUNDLE MODE BATCH N"""
import sys, json, collections, tempfile
from pathlib import Path
sys.path.insert(0, "benchmarks")
from profile_step import verifier_graphs, verifier_session
from aggdec.runtime.generator import Generator
from aggdec.runtime.loader import open_bundle
from aggdec.sentences import load_examples
bundle, mode, bs, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
src = [e.source for e in load_examples("uagec-test", n)]
opened = open_bundle(bundle, threads=1)
gen = Generator.from_bundle(opened)
gen.generate(src[:4], mode=mode, batch_size=bs)
prof = {}
for graph, attr in verifier_graphs(gen).items():
    prof[graph] = verifier_session(opened, graph, 1, str(Path(tempfile.mkdtemp()) / graph))
    setattr(gen.verifier, attr, prof[graph])
gen.generate(src, mode=mode, batch_size=bs)
for graph, s in prof.items():
    trace = json.load(open(s.end_profiling()))
    t = collections.Counter(); shapes = {}; calls = 0
    for e in trace:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            nm = e["name"][:-12]; t[(e["args"]["op_name"], nm)] += e["dur"]
            shapes[nm] = e["args"].get("output_type_shape")
        if e.get("cat") == "Session" and e["name"] == "model_run": calls += 1
    if not calls: continue
    print(graph, "calls", calls, "kernel us/call", round(sum(t.values()) / calls, 1), "nodes", len(t))
    for (op, nm), d in t.most_common(25):
        print(f"  {d/calls:8.2f} us  {op:14s} {nm[:60]:60s} {str(shapes[nm])[:80]}")
