# Two runtimes' GAD against greedy, in turn, twice (old, new, old, new), in aggdec bench's regime:
# one generate call per batch of B sentences (iteration_split.py --chunk B).
#   RUNTIMES=DIR BUNDLE=DIR bash ab_code.sh B [N]   # DIR/old/runtime and DIR/new/runtime: `git archive` of each commit's runtime/
# Run from the repository root; prints each side's ms a token, greedy and GAD, and GAD's time over greedy's.
HERE=$(dirname "$0")
B=$1; N=${2:-960}
for i in 1 2; do
  for side in old new; do
    r=$(nice -n -10 .venv/bin/python "$HERE/run_with_runtime.py" "$RUNTIMES/$side/runtime" benchmarks/iteration_split.py \
        "$BUNDLE" --batch-size "$B" --chunk "$B" --limit "$N" 2>&1 | grep " all  all" | awk '{print $1, $NF}' | paste -sd' ')
    echo "$side b$B: $r" | awk '{print $0, "gad/greedy time:", $NF/$4}'
  done
done
