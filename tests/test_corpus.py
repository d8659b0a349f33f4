"""The built-in corpus: size, encoding, exact regeneration, and diversity (not a word salad)."""

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tools.corpus import generate

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS_PATH = REPO_ROOT / "daisy" / "corpus" / "builtin.txt"
SENTENCE = re.compile(r"[^.!?\n]*[.!?]")   # a run ending in . ! or ?, never across a line break
WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")


def corpus_bytes() -> bytes:
    return CORPUS_PATH.read_bytes()


def corpus_text() -> str:
    return corpus_bytes().decode("utf-8")


def first_difference(a: bytes, b: bytes) -> str:
    """Describe the first offset where a and b differ (or the length mismatch)."""
    for offset, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return (f"first difference at byte {offset}: committed {a[offset:offset + 40]!r} "
                    f"vs generated {b[offset:offset + 40]!r}")
    return f"one is a prefix of the other: committed {len(a)} bytes, generated {len(b)} bytes"


def long_sentences(text: str) -> list[str]:
    """Sentences of at least five words (short ones like 'Method:' may repeat freely)."""
    return [s.strip() for s in SENTENCE.findall(text) if len(s.split()) >= 5]


def test_size_is_within_bounds():
    size = len(corpus_bytes())
    assert 230_000 <= size <= 300_000, f"builtin.txt is {size} bytes, want 230000..300000"


def test_is_valid_utf8_mostly_ascii_and_clean():
    data = corpus_bytes()
    text = data.decode("utf-8")   # strict: raises on any invalid sequence
    non_ascii = sum(1 for ch in text if ord(ch) > 127)
    assert 0 < non_ascii < len(text) // 200, f"{non_ascii} non-ASCII characters of {len(text)}"
    controls = sorted({repr(ch) for ch in text if ch < " " and ch != "\n"})
    assert not controls, f"control characters present: {controls}"
    assert text.endswith("\n") and not text.endswith("\n\n"), "file should end with one newline"


def test_documents_are_separated_by_two_blank_lines():
    text = corpus_text()
    assert "<|endoftext|>" not in text
    assert "\n\n\n\n" not in text, "a gap wider than the document separator"
    documents = text[:-1].split(generate.DOCUMENT_SEPARATOR)
    assert len(documents) >= 300, f"only {len(documents)} documents"
    for index, document in enumerate(documents):
        assert document and document == document.strip(), f"document {index} is empty or padded"
    assert len(set(documents)) == len(documents), "a whole document is repeated"


def test_regenerating_in_process_is_byte_identical():
    generated = generate.build_corpus().encode("utf-8")
    committed = corpus_bytes()
    assert generated == committed, first_difference(committed, generated)


def test_command_line_regeneration_is_byte_identical(tmp_path):
    # Runs the real CLI (to a temporary file, so a mismatch never overwrites the committed copy),
    # under a different string-hash seed to show the output does not depend on it.
    output = tmp_path / "builtin.txt"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    result = subprocess.run([sys.executable, "-m", "tools.corpus.generate", "--output", str(output)],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    generated, committed = output.read_bytes(), corpus_bytes()
    assert generated == committed, first_difference(committed, generated)


def test_the_seed_drives_the_output():
    small = 20_000
    assert generate.build_corpus(seed=1, target_bytes=small) == generate.build_corpus(seed=1, target_bytes=small)
    assert generate.build_corpus(seed=1, target_bytes=small) != generate.build_corpus(seed=2, target_bytes=small)


def test_no_sentence_repeats_often():
    counts = Counter(long_sentences(corpus_text()))
    sentence, most = counts.most_common(1)[0]
    assert most <= 5, f"sentence repeated {most} times: {sentence!r}"
    total = sum(counts.values())
    assert total >= 2500, f"only {total} sentences of five words or more"
    distinct_ratio = len(counts) / total
    assert distinct_ratio >= 0.65, f"distinct-sentence ratio {distinct_ratio:.3f} < 0.65"


def test_vocabulary_is_large_and_natural():
    words = [w.lower() for w in WORD.findall(corpus_text())]
    vocabulary = Counter(words)
    assert len(vocabulary) >= 3000, f"only {len(vocabulary)} distinct words"
    # Real English word statistics: function words dominate.
    top = [word for word, _ in vocabulary.most_common(10)]
    for common in ("the", "and", "a", "of", "to"):
        assert common in top, f"{common!r} not among the ten most frequent words: {top}"
    assert vocabulary["the"] / len(words) > 0.03, "'the' is implausibly rare for English"


def test_no_long_exact_repeats():
    data = corpus_bytes()
    chunk = 200
    counts = Counter(data[i:i + chunk] for i in range(len(data) - chunk + 1))
    repeated, most = counts.most_common(1)[0]
    assert most <= 4, f"a {chunk}-byte chunk occurs {most} times: {repeated[:80]!r}..."


def test_many_kinds_of_document():
    text = corpus_text()
    documents = text.split(generate.DOCUMENT_SEPARATOR)
    topic_titles = {topic["title"] for topic in generate.TOPICS}
    kinds = {
        "explanation": sum(d.split("\n", 1)[0] in topic_titles for d in documents),
        "recipe": sum("\nIngredients:\n" in d and "\nMethod:\n1. " in d for d in documents),
        "letter": sum(bool(re.search(r"^Dear [^\n]+,$", d, re.M)) for d in documents),
        "questions": sum("\nQ: " in d or " asks: " in d for d in documents),
        "fable": sum("\nMoral: " in d for d in documents),
        "dialogue": sum(bool(re.search(r"^(Baker|Clerk|Librarian|Mechanic): ", d, re.M)) for d in documents),
        "story with speech": sum(bool(re.search(r'"[^"\n]+[,?!]" [a-z]', d)) for d in documents),
        "weather": sum("degrees" in d and ("Forecast" in d or "Weather for" in d) for d in documents),
        "how-to": sum(d.lower().startswith("how to ") for d in documents),
        "poem": sum(bool(re.search(r",\n[A-Z][^\n]*,\n", d)) for d in documents),
        "notices": sum(d.startswith("Notices from ") for d in documents),
    }
    scarce = {kind: count for kind, count in kinds.items() if count < 5}
    assert not scarce, f"too few documents of these kinds: {scarce} (all: {kinds})"
