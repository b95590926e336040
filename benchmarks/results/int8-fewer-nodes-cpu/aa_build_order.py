"""A/A with the two Generators built and warmed up in a given order: is the side made ready last faster?

    python aa_build_order.py A_DIR B_DIR DATA N BUILT WARMED    # BUILT, WARMED: "AB" or "BA"
"""
import sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))  # benchmarks/
from alternate import alternate
from aggdec import Generator
from aggdec.sentences import load_examples
a_dir, b_dir, data, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
order = sys.argv[5]  # construction order
warm = sys.argv[6]  # warm-up order
texts = [e.source for e in load_examples(data, limit=n)]
gens = {}
for key in order:
    gens[key] = Generator(a_dir if key == "A" else b_dir, threads=1)
for key in warm:
    gens[key].generate(texts[:8])
sides = {k: (lambda s, g=gens[k]: g.generate([s])[0]) for k in ("A", "B")}
done = alternate(sides, texts)
print("built", order, "warmed", warm, "B/A", round(done["B"].total / done["A"].total, 3), "A", round(done["A"].total, 2), "B", round(done["B"].total, 2))
