"""GEC scores and edit ratios (plain Python, no external scorer), and translation scores
(chrF and BLEU, computed by sacrebleu).

GEC scores are token-level edit precision / recall / F0.5 against human targets. Tokens are
whitespace tokens (``str.split()``). Edits come from ``difflib.SequenceMatcher`` opcodes over
tokens, source->hypothesis and source->reference; an edit is ``(start, end, replacement
tokens)`` in source coordinates; TP = hypothesis edits that are also reference edits, summed
over the corpus. As in the M2 scorer, precision is 1.0 when a system proposes no edits (so
copying the source scores P = 1, R = 0, F0.5 = 0).

The edit ratio of Figure 5 of the IAD paper: the edit distance between input and output,
normalized by the input length (here over whitespace tokens).
"""

from __future__ import annotations

import difflib


def edits(src: list[str], hyp: list[str]) -> set[tuple[int, int, tuple[str, ...]]]:
    sm = difflib.SequenceMatcher(None, src, hyp, autojunk=False)
    return {(i1, i2, tuple(hyp[j1:j2])) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != "equal"}


def prf(tp: int, n_hyp: int, n_ref: int, beta: float = 0.5) -> dict:
    p = tp / n_hyp if n_hyp else 1.0
    r = tp / n_ref if n_ref else 1.0
    b2 = beta * beta
    f = (1 + b2) * p * r / (b2 * p + r) if (p + r) > 0 and (b2 * p + r) > 0 else 0.0
    return {"precision": round(p, 4), "recall": round(r, 4), "f0.5": round(f, 4),
            "tp": tp, "hyp_edits": n_hyp, "ref_edits": n_ref}


def score(sources: list[str], hyps: list[str], refs: list[str]) -> dict:
    tp = nh = nr = 0
    exact = unchanged = 0
    for s, h, r in zip(sources, hyps, refs):
        st = s.split()
        he, re_ = edits(st, h.split()), edits(st, r.split())
        tp += len(he & re_)
        nh += len(he)
        nr += len(re_)
        exact += h == r
        unchanged += h == s
    n = max(1, len(sources))
    return {"n": len(sources), "exact_match": round(exact / n, 4),
            "unchanged_rate": round(unchanged / n, 4), **prf(tp, nh, nr)}


def edit_distance(a: list[str], b: list[str]) -> int:
    """Levenshtein distance over tokens (insertions, deletions, substitutions cost 1)."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def edit_ratio(source: str, output: str) -> float:
    words = source.split()
    return edit_distance(words, output.split()) / max(len(words), 1)


def translation_scores(hyps: list[str], greedy: list[str], references: list[str] | None = None,
                       sources: list[str] | None = None, back: list[str] | None = None) -> dict:
    """Corpus chrF and BLEU (sacrebleu's defaults) of ``hyps`` against aggdec's float greedy
    outputs (``greedy``: how far a system is from the model it runs), against human
    ``references`` where the data has them, and of the round trip (``back``: ``hyps`` translated
    back to the source language) against the ``sources``."""
    try:
        import sacrebleu
    except ImportError:
        from aggdec.runtime.errors import InputError

        raise InputError("translation scores need sacrebleu: pip install 'aggdec[bench]'") from None

    def both(candidates: list[str], targets: list[str]) -> dict:
        return {"chrf": round(sacrebleu.corpus_chrf(candidates, [targets]).score, 2),
                "bleu": round(sacrebleu.corpus_bleu(candidates, [targets]).score, 2)}

    scores = {"vs_greedy": both(hyps, greedy)}
    if references is not None:
        scores["vs_references"] = both(hyps, references)
    if back is not None and sources is not None:
        scores["round_trip"] = both(back, sources)
    return scores
