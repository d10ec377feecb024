"""The backward pass: the gradient of the model's own LM loss with respect to the residual stream at a few sites,
kept as float64 sums per frequency stratum (SiteSums) and a seeded sample of tokens. The only code here that
needs the model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from anisweep.extract.recorder import Sample, first_tensor

if TYPE_CHECKING:
    from anisweep.adapters import Adapter

from anisweep.tangent.batch import LMBatch, frequency_strata, lm_logits
from anisweep.tangent.settings import GradientSettings
from anisweep.tangent.sums import GradientPass, SiteSums


# --------------------------------------------------------------------------- sites and strata
@dataclass(frozen=True)
class GradientSite:
    layer: int
    site: str  # "resid", "final_ln_in", "final_ln_out"
    module: nn.Module
    reads: str  # "output" or "input" of the module


def gradient_sites(adapter: Adapter, base: nn.Module, n_layers: int, settings: GradientSettings) -> list[GradientSite]:
    """The residual-stream modules at the configured layers, and the final LayerNorm's input and output."""
    # By default the last layer is read through the final LayerNorm's sites, one of which it equals.
    default = {0, n_layers // 2} if settings.final_ln else {0, n_layers // 2, n_layers}
    layers = settings.layers if settings.layers is not None else sorted(default)
    resid = {site.layer: site.module for site in adapter.resid_sites(base)}
    unknown = sorted(set(layers) - set(resid))
    if unknown:
        raise ValueError(
            f"gradients.layers: {unknown} are not residual-stream layers of this model (0 = embedding output, "
            f"1..{n_layers} = block outputs)"
        )
    sites = [GradientSite(layer, "resid", resid[layer], "output") for layer in layers]
    if settings.final_ln:
        final = [s for s in adapter.layernorm_sites(base) if s.site == "final_ln"]
        for s in final:
            sites += [GradientSite(s.layer, "final_ln_in", s.module, "input")]
            sites += [GradientSite(s.layer, "final_ln_out", s.module, "output")]
    return sites


# --------------------------------------------------------------------------- the pass
def _capture(sites: list[GradientSite], captured: dict):
    handles = []
    for site in sites:
        key = (site.layer, site.site)
        if site.reads == "output":
            hook = lambda m, a, o, key=key: captured.__setitem__(key, first_tensor(o))  # noqa: E731
        else:
            hook = lambda m, a, o, key=key: captured.__setitem__(key, a[0])  # noqa: E731
        handles.append(site.module.register_forward_hook(hook))
    return handles


def gradient_pass(
    model: nn.Module,
    adapter: Adapter,
    d_model: int,
    n_layers: int,
    lm: LMBatch,
    settings: GradientSettings,
    batch_size: int,
    progress: bool = True,
) -> GradientPass:
    """Stream the batch through the LM in mini-batches; per mini-batch one backward of (its share of) the mean
    loss over every target of the batch, to the residual-stream sites only (torch.autograd.grad: no
    parameter's .grad is touched). The model is put in eval mode and given back in the mode it had."""
    device = next(model.parameters()).device
    base = adapter.base_model(model)
    sites = gradient_sites(adapter, base, n_layers, settings)
    strata, strata_info = frequency_strata(lm.token_ids, lm.valid, lm.corpus_counts, lm.special_ids)
    sample = Sample.draw(lm.token_ids, lm.valid, settings.sample_tokens, settings.seed)
    sample_strata = strata[sample.seq, sample.position].numpy()
    sums = {(s.layer, s.site): SiteSums(d_model, device) for s in sites}
    act_sample = {key: np.zeros((len(sample.seq), d_model), np.float32) for key in sums}
    grad_sample = {key: np.zeros((len(sample.seq), d_model), np.float32) for key in sums}
    n_targets = lm.n_targets
    if n_targets == 0:
        raise ValueError("gradients: the evaluation batch has no LM target (sequences of one token?)")
    was_training = model.training
    model.eval()
    captured: dict = {}
    handles = _capture(sites, captured)
    total_loss, started = 0.0, time.perf_counter()
    try:
        starts = range(0, lm.input_ids.shape[0], batch_size)
        for start in tqdm(starts, desc="gradients", unit="batch", disable=not progress, leave=False):
            rows = slice(start, start + batch_size)
            ids, valid = lm.input_ids[rows].to(device), lm.valid[rows].to(device)
            labels = lm.labels[rows].to(device)
            captured.clear()
            with torch.enable_grad():
                logits = lm_logits(model(input_ids=ids, attention_mask=valid.long()))
                loss = nn.functional.cross_entropy(
                    logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
                ) / float(n_targets)
                keys = list(captured)
                unique = list({id(captured[k]): captured[k] for k in keys}.values())
                grads = torch.autograd.grad(loss, unique, allow_unused=True)
            by_id = {id(t): (t, gr) for t, gr in zip(unique, grads, strict=True)}
            total_loss += float(loss.detach())
            flat_valid = valid.reshape(-1)
            batch_strata = strata[rows].reshape(-1).to(device)[flat_valid]
            in_batch = (sample.seq >= start) & (sample.seq < start + ids.shape[0])
            flat_index = ((sample.seq[in_batch] - start) * ids.shape[1] + sample.position[in_batch]).to(device)
            for key in keys:
                tensor, grad = by_id[id(captured[key])]
                act = tensor.detach().float().reshape(-1, d_model)
                grad = torch.zeros_like(act) if grad is None else grad.float().reshape(-1, d_model)
                sums[key].add(act[flat_valid], grad[flat_valid], batch_strata)
                act_sample[key][in_batch.numpy()] = act[flat_index].cpu().numpy()
                grad_sample[key][in_batch.numpy()] = grad[flat_index].cpu().numpy()
            del logits, loss, grads, by_id
            captured.clear()
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return GradientPass(
        sites,
        {key: value.finish() for key, value in sums.items()},
        act_sample,
        grad_sample,
        sample_strata,
        total_loss,
        n_targets,
        strata_info,
        time.perf_counter() - started,
    )


# --------------------------------------------------------------------------- one checkpoint
def load_lm(path, dtype: str = "float32", device: torch.device | str = "cpu"):
    """The checkpoint's LM class (as extract.load_model picks it) with its head, standard attention; every tensor,
    the head's included, from the checkpoint (anisweep.extract.checked_load)."""
    import transformers

    from anisweep.adapters import adapter_for
    from anisweep.extract.checked_load import load_checked
    from anisweep.extract.model import DTYPES, GRADIENT_HEAD

    hf_config = transformers.AutoConfig.from_pretrained(path)
    adapter = adapter_for(hf_config)
    arch = (hf_config.architectures or [None])[0]
    if arch not in adapter.architectures:
        raise ValueError(
            f"gradients: {path} is a {arch}, not one of {adapter.architectures}: no LM head to take a loss"
        )
    cls = getattr(transformers, arch)
    kwargs = {"dtype": DTYPES[dtype], "attn_implementation": "sdpa"}
    model = load_checked(cls, path, head_may_be_initialised=False, head_needed_by=GRADIENT_HEAD, **kwargs).model
    if model.get_output_embeddings() is None:
        raise ValueError(
            f"gradients: {path} is a {arch}, without an LM head: the gradient of the LM loss needs the checkpoint's "
            "LM class (e.g. BertForMaskedLM, GPTNeoXForCausalLM); set gradients.enabled: false for it"
        )
    return model.to(device).eval(), adapter
