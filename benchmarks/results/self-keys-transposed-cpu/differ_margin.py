"""Where two bundles' greedy outputs differ on the UA-GEC test split (batch 32, 1 thread): the
first differing position, and there each bundle's top two candidates and their log-prob gap,
read from its top-K verifier graph on the common prefix (one block call: bitwise the positions
alone, the export's check). With --transformers CHECKPOINT, also transformers' greedy of them.

    python differ_margin.py OLD NEW [--transformers CHECKPOINT] [--max-new N]
"""
import argparse

import numpy as np
import onnxruntime as ort

from aggdec.runtime.decoding.cache import self_cache_names
from aggdec.runtime.generator import Generator
from aggdec.runtime.manifest import load_manifest
from aggdec.sentences import load_examples

parser = argparse.ArgumentParser()
parser.add_argument("old"); parser.add_argument("new")
parser.add_argument("--transformers"); parser.add_argument("--max-new", type=int, default=None)
args = parser.parse_args()
texts = [e.source for e in load_examples("uagec-test")]
gens = {p: Generator(p, threads=1) for p in (args.old, args.new)}
ids = {p: [r.ids for r in g.generate(texts, mode="greedy", batch_size=32, max_new_tokens=args.max_new)]
       for p, g in gens.items()}
differ = [i for i in range(len(texts)) if ids[args.old][i] != ids[args.new][i]]
print(f"{len(texts) - len(differ)} of {len(texts)} equal; differ at {differ}")


for i in differ:
    a, b = ids[args.old][i], ids[args.new][i]
    at = next(k for k in range(min(len(a), len(b)) + 1) if k == min(len(a), len(b)) or a[k] != b[k])
    print(f"sentence {i}: first difference at output position {at}: old {a[at] if at < len(a) else 'end'}, "
          f"new {b[at] if at < len(b) else 'end'}")
    for path in (args.old, args.new):
        g = gens[path]
        m = load_manifest(path, verify=False)
        options = ort.SessionOptions(); options.intra_op_num_threads = 1
        enc = ort.InferenceSession(f"{path}/{m.graph('encoder').file}", options, providers=["CPUExecutionProvider"])
        ver = ort.InferenceSession(f"{path}/{m.graph('verifier').file}", options, providers=["CPUExecutionProvider"])
        src = np.array([g.encode([texts[i]])[0]], np.int64)
        mask = np.ones_like(src)
        out = dict(zip([o.name for o in enc.get_outputs()], enc.run(None, {"input_ids": src, "attention_mask": mask})))
        block = np.array([[m.decoder_start_token_id, *a[:at]]], np.int64)
        capacity = block.shape[1] + 4
        feeds = {"input_ids": block, "past_lengths": np.zeros(1, np.int64), "encoder_attention_mask": mask,
                 **{n: np.zeros((1, m.num_heads, capacity, m.head_dim), np.float32)
                    for n in self_cache_names(m.decoder_layers)},
                 **{n: out[n] for n in out if n.startswith("cross_")}}
        res = dict(zip([o.name for o in ver.get_outputs()], ver.run(None, feeds)))
        lp, top = res["top_logprobs"][0, -1], res["top_ids"][0, -1]
        print(f"  {path}: top ids {top[:2].tolist()} log-probs {lp[0]:.9g} {lp[1]:.9g} (gap {lp[0] - lp[1]:.3g})")
if differ and args.transformers:
    from tests.runtime.test_lossless import transformers_greedy
    reference = transformers_greedy(args.transformers, [texts[i] for i in differ], args.max_new)
    for i, expected in zip(differ, reference):
        print(f"sentence {i}: old = transformers {ids[args.old][i] == expected}, "
              f"new = transformers {ids[args.new][i] == expected}")
