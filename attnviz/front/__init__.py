"""The front door of the experiments, beside attnviz.capture: each takes the model as capture does (a name, a
folder, a .gguf file, or a transformers model object with tokenizer=, lent and left exactly as it was), a text as
text or token ids, answers as strings of one token or token ids, and one spelling of its keywords (layer, head,
query, key, answer, wrong, position); each returns a result with .to_frame() (a tidy DataFrame), a notebook view
and .save(path).

    attnviz.knockout(model, text, layer=, head=, answer=)        head knock-outs          KnockoutResults
    attnviz.patching(model, clean, corrupted, answer=, wrong=)   activation patching      PatchingResults
        method="attribution": attribution patching (AtP)
    attnviz.logit_attribution(model, text, answer=, wrong=)      direct logit attribution LogitAttributionResults
    attnviz.qk_attribution(model, text, layer=, head=, query=, key=)  one score's parts   QKAttributionResults
    attnviz.attention_flow(model, text, query=, layer=)          attention flow           FlowResults
    attnviz.rollout(model, text, layer=)                         attention rollout        RolloutResults
    attnviz.generate(model, text, max_new_tokens=)               attention at each step   GenerationResults

The package, from the bottom up: inputs (checks, ExperimentError, the model lent), results (the result objects and
their views), experiments (the seven functions, each a wrapper of its module's own function: the maths stays there).
attnviz.knockout, .patching, .logit_attribution, .qk_attribution and .rollout are those modules, made callable
(attnviz.doors)."""

from attnviz.front.experiments import (attention_flow, generate, knockout, logit_attribution, patching,
                                       qk_attribution, rollout)
from attnviz.front.inputs import ExperimentError
from attnviz.front.results import (FlowResults, GenerationResults, KnockoutResults, LogitAttributionResults,
                                   PatchingResults, QKAttributionResults, Result, RolloutResults)

__all__ = ["ExperimentError", "FlowResults", "GenerationResults", "KnockoutResults", "LogitAttributionResults",
           "PatchingResults", "QKAttributionResults", "Result", "RolloutResults", "attention_flow", "generate",
           "knockout", "logit_attribution", "patching", "qk_attribution", "rollout"]
