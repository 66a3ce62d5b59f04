"""Training a toy-lab run: the loss, the head scores at each checkpoint, and LabRun, which trains in a background
thread and is polled through snapshot(). Runs never share mutable state, so one session cannot disturb another's."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from attnviz.errors import AttnvizError
from attnviz.lab.config import MAX_SECONDS, LabConfig
from attnviz.lab.storage import StorageRefused, check_name, save_folder
from attnviz.lab.tasks import make_batch, make_probe, probe_lengths, text_probe
from attnviz.lab.variants import build_model
from attnviz.diagnostics import repeated_token_scores
from attnviz.sinks import sink_rate, sink_scores
from attnviz.stats import previous_token_score, sink_mass
from attnviz import budget

MAX_CONCURRENT_RUNS = 2   # the app's host has few cores; a third run waits for one to finish
log = logging.getLogger(__name__)


def task_loss(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) over the answer tokens: token j scored from logits at j-1."""
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits                     # [batch, n, vocab]
    target_mask = mask[:, 1:]                                  # [batch, n-1]
    return F.cross_entropy(logits[:, :-1][target_mask], ids[:, 1:][target_mask])


def _patterns(model: PreTrainedModel, probe: torch.Tensor) -> np.ndarray:
    """[batch, layer, head, query, key] float64 attention weights from output_attentions (eager attention)."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(input_ids=probe, attention_mask=torch.ones_like(probe), output_attentions=True)
    model.train(was_training)
    return torch.stack(out.attentions, dim=1).double().numpy()


def head_scores(model: PreTrainedModel, probe: torch.Tensor, segment_len: int,
                sink_probe: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """Previous-token, induction and sink scores of every head on the probe batch (make_probe), from
    output_attentions: each row scored with its own repeat length (probe_lengths), then averaged over rows
    (name -> [layer, head]); and "alpha0" [row, layer, head], Gu et al.'s alpha_0 of every head on each row of
    sink_probe (the task's texts; the probe itself when None), for the sink metric (attnviz.sinks.sink_rate)."""
    pattern = _patterns(model, probe)
    lengths = probe_lengths(segment_len, probe.shape[0])
    sink_pattern = pattern if sink_probe is None else _patterns(model, sink_probe)
    induction = [repeated_token_scores(p, l, start=1)["prefix_matching"] for p, l in zip(pattern, lengths)]
    return {"previous_token": previous_token_score(pattern).mean(axis=0),
            "induction": np.mean(induction, axis=0),
            "sink": sink_mass(pattern).mean(axis=0),
            "alpha0": sink_scores(sink_pattern)[..., 0]}


@dataclass
class Checkpoint:
    """Statistics at one step: the recent training loss, every head's scores ([layer, head] each) and the sink
    metric Sink_0^0.3 over the task's probe texts (attnviz.sinks.sink_rate of alpha0 [text, layer, head])."""

    step: int
    loss: float
    previous_token: np.ndarray
    induction: np.ndarray
    sink: np.ndarray
    sink_rate: float = float("nan")
    alpha0: np.ndarray | None = None


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


class LabError(AttnvizError, ValueError):
    """A toy-lab run cannot be made with these settings; the message says which are wrong."""


class LabStateError(AttnvizError, RuntimeError):
    """A toy-lab run was asked for something its state does not allow (saved while training, started twice)."""


class LabBusyError(AttnvizError, RuntimeError):
    """Raised when MAX_CONCURRENT_RUNS runs are already training."""


_ACTIVE: dict = {}  # owner -> the bytes of the memory budget its training holds
_ACTIVE_LOCK = threading.Lock()


def training_bytes(config) -> int:
    """Estimated peak bytes of training `config`: the parameters with their gradients and AdamW's two moments
    (4 float32 copies), and the activations kept for the backward pass (about 16 d_model values per token and
    layer, and each head's scores, weights and their gradients, 3 per (query, key)), doubled for the backward
    pass's own buffers. A 257-token vocabulary (the byte tokenizer) and a 4 d_model MLP."""
    d, n_layers, t = config.d_model, config.n_layers, config.seq_len
    params = 257 * d * 2 + n_layers * 12 * d * d + t * d
    activations = config.batch_size * n_layers * t * (16 * d + 3 * config.n_heads * t)
    return 4 * (4 * params + 2 * activations)


def active_runs() -> int:
    """How many runs are training right now in this process."""
    with _ACTIVE_LOCK:
        return len(_ACTIVE)


def take_slot(owner) -> None:
    """Takes one of the MAX_CONCURRENT_RUNS training slots of this process for `owner` (a LabRun, or a
    VariantComparison training several runs in one thread); LabBusyError when none is free."""
    with _ACTIVE_LOCK:
        if len(_ACTIVE) >= MAX_CONCURRENT_RUNS:
            raise LabBusyError(f"{len(_ACTIVE)} runs are already training on this server; try again shortly")
        try:  # never waits: a visitor whose run cannot start now is told so and tries again
            configs = [r.config for r in owner.runs.values()] if hasattr(owner, "runs") else [owner.config]
            need = sum(training_bytes(c) for c in configs)  # a comparison trains its runs side by side
            _ACTIVE[owner] = budget.BUDGET.acquire(need, timeout=0, what="This training run")
        except TimeoutError:
            raise LabBusyError("other visitors' work holds this server's memory right now; try again shortly") \
                from None
        except budget.OverBudget as exc:
            raise LabBusyError(str(exc).rstrip(".")) from None


def train_in_slot(owner, name: str) -> threading.Thread:
    """Starts owner.run() in a daemon thread that gives owner's slot (take_slot) back when it ends."""
    def train() -> None:
        try:
            owner.run()
        finally:
            with _ACTIVE_LOCK:
                budget.BUDGET.release(_ACTIVE.pop(owner, 0))

    thread = threading.Thread(target=train, name=name, daemon=True)
    thread.start()
    return thread


class LabRun:
    """One training run. It owns its model, optimiser and data generator; only its own thread touches them while it
    trains. Other threads read progress through snapshot() and ask it to end through stop().

    run() trains in the calling thread (tests, scripts); start() trains in a daemon thread and returns at once.
    on_checkpoint(checkpoint), when given, is called in the training thread after each checkpoint (a benchmark
    stops a run there once its sink metric passes a threshold).
    model, when given, is trained instead of build_model(config) (the config still sets the task and the training);
    a subclass measures its own statistics by overriding measure().
    owner: who saves it (attnviz.lab.storage: an opaque token, one per visitor; None for scripts). auto_save names
    the folder saved when training ends; should another owner hold that name, the first free "<name>-k" is used.
    """

    def __init__(self, config: LabConfig, *, auto_save: str | None = None, owner: str | None = None,
                 max_seconds: float = MAX_SECONDS, on_checkpoint=None, model: PreTrainedModel | None = None):
        problems = config.problems()
        if problems:
            raise LabError("; ".join(problems))
        self.config = config
        self.auto_save = auto_save
        self.owner = owner
        self.max_seconds = max_seconds
        self.on_checkpoint = on_checkpoint
        self.model = build_model(config) if model is None else model
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
        self._sink_probe = text_probe(config.text_len) if config.task == "text" else None
        self._checkpoint(0, float("nan"))      # so every snapshot has the untrained scores

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
        take_slot(self)
        self._set(status="running")
        self._thread = train_in_slot(self, "attnviz-lab")
        return self

    def run(self) -> RunSnapshot:
        """Trains in the calling thread until done, stopped or out of time. Returns the final snapshot."""
        with self._lock:
            if self._status not in ("ready", "running"):
                raise LabStateError(f"this run has already ended ({self._status}); start a new LabRun")
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
        for _ in self.steps():
            pass
        return self.snapshot()

    def steps(self):
        """The training loop as a generator that yields after every step (and once at the end), so that a caller
        can interleave several runs in one thread (VariantComparison). The caller sets torch's thread count."""
        cfg = self.config
        data = torch.Generator().manual_seed(cfg.seed)
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
        warmup = max(1, min(50, cfg.steps // 10))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
        self.model.train()
        t0 = time.perf_counter()
        status = "done"
        self._set(status="running")
        try:
            for step in range(1, cfg.steps + 1):
                if self._stop.is_set():
                    status = "stopped"
                    break
                if time.perf_counter() - t0 > self.max_seconds:
                    status = "time limit"
                    break
                ids, mask = make_batch(cfg.task, cfg.batch_size, cfg.segment_len, data, cfg.n_letters, cfg.text_len)
                loss = task_loss(self.model, ids, mask)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                sched.step()
                self._set(step=step, loss=loss.item(), elapsed=time.perf_counter() - t0)
                if step % cfg.eval_every == 0 or step == cfg.steps:
                    recent = self._losses[-cfg.eval_every:]
                    self._checkpoint(step, float(np.mean(recent)))
                yield step
        except Exception:  # reported through the snapshot: the page says so instead of leaving a dead thread
            log.exception("toy-lab training failed (%s)", cfg)
            status = "failed"
            self._set(error="training failed at this step; the server's log has the details")
        self.model.eval()
        final = self.snapshot()
        if status != "failed" and final.checkpoints[-1].step != final.step:
            recent = final.losses[-cfg.eval_every:]
            self._checkpoint(final.step, float(np.mean(recent)) if recent else float("nan"))
        if self.auto_save and status != "failed":
            try:
                self.save(self.auto_save, rename=True)  # the visitor never chose this name: take a free one
            except StorageRefused as exc:
                self._set(error=f"training ended, but the model was not saved: {exc}")
            except Exception:
                log.exception("saving a toy-lab run failed")
                self._set(error="training ended, but the model could not be saved; the server's log has the "
                                "details")
        self._set(status=status, elapsed=time.perf_counter() - t0)
        yield self._step

    def save(self, name: str, *, rename: bool = False) -> Path:
        """Writes the model (safetensors) and the byte tokenizer to trained_dir()/name, plus the lab file (config,
        history and owner: attnviz.lab.storage.save_folder), replacing this owner's folder of that name. Another
        owner's name raises NameTaken, or with rename=True is saved as the first free "<name>-k"; a limit passed
        raises QuotaExceeded. Every page lists the folder as "lab/<its name>"."""
        check_name(name)
        with self._lock:
            if self._status == "running" and threading.current_thread() is not self._thread \
                    and self._thread is not None:
                raise LabStateError("the run is still training; stop it or wait for it to finish, then save")
        target = save_folder(self.model, self.snapshot(), name, self.owner, rename=rename)
        self._set(saved_as=target.name)
        return target

    def measure(self, step: int, loss: float) -> Checkpoint:
        """The statistics at `step`: every head's scores on the probe and the sink metric (head_scores)."""
        scores = head_scores(self.model, self._probe, self.config.segment_len, self._sink_probe)
        return Checkpoint(step, loss, scores["previous_token"], scores["induction"], scores["sink"],
                          sink_rate(scores["alpha0"]), scores["alpha0"])

    def _checkpoint(self, step: int, loss: float) -> None:
        checkpoint = self.measure(step, loss)
        with self._lock:
            self._checkpoints.append(checkpoint)
        if self.on_checkpoint is not None and step > 0:
            self.on_checkpoint(checkpoint)

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

