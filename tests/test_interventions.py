"""attnviz.interventions: every site kind read, zeroed and replaced on a tiny model, each against a copy of the
model whose module is edited by a hook written here (found by the family's own attribute names, not by attnviz);
batches sharing their first layers against one copy per row; two threads with two plans; hooks gone afterwards."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from attnviz import interventions as iv
from attnviz.models import load_model

TEXT = "When Mary and John went to the store, John gave a drink to"
TOYS = ("toy-llama-gqa", "toy-gpt2")
SITES = [("heads", 1, 2), ("resid", 1, 5), ("attn", 0, 7), ("mlp", 1, 3), ("out", 0, 1), ("resid", 0, 0)]


@pytest.fixture(scope="module", params=TOYS)
def toy(request):
    return load_model(request.param)


def _ids(loaded) -> torch.Tensor:
    return torch.tensor([loaded.tokenizer(TEXT).input_ids])


def _module(model, kind: str, layer: int) -> tuple[torch.nn.Module, str]:
    """The module carrying a site, by the family's attribute names, and whether its input or output is the site."""
    block = model.model.layers[layer] if hasattr(model, "model") else model.transformer.h[layer]
    attn = block.self_attn if hasattr(block, "self_attn") else block.attn
    return {"heads": (getattr(attn, "o_proj", None) or getattr(attn, "c_proj", None), "input"),
            "resid": (block, "input"), "attn": (attn, "output"), "mlp": (block.mlp, "output"),
            "out": (block, "output")}[kind]


def _hook(model, kind: str, layer: int, fn):
    """fn(tensor [rows, n, d]) -> tensor on the site's tensor, by a hook written here."""
    module, where = _module(model, kind, layer)
    if where == "output":
        def post(m, args, out):
            return (fn(out[0]), *out[1:]) if isinstance(out, tuple) else fn(out)
        return module.register_forward_hook(post)

    def pre(m, args, kwargs):
        if args:
            return (fn(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}
    return module.register_forward_pre_hook(pre, with_kwargs=True)


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits.float()


def _hand_edited(loaded, ids, sites_values) -> torch.Tensor:
    """[n, vocab] logits of a copy of the model whose sites are set by hooks written here: {site: value}."""
    model, heads = copy.deepcopy(loaded.model), loaded.shape.heads
    for (kind, layer, index), value in sites_values.items():
        def edit(x, kind=kind, index=index, value=value):
            x = x.clone()
            if kind == "heads":
                d_v = x.shape[-1] // heads
                x[:, :, index * d_v:(index + 1) * d_v] = value
            else:
                x[:, index] = value
            return x
        _hook(model, kind, layer, edit)
    return _logits(model, ids)[0]


def _hooks_on(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_read_gives_what_each_module_saw(toy):
    ids, seen, handles = _ids(toy), {}, []
    for kind in iv.KINDS:
        for layer in range(toy.shape.layers):
            def keep(x, key=(kind, layer)):
                seen[key] = x[0].detach().clone()
                return x
            handles.append(_hook(toy.model, kind, layer, keep))
    plain = _logits(toy.model, ids)[0]
    for h in handles:
        h.remove()
    record, logits = iv.read(toy.model, ids)
    assert set(record) == set(seen) and len(seen) == len(iv.KINDS) * toy.shape.layers
    for key, x in seen.items():
        assert torch.equal(record[key], x), key
    assert torch.equal(logits, plain)
    assert _hooks_on(toy.model) == 0 and iv.HOOKS.installed(toy.model) == 0


@pytest.mark.parametrize("site", SITES, ids=[f"{k}{layer}.{i}" for k, layer, i in SITES])
def test_zero_and_replace_each_site_equal_the_hand_edited_copy(toy, site):
    ids, heads = _ids(toy), toy.shape.heads
    record, _ = iv.read(toy.model, ids)
    zeroed = iv.run(toy.model, ids, iv.Plan().edit(*iv.zero(site, heads=heads)))[0]
    assert torch.equal(zeroed, _hand_edited(toy, ids, {site: 0.0}))
    d = record[site[:2]].shape[-1] // heads if site[0] == "heads" else record[site[:2]].shape[-1]
    value = torch.randn(d, generator=torch.Generator().manual_seed(site[1] * 10 + site[2])) * 3
    replaced = iv.run(toy.model, ids, iv.Plan().edit(*iv.replace(site, value, heads=heads)))[0]
    assert torch.equal(replaced, _hand_edited(toy, ids, {site: value}))
    assert not torch.allclose(replaced, zeroed)  # the edits do something, and not the same thing
    after, _ = iv.read(toy.model, ids, kinds=(site[0],))
    assert torch.equal(after[site[:2]], record[site[:2]]), "a finished plan leaves the model as it was"


def test_a_batch_sharing_its_first_layers_equals_one_copy_per_row(toy):
    ids, heads = _ids(toy), toy.shape.heads
    n = ids.shape[1]
    rows = [[("heads", 1, 0)], [("resid", 1, 4), ("mlp", 1, 2)], [], [("attn", 1, 9), ("heads", 1, 3)]]
    value = {("heads", 1): torch.full((1, 1, toy.model.config.hidden_size), 0.5), ("resid", 1): -1.0,
             ("mlp", 1): 2.0, ("attn", 1): torch.linspace(-1, 1, toy.model.config.hidden_size)}
    plan = iv.Plan(rows=len(rows), edits=iv.batch_edits(rows, value.__getitem__, n=n, heads=heads,
                                                        d_v=toy.model.config.hidden_size // heads))
    iv.share_prefix(toy.model, ids, plan, iv.first_layer(rows))
    assert plan.expand_at == 1  # these families' blocks take no per-row inputs: layer 0 runs once for every row
    out = iv.run(toy.model, ids, plan)
    for b, row in enumerate(rows):
        wanted = {}
        for kind, layer, index in row:
            v = value[(kind, layer)]
            d_v = toy.model.config.hidden_size // heads
            wanted[(kind, layer, index)] = (torch.as_tensor(v).reshape(-1)[index * d_v:(index + 1) * d_v]
                                            if kind == "heads" and torch.as_tensor(v).dim() else v)
        torch.testing.assert_close(out[b], _hand_edited(toy, ids, wanted), atol=1e-5, rtol=1e-5)


def test_an_outer_plan_applies_to_reads_inside_it_and_a_position_past_the_text_to_nothing():
    toy = load_model("toy-llama-gqa")
    ids = _ids(toy)
    outer = iv.Plan().edit(*iv.zero(("out", 0, 1), heads=toy.shape.heads))
    with iv.applied(toy.model, outer):
        record, _ = iv.read(toy.model, ids, kinds=("out",))
    assert torch.all(record[("out", 0)][1] == 0) and not torch.all(record[("out", 0)][2] == 0)
    far = iv.Plan().edit(("resid", 1), iv.Put(0.0, position=ids.shape[1] + 3))
    assert torch.equal(iv.run(toy.model, ids, far), iv.run(toy.model, ids, iv.Plan()))


def test_rotary_tables_are_read_as_the_model_made_them():
    toy = load_model("toy-llama-gqa")
    ids = _ids(toy)
    record, _ = iv.read(toy.model, ids, kinds=("rope",))
    hidden = toy.model.model.embed_tokens(ids)
    cos, sin = toy.model.model.rotary_emb(hidden, torch.arange(ids.shape[1])[None])
    for layer in range(toy.shape.layers):
        assert torch.equal(record[("rope", layer)][0], cos[0].double())
        assert torch.equal(record[("rope", layer)][1], sin[0].double())


def test_two_threads_with_two_plans_stay_independent_and_the_hooks_go():
    toy = load_model("toy-gpt2")
    ids, heads = _ids(toy), toy.shape.heads
    plans = {"a": lambda: iv.Plan().edit(*iv.zero(("heads", 0, 1), heads=heads)),
             "b": lambda: iv.Plan().edit(*iv.replace(("resid", 1, 3), 4.0, heads=heads))}
    expected = {"a": _hand_edited(toy, ids, {("heads", 0, 1): 0.0}),
                "b": _hand_edited(toy, ids, {("resid", 1, 3): 4.0})}
    plain = _logits(toy.model, ids)[0]
    start, errors = threading.Barrier(3), []

    def worker(name):
        try:
            start.wait(10)
            for _ in range(8):
                assert torch.equal(iv.run(toy.model, ids, plans[name]())[0], expected[name]), name
        except Exception as exc:  # collected, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(name,)) for name in plans]
    for t in threads:
        t.start()
    start.wait(10)
    for _ in range(8):  # this thread, under no plan, sees the model as it is
        assert torch.equal(_logits(toy.model, ids)[0], plain)
    for t in threads:
        t.join()
    assert not errors, errors
    assert iv.HOOKS.users(toy.model) == 0 and iv.HOOKS.installed(toy.model) == 0 and _hooks_on(toy.model) == 0


def test_an_unknown_kind_is_refused():
    with pytest.raises(iv.InterventionError, match="Unknown site kind 'z'"):
        iv.zero(("z", 0, 0), heads=4)


def test_each_experiment_refuses_in_its_own_words(minilm):
    from attnviz import knockout, logit_attribution, patching, qk_attribution
    from attnviz.residual import DecompositionError, refused_as

    toy = load_model("toy-llama-gqa")
    one = toy.tokenizer("a").input_ids[:1]
    with pytest.raises(logit_attribution.LogitAttributionError, match="one token long"):
        logit_attribution.direct_logit_attribution(toy, one, 1, 2)
    with pytest.raises(qk_attribution.QKAttributionError, match="one token long"):
        qk_attribution.qk_attribution(toy, one, 0, 0)
    with pytest.raises(knockout.KnockoutError, match="one token long"):
        knockout.knockout_effects(toy, one, [((0, 0),)])
    ids = minilm.tokenizer("The cat sat.").input_ids
    for run, error, name in [(lambda: logit_attribution.direct_logit_attribution(minilm, ids, 1, 2),
                              logit_attribution.LogitAttributionError, "direct logit attribution"),
                             (lambda: patching.tokenize_pair(minilm, next(iter(patching.READY_PAIRS.values()))),
                              patching.PatchingError, "encoder")]:
        with pytest.raises(error, match=name):
            run()

    @refused_as(knockout.KnockoutError)
    def splits():
        raise DecompositionError("cannot be split")
    with pytest.raises(knockout.KnockoutError, match="cannot be split"):
        splits()
