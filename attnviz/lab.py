"""The toy lab: train a small real-architecture transformer on a synthetic task and watch its heads form.

Three tasks with a known answer, over the first n lowercase letters (8 by default) of the byte-level tokenizer
(token id = byte value, <bos> = 256 first), so a trained model reads text a person can type ("dafchedafche"):

- induction: a random segment x_1..x_l of distinct letters, the same segment again, then random letters; l varies
  from row to row (3..L). Every letter of the repeat after its first is predictable, but only by finding the
  earlier occurrence of the current letter and copying what came next: the induction-head algorithm (Olsson et
  al. 2022, "In-context learning and induction heads"). Because l varies, no fixed offset or position solves it.
- copy: "x_1..x_L=x_1..x_L" with a fixed L; the answer sits a fixed distance back, so positions alone solve it.
- reverse: "x_1..x_L=x_L..x_1"; the answer for output k is input L+1-k.

The positional scheme picks the transformers architecture, so every page opens a trained model like any other:
learned -> GPT2LMHeadModel; sinusoidal -> the same GPT-2 with its position table wpe set to the sinusoidal
encoding of Vaswani et al. 2017 §3.5 and frozen; rope -> LlamaForCausalLM; alibi -> BloomForCausalLM.

Per-head statistics are computed from output_attentions (eager attention) on a fixed probe batch: rows of <bos>,
a random segment of length L, the same segment again (then filler letters), L varying from row to row; for each
row's pattern A [layer, head, query, key]:
- previous-token score = mean over queries i >= 1 of A[i, i-1]
- induction score = mean over second-copy queries i = L+1..2L of A[i, i-L+1] (the token after the previous
  occurrence of the current token)
- sink score = mean over queries i >= 1 of A[i, 0] (attention parked on <bos>)
averaged over rows. These are the definitions attnviz.stats uses for a captured text. Because L varies, a head that
looks a fixed distance back (which positions alone allow) cannot score high on induction.

A LabRun owns its model, optimiser, data generator and progress, trains in a background thread with one torch
thread, and is polled through snapshot(): runs never share mutable state, so one session cannot disturb another's.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import (BloomConfig, BloomForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          PreTrainedModel)

from attnviz.paths import cache_dir, trained_dir
from attnviz.positional import sinusoidal_encoding
from attnviz.tokenizer import VOCAB_SIZE, byte_tokenizer

ALPHABET = "abcdefghijklmnopqrstuvwxyz"
SEPARATOR = "="
BOS_ID = 256
TASKS = ("induction", "copy", "reverse")
TASK_INFO = {
    "induction": "a random string of letters repeated; predict the repeats",
    "copy": "letters, '=', then the same letters again",
    "reverse": "letters, '=', then the same letters backwards",
}
POSITIONAL = ("learned", "sinusoidal", "rope", "alibi")
ARCHITECTURE = {"learned": "GPT2LMHeadModel", "sinusoidal": "GPT2LMHeadModel (frozen sinusoidal wpe)",
                "rope": "LlamaForCausalLM", "alibi": "BloomForCausalLM"}
MAX_STEPS = 3000          # one run never trains longer than this...
MAX_SECONDS = 240.0       # ...nor longer than this, so nobody holds the shared CPU for long
MAX_CONCURRENT_RUNS = 2   # the app's host has few cores; a third run waits for one to finish
N_POSITIONS = 256         # learned/sinusoidal position table: room for text typed on other pages
PROBE_SEED = 1234         # the probe batch is the same for every run, so scores compare across runs
PROBE_BATCH = 16
INIT_STD = 0.02           # GPT-2's initializer_range, used for every architecture
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,47}$")


@dataclass(frozen=True)
class LabConfig:
    """Everything that determines a run: same config, same losses."""

    task: str = "induction"
    positional: str = "rope"  # relative positions make the previous-token head easy to find
    seed: int = 0
    steps: int = 1000
    lr: float = 3e-3
    batch_size: int = 32
    segment_len: int = 8    # L: letters per segment (the longest repeat, for induction)
    n_layers: int = 2       # an induction head needs two layers: one to look back a token, one to match
    n_heads: int = 4
    d_model: int = 64
    eval_every: int = 25    # steps between statistics checkpoints
    n_letters: int = 8      # tasks use the first n letters; with 26 an induction head takes several times longer

    def problems(self) -> list[str]:
        """What is wrong with this config, in words a page can show; empty when it is usable."""
        out = []
        if self.task not in TASKS:
            out.append(f"task must be one of {', '.join(TASKS)}")
        if self.positional not in POSITIONAL:
            out.append(f"positional scheme must be one of {', '.join(POSITIONAL)}")
        if not 1 <= self.steps <= MAX_STEPS:
            out.append(f"steps must be between 1 and {MAX_STEPS}")
        if not 1e-5 <= self.lr <= 0.1:
            out.append("learning rate must be between 1e-5 and 0.1")
        if not 1 <= self.batch_size <= 256:
            out.append("batch size must be between 1 and 256")
        if not 3 <= self.n_letters <= len(ALPHABET):
            out.append(f"the number of letters must be between 3 and {len(ALPHABET)}")
        if not 3 <= self.segment_len <= min(self.n_letters, len(ALPHABET)):
            out.append("segment length must be between 3 and the number of letters (segments use distinct letters)")
        if not 1 <= self.n_layers <= 4:
            out.append("layers must be between 1 and 4")
        if not 1 <= self.n_heads <= 16:
            out.append("heads must be between 1 and 16")
        if not 8 <= self.d_model <= 256:
            out.append("model width must be between 8 and 256")
        elif self.n_heads >= 1 and self.d_model % self.n_heads:
            out.append("model width must be a multiple of the number of heads")
        elif self.n_heads >= 1 and (self.d_model // self.n_heads) % 2:
            out.append("head size (width / heads) must be even (RoPE and sinusoids rotate pairs)")
        if not 1 <= self.eval_every <= MAX_STEPS:
            out.append(f"checkpoint interval must be between 1 and {MAX_STEPS} steps")
        return out

    @property
    def seq_len(self) -> int:
        """Tokens per training sequence, <bos> included: 1 + L + 1 + L for every task."""
        return 2 * self.segment_len + 2

    def default_name(self) -> str:
        """A folder name that identifies the run: same config, same name (a digest of every field ends it)."""
        digest = hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:6]
        return f"{self.task}-{self.positional}-{self.steps}steps-seed{self.seed}-{digest}"


def chance_loss(n_letters: int = len(ALPHABET)) -> float:
    """Cross-entropy in nats of guessing uniformly among the task's letters: log(n_letters). Every task draws its
    answers uniformly from those letters, so this is the loss of a model that knows which letters occur but not
    the task."""
    return math.log(n_letters)


def make_batch(task: str, batch_size: int, segment_len: int, generator: torch.Generator,
               n_letters: int = len(ALPHABET)):
    """A batch of a task. Returns (input_ids [batch, 2L+2] int64, answer_mask [batch, 2L+2] bool), where
    answer_mask[b, j] is True when token j is determined by tokens 0..j-1 and is scored by the loss.

    Every row starts with <bos>; segments are L distinct letters (so an earlier occurrence is unique).
    induction: x_1..x_l x_1..x_l then random letters, l uniform in [3, L] per row. Every letter of the repeat
    after its first is scored (the first is not predictable: the row could have gone on with new letters).
    """
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
        raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
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


def example_text(config: LabConfig) -> str:
    """A short text in the task's own format to try a trained model on, e.g. "dafchedafche" for induction over 8
    letters: a fixed scramble of up to 6 of its letters, then what the task makes of them."""
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
    from attnviz.stats import induction_targets
    from attnviz.tokenizer import BOS

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


def previous_token_score(pattern) -> np.ndarray:
    """Mean over queries i >= 1 of A[i, i-1] (attnviz.stats' definition). pattern [..., query, key] -> [...]."""
    from attnviz.stats import previous_token_score as score

    return score(pattern)


def induction_score(pattern, repeat_len: int) -> np.ndarray:
    """On <bos> + x_1..x_L + x_1..x_L: mean over queries i = L+1..2L of A[i, i-L+1], the key just after the
    previous occurrence of the query's token (Olsson et al. 2022). pattern [..., query, key] -> [...]."""
    a = np.asarray(pattern, dtype=np.float64)
    L = repeat_len
    if a.shape[-2] < 2 * L + 1:
        raise ValueError(f"the pattern covers {a.shape[-2]} tokens; a repeat of length {L} needs {2 * L + 1}")
    i = np.arange(L + 1, 2 * L + 1)
    return a[..., i, i - L + 1].mean(axis=-1)


def sink_score(pattern) -> np.ndarray:
    """Mean over queries i >= 1 of A[i, 0], the attention parked on the first token (attnviz.stats.sink_mass).
    [..., query, key] -> [...]."""
    from attnviz.stats import sink_mass

    return sink_mass(pattern)


def build_model(config: LabConfig) -> PreTrainedModel:
    """A fresh model for the config's positional scheme, eager attention, no dropout, weights drawn from a
    generator seeded with config.seed (not the global RNG, which other threads may reseed at any time):
    N(0, 0.02) for matrices and embeddings, 1 for norm scales, 0 for biases."""
    d, h, n = config.d_model, config.n_heads, config.n_layers
    common = dict(vocab_size=VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=BOS_ID, pad_token_id=BOS_ID)
    if config.positional in ("learned", "sinusoidal"):
        cfg = GPT2Config(n_embd=d, n_head=h, n_layer=n, n_positions=N_POSITIONS, resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0, **common)
        cls = GPT2LMHeadModel
    elif config.positional == "rope":
        cfg = LlamaConfig(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=n, num_attention_heads=h,
                          num_key_value_heads=h, max_position_embeddings=N_POSITIONS, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)
        cls = LlamaForCausalLM
    elif config.positional == "alibi":
        cfg = BloomConfig(hidden_size=d, n_head=h, n_layer=n, hidden_dropout=0.0, attention_dropout=0.0, **common)
        cls = BloomForCausalLM
    else:
        raise ValueError(f"unknown positional scheme {config.positional!r}; choose one of {POSITIONAL}")
    cfg._attn_implementation = "eager"
    model = cls(cfg)
    model.set_attn_implementation("eager")
    g = torch.Generator().manual_seed(config.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * INIT_STD)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
        if config.positional == "sinusoidal":
            model.transformer.wpe.weight.copy_(torch.from_numpy(sinusoidal_encoding(N_POSITIONS, d)))
            model.transformer.wpe.weight.requires_grad_(False)
    return model


def task_loss(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) over the answer tokens: token j scored from logits at j-1."""
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits                     # [batch, n, vocab]
    target_mask = mask[:, 1:]                                  # [batch, n-1]
    return F.cross_entropy(logits[:, :-1][target_mask], ids[:, 1:][target_mask])


def head_scores(model: PreTrainedModel, probe: torch.Tensor, segment_len: int) -> dict[str, np.ndarray]:
    """Previous-token, induction and sink scores of every head on the probe batch (make_probe), from
    output_attentions: each row scored with its own repeat length (probe_lengths), then averaged over rows.
    Returns name -> [layer, head]."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(input_ids=probe, attention_mask=torch.ones_like(probe), output_attentions=True)
    model.train(was_training)
    pattern = torch.stack(out.attentions, dim=1).double().numpy()            # [batch, layer, head, query, key]
    lengths = probe_lengths(segment_len, probe.shape[0])
    return {"previous_token": previous_token_score(pattern).mean(axis=0),
            "induction": np.mean([induction_score(p, l) for p, l in zip(pattern, lengths)], axis=0),
            "sink": sink_score(pattern).mean(axis=0)}


@dataclass
class Checkpoint:
    """Statistics at one step: the recent training loss and every head's scores ([layer, head] each)."""

    step: int
    loss: float
    previous_token: np.ndarray
    induction: np.ndarray
    sink: np.ndarray


@dataclass
class RunSnapshot:
    """A consistent copy of a run's progress, safe to read while the run goes on."""

    config: LabConfig
    status: str                 # "ready", "running", "done", "stopped", "time limit", "failed"
    step: int
    losses: list[float]         # one per step, nats, answer tokens only
    checkpoints: list[Checkpoint]
    elapsed_s: float
    error: str | None = None
    saved_as: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("done", "stopped", "time limit", "failed")

    @property
    def progress(self) -> float:
        return self.step / self.config.steps


class LabBusyError(RuntimeError):
    """Raised when MAX_CONCURRENT_RUNS runs are already training."""


_ACTIVE: set[LabRun] = set()
_ACTIVE_LOCK = threading.Lock()


def active_runs() -> int:
    """How many runs are training right now in this process."""
    with _ACTIVE_LOCK:
        return len(_ACTIVE)


class LabRun:
    """One training run. It owns its model, optimiser and data generator; only its own thread touches them while it
    trains. Other threads read progress through snapshot() and ask it to end through stop().

    run() trains in the calling thread (tests, scripts); start() trains in a daemon thread and returns at once.
    """

    def __init__(self, config: LabConfig, *, auto_save: str | None = None, max_seconds: float = MAX_SECONDS):
        problems = config.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.config = config
        self.auto_save = auto_save
        self.max_seconds = max_seconds
        self.model = build_model(config)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._status = "ready"
        self._step = 0
        self._losses: list[float] = []
        self._checkpoints: list[Checkpoint] = []
        self._elapsed = 0.0
        self._error: str | None = None
        self._saved_as: str | None = None
        self._probe = make_probe(config.segment_len, n_letters=config.n_letters)
        self._checkpoint(0, float("nan"), self._probe)      # so every snapshot has the untrained scores

    def snapshot(self) -> RunSnapshot:
        with self._lock:
            return RunSnapshot(self.config, self._status, self._step, list(self._losses), list(self._checkpoints),
                               self._elapsed, self._error, self._saved_as)

    def stop(self) -> None:
        """Asks the run to end after the current step; the model keeps the weights it has reached."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> RunSnapshot:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.snapshot()

    def start(self) -> LabRun:
        """Trains in a background thread. Raises LabBusyError when MAX_CONCURRENT_RUNS runs are training."""
        with _ACTIVE_LOCK:
            if len(_ACTIVE) >= MAX_CONCURRENT_RUNS:
                raise LabBusyError(f"{len(_ACTIVE)} runs are already training on this server; try again shortly")
            _ACTIVE.add(self)
        self._set(status="running")
        self._thread = threading.Thread(target=self._train_in_thread, name="attnviz-lab", daemon=True)
        self._thread.start()
        return self

    def run(self) -> RunSnapshot:
        """Trains in the calling thread until done, stopped or out of time. Returns the final snapshot."""
        with self._lock:
            if self._status not in ("ready", "running"):
                raise RuntimeError(f"this run has already ended ({self._status}); start a new LabRun")
            self._status = "running"
        # One intra-op thread: a model this small gains nothing from more, and on a busy machine the threads of
        # several runs spin against each other (measured: 30x slower steps). The setting is per calling thread.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._train()
        finally:
            torch.set_num_threads(threads)

    def _train(self) -> RunSnapshot:
        cfg = self.config
        data = torch.Generator().manual_seed(cfg.seed)
        probe = self._probe
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01)
        warmup = max(1, min(50, cfg.steps // 10))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
        self.model.train()
        t0 = time.perf_counter()
        status = "done"
        try:
            for step in range(1, cfg.steps + 1):
                if self._stop.is_set():
                    status = "stopped"
                    break
                if time.perf_counter() - t0 > self.max_seconds:
                    status = "time limit"
                    break
                ids, mask = make_batch(cfg.task, cfg.batch_size, cfg.segment_len, data, cfg.n_letters)
                loss = task_loss(self.model, ids, mask)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                sched.step()
                self._set(step=step, loss=loss.item(), elapsed=time.perf_counter() - t0)
                if step % cfg.eval_every == 0 or step == cfg.steps:
                    recent = self._losses[-cfg.eval_every:]
                    self._checkpoint(step, float(np.mean(recent)), probe)
        except Exception as exc:  # reported through the snapshot: the page shows it instead of a dead thread
            status = "failed"
            self._set(error=f"{type(exc).__name__}: {exc}")
        self.model.eval()
        final = self.snapshot()
        if status != "failed" and final.checkpoints[-1].step != final.step:
            recent = final.losses[-cfg.eval_every:]
            self._checkpoint(final.step, float(np.mean(recent)) if recent else float("nan"), probe)
        if self.auto_save and status != "failed":
            try:
                self.save(self.auto_save)
            except Exception as exc:
                self._set(error=f"training ended but saving failed: {type(exc).__name__}: {exc}")
        self._set(status=status, elapsed=time.perf_counter() - t0)
        return self.snapshot()

    def save(self, name: str) -> Path:
        """Writes the model (safetensors) and the byte tokenizer to trained_dir()/name, plus lab.json (config and
        history), replacing any folder of that name. The Heads page lists it as the model "lab/<name>"."""
        if not _NAME.match(name):
            raise ValueError("a name is 1-48 lowercase letters, digits, '-', '_' or '.', starting with a letter "
                             "or digit")
        with self._lock:
            if self._status == "running" and threading.current_thread() is not self._thread \
                    and self._thread is not None:
                raise RuntimeError("the run is still training; stop it or wait for it to finish, then save")
        snap = self.snapshot()
        target = trained_dir() / name
        tmp = Path(tempfile.mkdtemp(prefix=".lab-", dir=cache_dir()))
        try:
            self.model.save_pretrained(tmp, safe_serialization=True)
            byte_tokenizer().save_pretrained(tmp)
            (tmp / "lab.json").write_text(json.dumps(_history(snap), indent=1))
            old = None
            if target.exists():
                old = Path(tempfile.mkdtemp(prefix=".lab-old-", dir=cache_dir()))
                os.replace(target, old / name)
            os.replace(tmp, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        self._set(saved_as=name)
        return target

    def _train_in_thread(self) -> None:
        try:
            self.run()
        finally:
            with _ACTIVE_LOCK:
                _ACTIVE.discard(self)

    def _checkpoint(self, step: int, loss: float, probe: torch.Tensor) -> None:
        scores = head_scores(self.model, probe, self.config.segment_len)
        with self._lock:
            self._checkpoints.append(Checkpoint(step, loss, scores["previous_token"], scores["induction"],
                                                scores["sink"]))

    def _set(self, *, status=None, step=None, loss=None, elapsed=None, error=None, saved_as=None) -> None:
        with self._lock:
            if status is not None:
                self._status = status
            if step is not None:
                self._step = step
            if loss is not None:
                self._losses.append(loss)
            if elapsed is not None:
                self._elapsed = elapsed
            if error is not None:
                self._error = error
            if saved_as is not None:
                self._saved_as = saved_as


def _history(snap: RunSnapshot) -> dict:
    """The run as JSON: config, final status, per-step losses and per-checkpoint head scores."""
    return {
        "config": asdict(snap.config),
        "architecture": ARCHITECTURE[snap.config.positional],
        "status": snap.status,
        "steps_trained": snap.step,
        "chance_loss": chance_loss(snap.config.n_letters),
        "losses": snap.losses,
        "checkpoints": [{"step": c.step, "loss": None if math.isnan(c.loss) else c.loss,
                         "previous_token": c.previous_token.tolist(), "induction": c.induction.tolist(),
                         "sink": c.sink.tolist()} for c in snap.checkpoints],
    }


def saved_runs() -> list[str]:
    """Names of the models saved by the lab (folders under trained_dir() holding a lab.json), sorted."""
    return sorted(p.name for p in trained_dir().iterdir() if (p / "lab.json").is_file())
