"""The toy lab: train a small real-architecture transformer on a synthetic task or on text, and watch its heads
(previous-token, induction, sinks) form. One module per idea:

- attnviz.lab.tasks: the tasks, and the probes the head scores are measured on;
- attnviz.lab.config: LabConfig, everything that determines a run;
- attnviz.lab.variants: the model each config builds (a transformers architecture per positional scheme, and
  four attention variants on one gpt-oss skeleton: softmax, off-by-one, learned sink, head-wise gate);
- attnviz.lab.training: the loss, the head scores (attnviz.stats' and attnviz.diagnostics' definitions),
  checkpoints and LabRun (trains in a background thread, polled by snapshot());
- attnviz.lab.comparison: VariantComparison, the attention variants trained side by side, and their maps;
- attnviz.lab.qwen3_next: transformers' Qwen3-Next at toy size: the hybrid (Gated DeltaNet layers, one gated
  softmax layer), its softmax model and that model with its output gate held open;
- attnviz.lab.hybrid: HybridComparison, those three trained side by side, every layer's map (a Gated DeltaNet
  layer's implicit map, attnviz.mixers) with its scores on |w|, and the sink metric over training;
- attnviz.lab.storage: the saved folder (safetensors, tokenizer, LAB_FILE) that opens everywhere as lab/<name>,
  its owner, and the limits on what visitors keep.

The names below are the lab's public surface; `from attnviz import lab` then `lab.LabRun(lab.LabConfig())`.
"""

from attnviz.lab.config import (ATTENTION, ATTENTION_INFO, MAX_SECONDS, MAX_STEPS, POSITIONAL, VARIANTS,
                                LabConfig)
from attnviz.lab.storage import (LAB_FILE, MAX_NAME, NameTaken, QuotaExceeded, StorageRefused, read_history,
                                 saved_history, saved_runs)
from attnviz.lab.tasks import (ALPHABET, BOS_ID, LETTER_TASKS, PROBE_BATCH, PROBE_SEED, SEPARATOR, TASK_INFO, TASKS,
                               chance_loss, example_text, make_batch, make_probe, probe_lengths, target_patterns,
                               text_probe)
from attnviz.lab.comparison import VariantComparison, weight_on_tokens
from attnviz.lab.training import (MAX_CONCURRENT_RUNS, Checkpoint, LabBusyError, LabError, LabRun, LabStateError,
                                  RunSnapshot, active_runs, head_scores, task_loss)
from attnviz.lab.variants import ARCHITECTURE, INIT_STD, N_POSITIONS, architecture, build_model
from attnviz.lab.hybrid import HybridComparison, LayerMaps, layer_maps

__all__ = ["ALPHABET", "ARCHITECTURE", "ATTENTION", "ATTENTION_INFO", "BOS_ID", "INIT_STD", "LAB_FILE",
           "MAX_CONCURRENT_RUNS", "MAX_NAME", "MAX_SECONDS", "MAX_STEPS", "N_POSITIONS", "POSITIONAL", "PROBE_BATCH",
           "PROBE_SEED", "SEPARATOR", "TASKS", "LETTER_TASKS", "TASK_INFO", "VARIANTS",
           "Checkpoint", "HybridComparison", "LabBusyError", "LayerMaps", "LabError", "LabStateError",
           "LabConfig", "LabRun", "NameTaken", "QuotaExceeded", "RunSnapshot", "StorageRefused", "VariantComparison",
           "active_runs", "architecture", "build_model", "chance_loss", "example_text", "head_scores", "layer_maps",
           "make_batch", "make_probe", "probe_lengths", "read_history", "saved_history", "saved_runs",
           "target_patterns", "task_loss", "text_probe", "weight_on_tokens"]
