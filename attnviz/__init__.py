"""attnviz: see how attention works, in real and toy transformers.

The library does every computation; the Streamlit pages only read widgets, call it and draw.
Only attnviz.ui imports streamlit; attnviz.figures imports neither torch nor streamlit.

From a notebook or a script:
    import attnviz
    cap = attnviz.capture("smollm2-135m", "The cat sat on the mat.")   # or (model, text, tokenizer=tokenizer)
    cap.head_pattern(3, 0); cap.stats(); cap.save("cap.npz"); cap.to_attentions()
    attnviz.from_attentions(outputs.attentions, tokens)                # any tool's output_attentions
    attnviz.knockout("smollm2-135m", text, layer=9, answer=" Paris").to_frame()   # and patching, logit_attribution,
    # qk_attribution, attention_flow, rollout, generate: attnviz.front

`import attnviz` itself imports nothing else (not torch, triton nor streamlit) and changes no environment variable:
the names below are imported on first use. Triton's backend is chosen by attnviz.kernels, when it is imported.
"""

import importlib
import sys
import types

__version__ = "0.1.0"

# name -> the module it lives in. attnviz.capture, and the experiments' modules knockout, patching,
# logit_attribution, qk_attribution and rollout, are themselves callable: each door is opened by its front door's
# module (attnviz.capture.front, attnviz.front; attnviz.doors), which is imported before the module is handed out
_DOORS = {"capture": "attnviz.capture.front",
          **{name: "attnviz.front" for name in ("knockout", "patching", "logit_attribution", "qk_attribution",
                                                "rollout")}}
_EXPORTS = {"capture": "attnviz.capture", "AttentionCapture": "attnviz.capture", "CaptureError": "attnviz.capture",
            "from_attentions": "attnviz.capture", "load_capture": "attnviz.capture",
            "corpus_run": "attnviz.corpus", "CorpusRun": "attnviz.corpus", "CorpusError": "attnviz.corpus",
            "AttnvizError": "attnviz.errors",
            **{name: f"attnviz.{name}" for name in _DOORS},
            "attention_flow": "attnviz.front", "generate": "attnviz.front", "ExperimentError": "attnviz.front"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _door(name: str) -> property:
    """attnviz.<name>: the module, its front door open. Python sets attnviz.<name> itself whenever the module is
    imported (by any `import attnviz.<name>`), so a plain lazy name would be replaced by the bare module: this
    property is read instead. While the module is still being imported, it is handed out as it is."""
    def get(package: types.ModuleType) -> types.ModuleType:
        module = sys.modules.get(f"attnviz.{name}")
        if module is None or not getattr(module.__spec__, "_initializing", False):
            importlib.import_module(_DOORS[name])
        return importlib.import_module(f"attnviz.{name}")

    def put(package: types.ModuleType, module: types.ModuleType) -> None:
        package.__dict__[name] = module

    return property(get, put)


# attnviz itself, with the front doors as properties
sys.modules[__name__].__class__ = type("_Package", (types.ModuleType,), {name: _door(name) for name in _DOORS})
