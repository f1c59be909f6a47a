"""The RL task: multi-digit addition written as a Python doctest, with a verifiable reward.

Numbers are lists of decimal digits, least significant first: 482 + 379 = 861 is the doctest
`>>> add([2, 8, 4], [9, 7, 3])` followed by the line `[1, 6, 8]`. The shared models' tokenizer
was trained on Python source (snippets/common/corpus.py) and gives every digit of such a list a
token of its own, whereas a plain `482` is cut into BPE pieces that differ from number to number
(`4|82`, `48|2`, `482`). Least significant first (Lee et al. 2023, "reverse" format), each
digit of the sum depends on two digits of the operands and the carry of the digit just written.
Prompts are left-padded with the end-of-text token to one length, so that a batch runs through
the static KV cache of the cuda-graph post's decode step. Problems are split into train, dev
and test by a hash of the pair: no test problem is ever trained on, and the dev problems (which
decide when the supervised warm-up stops) are not the test problems.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EOS = 0  # the tokenizer's end-of-text token (data/trained_models.yaml): also the left padding
SPLITS = ("train", "dev", "test")


class TaskError(ValueError):
    """Bad input to the task; the message says which argument and which row."""


# --8<-- [start:problems]
@dataclass(frozen=True)
class Problems:
    a: torch.Tensor  # [n] int64 operands
    b: torch.Tensor

    def __len__(self) -> int:
        return len(self.a)

    def answers(self) -> list[str]:
        return [digits(x) for x in (self.a + self.b).tolist()]


def digits(n: int) -> str:
    """482 -> '[2, 8, 4]': a Python list of the decimal digits, least significant first."""
    if n < 0:
        raise TaskError(f"the task adds non-negative numbers, got {n}")
    return "[" + ", ".join(reversed(str(n))) + "]"


def doctest(a: int, b: int) -> tuple[str, str]:
    """(prompt line, answer line) of one problem, newlines included."""
    return f">>> add({digits(a)}, {digits(b)})\n", f"{digits(a + b)}\n"


def split_of(a: torch.Tensor, b: torch.Tensor, modulus: int = 16) -> torch.Tensor:
    """0 train, 1 dev, 2 test: a fixed hash of the pair (test 1/modulus, dev 1/modulus)."""
    h = ((a * 73856093) ^ (b * 19349663)) % modulus
    return torch.where(h == 0, 2, torch.where(h == 1, 1, 0))


def draw(n: int, split: str, generator: torch.Generator, max_digits: int = 3) -> Problems:
    """n problems of one split: each operand's digit count uniform in 1..max_digits, then its
    value uniform among the numbers with that many digits (0 counts as one digit)."""
    if split not in SPLITS:
        raise TaskError(f"split must be one of {SPLITS}, got {split!r}")
    if n < 1 or max_digits < 1:
        raise TaskError(f"need n >= 1 and max_digits >= 1, got n={n}, max_digits={max_digits}")
    want, got_a, got_b, have = SPLITS.index(split), [], [], 0
    while have < n:  # a split holds 1/16 of the pairs or more: a few rounds at most
        k = 16 * n
        digits = torch.randint(1, max_digits + 1, (2, k), generator=generator)
        low = torch.where(digits == 1, 0, 10 ** (digits - 1))
        u = torch.rand(2, k, generator=generator, dtype=torch.float64)
        x = low + (u * (10**digits - low)).long()
        keep = split_of(x[0], x[1]) == want
        got_a.append(x[0][keep])
        got_b.append(x[1][keep])
        have += int(keep.sum())
    return Problems(torch.cat(got_a)[:n], torch.cat(got_b)[:n])


# --8<-- [end:problems]


# --8<-- [start:tokens]
class AdditionTask:
    """Token rows for the problems and the reward of a sampled answer.

    The tokenizer's pre-tokenizer cuts `>>> add([2, 8, 4], [9, 7, 3])` into words (`>>>`,
    ` add`, `([`, `2`, `,`, ` 8`, ..., `])`), and BPE never merges across words, so a row is
    the concatenation of four pieces looked up once per number: `>>> add`, the first operand
    with its brackets, the second, the newline (the constructor checks the concatenation
    against the tokenizer on a sample)."""

    def __init__(self, tokenizer, max_digits: int = 3, slack: int = 2):
        self.tokenizer, self.max_digits = tokenizer, max_digits
        top = 10**max_digits - 1

        def ids(texts):
            return [e.ids for e in tokenizer.encode_batch(texts)]

        self.head, self.nl = ids([">>> add", "\n"])
        self.first = ids([f"({digits(n)}," for n in range(top + 1)])
        self.second = ids([f" {digits(n)})" for n in range(top + 1)])
        self.answer = ids([f"{digits(n)}\n" for n in range(2 * top + 1)])
        longest = max(map(len, self.first)) + max(map(len, self.second))
        self.prompt_len = len(self.head) + longest + len(self.nl)
        self.max_new = max(map(len, self.answer)) + slack  # room for a wrong, longer answer
        vocab = tokenizer.get_vocab_size()
        texts = tokenizer.decode_batch([[i] for i in range(vocab)])
        # a response ends at its first token holding a newline, or at end-of-text
        self.is_end = torch.tensor(["\n" in t for t in texts])
        self.is_end[EOS] = True
        self.end_ids = frozenset(self.is_end.nonzero()[:, 0].tolist())
        self._check(ids)

    def to(self, device) -> AdditionTask:
        """Keep the end-token table on `device` (a captured graph cannot copy it there)."""
        self.is_end = self.is_end.to(device)
        return self

    def _check(self, ids) -> None:
        gen = torch.Generator().manual_seed(0)
        p = draw(64, "train", gen, self.max_digits)
        pairs = list(zip(p.a.tolist(), p.b.tolist(), strict=True))
        texts = ["".join(doctest(a, b)) for a, b in pairs]
        rows = self.rows(p, answers=True)
        for row, text, want in zip(rows.tolist(), texts, ids(texts), strict=True):
            got = [t for t in row if t != EOS]
            if got != want:
                raise TaskError(f"the tokenizer splits {text!r} as {want}, not as the "
                                f"per-word concatenation {got}: cannot build the rows")  # fmt: skip

    def rows(self, problems: Problems, answers: bool = False) -> torch.Tensor:
        """[n, prompt_len] prompts, left-padded with EOS; answers=True: [n, prompt_len +
        max_new] with the answer and its newline after the prompt, EOS after that."""
        rows = []
        for a, b in zip(problems.a.tolist(), problems.b.tolist(), strict=True):
            prompt = self.head + self.first[a] + self.second[b] + self.nl
            row = [EOS] * (self.prompt_len - len(prompt)) + prompt
            if answers:
                ans = self.answer[a + b]
                row += ans + [EOS] * (self.max_new - len(ans))
            rows.append(row)
        return torch.tensor(rows, dtype=torch.long)  # one conversion: a few ms for 2048 rows

    # --8<-- [end:tokens]

    # --8<-- [start:reward]
    def response_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """[n, T] 1 for each token of a response: up to and including its first end token (all
        T tokens when there is none). No host sync: usable inside a captured CUDA graph."""
        if self.is_end.device != tokens.device:
            raise TaskError(f"tokens are on {tokens.device}, the end table on "
                            f"{self.is_end.device}: call task.to(device) first")  # fmt: skip
        end = self.is_end[tokens].long()
        return ((end.cumsum(-1) - end) == 0).to(torch.float32)

    def score(self, problems: Problems, tokens: torch.Tensor) -> torch.Tensor:
        """[n] 1.0 where the text before a response's first end token is exactly the sum's
        digit list (`[1, 6, 8]`: no other spacing, no leading zero); 0.0 otherwise, and 0.0
        for a response with no end token within its T tokens (truncated)."""
        if tokens.dim() != 2 or tokens.shape[0] != len(problems):
            raise TaskError(f"tokens must be [{len(problems)}, T], got {tuple(tokens.shape)}")
        rows, ends = tokens.tolist(), self.end_ids
        cut = [next((t for t, tok in enumerate(r) if tok in ends), None) for r in rows]
        texts = self.tokenizer.decode_batch([r[:c] if c is not None else [] for r, c in
                                             zip(rows, cut, strict=True)])  # fmt: skip
        want = problems.answers()
        ok = [c is not None and t == w for c, t, w in zip(cut, texts, want, strict=True)]
        return torch.tensor(ok, dtype=torch.float32)


# --8<-- [end:reward]
