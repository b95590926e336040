"""Experiment (marian-beam-oracle-cpu): export the Bergamot en-pt bundle with <unk> masked BEFORE the log-softmax (the
order before this branch), to see which order upstream Marian's beam scores follow."""
import json, sys, torch
from pathlib import Path
from aggdec.export.marian import graphs as G, export as E
from aggdec.export.graphs import candidates
from aggdec.export.shortlist_head import shortlist_logits, ids_at

def forward_logits_before(self, hidden, output_ids, rows):
    model = self.model
    logits, row_ids = shortlist_logits(hidden, output_ids, model.output_weight, model.output_bias + self.suppress_bias, rows=rows)
    chosen = candidates(logits, self.top_k, self.head)
    if self.head == "argmax":
        return (ids_at(row_ids, chosen[0]),)
    top_logprobs, local = chosen
    return top_logprobs, ids_at(row_ids, local)
G.RecurrentVerifierGraph._shortlisted = forward_logits_before
orig = E.reference_cases
E.reference_cases = lambda *a, **k: orig(*a, **{**k, "suppress_after": False})
from aggdec.export import export_bundle
out = Path(sys.argv[2])
export_bundle(Path(sys.argv[1]), out, progress=None)
m = json.loads((out / "manifest.json").read_text())
m["suppression"] = "after_log_softmax"  # only so that the runtime lets beams run on it, for this experiment
(out / "manifest.json").write_text(json.dumps(m, indent=2))
