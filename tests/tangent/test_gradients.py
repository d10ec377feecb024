"""Gradient analysis (anisweep.tangent) against independent computations: brute-force shares, planted subspaces,
and torch.autograd on tiny models. Semi-NMF itself (anisweep.tangent.seminmf): test_seminmf.py."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from transformers import BertForMaskedLM, GPTNeoXForCausalLM

from anisweep.adapters import adapter_for
from anisweep.measures import geometry
from anisweep.tangent.analysis import analyse
from anisweep.tangent.backward import gradient_pass, gradient_sites, load_lm
from anisweep.tangent.batch import LMBatch, causal_lm_batch, frequency_strata, masked_lm_batch
from anisweep.tangent.seminmf import orthonormal_basis, semi_nmf
from anisweep.tangent.settings import GradientSettings
from anisweep.tangent.shares import (
    STRATA,
    anisotropy_share,
    control_bases,
    energy_share,
    moments,
    null_moments,
    pca_basis,
    random_bases,
    share_rows,
    top_eigenpairs,
)
from anisweep.tangent.sums import SiteSums

from conftest import bert_config, neox_config, padded_batch, saved, tiny_neox_lm


# --------------------------------------------------------------------------- shares
def brute_force_shares(g: np.ndarray, basis: np.ndarray, m: int) -> tuple[float, float]:
    projector = basis @ np.linalg.pinv(basis)  # the orthogonal projector on span(basis), built independently
    energy = sum(np.sum((projector @ v) ** 2) for v in g) / sum(np.sum(v**2) for v in g)
    covariance = np.cov(g.T, bias=True)
    values, vectors = np.linalg.eigh(covariance)
    top = np.argsort(values)[::-1][:m]
    captured = [np.sum((projector @ vectors[:, i]) ** 2) for i in top]
    return energy, float(np.dot(values[top], captured) / values[top].sum())


def site_sums(act, grad, strata):
    sums = SiteSums(act.shape[1])
    sums.add(torch.from_numpy(act), torch.from_numpy(grad), torch.from_numpy(strata))
    return sums.finish()


def test_shares_against_brute_force():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(300, 10)) * np.linspace(3, 0.5, 10) + 0.3
    basis = rng.normal(size=(10, 3))
    sums = site_sums(g, g, np.random.default_rng(1).integers(0, 3, 300))
    second, covariance = moments(sums, 0)
    values, vectors = top_eigenpairs(covariance, 3)
    u = orthonormal_basis(basis)
    energy, anisotropy = brute_force_shares(g, basis, 3)
    assert energy_share(u, second) == pytest.approx(energy, rel=1e-10)
    assert anisotropy_share(u, values, vectors) == pytest.approx(anisotropy, rel=1e-10)
    # per stratum: the sums of each stratum are those of its rows alone
    strata = rng.integers(0, 3, 300)
    sums = site_sums(g, g, strata)
    for i in range(3):
        rows = strata == i
        np.testing.assert_allclose(sums.grad_second[i + 1], g[rows].T @ g[rows])
        assert sums.n[i + 1] == rows.sum()
    np.testing.assert_allclose(sums.grad_second[0], g.T @ g)  # `all`: every token
    assert sums.n[0] == 300


def test_the_covariance_is_exact_where_the_mean_dwarfs_the_spread():
    """Gradients of mean 1e3 and spread 1e-2 to 1 in three mini-batches with zero gradients among them: each
    stratum's covariance, and `all`'s, against numpy's two-pass one of the tokens with a gradient, also read back
    from gradient_sums.parquet; M / n - mean mean^T is off there by ~1e-6 relative."""
    from anisweep.tangent.pass_tables import pass_tables, read_pass
    from anisweep.tangent.sums import GradientPass

    rng = np.random.default_rng(5)
    d, n = 6, 900
    g = 1e3 + rng.normal(size=(n, d)) * np.geomspace(1e-2, 1.0, d)
    g[::50] = 0.0  # no gradient: left out, as geometry.unit_sum leaves zero vectors out
    strata = rng.integers(0, 3, n)
    sums = SiteSums(d)
    for part in np.array_split(np.arange(n), 3):
        sums.add(*(torch.from_numpy(a[part]) for a in (g, g, strata)))
    sums = sums.finish()
    has_grad = np.linalg.norm(g, axis=1) > 0
    result = GradientPass([], {(1, "resid"): sums}, {}, {}, np.zeros(0), 0.0, 0, {}, 0.0)
    tables = pass_tables(result)
    read = read_pass(tables["gradient_sums"], tables["gradient_sample"]).sums[(1, "resid")]
    for index, rows in [(0, has_grad)] + [(i + 1, has_grad & (strata == i)) for i in range(3)]:
        expected = np.cov(g[rows].T, bias=True)
        for source in (sums, read):
            covariance = moments(source, index)[1]
            np.testing.assert_allclose(np.diag(covariance), np.diag(expected), rtol=1e-9)
            np.testing.assert_allclose(covariance, expected, rtol=1e-7, atol=1e-9 * np.abs(expected).max())


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize(("d", "k"), [(12, 3), (32, 4), pytest.param(64, 16, marks=pytest.mark.slow)])
def test_the_exact_null_equals_many_random_subspaces(d, k):
    """null_moments against 20,000 Haar-random rank-k projectors (QR of Gaussian matrices), for a spread-out and
    a nearly rank-one A: mean k / d and the sd to Monte Carlo precision (a few percent)."""
    rng = np.random.default_rng(0)
    for scale in (np.linspace(1, 3, d), np.r_[50.0, np.ones(d - 1) * 0.1]):
        q = np.linalg.qr(rng.normal(size=(d, d)))[0]
        a = (q * scale) @ q.T
        shares = np.array([energy_share(u, a) for u in random_bases(d, k, 20_000, seed=1)])
        mean, sd = null_moments(float(np.trace(a)), float((a**2).sum()), d, k)
        assert mean == k / d and shares.mean() == pytest.approx(mean, abs=3 * sd / np.sqrt(len(shares)))
        assert sd == pytest.approx(shares.std(ddof=1), rel=0.03)


def test_z_is_against_the_exact_null_the_controls_are_a_check():
    rng = np.random.default_rng(3)
    d, k, n = 24, 4, 500
    act, grad = rng.normal(size=(n, d)), rng.normal(size=(n, d)) * np.linspace(1, 4, d)
    sums = site_sums(act, grad, rng.integers(0, 3, n))
    basis = np.linalg.qr(rng.normal(size=(d, k)))[0]
    rows = share_rows({"u": basis}, random_bases(d, k, 50, seed=1), sums, k)
    for r in rows:
        if r["subspace"] == "u" and r["measure"] == "energy_share":
            m = sums.grad_second[STRATA.index(r["stratum"])]
            mean, sd = null_moments(float(np.trace(m)), float((m**2).sum()), d, k)
            assert (r["null_mean"], r["null_sd"]) == (mean, sd)
            assert r["z"] == pytest.approx((r["value"] - mean) / sd)
            assert r["control_mean"] == pytest.approx(mean, abs=4 * sd / np.sqrt(50))


def test_the_two_pca_references_are_the_centred_and_the_raw_top_axes():
    """`pca` spans the top eigenvectors of the covariance, `pca_uncentred` those of X^T X (an eigendecomposition,
    against the SVD the code takes); with a large mean they differ, the uncentred one holding the mean."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(400, 8)) * np.linspace(3, 0.5, 8) + 10 * np.eye(8)[5]
    for centred, matrix in ((True, np.cov(x.T)), (False, x.T @ x)):
        top = np.linalg.eigh(matrix)[1][:, ::-1][:, :2]
        cosines = np.linalg.svd(pca_basis(x, 2, centred=centred).T @ top, compute_uv=False)
        assert cosines.min() > 1 - 1e-9
    assert abs(pca_basis(x, 1, centred=False)[5, 0]) > 0.99 and abs(pca_basis(x, 1)[5, 0]) < 0.1


def test_a_planted_subspace_is_found_and_a_random_one_is_not():
    rng = np.random.default_rng(4)
    n, d, k = 1500, 24, 4
    tangent = np.linalg.qr(rng.normal(size=(d, k)))[0]
    act = np.maximum(rng.normal(size=(n, k)), 0) @ tangent.T * 3 + 0.05 * rng.normal(size=(n, d))
    grad = rng.normal(size=(n, k)) * [4, 3, 2, 1] @ tangent.T + 0.2 * rng.normal(size=(n, d))
    sums = site_sums(act, grad, rng.integers(0, 3, n))
    fitted = orthonormal_basis(semi_nmf(act, k, seed=0).F)
    other = np.linalg.qr(rng.normal(size=(d, k)))[0]
    controls = random_bases(d, k, 20, seed=1)
    rows = share_rows({"seminmf": fitted, "pca": pca_basis(act, k), "other": other}, controls, sums, k)
    by = {(r["stratum"], r["subspace"], r["measure"]): r for r in rows}
    for stratum in STRATA[:4]:  # no special tokens here
        for measure in ("energy_share", "anisotropy_share"):
            for found in ("seminmf", "pca"):
                assert by[(stratum, found, measure)]["value"] > 0.9
                assert by[(stratum, found, measure)]["z"] > 5
            assert abs(by[(stratum, "other", measure)]["z"]) < 4
            assert by[(stratum, "random", measure)]["value"] == pytest.approx(k / d, abs=0.1)


def test_frequency_strata_split_tokens_at_the_count_terciles():
    ids = torch.tensor([[1, 1, 1, 1, 1, 1, 2, 2, 2], [3, 3, 4, 5, 6, 2, 0, 0, 0]])
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[1, 6:] = False
    strata, info = frequency_strata(ids, valid)
    counts = {1: 6, 2: 4, 3: 2, 4: 1, 5: 1, 6: 1}
    per_token = np.array([counts[int(i)] for i in ids[valid]])
    q1, q2 = np.quantile(per_token, [1 / 3, 2 / 3])
    expected = [0 if c >= q2 else 1 if c > q1 else 2 for c in per_token]
    assert strata[valid].tolist() == expected
    assert (strata[~valid] == -1).all()
    assert info == {"count_q1": q1, "count_q2": q2, "strata_from_corpus": 0.0}
    assert strata[0, 0] == 0 and strata[0, 6] == 1 and strata[1, 3] == 2


def test_strata_from_the_training_corpus_with_special_tokens_apart():
    """With the training corpus's counts the strata follow them, not the batch's; special tokens are a stratum of
    their own and take no part in the terciles (brute force)."""
    ids = torch.tensor([[0, 5, 5, 5, 6, 7, 8, 1], [0, 8, 8, 9, 9, 9, 9, 1]])  # 0 and 1: [CLS] and [SEP]
    valid = torch.ones_like(ids, dtype=torch.bool)
    corpus = np.array([50, 50, 0, 0, 0, 1, 900, 40, 2, 7], np.float64)  # 5 is rare in the corpus, 6 frequent
    strata, info = frequency_strata(ids, valid, corpus, special_ids=[0, 1])
    words = ~torch.isin(ids, torch.tensor([0, 1]))
    per_token = corpus[ids[words].numpy()]
    q1, q2 = np.quantile(per_token, [1 / 3, 2 / 3])
    assert strata[words].tolist() == [0 if c >= q2 else 1 if c > q1 else 2 for c in per_token]
    assert (strata[~words] == 3).all()
    assert info == {"count_q1": q1, "count_q2": q2, "strata_from_corpus": 1.0}
    assert strata[0, 1] == 2 and strata[0, 4] == 0  # by the corpus: 5 rare, 6 frequent (once in the batch)
    batch_strata, _ = frequency_strata(ids, valid, special_ids=[0, 1])
    assert batch_strata[0, 4] == 2  # by the batch, 6 is rare


# --------------------------------------------------------------------------- the gradient pass
def reference_gradients(model, lm: LMBatch):
    """Independently: one full-batch forward with output_hidden_states, retain_grad, loss.backward()."""
    model.zero_grad()
    out = model(input_ids=lm.input_ids, attention_mask=lm.valid.long(), output_hidden_states=True)
    for h in out.hidden_states:
        h.retain_grad()
    loss = torch.nn.functional.cross_entropy(
        out.logits.reshape(-1, out.logits.shape[-1]), lm.labels.reshape(-1), ignore_index=-100
    )
    loss.backward()
    model.zero_grad()
    return float(loss.detach()), [h.grad for h in out.hidden_states]


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("arch", ["bert", "neox"])
def test_per_token_gradients_equal_full_backward(tmp_path, arch):
    cls, cfg = (BertForMaskedLM, bert_config()) if arch == "bert" else (GPTNeoXForCausalLM, neox_config())
    model = cls.from_pretrained(saved(tmp_path, cls, cfg, arch), attn_implementation="eager").eval()
    adapter = adapter_for(model.config)
    batch = padded_batch()
    valid = batch["attention_mask"].bool()
    if arch == "bert":
        lm = masked_lm_batch(batch["input_ids"], valid, 4, [0, 1, 2, 3, 4], 60, probability=0.3, seed=0)
        labels = lm.labels
    else:
        lm = causal_lm_batch(batch["input_ids"], valid)
        labels = torch.where(valid, batch["input_ids"], -100)  # HF shifts the labels itself
    settings = GradientSettings(layers=[0, 1, 2], sample_tokens=10_000)
    rng_before = torch.get_rng_state()
    result = gradient_pass(model, adapter, 32, 2, lm, settings, batch_size=2, progress=False)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert all(p.grad is None for p in model.parameters())
    loss, hidden_grads = reference_gradients(model, lm)
    assert result.loss == pytest.approx(loss, rel=1e-5)
    hf_loss = float(model(input_ids=lm.input_ids, attention_mask=lm.valid.long(), labels=labels).loss.detach())
    assert result.loss == pytest.approx(hf_loss, rel=1e-5)
    seqs, positions = valid.nonzero(as_tuple=True)
    assert len(result.grad_sample[(0, "resid")]) == len(seqs)
    n_layers = 2
    expected = {(layer, "resid"): hidden_grads[layer] for layer in range(n_layers + 1)}
    if arch == "neox":  # hidden_states[-1] is after the final LayerNorm; its input is block 2's output
        expected[(2, "final_ln_out")] = hidden_grads[-1]
        del expected[(2, "resid")]
    else:  # BERT: the last block's output LayerNorm is the final one
        expected[(2, "final_ln_out")] = hidden_grads[-1]
    for key, grad in expected.items():
        torch.testing.assert_close(
            torch.from_numpy(result.grad_sample[key]), grad[seqs, positions], rtol=1e-4, atol=1e-7, msg=str(key)
        )
        assert np.abs(result.grad_sample[key]).max() > 0
    # the exact sums over every token equal the sample's (here every token is sampled)
    g = result.grad_sample[(1, "resid")].astype(np.float64)
    np.testing.assert_allclose(result.sums[(1, "resid")].grad_second[0], g.T @ g, rtol=1e-5, atol=1e-12)
    table = analyse(result, GradientSettings(rank=[2, 4], n_random=5), 32, progress=False)
    shares = table.filter(table["measure"] == "energy_share")
    assert set(shares["subspace"]) == {"seminmf", "pca", "pca_uncentred", "random"}
    assert {"all", "frequent", "rare"} <= set(shares["stratum"]) <= set(STRATA)  # random ids: middle may be empty
    assert set(shares["rank"]) == {2, 4}
    assert shares["value"].is_between(0, 1).all()


def test_tokens_without_a_gradient_are_left_out_and_counted(tmp_path):
    """At BERT's final sites only the masked targets have a gradient: the others are zero vectors, which have no
    direction. They are counted apart (n_grad, n_zero_grad) and left out of avg_cos, the mean norm and the
    shares' n_tokens, as geometry.unit_sum leaves zero rows out (brute force over the sampled tokens, here all)."""
    model = BertForMaskedLM.from_pretrained(saved(tmp_path, BertForMaskedLM, bert_config(), "b")).eval()
    batch = padded_batch()
    valid = batch["attention_mask"].bool()
    lm = masked_lm_batch(batch["input_ids"], valid, 4, [0, 1, 2, 3, 4], 60, probability=0.3, seed=0)
    settings = GradientSettings(layers=[0, 1], sample_tokens=10_000)
    result = gradient_pass(model, adapter_for(model.config), 32, 2, lm, settings, batch_size=2, progress=False)
    key = (2, "final_ln_out")
    grad = result.grad_sample[key].astype(np.float64)
    has_grad = np.linalg.norm(grad, axis=1) > 0
    n_targets = int((lm.labels != -100).sum())
    assert has_grad.sum() == n_targets < len(grad)  # the masked targets alone
    sums = result.sums[key]
    assert (sums.n[0], sums.n_grad[0]) == (len(grad), n_targets)
    table = analyse(result, GradientSettings(rank=2, n_random=3), 32, progress=False)
    rows = table.filter((pl.col("layer") == 2) & (pl.col("site") == "final_ln_out") & (pl.col("stratum") == "all"))
    value = dict(rows.filter(pl.col("subspace").is_null()).select("measure", "value").iter_rows())
    unit, n = geometry.unit_sum(grad)
    assert n == n_targets
    assert value["grad_avg_cos"] == pytest.approx(geometry.avg_cos_from_sums(unit, n), rel=1e-6)
    assert value["grad_norm_mean"] == pytest.approx(np.linalg.norm(grad[has_grad], axis=1).mean(), rel=1e-5)
    assert (value["n_grad"], value["n_zero_grad"]) == (n_targets, len(grad) - n_targets)
    shares = rows.filter(pl.col("measure") == "energy_share")
    assert set(shares["n_tokens"]) == {n_targets}


def test_the_gradient_pass_does_not_depend_on_the_mini_batch_size(tmp_path):
    model, adapter, batch = tiny_neox_lm(tmp_path)
    lm = causal_lm_batch(batch["input_ids"], batch["attention_mask"].bool())
    settings = GradientSettings(sample_tokens=20)
    a = gradient_pass(model, adapter, 32, 2, lm, settings, batch_size=1, progress=False)
    b = gradient_pass(model, adapter, 32, 2, lm, settings, batch_size=5, progress=False)
    assert a.loss == pytest.approx(b.loss, rel=1e-6)
    for key in a.sums:
        np.testing.assert_allclose(a.grad_sample[key], b.grad_sample[key], rtol=1e-4, atol=1e-8)
        np.testing.assert_allclose(a.sums[key].grad_second, b.sums[key].grad_second, rtol=1e-4, atol=1e-14)


def test_unknown_layers_and_base_models_are_named(tmp_path):
    model = GPTNeoXForCausalLM(neox_config())
    adapter = adapter_for(model.config)
    with pytest.raises(ValueError, match=r"gradients.layers: \[7\]"):
        gradient_sites(adapter, model.gpt_neox, 2, GradientSettings(layers=[1, 7]))
    from transformers import GPTNeoXModel

    GPTNeoXModel(neox_config()).save_pretrained(tmp_path / "base")
    with pytest.raises(ValueError, match="LM head|not one of"):
        load_lm(tmp_path / "base")


def test_default_sites_read_the_last_layer_once():
    model = GPTNeoXForCausalLM(neox_config())
    adapter = adapter_for(model.config)
    sites = gradient_sites(adapter, model.gpt_neox, 2, GradientSettings())
    assert [(s.layer, s.site) for s in sites] == [(0, "resid"), (1, "resid"), (2, "final_ln_in"), (2, "final_ln_out")]
    sites = gradient_sites(adapter, model.gpt_neox, 2, GradientSettings(final_ln=False))
    assert [(s.layer, s.site) for s in sites] == [(0, "resid"), (1, "resid"), (2, "resid")]


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_gradient_sweep_and_figures_from_checkpoint_tables(tmp_path):
    from anisweep.plots.gradients import GRADIENT_FIGURES, plot_gradients
    from anisweep.tables import with_identity, write_atomic
    from anisweep.tangent.sweep import gradients_sweep

    model, adapter, batch = tiny_neox_lm(tmp_path)
    lm = causal_lm_batch(batch["input_ids"], batch["attention_mask"].bool())
    settings = GradientSettings(rank=2, n_random=4)
    result = gradient_pass(model, adapter, 32, 2, lm, settings, batch_size=5, progress=False)
    table = analyse(result, settings, 32, progress=False)
    paths = []
    for step in (0, 10, 100):
        ident = {"family": "toy", "model": "m", "seed": 0, "step": step, "tokens_seen": step * 64}
        paths.append(tmp_path / f"step{step}.parquet")
        write_atomic(with_identity(table, ident), paths[-1])
    sweep = gradients_sweep(paths[::-1])
    assert sweep["step"].is_sorted() and sweep.height == 3 * table.height
    written = plot_gradients(sweep, tmp_path / "figures")
    assert [p.name for p in written] == list(GRADIENT_FIGURES)
    assert all(p.stat().st_size > 10_000 for p in written)


def test_control_bases_are_the_random_bases_drawn_once_and_read_only():
    controls = control_bases(12, 3, 5, 7)
    assert control_bases(12, 3, 5, 7) is controls
    for cached, fresh in zip(controls, random_bases(12, 3, 5, 7), strict=True):
        np.testing.assert_array_equal(cached, fresh)
        assert not cached.flags.writeable
