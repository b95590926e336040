"""The reference model exported with an untrained drafter (random weights, k = 20): drafts that
are almost never kept, the worst case for GAD. Run from this directory: writes drafter/ and W/."""
from transformers import AutoModelForSeq2SeqLM
from aggdec.export import export_bundle
from aggdec.export.drafter import new_drafter_from_verifier
m = "/work/main/benchmarks/models/uagec/model"
new_drafter_from_verifier(AutoModelForSeq2SeqLM.from_pretrained(m), layers=2, k=20, seed=1).eval().save("drafter")
export_bundle(m, "W", drafter_dir="drafter", progress=print)
