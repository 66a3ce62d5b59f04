"""The toy lab's tasks and probes: what a run trains on and what its heads are measured on.

Tasks over the first n lowercase letters (8 by default) of the byte-level tokenizer (token id = byte value,
<bos> = 256 first), so a trained model reads text a person can type ("dafchedafche"):

- induction: a random segment x_1..x_l of distinct letters, the same segment again, then random letters; l varies
  from row to row (3..L). Every letter of the repeat after its first is predictable, but only by finding the
  earlier occurrence of the current letter and copying what came next: the induction-head algorithm (Olsson et
  al. 2022, "In-context learning and induction heads"). Because l varies, no fixed offset or position solves it.
- copy: "x_1..x_L=x_1..x_L" with a fixed L; the answer sits a fixed distance back, so positions alone solve it.
- reverse: "x_1..x_L=x_L..x_1"; the answer for output k is input L+1-k.
- text: byte-level language modelling on windows of the shipped public-domain text (data/), <bos> first and every
  byte after it scored: the setting in which trained decoders grow attention sinks (Gu et al., ICLR 2025).

Per-head statistics (attnviz.lab.training.head_scores) are computed on a fixed probe batch: rows of <bos>, a
random segment of length L, the same segment again (then filler letters), L varying from row to row; for each row's
pattern A [layer, head, query, key]:
- previous-token score = mean over queries i >= 1 of A[i, i-1] (attnviz.stats.previous_token_score)
- induction score = mean over second-copy queries i = L+1..2L of A[i, i-L+1], the token after the previous
  occurrence of the current token (attnviz.diagnostics.repeated_token_scores' prefix_matching with the repeat from
  position 1: stats' induction statistic on the targets the layout gives, so filler letters that happen to repeat
  are not counted)
- sink score = mean over queries i >= 1 of A[i, 0], attention parked on <bos> (attnviz.stats.sink_mass)
averaged over rows. Because L varies, a head that looks a fixed distance back (which positions alone allow) cannot
score high on induction. The sink metric of Gu et al. (attnviz.sinks.sink_rate) is measured on the task's own texts
(text_probe) or on the probe itself.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from attnviz.errors import AttnvizError
from attnviz.stats import induction_targets
from attnviz.tokenizer import BOS

ALPHABET = "abcdefghijklmnopqrstuvwxyz"
SEPARATOR = "="
BOS_ID = 256
LETTER_TASKS = ("induction", "copy", "reverse")
TASKS = LETTER_TASKS + ("text",)
TASK_INFO = {
    "induction": "a random string of letters repeated; predict the repeats",
    "copy": "letters, '=', then the same letters again",
    "reverse": "letters, '=', then the same letters backwards",
    "text": "every next byte of windows of a public-domain English text (the Declaration, Lincoln)",
}
PROBE_SEED = 1234         # the probe batch is the same for every run, so scores compare across runs
PROBE_BATCH = 16
TEXT_FILE = Path(__file__).resolve().parent.parent.parent / "data" / "declaration_and_lincoln.txt"


class TaskError(AttnvizError, ValueError):
    """A toy-lab task that does not exist; the message lists those that do."""


def text_bytes() -> torch.Tensor:
    """The shipped text as byte ids [n_bytes] int64 (the byte tokenizer's ids)."""
    return torch.tensor(list(TEXT_FILE.read_bytes()), dtype=torch.long)


def chance_loss(n_letters: int = len(ALPHABET), task: str = "induction") -> float:
    """Cross-entropy in nats of guessing uniformly among the task's symbols: log(n_letters) for the letter tasks
    (their answers are drawn uniformly from those letters), log(256) for the text task (any byte)."""
    return math.log(256 if task == "text" else n_letters)


def make_batch(task: str, batch_size: int, segment_len: int, generator: torch.Generator,
               n_letters: int = len(ALPHABET), text_len: int = 64):
    """A batch of a task. Returns (input_ids [batch, n] int64, answer_mask [batch, n] bool), where answer_mask[b, j]
    is True when token j is determined by tokens 0..j-1 and is scored by the loss. n = 2L+2 for the letter tasks,
    text_len for the text task.

    Every row starts with <bos>; segments are L distinct letters (so an earlier occurrence is unique).
    induction: x_1..x_l x_1..x_l then random letters, l uniform in [3, L] per row. Every letter of the repeat
    after its first is scored (the first is not predictable: the row could have gone on with new letters).
    text: text_len - 1 consecutive bytes from a random place of the shipped text, every one scored.
    """
    if task == "text":
        data = text_bytes()
        starts = torch.randint(0, len(data) - text_len + 2, (batch_size,), generator=generator)  # any window
        body = data[starts[:, None] + torch.arange(text_len - 1)[None, :]]                    # [batch, n - 1]
        ids = torch.cat([torch.full((batch_size, 1), BOS_ID, dtype=torch.long), body], dim=1)
        mask = torch.ones_like(ids, dtype=torch.bool)
        mask[:, 0] = False
        return ids, mask
    L = segment_len
    letters = torch.tensor([ord(c) for c in ALPHABET[:n_letters]])
    segment = torch.rand(batch_size, n_letters, generator=generator).argsort(dim=1)[:, :L]   # [batch, L] distinct
    ids = torch.full((batch_size, 2 * L + 2), BOS_ID, dtype=torch.long)
    mask = torch.zeros(batch_size, 2 * L + 2, dtype=torch.bool)
    if task == "induction":
        length = torch.randint(3, L + 1, (batch_size,), generator=generator)                    # [batch]
        noise = torch.randint(0, n_letters, (batch_size, 2 * L + 1), generator=generator)
        k = torch.arange(2 * L + 1)[None, :]                                                   # [1, 2L+1]
        l = length[:, None]
        repeat = torch.gather(segment, 1, (k % l).clamp(max=L - 1))                            # [batch, 2L+1]
        body = torch.where(k < 2 * l, repeat, noise)
        ids[:, 1:] = letters[body]
        mask[:, 1:] = (k > l) & (k < 2 * l)
    elif task in ("copy", "reverse"):
        out = segment if task == "copy" else segment.flip(1)
        ids[:, 1:L + 1] = letters[segment]
        ids[:, L + 1] = ord(SEPARATOR)
        ids[:, L + 2:] = letters[out]
        mask[:, L + 2:] = True
    else:
        raise TaskError(f"unknown task {task!r}; choose one of {TASKS}")
    return ids, mask


def probe_lengths(segment_len: int, batch_size: int = PROBE_BATCH) -> list[int]:
    """Repeat length of each probe row: cycling through ceil(L/2)..L (at least 3), so that a head looking a fixed
    distance back (which positions alone allow) matches few rows, while a true induction head matches them all."""
    lengths = list(range(max(3, (segment_len + 1) // 2), segment_len + 1))
    return [lengths[r % len(lengths)] for r in range(batch_size)]


def make_probe(segment_len: int, batch_size: int = PROBE_BATCH, seed: int = PROBE_SEED,
               n_letters: int = len(ALPHABET)) -> torch.Tensor:
    """The statistics probe: row r is <bos>, l_r distinct random letters, the same letters again, then random
    letters up to 2L+1 tokens (l_r from probe_lengths). Returns [batch, 2L+1] int64."""
    g = torch.Generator().manual_seed(seed)
    L = segment_len
    segment = torch.rand(batch_size, n_letters, generator=g).argsort(dim=1)[:, :L]
    noise = torch.randint(0, n_letters, (batch_size, 2 * L), generator=g)
    k = torch.arange(2 * L)[None, :]
    l = torch.tensor(probe_lengths(L, batch_size))[:, None]
    body = torch.where(k < 2 * l, torch.gather(segment, 1, (k % l).clamp(max=L - 1)), noise)
    letters = torch.tensor([ord(c) for c in ALPHABET[:n_letters]])[body]
    return torch.cat([torch.full((batch_size, 1), BOS_ID, dtype=torch.long), letters], dim=1)


def text_probe(text_len: int = 64, batch_size: int = PROBE_BATCH) -> torch.Tensor:
    """Fixed windows of the shipped text, evenly spaced through it, each <bos> + text_len - 1 bytes: the texts the
    sink metric of a text-task run is measured on. Returns [batch, text_len] int64."""
    data = text_bytes()
    starts = np.linspace(0, len(data) - (text_len - 1), batch_size).astype(int)  # the last ends the text
    body = torch.stack([data[s:s + text_len - 1] for s in starts])
    return torch.cat([torch.full((batch_size, 1), BOS_ID, dtype=torch.long), body], dim=1)


def example_text(config) -> str:
    """A short text in the task's own format to try a trained model on, e.g. "dafchedafche" for induction over 8
    letters: a fixed scramble of up to 6 of its letters, then what the task makes of them; for the text task the
    opening of the Gettysburg Address."""
    if config.task == "text":
        return "Four score and seven years ago our fathers brought forth on this continent, a new nation"
    letters = ALPHABET[:config.n_letters]
    k = min(len(letters), 6, config.segment_len)
    segment = "".join(letters[(5 * i + 3) % len(letters)] for i in range(len(letters)))[:k]
    if len(set(segment)) < k:                  # 5 and n share a factor: fall back to the letters in order
        segment = letters[:k]
    if config.task == "induction":
        return segment + segment
    return segment + SEPARATOR + (segment if config.task == "copy" else segment[::-1])


def target_patterns(text: str) -> tuple[list[str], dict[str, np.ndarray]]:
    """The patterns a perfect previous-token head and a perfect induction head would have on <bos> + text.

    previous-token: query i puts all its weight on key i - 1 (<bos> on itself). induction: query i splits its weight
    over the keys just after earlier occurrences of its own token (attnviz.stats.induction_targets); a query whose
    token has not occurred before has nothing to copy and parks its weight on <bos>, as trained heads do.
    Returns (tokens, {"previous-token": [n, n], "induction": [n, n]}), n = len(text) + 1, rows summing to 1.
    """
    tokens = [BOS] + list(text)
    n = len(tokens)
    previous = np.zeros((n, n))
    previous[0, 0] = 1.0
    previous[np.arange(1, n), np.arange(n - 1)] = 1.0
    induction = np.zeros((n, n))
    for q, keys in enumerate(induction_targets([BOS_ID] + [ord(c) for c in text])):
        if keys:
            induction[q, keys] = 1.0 / len(keys)
        else:
            induction[q, 0] = 1.0
    return tokens, {"previous-token": previous, "induction": induction}
