"""One set of hooks on a model for every intervention: each site's hook reads this thread's Plan (a ContextVar)
and does nothing without one, so sessions sharing one cached model stay independent; the hooks are shared and
counted (attnviz.capture.SharedHooks): the first user installs them, the last removes them."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from functools import partial

import torch

from attnviz import lm
from attnviz.capture import SharedHooks, numbered_attention
from attnviz.interventions.sites import InterventionError, Key, Plan, blocks, mlp_module
from attnviz.projection import KnockoutError, output_projection

_PLAN: ContextVar[Plan | None] = ContextVar("attnviz_interventions", default=None)
SHARED_PREFIX: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> whether prefix_ok holds


def current() -> Plan | None:
    """The plan this thread runs under now (None outside any)."""
    return _PLAN.get()


def _site(plan: Plan, key: Key, x: torch.Tensor) -> torch.Tensor:
    """x [rows, n, d] at a site as the plan wants it: its edits, then recorded, then its delta added."""
    for edit in plan.edits.get(key, ()):
        x = edit(x)
    if plan.wants(key[0]):
        if plan.record is not None:
            plan.record[key] = x[0].detach().cpu().clone()
        if plan.deltas is not None:
            plan.deltas[key] = torch.zeros_like(x, requires_grad=True)
            x = x + plan.deltas[key]
    return x


def _block_input(layer: int, module, args, kwargs):
    plan = _PLAN.get()
    if plan is None:
        return None
    hidden = args[0] if args else kwargs["hidden_states"]
    new = hidden.expand(plan.rows, *hidden.shape[1:]) if plan.expand_at == layer else hidden
    new = _site(plan, ("resid", layer), new)
    if new is hidden:
        return None
    return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})


def _module_output(key: Key, module, args, output):
    plan = _PLAN.get()
    if plan is None:
        return None
    first = output[0] if isinstance(output, tuple) else output
    new = _site(plan, key, first)
    if new is first:
        return None
    return (new, *output[1:]) if isinstance(output, tuple) else new


def _projection_input(layer: int, module, args):
    plan = _PLAN.get()
    if plan is None:
        return None
    new = _site(plan, ("heads", layer), args[0])
    return None if new is args[0] else (new, *args[1:])


def _attention_input(layer: int, module, args, kwargs):
    plan = _PLAN.get()
    if plan is None or plan.record is None or not plan.wants("rope"):
        return None
    if kwargs.get("position_embeddings") is not None:
        cos, sin = kwargs["position_embeddings"]
        plan.record[("rope", layer)] = (cos[0].detach().double().cpu(), sin[0].detach().double().cpu())
    return None


def _install(model) -> list:
    handles = []
    for layer, attn in numbered_attention(model).items():  # model layers: a hybrid's attention may be layer 3
        try:
            projection = output_projection(model, layer)
        except KnockoutError:  # no head sites in this family; the others stay
            projection = None
        if projection is not None:
            handles.append(projection.register_forward_pre_hook(partial(_projection_input, layer)))
        handles.append(attn.register_forward_pre_hook(partial(_attention_input, layer), with_kwargs=True))
        handles.append(attn.register_forward_hook(partial(_module_output, ("attn", layer))))
    for layer, block in enumerate(blocks(model) or []):
        handles.append(block.register_forward_pre_hook(partial(_block_input, layer), with_kwargs=True))
        handles.append(block.register_forward_hook(partial(_module_output, ("out", layer))))
        mlp = mlp_module(block, required=False)
        if mlp is not None:
            handles.append(mlp.register_forward_hook(partial(_module_output, ("mlp", layer))))
    return handles


HOOKS = SharedHooks(_install)  # every site's hook, shared by concurrent users of one model


@contextlib.contextmanager
def applied(model, plan: Plan) -> Iterator[Plan]:
    """Every forward pass this thread runs inside the block goes through `plan`; other threads see the model as it
    is. Yields the plan (its record and deltas fill as the model runs)."""
    with HOOKS.serving(model, _PLAN, plan):
        yield plan


def run(model, ids: torch.Tensor, plan: Plan) -> torch.Tensor:
    """[rows, n, vocab] float32 logits of ids [1, n] under `plan` (rows = plan.rows; without expand_at the ids are
    copied to every row, with it the blocks below expand_at run once)."""
    if plan.expand_at is None:
        ids = ids.expand(plan.rows, -1)
    with applied(model, plan), torch.inference_mode():
        logits = lm.next_token_logits(model, ids, attention_mask=torch.ones_like(ids))
    if logits.shape[0] != plan.rows:
        raise InterventionError("The shared first layers did not expand to every row.")
    return logits


def read(model, ids: torch.Tensor, kinds: tuple[str, ...] | None = None) -> tuple[dict, torch.Tensor]:
    """({(kind, layer): [n, d]} every site's activation of `kinds` (None: every kind) in a plain run of ids [1, n],
    its [n, vocab] logits). The edits of a plan this thread is already under apply."""
    plan = Plan(record={}, kinds=kinds).following(current())
    logits = run(model, ids, plan)
    return plan.record, logits[0]


def prefix_ok(model, ids: torch.Tensor) -> bool:
    """Whether running the untouched first layers once and copying them to every row gives the plain forward pass
    (once per model; families whose blocks take per-row inputs, as BLOOM's ALiBi, do not)."""
    ok = SHARED_PREFIX.get(model)
    if ok is None:
        n_blocks = len(blocks(model) or [])
        ok = False
        if n_blocks > 1:
            try:
                plain = run(model, ids, Plan())
                shared = run(model, ids, Plan(expand_at=n_blocks - 1, rows=2))
                ok = bool(torch.allclose(shared, plain.expand_as(shared), atol=1e-4, rtol=1e-4))
            except Exception:
                ok = False
        SHARED_PREFIX[model] = ok
    return ok


def share_prefix(model, ids: torch.Tensor, plan: Plan, first: int | None) -> Plan:
    """The plan with expand_at = first (the lowest layer it edits) where that is above layer 0, the plan has
    several rows and the model's blocks allow it (prefix_ok); returns the plan."""
    if plan.rows > 1 and first and prefix_ok(model, ids):
        plan.expand_at = first
    return plan
