"""One home for intervening on a model: named sites, one per-thread mechanism to read, zero and replace them, and
the batching every experiment shares. Knock-outs (attnviz.knockout), activation and attribution patching
(attnviz.patching), direct logit attribution (attnviz.logit_attribution), QK attribution (attnviz.qk_attribution)
and the massive-activation edit (attnviz.massive) all run through it, side by side.

Sites, in the TransformerLens manner, as tuples (kind, layer, index) (tuples rather than strings: a batch builds
thousands of them and the UI's grids index them by layer and head or position):

  ("heads", layer, head)     a head's output before the output projection (hook_z), at every position
  ("resid", layer, position) the residual stream entering block `layer` (hook_resid_pre)
  ("attn", layer, position)  the attention module's output (hook_attn_out)
  ("mlp", layer, position)   the MLP's output (hook_mlp_out)
  ("out", layer, position)   the block's output (hook_resid_post)

Reading. read(model, ids) -> ({(kind, layer): [n, d]}, logits): every site's tensor in one plain run.

Editing. A Plan says what one forward pass of `rows` rows does: Plan.edit((kind, layer), edit) with edit a
Replace (a mask and a value over [rows, n, d]: batch_edits builds one per (kind, layer) for a whole batch) or a
Put (x[row, position, columns] = value; zero(site) and replace(site, value) make them for one site). run(model,
ids, plan) gives [rows, n, vocab] logits; applied(model, plan) applies the plan to every forward pass this thread
runs inside the block (the capture, a loss, a backward pass).

Batches. Each row carries its own edits; share_prefix sets plan.expand_at to the lowest edited layer, so the layers
below it run once for one row and are copied to every row (checked once per model by prefix_ok against a plain
forward pass; a family where that does not hold, as BLOOM with its per-row ALiBi, runs full rows). Callers sort their
rows by first layer so each batch shares as many layers as it can.

Threads. Every hook reads this thread's plan from a ContextVar and does nothing without one, so two sessions on one
cached model never see each other's edits; the hooks are installed by the first user and removed by the last
(HOOKS, an attnviz.capture.SharedHooks).
"""

from attnviz.interventions.hooks import (HOOKS, SHARED_PREFIX, applied, current, prefix_ok, read, run,
                                         share_prefix)
from attnviz.interventions.sites import (KINDS, MLP_NAMES, READ_ONLY, Edit, InterventionError, Key, Plan, Put,
                                         Replace, Site, as_ids, batch_edits, blocks, check_text, first_layer,
                                         mlp_module, replace, zero)

__all__ = ["HOOKS", "KINDS", "MLP_NAMES", "READ_ONLY", "SHARED_PREFIX", "Edit", "InterventionError", "Key", "Plan",
           "Put", "Replace", "Site", "applied", "as_ids", "batch_edits", "blocks", "check_text", "current",
           "first_layer", "mlp_module", "prefix_ok", "read", "replace", "run", "share_prefix", "zero"]
