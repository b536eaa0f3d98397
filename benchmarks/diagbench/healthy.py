"""Healthy controls: configurations that train normally yet look, to a naive rule, like a failure.

Each is an ordinary run of one family; together they cover step decay down to ~0 loss, cosine with warm-up,
AdamW with weight decay, active gradient clipping, small noisy batches, an early plateau, an easy task whose
loss reaches ~1e-7 (every gradient shrinks 1000× legitimately), gradient accumulation, a part frozen on
purpose from step 0, evaluation passes under ``torch.no_grad()`` between steps, and the look-alikes of mode
collapse (a sigmoid bottleneck whose per-sample spread is low but steady) and of imbalanced learning
(branches of different but steady scale; one branch trained with a 10× smaller learning rate on purpose;
OGM-style gradient modulation that slows the leading branch all along).
"""
from __future__ import annotations

from benchmarks.diagbench.families import families
from benchmarks.diagbench.setup import Config


def healthy_configs() -> list[Config]:
    """Every healthy configuration, family by family."""
    f = families()
    mlp, res, cnn, rnn = f["mlp"], f["resmlp"], f["cnn"], f["rnn"]
    tfm, ae, two = f["transformer"], f["autoencoder"], f["twobranch"]
    return [
        mlp.config("relu_adam"),
        mlp.config("tanh_sgd_step_decay", activation="tanh", optimizer="sgd", lr=0.03, schedule="step",
                   task="easy"),
        mlp.config("easy_loss_to_1e-7", lr=1e-2, task="easy"),
        mlp.config("momentum_step_decay_to_0", optimizer="sgd", lr=0.03, schedule="step", task="easy"),
        res.config("adamw_weight_decay", weight_decay=0.05),
        res.config("cosine_warmup", schedule="warmup_cosine", lr=4e-3),
        res.config("small_noisy_batches", batch_size=8, task="noisy", loss="functional"),
        cnn.config("sgd_step_decay", schedule="step"),
        cnn.config("clipped", lr=0.1, clip=0.1),
        cnn.config("eval_passes", eval_every=10, loss="hooked"),
        rnn.config("gru_clipped", clip=1.0),
        rnn.config("lstm_accumulate", cell="lstm", accumulate=2, batch_size=16),
        rnn.config("gru_plateau", task="noisy", loss="module"),
        tfm.config("warmup_cosine", schedule="warmup_cosine", loss="hooked"),
        tfm.config("frozen_embeddings", frozen="tok"),
        tfm.config("relu_eval_passes", activation="relu", eval_every=10, loss="module"),
        ae.config("mse_adam"),
        ae.config("sigmoid_bottleneck", task="sigmoid_code", loss="hooked"),
        ae.config("masked_denoising", loss="custom"),
        ae.config("standardised_linear", task="standardised_linear"),
        two.config("balanced"),
        two.config("unequal_scales", task="unequal"),
        two.config("slow_branch", task="slow_branch"),
        two.config("ogm_modulation", task="ogm"),
    ]
