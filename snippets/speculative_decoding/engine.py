"""Speculative decoding on the shared models: a round of draft -> verify -> accept for a batch,
with three drafters (an independent draft model, the EAGLE-3 head, n-gram prompt lookup).

State lives in fixed buffers: `seq` [b, max_len] holds each row's text, `length` [b] how much
of it is committed. The target's cache holds the keys and values of seq[:, :length - 1]; the
last committed token is the first input of the next round. A round is

    draft, q = drafter.propose()                 gamma tokens per row, and their distributions
    p = target([last token, draft])              gamma + 1 positions in one pass
    n, t = verify(draft, q, p)                   sampling.py
    seq[length : length + n + 1] = draft[:n], t  and length += n + 1

Rows accept different numbers of drafts; nothing leaves the GPU, so `Engine.round` can be
captured once as a CUDA graph and replayed. `advance = 0` replays the same round without
committing (the work is identical): a round's time can then be measured by replaying it.
"""

from __future__ import annotations

import torch

from snippets.speculative_decoding.eagle import HeadRunner
from snippets.speculative_decoding.runner import Runner, Tree
from snippets.speculative_decoding.sampling import emitted, sample, verify


# --8<-- [start:engine]
class Engine:
    """Decoding `batch` rows with `target` and `drafter` (None: target only, gamma = 0)."""

    def __init__(self, target: Runner, drafter_kind, batch: int, gamma: int, *,
                 greedy: bool, eos: int | None = None, max_len: int | None = None):  # fmt: skip
        if gamma < 0 or (drafter_kind is None) != (gamma == 0):
            raise ValueError(f"gamma = {gamma}: a drafter drafts gamma >= 1 tokens, none drafts 0")
        dev = target.device
        self.target, self.batch, self.gamma = target, batch, gamma
        self.greedy, self.eos = greedy, eos
        self.max_len = max_len or target.max_len
        self.cache = target.cache(batch, self.max_len)
        self.seq = torch.zeros(batch, self.max_len, dtype=torch.long, device=dev)
        self.length = torch.zeros(batch, dtype=torch.long, device=dev)
        self.start = torch.zeros_like(self.length)
        self.done = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.advance = torch.ones((), dtype=torch.long, device=dev)
        self.tree = Tree.chain(gamma + 1, dev)
        self.steps = torch.arange(gamma + 1, device=dev)
        # statistics, accumulated over rounds of live rows
        self.hist = torch.zeros(gamma + 1, dtype=torch.long, device=dev)  # rounds by accepted
        self.overlap = torch.zeros(gamma, dtype=torch.float64, device=dev)  # sum of sum min(p, q)
        self.drafter = None if drafter_kind is None else drafter_kind(self)

    def prefill(self, prompts: torch.Tensor) -> None:
        """Every row starts with prompts[i] (all of one length, at least gamma + 2)."""
        b, n = prompts.shape
        if b != self.batch or n < self.gamma + 2:
            raise ValueError(f"prompts {tuple(prompts.shape)}: need [{self.batch}, "
                             f">= {self.gamma + 2}]")  # fmt: skip
        self.seq[:, :n] = prompts
        self.start.fill_(n)
        self.reset()
        zero = torch.zeros(b, dtype=torch.long, device=prompts.device)
        chain = Tree.chain(n - 1, prompts.device)
        _, taps = self.target.forward(self.cache, prompts[:, :-1], zero, chain)
        if self.drafter is not None:
            self.drafter.prefill(taps)

    def reset(self) -> None:
        """Back to the prompts (the caches keep what they hold: it is masked by length)."""
        self.length.copy_(self.start)
        self.done.zero_()
        self.hist.zero_()
        self.overlap.zero_()

    def room(self, rounds: int) -> bool:
        """Whether `rounds` more rounds fit in max_len for every row (checked on the host)."""
        return int(self.length.max()) + rounds * (self.gamma + 1) + self.gamma + 1 <= self.max_len

    @torch.no_grad()
    def round(self) -> None:
        L, g, b = self.length, self.gamma, self.batch
        if self.drafter is None:
            draft, q = torch.zeros(b, 0, dtype=torch.long, device=L.device), None
        else:
            draft, q = self.drafter.propose()
        inputs = torch.cat([self.seq.gather(1, (L - 1)[:, None]), draft], 1)
        hidden, taps = self.target.forward(self.cache, inputs, L - 1, self.tree)
        logits = self.target.logits(hidden)
        p = logits if self.greedy else logits.softmax(-1)  # greedy only needs the argmax
        verdict = verify(draft, q, p, greedy=self.greedy)
        out = emitted(draft, verdict)
        count = verdict.accepted + 1
        live = ~self.done
        if self.eos is not None:  # keep tokens up to the first EOS; the row then stops
            eos = (out == self.eos) & (self.steps < count[:, None])
            first = torch.where(eos, self.steps, g + 1).min(1).values
            count = torch.minimum(count, first + 1)
            self.done |= eos.any(1) & live
        self.seq.scatter_(1, L[:, None] + self.steps, out)  # past length: not yet committed
        if self.drafter is not None:
            self.drafter.commit(taps, L)
        self.hist.scatter_add_(0, verdict.accepted, live.long())  # (one_hot would sync)
        if not self.greedy and g:  # expected acceptance sum min(p, q) where a draft was judged
            judged = (self.steps[None, :g] <= verdict.accepted[:, None]) & live[:, None]
            if q is None:  # a one-hot q: sum min(p, q) = p(draft)
                overlap = p[:, :g].gather(-1, draft[..., None])[..., 0]
            else:
                overlap = torch.minimum(p[:, :g], q).sum(-1)
            self.overlap += (overlap * judged).sum(0).double()
        self.length += count * live * self.advance

    def generated(self) -> torch.Tensor:
        """Tokens committed since the prompts, per row."""
        return self.length - self.start


# --8<-- [end:engine]


# --8<-- [start:draft_model]
class DraftModel:
    """An independent small model drafts autoregressively. Its cache holds the committed text
    but the last two tokens; each round it first reads those two (one of them it may already
    hold, when every draft was accepted: it never read its own last draft), then drafts."""

    def __init__(self, runner: Runner, engine: Engine):
        self.runner, self.e = runner, engine
        self.cache = runner.cache(engine.batch, engine.max_len)
        dev = runner.device
        self.two, self.one = Tree.chain(2, dev), Tree.chain(1, dev)

    def prefill(self, taps) -> None:
        e = self.e
        n = int(e.start[0])
        zero = torch.zeros(e.batch, dtype=torch.long, device=e.seq.device)
        self.runner.forward(self.cache, e.seq[:, : n - 2], zero, Tree.chain(n - 2, e.seq.device))

    def propose(self):
        e, L = self.e, self.e.length
        last_two = e.seq.gather(1, torch.stack([L - 2, L - 1], 1))
        hidden, _ = self.runner.forward(self.cache, last_two, L - 2, self.two)
        logits = self.runner.logits(hidden[:, -1])
        drafts, qs = [], []
        for j in range(e.gamma):
            if e.greedy:
                drafts.append(logits.argmax(-1))
            else:
                qs.append(logits.softmax(-1))
                drafts.append(sample(qs[-1]))
            if j + 1 < e.gamma:  # read draft j at position L + j
                hidden, _ = self.runner.forward(self.cache, drafts[-1][:, None], L + j, self.one)
                logits = self.runner.logits(hidden[:, -1])
        return torch.stack(drafts, 1), (torch.stack(qs, 1) if qs else None)

    def commit(self, taps, old_length) -> None:
        pass


# --8<-- [end:draft_model]


# --8<-- [start:eagle]
class Eagle:
    """The EAGLE-3 head. The target's features of every committed position are kept in
    `feats`; each round the head rereads the last gamma + 1 (feature, next token) pairs -- as
    many as one round can commit -- at their positions, then drafts a chain, feeding back its
    own output in place of the feature."""

    def __init__(self, head: HeadRunner, engine: Engine):
        self.head, self.e = head, engine
        self.cache = head.cache(engine.batch, engine.max_len)
        c, dev = head.cfg, head.device
        self.feats = torch.zeros(engine.batch, engine.max_len, c.features * c.hidden,
                                 dtype=head.dtype, device=dev)  # fmt: skip
        self.window = Tree.chain(engine.gamma + 1, dev)
        self.one = Tree.chain(1, dev)
        self.back = torch.arange(-engine.gamma - 1, 0, device=dev)  # offsets of the window

    def prefill(self, taps) -> None:
        e = self.e
        n = int(e.start[0])
        self.feats[:, : n - 1] = torch.cat(taps, -1)
        zero = torch.zeros(e.batch, dtype=torch.long, device=e.seq.device)
        self.head.forward(self.cache, e.seq[:, 1:n], self.head.fuse(self.feats[:, : n - 1]), zero,
                          Tree.chain(n - 1, e.seq.device))  # fmt: skip

    def propose(self):
        e, L = self.e, self.e.length
        at = L[:, None] - 1 + self.back  # positions L-2-gamma .. L-2
        feats = self.feats.gather(1, at[..., None].expand(-1, -1, self.feats.shape[-1]))
        tokens = e.seq.gather(1, at + 1)
        g = self.head.fuse(feats)
        o, logits = self.head.forward(self.cache, tokens, g, at[:, 0], self.window)
        o, logits = o[:, -1:], logits[:, -1]
        drafts, qs = [], []
        for j in range(e.gamma):
            if e.greedy:
                drafts.append(logits.argmax(-1))
            else:
                qs.append(logits.softmax(-1))
                drafts.append(sample(qs[-1]))
            if j + 1 < e.gamma:  # (own output, draft j) at position L - 1 + j
                token = drafts[-1][:, None]
                o, logits = self.head.forward(self.cache, token, o, L - 1 + j, self.one)
                logits = logits[:, -1]
        return torch.stack(drafts, 1), (torch.stack(qs, 1) if qs else None)

    def commit(self, taps, old_length) -> None:
        """The target's features of this round's inputs, at their positions."""
        at = old_length[:, None] - 1 + self.e.steps
        fresh = torch.cat(taps, -1)
        self.feats.scatter_(1, at[..., None].expand(-1, -1, fresh.shape[-1]), fresh)


# --8<-- [end:eagle]


# --8<-- [start:ngram]
class Ngram:
    """Prompt lookup: find the longest suffix of the committed text (max_n down to min_n
    tokens) that occurred before, at its earliest occurrence, and propose the gamma tokens
    that followed it (vLLM's ngram proposer picks the same match). The drafts are
    deterministic: q is one-hot (verify(q=None)). Where nothing matches, or the continuation
    runs past the text, the slots repeat the last token: a guess, verified like any other."""

    def __init__(self, engine: Engine, min_n: int = 1, max_n: int = 3):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.e, self.min_n, self.max_n = engine, min_n, max_n
        self.slots = torch.arange(engine.max_len, device=engine.seq.device)

    def prefill(self, taps) -> None:
        pass

    def propose(self):
        e, L = self.e, self.e.length
        seq, b = e.seq, e.batch
        found = torch.zeros(b, dtype=torch.bool, device=seq.device)
        start = torch.zeros(b, dtype=torch.long, device=seq.device)  # where the continuation starts
        for n in range(self.max_n, self.min_n - 1, -1):
            tail = L[:, None] - n + torch.arange(n, device=seq.device)
            suffix = seq.gather(1, tail.clamp(min=0))  # the last n committed tokens
            windows = seq.unfold(1, n, 1)  # [b, max_len - n + 1, n]: windows[s] = seq[s : s + n]
            s = self.slots[: windows.shape[1]]
            before = (s[None] + n < L[:, None]) & (L[:, None] >= n)  # a token follows it
            match = (windows == suffix[:, None, :]).all(-1) & before
            first = torch.where(match, s[None], seq.shape[1]).min(1).values  # earliest
            hit = match.any(1) & ~found
            start = torch.where(hit, first + n, start)
            found |= hit
        pos = start[:, None] + torch.arange(e.gamma, device=seq.device)
        last = seq.gather(1, (L - 1)[:, None]).expand(b, e.gamma)
        ok = found[:, None] & (pos < L[:, None])
        return torch.where(ok, seq.gather(1, pos.clamp(max=seq.shape[1] - 1)), last), None

    def commit(self, taps, old_length) -> None:
        pass


# --8<-- [end:ngram]


def draft_model(runner: Runner):
    return lambda engine: DraftModel(runner, engine)


def eagle(head: HeadRunner):
    return lambda engine: Eagle(head, engine)


def ngram(min_n: int = 1, max_n: int = 3):
    return lambda engine: Ngram(engine, min_n, max_n)
