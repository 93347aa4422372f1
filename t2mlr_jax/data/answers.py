"""Answer checks for greedy-generation evaluation (the release's generation_eval rules, re-derived)."""

from __future__ import annotations

import re

_END_MARKERS = ("<|eot_id|>", "<|endoftext|>", "<|end|>", "<|im_end|>")
_PROSQA_STATEMENT = re.compile(r"^(?:Every\s+)?(?P<lhs>.+?)\s+is\s+an?\s+(?P<rhs>.+?)\.\s*$", re.IGNORECASE)


def _cut_at_end_marker(text: str) -> str:
    for marker in _END_MARKERS:
        text = text.split(marker)[0]
    return text.strip()


def extract_gsm_answer(text: str) -> str | None:
    """The text after the last "####" (else "###"), or else the last non-empty line; end-of-text markers
    and trailing "!"/space padding removed. None if nothing is left."""
    for marker in ("####", "###"):
        if marker in text:
            candidate = _cut_at_end_marker(text.rsplit(marker, 1)[-1]).rstrip("! ").strip()
            if candidate:
                return candidate
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines:
        candidate = _cut_at_end_marker(lines[-1]).rstrip("! ").strip()
        return candidate or None
    return None


def normalize_gsm_answer(answer: str) -> str:
    """Drop one trailing period and thousands separators: "1,234." -> "1234"."""
    answer = answer.strip()
    return (answer[:-1] if answer.endswith(".") else answer).replace(",", "").strip()


def gsm_answer_correct(generated: str, reference: str) -> bool:
    """Extracted answers equal after normalisation; exact string match if either has none."""
    gold, predicted = extract_gsm_answer(reference), extract_gsm_answer(generated)
    if gold is None or predicted is None:
        return generated.strip() == reference.strip()
    return normalize_gsm_answer(predicted) == normalize_gsm_answer(gold)


def exact_answer_correct(generated: str, reference: str) -> bool:
    """The release's "exact" mode (variable assignment): stripped strings equal."""
    return _cut_at_end_marker(generated) == reference.strip()


def extract_boxed(text: str) -> str | None:
    """The contents of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    depth, begin = 0, text.index("{", start)
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin + 1 : i].strip()
    return None  # unbalanced: the generation stopped inside the box


def normalize_math_answer(answer: str) -> str:
    """Spelling-only differences removed: spaces, $, \\left/\\right, \\! and \\, spacing, \\dfrac/\\tfrac,
    ^\\circ, a trailing period, and thousands separators inside numbers ("1,234" -> "1234")."""
    for old, new in (
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("$", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("^\\circ", ""),
        ("^{\\circ}", ""),
    ):
        answer = answer.replace(old, new)
    answer = re.sub(r"\s+", "", answer).rstrip(".")
    return re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", answer)


def boxed_answer_correct(generated: str, reference: str) -> bool:
    """Math SFT (OpenMathReasoning, MATH500): the last boxed answers agree after normalisation; a reference
    without a box is compared as a whole (`exact_answer_correct`)."""
    gold = extract_boxed(reference)
    if gold is None:
        return exact_answer_correct(generated, reference)
    predicted = extract_boxed(generated)
    return predicted is not None and normalize_math_answer(predicted) == normalize_math_answer(gold)


def _prosqa_statement(line: str) -> tuple[str, str] | None:
    line = _cut_at_end_marker(line.strip().lstrip("#").strip())
    match = _PROSQA_STATEMENT.match(line)
    return (match.group("lhs").strip(), match.group("rhs").strip()) if match else None


def prosqa_path_correct(generated: str, record: dict) -> bool:
    """The proof is a chain of graph edges from the entity to the correct concept, and the final
    "### X is a Y." answer (or the last statement about the entity) names that concept."""
    symbols = {s: i for i, s in enumerate(record["idx_to_symbol"])}
    edges = {tuple(e) for e in record["edges"]}
    gold = _prosqa_statement(record["answer"])
    statements, answer = [], None
    for line in generated.splitlines():
        parsed = _prosqa_statement(line)
        if parsed is None:
            continue
        if line.strip().startswith("#"):
            answer = parsed
        else:
            statements.append(parsed)
    if not statements or gold is None:
        return False
    if answer is None:
        answer = next((s for s in reversed(statements) if s[0] == gold[0]), None)
    if answer != gold:
        return False
    current = gold[0]
    for lhs, rhs in statements:
        if (
            lhs != current
            or lhs not in symbols
            or rhs not in symbols
            or (symbols[lhs], symbols[rhs]) not in edges
        ):
            return False
        current = rhs
    return current == gold[1]


def pathfinding_path_correct(generated: str, record: dict) -> bool:
    """ "a -> b -> ... -> z" follows graph edges from start to end with the shortest length (text after
    a "|" divider only, as the release's random-walk-prefix format)."""
    text = _cut_at_end_marker(generated).split("|")[-1].strip()
    if text.startswith("Wait "):
        text = text[len("Wait ") :]
    parts = [p.strip().rstrip(".,;") for p in text.split("->")]
    symbols = {s: i for i, s in enumerate(record["idx_to_symbol"])}
    if len(parts) < 2 or any(p not in symbols for p in parts):
        return False
    path = [symbols[p] for p in parts]
    edges = {tuple(e) for e in record["edges"]}
    return (
        path[0] == record["start"]
        and path[-1] == record["end"]
        and all((u, v) in edges for u, v in zip(path, path[1:]))
        and len(path) - 1 == record["path_length"]
    )
