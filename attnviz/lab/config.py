"""LabConfig: everything that determines a toy-lab run (same config, same weights, same losses), and its limits."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from attnviz.lab.tasks import ALPHABET, TASKS

POSITIONAL = ("learned", "sinusoidal", "rope", "alibi")
# "standard": the positional scheme's own architecture (below). The four others are the same gpt-oss skeleton
# (RoPE, one dense expert) that differs only in its attention, so they can be trained side by side.
ATTENTION = ("standard", "softmax", "off_by_one", "learned_sink", "gated")
ATTENTION_INFO = {
    "standard": "the positional scheme's own architecture",
    "softmax": "plain softmax (gpt-oss skeleton, sink logit fixed at -inf)",
    "off_by_one": "softmax with 1 added to the denominator (a sink logit fixed at 0)",
    "learned_sink": "a learned sink logit per head (gpt-oss's attention sinks)",
    "gated": "softmax, then a sigmoid gate per head on the attention output (gated attention)",
}
VARIANTS = ATTENTION[1:]
MAX_STEPS = 3000          # one run never trains longer than this...
MAX_SECONDS = 240.0       # ...nor longer than this, so nobody holds the shared CPU for long
MAX_TEXT_LEN = 128


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
    attention: str = "standard"
    text_len: int = 64      # tokens per row of the text task (<bos> included); Gu et al. measure on 64
    weight_decay: float = 0.01  # AdamW's; Gu et al. find that more weight decay makes sinks emerge sooner

    def problems(self) -> list[str]:
        """What is wrong with this config, in words a page can show; empty when it is usable."""
        out = []
        if self.task not in TASKS:
            out.append(f"task must be one of {', '.join(TASKS)}")
        if self.positional not in POSITIONAL:
            out.append(f"positional scheme must be one of {', '.join(POSITIONAL)}")
        if self.attention not in ATTENTION:
            out.append(f"attention must be one of {', '.join(ATTENTION)}")
        elif self.attention != "standard" and self.positional != "rope":
            out.append("the attention variants are built on gpt-oss, which uses RoPE: choose rope positions")
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
        if not 8 <= self.text_len <= MAX_TEXT_LEN:
            out.append(f"text rows must be between 8 and {MAX_TEXT_LEN} tokens")
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
        if not 0.0 <= self.weight_decay <= 1.0:
            out.append("weight decay must be between 0 and 1")
        if not 1 <= self.eval_every <= MAX_STEPS:
            out.append(f"checkpoint interval must be between 1 and {MAX_STEPS} steps")
        return out

    @property
    def seq_len(self) -> int:
        """Tokens per training sequence, <bos> included: 1 + L + 1 + L for the letter tasks, text_len for text."""
        return self.text_len if self.task == "text" else 2 * self.segment_len + 2

    def default_name(self) -> str:
        """A folder name that identifies the run: same config, same name (a digest of every field ends it)."""
        fields = asdict(self)
        # so older runs keep their names
        for name, default in (("attention", "standard"), ("text_len", 64), ("weight_decay", 0.01)):
            if fields[name] == default:
                del fields[name]
        digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:6]
        kind = self.positional if self.attention == "standard" else self.attention.replace("_", "-")
        return f"{self.task}-{kind}-{self.steps}steps-seed{self.seed}-{digest}"
